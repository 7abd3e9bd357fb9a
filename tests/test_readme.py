"""The README's library examples run on their own as written (with fewer rounds), twice in a row
in one folder."""

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


def test_readme_composition_example(tmp_path, monkeypatch):
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  setup = re.search(r"## Library example\n\n```python\n(.*?)```", readme, re.S).group(1)
  setup = setup.split("sim = ")[0]  # The imports, data and model of the first example.
  code = re.search(r"in one simulation:\n\n```python\n(.*?)```", readme, re.S).group(1)
  assert "rounds=20" in code
  monkeypatch.chdir(tmp_path)
  scope = {}
  exec(compile(setup + code.replace("rounds=20", "rounds=3"), "README.md", "exec"), scope)  # pylint: disable=exec-used
  records = scope["records"]
  assert len(records) == 3 and records[1]["rule"]["gated"]
  assert all(len(r["selected"]) == 10 for r in records)


def test_readme_batch_example(tmp_path, monkeypatch):
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  setup = re.search(r"## Library example\n\n```python\n(.*?)```", readme, re.S).group(1)
  setup = setup.split("sim = ")[0]
  code = re.search(r"as four runs here:\n\n```python\n(.*?)```", readme, re.S).group(1)
  assert "rounds=30" in code
  monkeypatch.chdir(tmp_path)
  scope = {}
  for _ in range(2):  # Twice in a row in one folder: the second reads the runs back.
    exec(compile(setup + code.replace("rounds=30", "rounds=2"), "README.md", "exec"), scope)  # pylint: disable=exec-used
  assert [len(r) for r in scope["runs"]] == [2, 2, 2, 2]
  assert [r[0]["lr"] for r in scope["runs"]] == [0.05, 0.1, 0.2, 0.4] or all(
      abs(r[0]["lr"] - lr) < 1e-6 for r, lr in zip(scope["runs"], (0.05, 0.1, 0.2, 0.4)))
  assert (tmp_path / "runs" / "batch" / "run3" / "metrics.jsonl").exists()
