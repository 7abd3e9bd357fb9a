"""Tiny launcher jobs whose metrics were recorded before the launcher redesign, and must not change.

Each job runs a launcher in a subprocess (2-3 rounds, two seeds, every method of the launcher, and
`experiments.run` with several compositions and a sweep). `record` writes each run's records,
less the wall-clock field, into `tests/golden/<job>.json`; `test_golden.py` reruns the jobs and
compares, bit for bit on the machine that recorded them (float fields as JSON writes them).

Record again only where a change of results is deliberate, and say why in the commit:

  python -m tests.golden_jobs  # rewrites tests/golden/*.json
"""

import json
import os
import subprocess
import sys

from tests.hang_guard import HANG_GUARD_S

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(REPO, "tests", "golden")
WALL_CLOCK = {"wall_s"}  # Fields that differ run to run.
SMALL = ("--num_clients=12", "--num_available=6", "--clients_per_round=3", "--rounds=2",
         "--seeds=0,1")

JOBS = {  # name -> (launcher module, arguments)
    "filfl": ("experiments.filfl", ("--rounds=3", "--seeds=0,1", "--num_clients=20",
                                    "--num_available=8", "--clients_per_round=3",
                                    "--selector=poc", "--poc_d=5")),
    "fedalign": ("experiments.fedalign", ("--rounds=3", "--seeds=0,1", "--num_clients=12",
                                          "--num_priority=2", "--warmup_fraction=0.34",
                                          "--eps0=0.3")),
    "uacs": ("experiments.uacs", ("--rounds=3", "--seeds=0,1", "--num_clients=20",
                                  "--clients_per_round=4", "--scenarios=1,2", "--test_samples=200",
                                  "--explore_prob=0.3")),
    "fedsrc": ("experiments.fedsrc", ("--rounds=3", "--seeds=0,1", "--num_clients=30",
                                      "--clients_per_round=5", "--fedsrc_with=median",
                                      "--fedsrc_beta=0.3")),
    "run_default": ("experiments.run", SMALL),
    "run_sweep": ("experiments.run", (*SMALL, "--sweep=lr:0.05,0.2")),
    "run_robust": ("experiments.run", (*SMALL, "--clients_per_round=5", "--num_available=8",
                                       "--selector=entropy", "--rule=fedsrc",
                                       "--aggregator=krum", "--krum_f=1", "--server_opt=adam")),
    "run_filter": ("experiments.run", (*SMALL, "--filter=dgf", "--selector=poc",
                                       "--rule=fedalign", "--corrupt_fraction=0.25")),
    # Recorded with the rules that are Oort's `paper` variant since FedScale's became the default.
    "run_clock": ("experiments.run", (*SMALL, "--selector=oort", "--oort_variant=paper",
                                      "--system_profile=lognormal", "--deadline_s=20",
                                      "--aggregator=trimmed_mean", "--server_opt=momentum")),
    # --num_available is the uniform model's (refused beside diurnal since issue 31; it was
    # ignored: the recorded runs are the same).
    "run_divfl": ("experiments.run", (*(a for a in SMALL if not a.startswith("--num_available")),
                                      "--selector=divfl", "--prox_mu=0.1",
                                      "--availability=diurnal", "--diurnal_period=4")),
}


def run_job(name: str, out_dir: str) -> dict[str, list[dict]]:
  """Runs job `name` into `out_dir`; returns {run folder relative to out_dir: its records less
  the wall-clock fields}. A failing launcher raises with its output."""
  module, args = JOBS[name]
  proc = subprocess.run([sys.executable, "-m", module, *args, f"--out_dir={out_dir}"], cwd=REPO,
                        capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
  if proc.returncode:
    raise AssertionError(f"{module} {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
  runs = {}
  for root, _, files in os.walk(out_dir):
    if "metrics.jsonl" in files:
      with open(os.path.join(root, "metrics.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
      runs[os.path.relpath(root, out_dir)] = [
          {k: v for k, v in r.items() if k not in WALL_CLOCK} for r in records]
  return dict(sorted(runs.items()))


def expected(name: str) -> dict[str, list[dict]]:
  with open(os.path.join(GOLDEN, f"{name}.json"), encoding="utf-8") as f:
    return json.load(f)


def record(out_root: str) -> None:
  """Runs every job under `out_root` and writes its records into tests/golden/."""
  os.makedirs(GOLDEN, exist_ok=True)
  for name in JOBS:
    runs = run_job(name, os.path.join(out_root, name))
    with open(os.path.join(GOLDEN, f"{name}.json"), "w", encoding="utf-8") as f:
      json.dump(runs, f, sort_keys=True)
      f.write("\n")
    print(f"{name}: {len(runs)} runs")


if __name__ == "__main__":
  import tempfile  # pylint: disable=import-outside-toplevel
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")  # As the suite compiles (conftest).
                             + " --xla_backend_optimization_level=0").strip()
  with tempfile.TemporaryDirectory() as tmp:
    record(tmp)
