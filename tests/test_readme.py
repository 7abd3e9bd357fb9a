"""The README's library example runs as written (with fewer rounds)."""

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_library_example(tmp_path, monkeypatch, capsys):
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  code = re.search(r"## Library example\n\n```python\n(.*?)```", readme, re.S).group(1)
  assert "rounds=30" in code
  monkeypatch.chdir(tmp_path)
  exec(compile(code.replace("rounds=30", "rounds=3"), "README.md", "exec"), {})  # pylint: disable=exec-used
  assert (tmp_path / "runs" / "example" / "metrics.jsonl").exists()
  assert "| FedAvg |" in capsys.readouterr().out
