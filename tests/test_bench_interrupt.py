"""The selection benchmark stopped by a signal (`experiments/bench.py`): the job it was running is
stopped with it (no process outlives it), it says so, and the job, resumed by the same command,
has a timing row of both processes' rounds."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.hang_guard import HANG_GUARD_S

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = ["--dataset=digits", "--model=logreg", "--num_clients=6", "--num_available=4",
       "--clients_per_round=2", "--seeds=0", "--checkpoint_every=1", "--eval_every=100000"]


def _scenarios(path, rounds: int) -> str:
  """A scenarios file of one tiny job of `rounds` rounds."""
  spec = {"common": [*JOB, f"--rounds={rounds}"], "quick": [*JOB, f"--rounds={rounds}"],
          "target": 0.5, "scenarios": {"tiny": []}}
  path.write_text(json.dumps(spec), encoding="utf-8")
  return str(path)


def _children(pid: int) -> list[int]:
  """The processes whose parent is `pid` (Linux's /proc)."""
  found = []
  for entry in os.listdir("/proc"):
    try:
      with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
      continue
    if fields[1] == str(pid):
      found.append(int(entry))
  return found


def _running(pid: int) -> bool:
  """`pid` exists and is not a zombie (an orphan goes on running under another parent)."""
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


def _wait_for(condition, what: str) -> None:
  deadline = time.monotonic() + HANG_GUARD_S
  while not condition():
    assert time.monotonic() < deadline, f"hang guard: {what}"
    time.sleep(0.2)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="finds processes in /proc")
@pytest.mark.xdist_group("bench")
def test_sigterm_stops_the_running_job_and_the_resumed_job_is_timed(tmp_path):
  out = tmp_path / "bench"
  args = [sys.executable, "-m", "experiments.bench", "--selectors=random", f"--out_dir={out}"]
  log = out / "tiny" / "random" / "bench.log"
  with open(tmp_path / "stderr", "w+", encoding="utf-8") as err:
    bench = subprocess.Popen(args + [f"--scenarios_file={_scenarios(tmp_path / 'a.json', 10**5)}"],
                             cwd=REPO, stdout=subprocess.DEVNULL, stderr=err)
    children = []
    try:
      # The job's process has trained a round (its progress line is in the job's log).
      _wait_for(lambda: bench.poll() is not None or (
          log.exists() and "[   1/" in log.read_text(encoding="utf-8")), "no round trained")
      assert bench.poll() is None, open(tmp_path / "stderr", encoding="utf-8").read()
      children = _children(bench.pid)
      assert children
      bench.send_signal(signal.SIGTERM)
      bench.wait(HANG_GUARD_S)
      _wait_for(lambda: not any(_running(c) for c in children), "the job outlived the bench")
    finally:
      for pid in [bench.pid, *children]:  # Only on failure: what this test started goes.
        if _running(pid):
          os.kill(pid, signal.SIGKILL)
    err.seek(0)
    stderr = err.read()
  assert bench.returncode == 130, stderr
  assert "interrupted: the job tiny / random was stopped and no process of the benchmark is " \
         "left" in stderr, stderr
  folder = out / "tiny" / "random"
  (stopped,) = json.loads((folder / "timing.json").read_text(encoding="utf-8"))
  assert stopped["status"] == 130 and stopped["rounds_trained"] >= 1, stopped
  # The same command, run again (here to a few rounds past those kept), resumes the job; its
  # timing counts the stopped process and the one that resumed it.
  done = len((folder / "seed0" / "metrics.jsonl").read_text(encoding="utf-8").splitlines())
  again = subprocess.run(args + [f"--scenarios_file={_scenarios(tmp_path / 'b.json', done + 2)}"],
                         cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S,
                         check=False)
  assert again.returncode == 0, again.stdout + again.stderr
  stopped_again, resumed = json.loads((folder / "timing.json").read_text(encoding="utf-8"))
  assert stopped_again == stopped and resumed["status"] == 0 and resumed["rounds_trained"] >= 2
  with open(out / "timing.csv", encoding="utf-8") as f:
    (row,) = csv.DictReader(f)
  assert row["processes"] == "2" and float(row["ms_per_round"]) > 0, row
