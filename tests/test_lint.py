"""The code passes the linter configured in pyproject.toml (`ruff check`), as the test command runs
it on a fresh machine."""

import os
import shutil
import subprocess
import sys

from tests.hang_guard import HANG_GUARD_S

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_finds_nothing():
  ruff = shutil.which("ruff") or os.path.join(os.path.dirname(sys.executable), "ruff")
  proc = subprocess.run([ruff, "check", "--no-cache", "fedjax_sel", "experiments", "tests",
                         "benchmarks"], cwd=REPO, capture_output=True, text=True,
                        timeout=HANG_GUARD_S, check=False)
  assert proc.returncode == 0, proc.stdout + proc.stderr
