"""Runs one launcher's `main` on many argument lists in one process (imports paid once).

  python -m tests.bad_input_harness experiments.run cases.json

`cases.json` holds a list of argument lists; prints one JSON line per case: the exception type
(`UsageError`, `FlagsError`, `SystemExit` or `none`), its message, whether a round ran, and the
figures the case saved (`figures`: per file, its title and each visible panel's title, axis labels
and lines, and its legends' texts: what the figure tests read, through matplotlib).
"""

import contextlib
import importlib
import io
import json
import os
import subprocess
import sys

from absl import app, flags

from tests.hang_guard import HANG_GUARD_S


def _wrote_metrics(out_dir) -> bool:
  """Whether a round's metrics line was written under `out_dir` (a round ran)."""
  for root, _, files in os.walk(out_dir or "/nonexistent"):
    if "metrics.jsonl" in files and os.path.getsize(os.path.join(root, "metrics.jsonl")):
      return "previous" not in root  # The fixture's previous run is not this case's.
  return False


def run_cases(launcher: str, cases: list[list[str]], folder: str, cwd: str) -> list[dict]:
  """Runs `cases` (argument lists) of `experiments.<launcher>` through this harness in one
  process started in `cwd`; one result dict per case (the case list is written to `folder`)."""
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  path = os.path.join(folder, f"{launcher}_cases.json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump(cases, f)
  proc = subprocess.run([sys.executable, "-m", "tests.bad_input_harness",
                         f"experiments.{launcher}", path], cwd=cwd, capture_output=True,
                        text=True, timeout=HANG_GUARD_S, env={**os.environ, "PYTHONPATH": repo})
  lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
  assert len(lines) == len(cases), proc.stdout + proc.stderr
  return lines


def _describe(fig) -> dict:
  suptitle = fig._suptitle.get_text() if fig._suptitle is not None else ""  # pylint: disable=protected-access
  return {"title": suptitle,
          "panels": [{"title": ax.get_title(), "xlabel": ax.get_xlabel(),
                      "ylabel": ax.get_ylabel(),
                      "lines": [line.get_label() for line in ax.get_lines()
                                if not line.get_label().startswith("_")]}
                     for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"],
          "legends": [[t.get_text() for t in legend.get_texts()] for legend in fig.legends]}


FIGURES: dict = {}


def _record_figures() -> None:
  """Wraps `Figure.savefig` to describe each saved figure into FIGURES."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel
  save = Figure.savefig

  def savefig(self, fname, *args, **kwargs):
    FIGURES[os.path.basename(str(fname))] = _describe(self)
    return save(self, fname, *args, **kwargs)

  Figure.savefig = savefig


def main():
  _record_figures()
  module = importlib.import_module(sys.argv[1])
  with open(sys.argv[2], encoding="utf-8") as f:
    cases = json.load(f)
  for args in cases:
    flags.FLAGS.unparse_flags()
    FIGURES.clear()
    out = io.StringIO()
    kind, message = "none", ""
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
      try:
        module.main(flags.FLAGS([sys.argv[1], *args]))  # As absl's app.run passes leftovers.
      except app.UsageError as e:
        kind, message = "UsageError", str(e)
      except flags.Error as e:
        kind, message = "FlagsError", str(e)
      except SystemExit as e:
        kind, message = "SystemExit", str(e.code)
    # A case whose flags did not parse leaves --out_dir at the default (a folder of the user's
    # own runs in the working directory): read its folder from its arguments instead. A tool
    # without --out_dir (experiments.compare) writes no run.
    out_dir = (None if "out_dir" not in flags.FLAGS else
               flags.FLAGS["out_dir"].value if kind != "FlagsError" else
               next((a.split("=", 1)[1] for a in args if a.startswith("--out_dir=")), None))
    ran = "[   1/" in out.getvalue() or _wrote_metrics(out_dir)
    print(json.dumps({"args": args, "kind": kind, "message": message, "ran": ran,
                      "figures": FIGURES}), flush=True)


if __name__ == "__main__":
  main()
