"""A job replays exactly from its folder, for every launcher run as users run it (`python -m`):
`--config=<out_dir>/config.json` or `--flagfile=<out_dir>/flags.txt` with a new `--out_dir` gives
the same metrics, launcher-own and part flags included. Every flag each launcher accepts changes
its job config, and the generic launcher runs a selector registered outside the package."""

import json
import os
import subprocess
import sys

import pytest

from tests.hang_guard import HANG_GUARD_S

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--num_clients=12", "--num_available=6", "--clients_per_round=3", "--rounds=2",
         "--seeds=0,1"]
JOBS = {  # Non-default launcher-own and part flags for each launcher.
    "run": [*SMALL, "--clients_per_round=5", "--num_available=8", "--selector=entropy",
            "--explore_prob=0.3", "--rule=fedsrc", "--fedsrc_beta=0.3", "--aggregator=krum",
            "--krum_f=1", "--server_opt=adam", "--sweep=lr:0.05,0.2"],
    "filfl": ["--rounds=2", "--seeds=0", "--num_clients=16", "--num_available=8",
              "--clients_per_round=3", "--filters=dgf", "--selector=poc", "--poc_d=5",
              "--filter_period=1", "--empty_value=global"],
    "fedalign": ["--rounds=3", "--seeds=0", "--num_clients=12", "--methods=fedalign,all",
                 "--eps0=0.5", "--warmup_fraction=0.34", "--eps_schedule=constant"],
    "uacs": ["--rounds=2", "--seeds=0", "--num_clients=20", "--clients_per_round=4",
             "--scenarios=2", "--methods=entropy,random", "--explore_prob=0.5",
             "--test_samples=100", "--num_boundary=4"],
    "fedsrc": ["--rounds=2", "--seeds=0", "--num_clients=30", "--clients_per_round=5",
               "--methods=fedsrc", "--splits=noniid", "--fedsrc_beta=0.2", "--kappa=0.4"],
}
DEFAULT = {"run", "filfl"}  # The rest: pytest -m slow.


def launch(module: str, *args: str) -> None:
  proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True,
                        text=True, timeout=HANG_GUARD_S, check=False)
  assert proc.returncode == 0, proc.stdout + proc.stderr


def metrics(out_dir) -> dict:
  runs = {}
  for root, _, files in os.walk(out_dir):
    if "metrics.jsonl" in files:
      with open(os.path.join(root, "metrics.jsonl"), encoding="utf-8") as f:
        runs[os.path.relpath(root, out_dir)] = [
            {k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in f]
  return runs


@pytest.mark.parametrize("launcher", [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow)
                                      for n in JOBS])
def test_config_and_flags_files_replay_the_job_exactly(launcher, tmp_path):
  """`--config=<out_dir>/config.json` and `--flagfile=<out_dir>/flags.txt`, each with a new
  `--out_dir`, give the same metrics; the replayed job's config.json equals the first's (its
  out_dir aside)."""
  first, again, flagged = tmp_path / "a", tmp_path / "b", tmp_path / "c"
  launch(f"experiments.{launcher}", *JOBS[launcher], f"--out_dir={first}")
  launch(f"experiments.{launcher}", f"--config={first}/config.json", f"--out_dir={again}")
  launch(f"experiments.{launcher}", f"--flagfile={first}/flags.txt", f"--out_dir={flagged}")
  want = metrics(first)
  assert want and metrics(again) == want and metrics(flagged) == want
  configs = [json.loads((d / "config.json").read_text(encoding="utf-8"))
             for d in (first, again, flagged)]
  for c in configs:
    c["output"].pop("out_dir")
  assert configs[1] == configs[0] and configs[2] == configs[0]
  own = [a.split("=")[0] for a in JOBS[launcher]]
  text = (first / "flags.txt").read_text(encoding="utf-8")
  assert all(f"\n{flag}=" in f"\n{text}" for flag in own), own


