"""The README's library example runs on its own as written (with fewer rounds), twice in a row in
one folder (the guides' examples run in test_docs.py), and the README links every guide."""

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_library_example(tmp_path, monkeypatch, capsys):
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  code = re.search(r"## Library example\n\n```python\n(.*?)```", readme, re.S).group(1)
  assert "rounds=30" in code
  monkeypatch.chdir(tmp_path)
  outputs = []
  for _ in range(2):  # The second time reads the finished run back.
    exec(compile(code.replace("rounds=30", "rounds=3"), "README.md", "exec"), {})  # pylint: disable=exec-used
    outputs.append(capsys.readouterr().out)
  assert (tmp_path / "runs" / "example" / "metrics.jsonl").exists()
  assert "| FedAvg |" in outputs[1]
  strip = lambda text: [line.rsplit("|", 2)[0] for line in text.splitlines() if "| FedAvg" in line]
  assert strip(outputs[0]) == strip(outputs[1])


def test_readme_links_every_guide():
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  guides = sorted(os.listdir(os.path.join(REPO, "docs", "guides")))
  unlinked = [g for g in guides if g.endswith(".md") and f"](docs/guides/{g})" not in readme]
  assert not unlinked, unlinked
