"""Runs one launcher's `main` on many argument lists in one process (imports paid once).

  python -m tests.bad_input_harness experiments.run cases.json

`cases.json` holds a list of argument lists; prints one JSON line per case: the exception type
(`UsageError`, `FlagsError`, `SystemExit` or `none`), its message, and whether a round ran.
"""

import contextlib
import importlib
import io
import json
import os
import sys

from absl import app, flags


def _wrote_metrics(out_dir) -> bool:
  """Whether a round's metrics line was written under `out_dir` (a round ran)."""
  for root, _, files in os.walk(out_dir or "/nonexistent"):
    if "metrics.jsonl" in files and os.path.getsize(os.path.join(root, "metrics.jsonl")):
      return "previous" not in root  # The fixture's previous run is not this case's.
  return False


def main():
  module = importlib.import_module(sys.argv[1])
  with open(sys.argv[2], encoding="utf-8") as f:
    cases = json.load(f)
  for args in cases:
    flags.FLAGS.unparse_flags()
    out = io.StringIO()
    kind, message = "none", ""
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
      try:
        flags.FLAGS([sys.argv[1], *args])
        module.main([])
      except app.UsageError as e:
        kind, message = "UsageError", str(e)
      except flags.Error as e:
        kind, message = "FlagsError", str(e)
      except SystemExit as e:
        kind, message = "SystemExit", str(e.code)
    ran = "[   1/" in out.getvalue() or _wrote_metrics(flags.FLAGS["out_dir"].value)
    print(json.dumps({"args": args, "kind": kind, "message": message, "ran": ran}), flush=True)


if __name__ == "__main__":
  main()