def test_run_writes_its_config_and_runs_a_selector_registered_outside(tmp_path):
  """`--selector=tests.toy_selector:lowest_index` (a module of this folder, not the package):
  every round selects the K available clients of lowest index, and config.json names it."""
  out = tmp_path / "toy"
  launch("experiments.run", "--num_clients=12", "--num_available=6", "--clients_per_round=3",
         "--rounds=3", "--seeds=0", "--selector=tests.toy_selector:lowest_index",
         f"--out_dir={out}")
  for record in metrics(out)["seed0"]:
    assert record["num_selected"] == 3
  config = json.loads((out / "config.json").read_text(encoding="utf-8"))
  assert config["parts"]["selector"] == {"name": "tests.toy_selector:lowest_index",
                                         "settings": {"offset": 0}}
  assert config["engine"]["clients_per_round"] == 3 and config["seeds"] == [0]


CHANGE_EVERY_FLAG = """
import importlib, json, sys
from absl import flags
from experiments.launch import config, flag_binding
from fedjax_sel import registry

module_name = sys.argv[1]
launcher = importlib.import_module(module_name)
FLAGS = flags.FLAGS
FLAGS([module_name])
bound = launcher.BINDING
base = config.to_dict(bound.job_config(launcher.resolve))
owners = {flag: o[0][:2] for flag, o in bound.settings.items()}
kinds = {v: k for k, v in flag_binding.PART_FLAG.items()}
unchanged = []
for name in sorted(f.name for f in FLAGS.flags_by_module_dict()[module_name]):
  flag = FLAGS[name]
  default = flag.default
  if name == "config":
    continue  # The replay file: tests/test_replay.py replays with it.
  if name in kinds:
    names = ("none",) + registry.names(kinds[name])
    value = next(n for n in names if n != default)
  elif name == "sweep":
    value = "lr:0.05,0.2"
  elif name == "seeds":
    value = ["3"]
  elif flag.flag_type() == "bool":
    value = not default
  elif hasattr(flag.parser, "enum_values"):
    value = next(v for v in flag.parser.enum_values if v != default)
  elif flag.flag_type() == "int":
    value = 2 if default is None else default + 1
  elif flag.flag_type() == "float":
    value = 0.5 if default is None else default * 0.5 + 0.25 if default != 0.5 else 0.3
  elif flag.flag_type() == "list":
    value = ["1", "2"] if list(default or []) != ["1", "2"] else ["3"]
  else:
    value = "other"
  FLAGS.unparse_flags()
  args = [module_name, f"--{name}={','.join(value) if isinstance(value, list) else value}"]
  if isinstance(value, bool):
    args[1] = f"--{'' if value else 'no'}{name}"
  if name in owners and owners[name][0] in bound.choices:
    kind, part = owners[name]
    args.append(f"--{flag_binding.PART_FLAG[kind]}={part}")
  FLAGS(args)
  try:
    changed = config.to_dict(bound.job_config(launcher.resolve)) != base
  except Exception:  # A refused value is read too: the config saw it.
    changed = True
  if not changed:
    unchanged.append(name)
print(json.dumps(unchanged))
"""


@pytest.mark.parametrize("launcher", ["run", "filfl", "fedalign", "uacs", "fedsrc"])
def test_every_flag_of_a_launcher_changes_its_config(launcher):
  """Each flag a launcher accepts (besides absl's own), set to another value (with its part
  chosen, for a part's setting), changes the job config: no flag is accepted and ignored."""
  proc = subprocess.run([sys.executable, "-c", CHANGE_EVERY_FLAG, f"experiments.{launcher}"],
                        cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
  assert proc.returncode == 0, proc.stderr
  assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_run_takes_a_dataset_registered_outside(tmp_path):
  """`--dataset=tests.toy_dataset:two_blobs --two_blobs_blob_gap=6`: the generic launcher builds,
  partitions and trains on a dataset registered in a test module; config.json names it and its
  setting."""
  out = tmp_path / "blobs"
  launch("experiments.run", "--dataset=tests.toy_dataset:two_blobs", "--two_blobs_blob_gap=6",
         "--model=logreg", "--num_clients=10", "--num_available=5", "--clients_per_round=3",
         "--rounds=3", "--seeds=0", f"--out_dir={out}")
  config = json.loads((out / "config.json").read_text(encoding="utf-8"))
  assert config["parts"]["dataset"] == {"name": "tests.toy_dataset:two_blobs",
                                        "settings": {"blob_gap": 6.0}}
  assert metrics(out)["seed0"][-1]["test_accuracy"] > 0.9  # Two classes 6 sigma apart.
