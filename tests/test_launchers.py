"""Launchers end to end in subprocesses: outputs written, bad flags rejected before compute."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.bad_input_harness import run_cases
from tests.hang_guard import HANG_GUARD_S

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(module, *args, check=True):
  proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True,
                        text=True, timeout=HANG_GUARD_S)
  if check and proc.returncode:
    raise AssertionError(proc.stdout + proc.stderr)
  return proc


@pytest.mark.parametrize("code,status", [(3, 3), (None, 0), ("stopped: why", 1)])
def test_exit_now_ends_as_sys_exit_after_threads_atexit_and_streams(tmp_path, code, status):
  # A launcher run as `python -m` ends with `cli.exit_now` (no interpreter teardown): what an
  # exit runs first must still run, and the status and message be sys.exit's.
  script = (
      "import atexit, sys, threading, time\n"
      "from experiments.launch import cli\n"
      f"atexit.register(lambda: open({str(tmp_path / 'atexit')!r}, 'w').write('ran'))\n"
      "def late():\n"
      "  time.sleep(0.2)\n"
      f"  open({str(tmp_path / 'thread')!r}, 'w').write('done')\n"
      "threading.Thread(target=late).start()\n"
      "sys.stdout.write('no newline, buffered')\n"
      f"cli.exit_now({code!r})\n")
  proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                        timeout=HANG_GUARD_S)
  assert proc.returncode == status, proc.stderr
  assert proc.stdout == "no newline, buffered"
  assert (tmp_path / "atexit").read_text() == "ran" and (tmp_path / "thread").read_text() == "done"
  assert proc.stderr == ("stopped: why\n" if isinstance(code, str) else "")


def test_run_writes_metrics_progress_and_summary(tmp_path):
  out = tmp_path / "run"
  proc = launch("experiments.run", "--rounds=3", "--num_clients=20", "--num_available=10",
                "--clients_per_round=4", f"--out_dir={out}", "--seeds=0,1", "--plot")
  assert "[   3/3]" in proc.stdout and "| FedAvg seed 1 |" in proc.stdout
  for seed in (0, 1):
    with open(out / f"seed{seed}" / "metrics.jsonl", encoding="utf-8") as f:
      recs = [json.loads(line) for line in f]
    assert [r["round"] for r in recs] == [0, 1, 2]
    assert {"test_accuracy", "train_loss", "cumulative_cost", "num_trained"} <= set(recs[-1])
  assert (out / "curves.png").exists() and (out / "summary.md").exists()


def test_sweep_runs_a_value_per_run_in_one_batch(tmp_path):
  """--sweep=lr:... with two seeds: four runs, each in its own folder with its own learning rate,
  labelled by value in the summary, advanced as one batch (one progress line per round; with
  --concurrent_batches=1: by default a CPU advances two batches of two at once)."""
  out = tmp_path / "sweep"
  proc = launch("experiments.run", "--rounds=2", "--num_clients=12", "--num_available=6",
                "--clients_per_round=3", "--seeds=0,1", "--sweep=lr:0.05,0.2", f"--out_dir={out}",
                "--concurrent_batches=1")
  assert "(4 runs) [   2/2]  runs 4/4" in proc.stdout
  for lr in (0.05, 0.2):
    for seed in (0, 1):
      recs = records(out / f"lr={lr:g}" / f"seed{seed}" / "metrics.jsonl")
      assert [r["lr"] for r in recs] == pytest.approx([lr, lr])
      assert f"| FedAvg lr={lr:g} seed {seed} |" in proc.stdout


SMALL_GRID = ("--rounds=2", "--num_clients=12", "--num_available=8", "--clients_per_round=3")


def test_a_selector_setting_grid_runs_as_one_batch_equal_to_its_runs_alone(tmp_path):
  """3 Oort explorations x 2 learning rates x 2 seeds: one compiled round for 12 runs (with
  --concurrent_batches=2, the default on a 2-core CPU, two batches of 6 at once), each filed under
  its values; a run of the grid equals the same run launched alone."""
  out = tmp_path / "grid"
  proc = launch("experiments.run", *SMALL_GRID, "--selector=oort", "--seeds=0,1",
                "--sweep=oort_exploration:0.3,0.6,0.9", "--sweep=lr:0.05,0.1", f"--out_dir={out}",
                "--concurrent_batches=2")
  assert "(6 runs) [   2/2]  runs 6/6" in proc.stdout, proc.stdout
  assert "compiled programs" not in proc.stdout
  assert "| FedAvg + oort oort_exploration=0.6 lr=0.1 seed 1 |" in proc.stdout
  job = json.loads((out / "job.json").read_text(encoding="utf-8"))
  assert {"oort_exploration": 0.6, "lr": 0.1} in [r["swept"] for r in job["runs"]]
  alone = tmp_path / "alone"
  launch("experiments.run", *SMALL_GRID, "--selector=oort", "--seeds=1", "--oort_exploration=0.6",
         "--lr=0.1", f"--out_dir={alone}")
  grid_run = records(out / "oort_exploration=0.6" / "lr=0.1" / "seed1" / "metrics.jsonl")
  alone_run = records(alone / "seed1" / "metrics.jsonl")
  for a, b in zip(grid_run, alone_run):
    assert a["selected"] == b["selected"]
    assert a["test_accuracy"] == b["test_accuracy"] and a["train_loss"] == b["train_loss"]


def test_a_user_selector_setting_sweeps_from_the_command_line(tmp_path):
  """tests/toy_selector.py's temperature (a float setting, nothing else written) is a run value:
  two temperatures run as one batch."""
  out = tmp_path / "tempered"
  proc = launch("experiments.run", *SMALL_GRID, "--selector=tests.toy_selector:tempered_loss",
                "--sweep=tempered_loss_temperature:0.01,100", f"--out_dir={out}")
  assert "(2 runs) [   2/2]" in proc.stdout
  for t in ("0.01", "100"):
    assert (out / f"tempered_loss_temperature={t}" / "seed0" / "metrics.jsonl").exists()


def test_a_structural_setting_compiles_a_program_per_value_and_says_so(tmp_path):
  """Power of choice's d sets how many candidates it scores: one program per value, logged."""
  out = tmp_path / "poc"
  proc = launch("experiments.run", *SMALL_GRID, "--selector=poc", "--seeds=0,1",
                "--sweep=poc_d:4,6", "--sweep=lr:0.05+prox_mu:0", f"--out_dir={out}")
  assert "-- 2 compiled programs for these runs, one per value of --poc_d" in proc.stdout
  assert proc.stdout.count("(2 runs) [   2/2]") == 2
  assert (out / "poc_d=6" / "lr=0.05,prox_mu=0" / "seed1" / "metrics.jsonl").exists()


def test_filfl_launcher_writes_filter_outputs(tmp_path):
  out = tmp_path / "filfl"
  proc = launch("experiments.filfl", "--rounds=3", "--seeds=0", "--num_clients=20",
                "--num_available=8", "--clients_per_round=3", "--filters=none,dgf", "--opt",
                "--submod_samples=4", f"--out_dir={out}", "--plot")
  assert "| FilFL-DGF |" in proc.stdout and "| FedAvg |" in proc.stdout
  with open(out / "dgf" / "seed0" / "metrics.jsonl", encoding="utf-8") as f:
    first = json.loads(f.readline())
  assert first["filter_round"] and first["num_filtered"] == len(first["filtered_in"])
  assert set(first["filtered_in"]) <= set(range(20))
  info = first["filter"]
  assert {"R_filtered", "R_available", "R_empty", "R_opt", "approx_ratio",
          "submod_verified"} <= set(info)
  assert info["R_opt"] >= info["R_filtered"] - 1e-6 or first["num_filtered"] == 0
  assert len(info["submod_verified"]) == 4
  assert (out / "filfl.png").exists() and (out / "filtered_bad.csv").exists()
  assert (out / "approx_ratio.png").exists()
  summary = (out / "summary.md").read_text(encoding="utf-8")
  assert "| FilFL-DGF seed 0 | 1 |" in summary and "R(greedy)/R(OPT) min / mean" in summary
  # The figure's train loss (over the uncorrupted clients) is in the table too, named as such.
  assert "final train loss (all clients) | final train loss (uncorrupted clients)" in summary


def records(path):
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def test_fedalign_launcher_writes_priority_metrics(tmp_path):
  out = tmp_path / "fa"
  proc = launch("experiments.fedalign", "--rounds=4", "--seeds=0", "--num_clients=12",
                "--num_priority=2", "--warmup_fraction=0.25", f"--out_dir={out}", "--plot")
  assert "| FedALIGN |" in proc.stdout and "| None |" in proc.stdout and "| All |" in proc.stdout
  recs = records(out / "main" / "fedalign" / "seed0" / "metrics.jsonl")
  assert [r["round"] for r in recs] == [0, 1, 2, 3]
  assert recs[0]["rule"]["warmup"] and recs[0]["others_trained"] == 0
  for r in recs:
    assert {"priority_objective", "priority_test_accuracy", "test_accuracy", "eps",
            "others_aggregated", "cumulative_cost"} <= set(r)
    assert r["others_aggregated"] <= r["others_trained"] <= 10
  none = records(out / "main" / "none" / "seed0" / "metrics.jsonl")
  assert all(len(r["trained_clients"]) == 2 for r in none)
  assert (out / "fedalign.png").exists() and (out / "summary.md").exists()


@pytest.mark.slow  # Covered by faster tests in the default suite; `pytest -m slow`.
def test_uacs_launcher_writes_selection_metrics(tmp_path):
  out = tmp_path / "uacs"
  proc = launch("experiments.uacs", "--rounds=3", "--seeds=0", "--scenarios=1", "--num_clients=20",
                "--num_boundary=3", "--clients_per_round=3", "--samples_per_client=20",
                f"--out_dir={out}", "--plot")
  for label in ("Entropy+Eps-Greedy", "Entropy Based", "Random", "Gradient Norm"):
    assert f"| {label} |" in proc.stdout
  recs = records(out / "scenario1" / "grad_norm" / "seed0" / "metrics.jsonl")
  assert all(len(r["selected"]) == 3 and 0 <= r["boundary_selected"] <= 3 for r in recs)
  assert recs[0]["cost"]["client_grad_samples"] > 0
  assert (out / "uacs.png").exists()


def test_fedsrc_launcher_writes_savings_and_exclusions(tmp_path):
  out = tmp_path / "fedsrc"
  proc = launch("experiments.fedsrc", "--rounds=3", "--seeds=0", "--num_clients=20",
                "--num_available=20", "--clients_per_round=8", "--methods=fedsrc,krum,fedasl",
                "--fedsrc_with=median", "--splits=iid", f"--out_dir={out}", "--plot")
  assert "| FedSRC+Median |" in proc.stdout and "uploads saved" in proc.stdout
  recs = records(out / "iid" / "fedsrc" / "seed0" / "metrics.jsonl")
  assert recs[0]["participation_rate"] == 1.0 and not recs[0]["rule"]["gated"]
  assert recs[1]["rule"]["gated"] and recs[1]["rule"]["phi"] > 0
  for r in recs:
    sampled = sum(v for k, v in r.items() if k.endswith("_sampled"))
    excluded = sum(v for k, v in r.items() if k.endswith("_excluded"))
    assert sampled == 8 and excluded == 8 - len(r["trained_clients"]) == r["uploads_saved"]
  assert (out / "fedsrc.png").exists()


BAD_FLAGS = [  # (launcher, flags, what the message must name)
    ("run", ["--sweep=momentum:0.1,0.9"], "--sweep"),
    ("run", ["--sweep=poc_d:12,20"], "no run of the job has the setting (it belongs to poc)"),
    ("run", ["--sweep=lr:0.1,0.2", "--sweep=lr:0.3"], "lr swept by more than one --sweep"),
    ("run", ["--sweep=lr:0.1,0.2+prox_mu:0"], "paired settings need as many values each"),
    ("run", ["--selector=poc", "--sweep=poc_d:4,x"], "'x' is not a valid --poc_d"),
    ("run", ["--sweep=lr:0.1,-1"], "--sweep"),
    ("uacs", ["--sweep=explore_prob:0.5,1.5"], "--sweep"),
    ("fedalign", ["--sweep=eps0:-1,2"], "--sweep"),
    ("fedsrc", ["--sweep=participation_target:0.5,2"], "--sweep"),
    ("run", ["--dataset=imagenet"], "--dataset"),
    ("run", ["--clients_per_round=30", "--num_available=25"], "--clients_per_round"),
    ("run", ["--lr=-0.1"], "--lr"),
    ("run", ["--test_fraction=0"], "--test_fraction"),  # No test accuracy to report (issue 37).
    ("run", ["--model=mlp", "--hidden=100000,100000"], "GiB of parameters"),  # No hang (37).
    ("run", ["--speed_median=50"], "--speed_median"),  # A clock setting without the clock.
    ("run", ["--concurrency=5"], "--mode=async"),  # An asynchronous flag in the synchronous mode.
    ("run", ["--mode=async", "--system_profile=none"], "--system_profile"),
    ("run", ["--mode=async", "--system_profile=lognormal", "--deadline_s=1"], "--deadline_s"),
    ("run", ["--mode=async", "--concurrency=30", "--num_available=25"], "--concurrency"),
    ("run", ["--mode=async", "--buffer_size=4", "--clients_per_round=5"], "--buffer_size"),
    ("run", ["--mode=async", "--async_alpha=0"], "--async_alpha"),
    # K set by --buffer_size is named as that flag, not --clients_per_round.
    ("run", ["--mode=async", "--buffer_size=30", "--num_available=25"],
     "need --buffer_size <= --num_available"),
    # A field given where the job's other settings leave it without effect (config.When).
    ("run", ["--mode=async", "--staleness=constant", "--staleness_b=2"],
     "--staleness_b=2.0 has no effect with --staleness=constant (it applies with "
     "--staleness=hinge)"),
    ("run", ["--shards_per_client=3"], "--shards_per_client=3 has no effect with "
     "--partition=dirichlet (it applies with --partition=shards)"),
    ("run", ["--partition=iid", "--dirichlet_alpha=0.1"],
     "--partition=dirichlet or inner_dirichlet"),
    ("run", ["--mode=async", "--async_alpha=0.3"], "(it applies with --async_rule=fedasync)"),
    ("run", ["--lr_decay_every=5"], "(it applies with --lr_decay other than 1.0)"),
    ("run", ["--corrupt_kinds=flip"], "(it applies with --corrupt_fraction other than 0.0)"),
    ("run", ["--figure_format=pdf"], "--figure_format=pdf has no effect with --noplot"),
    ("run", ["--wandb", "--concurrent_batches=2"],
     "--concurrent_batches=2 has no effect with --wandb (it applies with --nowandb)"),
    ("run", ["--store=host", "--concurrent_batches=2"],
     "--concurrent_batches=2 has no effect with --store=host"),
    ("fedsrc", ["--speed_median=50"], "(it applies with --system_profile=lognormal)"),
    ("run", ["--partition=k_classes", "--classes_per_client=12"], "classes_per_client"),
    ("run", ["--partition=uni_class", "--num_clients=1700", "--num_available=30"], "--num_clients"),
    ("run", ["--dataset=fashion_mnist", "--data_dir=/nonexistent"], "--data_dir"),
    ("filfl", ["--filters=foo"], "--filters"),
    ("filfl", ["--opt"], "--num_available"),
    ("filfl", ["--public_fraction=0"], "--public_fraction"),
    ("filfl", ["--selector=poc", "--poc_d=2"], "--poc_d"),
    ("fedalign", ["--eps0=-0.1"], "--eps0"),
    ("fedalign", ["--eps0=nan"], "--eps0"),
    ("fedalign", ["--warmup_fraction=1.0"], "--warmup_fraction"),
    ("fedalign", ["--num_priority=0"], "--num_priority"),
    ("fedalign", ["--num_priority=30"], "--num_priority"),
    ("fedalign", ["--priority_ids=3,99"], "--priority_ids"),
    ("fedalign", ["--eps_schedule=cosine"], "eps_schedule"),
    ("fedalign", ["--methods=fedalign,best"], "--methods"),
    ("uacs", ["--explore_prob=1.5"], "--explore_prob"),
    ("uacs", ["--clients_per_round=0"], "clients_per_round"),
    ("uacs", ["--clients_per_round=200"], "--clients_per_round"),
    ("uacs", ["--scenarios=4"], "--scenarios"),
    ("uacs", ["--num_boundary=150"], "--num_boundary"),
    ("uacs", ["--samples_per_client=0"], "--samples_per_client"),
    ("fedsrc", ["--corrupt_fraction=1.5"], "--corrupt_fraction"),
    ("fedsrc", ["--fedsrc_beta=0.95"], "--fedsrc_beta"),
    ("fedsrc", ["--krum_f=0.45"], "--krum_f"),
    ("fedsrc", ["--methods=fedavg,bulyan"], "--methods"),
    ("fedsrc", ["--participation_target=0"], "--participation_target"),
    ("fedsrc", ["--reinclude_prob=2"], "--reinclude_prob"),
    ("fedsrc", ["--val_fraction=0"], "--val_fraction"),
]


@pytest.fixture(scope="module")
def bad_flag_results(tmp_path_factory):
  """Every bad-flag case, one process per launcher (`tests/bad_input_harness.py`)."""
  root = str(tmp_path_factory.mktemp("bad_flags"))
  return {launcher: run_cases(launcher, [[*args, f"--out_dir={root}/out_{i}"]
                                         for i, (name, args, _) in enumerate(BAD_FLAGS)
                                         if name == launcher], root, REPO)
          for launcher in sorted({c[0] for c in BAD_FLAGS})}


@pytest.mark.xdist_group("bad_flags")  # One worker runs the module fixture's processes, once.
@pytest.mark.parametrize("index", range(len(BAD_FLAGS)),
                         ids=[f"{c[0]}:{' '.join(c[1])}" for c in BAD_FLAGS])
def test_bad_flags_fail_before_compute(bad_flag_results, index):
  """The launcher stops with a usage error naming the flag, and no round runs."""
  launcher, _, needle = BAD_FLAGS[index]
  position = [i for i, c in enumerate(BAD_FLAGS) if c[0] == launcher].index(index)
  result = bad_flag_results[launcher][position]
  assert result["kind"] in ("UsageError", "FlagsError"), result
  assert needle in result["message"], result
  assert not result["ran"], result


def test_swept_values_keep_their_exact_text_in_folders_and_labels():
  """Values that `:g` would round alike (0.1234567, 0.1234568: both 0.123457) get distinct tags,
  each reading back as its value; short values keep their short text."""
  from experiments.launch import config  # pylint: disable=import-outside-toplevel
  values = (0.1234567, 0.1234568, 0.1, 2.0, 1e-5)
  sweep = config.Sweep(("lr",), ("local.lr",), tuple((v,) for v in values))
  tags = [sweep.tag(p) for p in sweep.points]
  assert tags == ["lr=0.1234567", "lr=0.1234568", "lr=0.1", "lr=2", "lr=1e-05"]
  assert [float(t.split("=")[1]) for t in tags] == list(values)


# experiments/run.py composes every part: by default each selection method of the literature with
# a robust aggregator, a server optimizer, FedSRC's rule and the clock, and the other parts each
# with the defaults for the others, two rounds; the remaining parts and combinations are slow.
SELECTION_METHODS = ("md", "afl", "clustered_size", "clustered_similarity", "exp3",
                     "fedcs", "tifl", "refl", "pyramidfl", "ocs", "delta",
                     "fedcor")
# OCS uploads 3/32 of K in expectation by default: with 3 clients and two rounds, often none.
SELECTION_EXTRA = {"ocs": ("--ocs_budget=1",)}
COMPOSE_BASE = ["--rounds=2", "--num_clients=12", "--num_available=6", "--clients_per_round=3",
                "--model=logreg", "--seeds=0", "--eval_every=2"]
COMPOSE_CASES = (
    # Random is every other test's default, power of choice runs in the async mode below, entropy
    # and gradient norm in UACS-FL's launcher tests.
    [[f"--selector={s}"] for s in ("divfl", "oort")]
    + [[f"--selector={s}", *SELECTION_EXTRA.get(s, ()), "--rule=fedsrc", "--aggregator=median",
        "--server_opt=adam", "--system_profile=lognormal"] for s in SELECTION_METHODS]
    + [[f"--selector={s}", "--seeds=0,1"] for s in ("md", "fedcor")]  # Seeds batch.
    + [[f"--filter={f}"] for f in ("dgf", "rgf")]
    + [[f"--rule={r}"] for r in ("fedalign", "fedsrc")]
    + [[f"--aggregator={a}"] for a in ("trimmed_mean", "krum")]
    + [[f"--server_opt={o}"] for o in ("momentum", "yogi")]
    + [["--prox_mu=0.01"], ["--availability=probability"],
       ["--availability=diurnal", "--diurnal_period=4"],
       ["--system_profile=lognormal", "--deadline_s=2"]])
# The asynchronous mode with selectors of each kind (uniform, loss-driven, bandit, time-aware,
# learned covariance), FedAsync with a robust aggregator and a server optimizer, FedBuff's seeds
# batched.
ASYNC_SELECTORS = ("random", "poc", "oort", "exp3", "delta", "fedcor")
ASYNC_CASES = (
    [["--mode=async", f"--selector={s}", *SELECTION_EXTRA.get(s, ())] for s in ASYNC_SELECTORS]
    + [["--mode=async", "--async_rule=fedasync", "--clients_per_round=1", "--staleness=hinge",
        "--aggregator=median", "--server_opt=adam"],
       ["--mode=async", "--aggregator=krum", "--staleness=constant", "--max_staleness=1",
        "--seeds=0,1"]])
SLOW_COMPOSE_CASES = (  # The rest of every part's combinations: pytest -m slow.
    [["--filter=dgf", "--selector=divfl", "--rule=fedalign", "--server_opt=yogi"],
     ["--selector=entropy", "--rule=fedsrc", "--aggregator=krum", "--availability=diurnal",
      "--system_profile=lognormal"],
     ["--filter=rgf", "--selector=oort", "--aggregator=trimmed_mean", "--server_opt=momentum",
      "--system_profile=lognormal", "--deadline_s=1"],
     ["--selector=oort", "--system_profile=lognormal", "--rule=fedsrc", "--aggregator=median",
      "--server_opt=adam"]]
    + [[f"--selector={s}", "--seeds=0,1"] for s in SELECTION_METHODS if s not in ("md", "fedcor")]
    + [[f"--selector={s}"] for s in ("random", "poc", "entropy", "grad_norm")]
    + [[f"--aggregator={a}"] for a in ("median", "fedasl", "multi_krum")]
    + [[f"--server_opt={o}"] for o in ("sgd", "adam", "adagrad")])
SLOW_ASYNC_CASES = [
    ["--mode=async", f"--selector={s}", *SELECTION_EXTRA.get(s, ())]
    for s in ("divfl", "entropy", "grad_norm", *SELECTION_METHODS) if s not in ASYNC_SELECTORS]


def _compose(tmp_path, cases):
  def base(case):  # --num_available is the uniform availability model's setting.
    other = any(a.startswith("--availability=") for a in case)
    return [a for a in COMPOSE_BASE if not (other and a.startswith("--num_available"))]

  full = [base(case) + case + [f"--out_dir={tmp_path}/c{i}"] for i, case in enumerate(cases)]
  results = run_cases("run", full, str(tmp_path), str(tmp_path))
  for i, (case, result) in enumerate(zip(cases, results)):
    assert result["kind"] == "none", (case, result)
    recs = records(tmp_path / f"c{i}" / "seed0" / "metrics.jsonl")
    assert [r["round"] for r in recs] == [0, 1], case
    assert "test_accuracy" in recs[-1], case
    # FedALIGN's warm-up trains the priority clients only; OCS's default budget uploads about
    # 0.3 of the 3 clients a round.
    default_ocs = case[0] == "--selector=ocs" and "--ocs_budget=1" not in case
    if "--rule=fedalign" not in case and not default_ocs:
      assert sum(r["num_trained"] for r in recs) >= 1, case


def test_run_composes_each_selection_method_and_kind_of_part(tmp_path):
  assert len(COMPOSE_CASES) + len(SLOW_COMPOSE_CASES) >= 49
  _compose(tmp_path, COMPOSE_CASES)


def _compose_async(tmp_path, cases):
  _compose(tmp_path, cases)
  for i, case in enumerate(cases):
    last = records(tmp_path / f"c{i}" / "seed0" / "metrics.jsonl")[-1]
    assert {"staleness_mean", "staleness_max", "dropped", "stale_dropped", "concurrency",
            "sim_time_s", "arrivals"} <= set(last), case


def test_async_mode_composes_with_each_kind_of_selector(tmp_path):
  _compose_async(tmp_path, ASYNC_CASES)


@pytest.mark.slow
def test_async_mode_composes_with_every_other_selector(tmp_path):
  _compose_async(tmp_path, SLOW_ASYNC_CASES)


@pytest.mark.slow
def test_run_composes_wider_combinations(tmp_path):
  _compose(tmp_path, SLOW_COMPOSE_CASES)


def test_compare_reads_jobs_through_their_manifests(tmp_path):
  """Two jobs (one with a two-value sweep) side by side: one table row per method with n seeds,
  the final and best values and rounds-to-target computed by hand from the records, and one
  figure per metric with a line per method."""
  import matplotlib.image  # pylint: disable=import-outside-toplevel

  from experiments import compare  # pylint: disable=import-outside-toplevel
  base = ["--rounds=3", "--num_clients=10", "--num_available=5", "--clients_per_round=2",
          "--seeds=0,1"]
  results = run_cases("run", [base + [f"--out_dir={tmp_path}/plain"],
                              base + ["--sweep=lr:0.05,0.2", f"--out_dir={tmp_path}/swept"]],
                      str(tmp_path), str(tmp_path))
  assert all(r["kind"] == "none" for r in results), results
  jobs = {name: compare.read_job(str(tmp_path / name)) for name in ("plain", "swept")}
  assert sorted(jobs["plain"]) == ["FedAvg"]
  assert sorted(jobs["swept"]) == ["FedAvg lr=0.05", "FedAvg lr=0.2"]
  text = compare.table(jobs, "test_accuracy", 0.3, 2)
  runs = jobs["plain"]["FedAvg"]
  finals = [recs[-1]["test_accuracy"] for recs in runs]
  reached = [next((r["round"] + 1 for r in recs if r["test_accuracy"] >= 0.3), None)
             for recs in runs]
  hits = [h for h in reached if h is not None]
  rounds = f"{np.mean(hits):.1f} ({len(hits)}/2)" if hits else "never"
  assert (f"| plain | FedAvg | 2 | {np.mean(finals):.4f} +- {np.std(finals, ddof=1):.4f} |"
          in text), text
  assert rounds in text.split("| plain | FedAvg |")[1].split("\n")[0]
  assert text.count("| swept | FedAvg lr=") == 2
  compare.figure(jobs, "test_loss", str(tmp_path / "cmp_test_loss.png"))
  assert matplotlib.image.imread(str(tmp_path / "cmp_test_loss.png")).shape[0] > 100


def test_flags_file_replays_the_job_and_the_manifest_names_its_runs(tmp_path):
  """`<out_dir>/flags.txt` replays a job to the same metrics (a later --out_dir overriding);
  `job.json` names every run with its seed, swept value and folder; `run_info.json` holds the
  command and versions."""
  first = ["--rounds=2", "--num_clients=10", "--num_available=5", "--clients_per_round=2",
           "--seeds=0,1", "--sweep=lr:0.05,0.1", f"--out_dir={tmp_path}/a"]
  replay = [f"--flagfile={tmp_path}/a/flags.txt", f"--out_dir={tmp_path}/b"]
  results = run_cases("run", [first, replay], str(tmp_path), str(tmp_path))
  assert all(r["kind"] == "none" for r in results), results
  job = json.loads((tmp_path / "a" / "job.json").read_text(encoding="utf-8"))["runs"]
  assert [(r["seed"], r["sweep"], r["folder"]) for r in job] == [
      (0, "lr=0.05", "lr=0.05/seed0"), (1, "lr=0.05", "lr=0.05/seed1"),
      (0, "lr=0.1", "lr=0.1/seed0"), (1, "lr=0.1", "lr=0.1/seed1")]
  for run in job:
    strip = lambda recs: [{k: v for k, v in r.items() if k != "wall_s"} for r in recs]
    assert strip(records(tmp_path / "a" / run["folder"] / "metrics.jsonl")) == strip(
        records(tmp_path / "b" / run["folder"] / "metrics.jsonl")), run
  info = json.loads((tmp_path / "a" / "run_info.json").read_text(encoding="utf-8"))
  assert info["versions"]["jax"] and info["versions"]["fedjax_sel"] and info["command"]
  assert info["time_utc"].endswith("Z") and info["devices"]
  flags_text = (tmp_path / "a" / "flags.txt").read_text(encoding="utf-8")
  assert "--sweep=lr:0.05,0.1" in flags_text and "--resume" not in flags_text


def _help_words(node) -> list[str]:
  """The literal words of a flag's help expression (strings, f-strings, concatenations)."""
  import ast  # pylint: disable=import-outside-toplevel
  text = " ".join(n.value for n in ast.walk(node)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str))
  return text.split()


def test_no_flag_help_is_only_a_symbol():
  """Every launcher flag says what it sets in words (at least four), not just `K.` or `B.`."""
  import ast  # pylint: disable=import-outside-toplevel
  short = []
  for name in sorted(os.listdir(os.path.join(REPO, "experiments"))):
    if not name.endswith(".py"):
      continue
    tree = ast.parse(open(os.path.join(REPO, "experiments", name), encoding="utf-8").read())
    for node in ast.walk(tree):
      if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr.startswith("DEFINE_") and node.args
          and isinstance(node.args[0], ast.Constant)):  # flag_binding's: checked below.
        index = 3 if node.func.attr == "DEFINE_enum" else 2
        help_node = node.args[index] if len(node.args) > index else next(
            (k.value for k in node.keywords if k.arg == "help"), None)
        words = _help_words(help_node) if help_node is not None else []
        if len(words) < 4:
          short.append(f"{name}: --{node.args[0].value}: {' '.join(words)!r}")
  import dataclasses  # pylint: disable=import-outside-toplevel

  from experiments.launch import config  # pylint: disable=import-outside-toplevel
  from fedjax_sel import registry  # pylint: disable=import-outside-toplevel
  bound = [(s.__name__, f) for s in config.SECTIONS.values() for f in dataclasses.fields(s)]
  bound += [(f"{kind} {name}", f) for kind in registry.KINDS for name in registry.names(kind)
            for f in dataclasses.fields(registry.lookup(kind, name).settings)]
  short += [f"{where}: {f.name}: {registry.setting_help(f)!r}" for where, f in bound
            if len(registry.setting_help(f).split()) < 4]
  assert not short, "\n".join(short)


def read_tensorboard_scalars(folder) -> dict:
  """{tag: {step: value}} of the TensorBoard event files under `folder` (TFRecord framing: length,
  its CRC, the Event proto, its CRC), read with tensorboardX's own protos."""
  import struct  # pylint: disable=import-outside-toplevel

  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
  out = {}
  for name in sorted(os.listdir(folder)):
    with open(os.path.join(folder, name), "rb") as f:
      blob = f.read()
    at = 0
    while at < len(blob):
      (length,) = struct.unpack("<Q", blob[at:at + 8])
      event = event_pb2.Event.FromString(blob[at + 12:at + 12 + length])
      at += 12 + length + 4
      for value in event.summary.value:
        out.setdefault(value.tag, {})[event.step] = value.simple_value
  return out


def test_tensorboard_scalars_equal_the_metrics_files(tmp_path):
  pytest.importorskip("tensorboardX", reason="the tensorboard extra (the README's test command "
                      "installs it)")
  args = ["--rounds=3", "--num_clients=10", "--num_available=5", "--clients_per_round=2",
          "--seeds=0,1", "--tensorboard", f"--out_dir={tmp_path}/job"]
  (result,) = run_cases("run", [args], str(tmp_path), str(tmp_path))
  assert result["kind"] == "none", result
  for seed in (0, 1):
    run = tmp_path / "job" / f"seed{seed}"
    events = read_tensorboard_scalars(run / "tensorboard")
    recs = records(run / "metrics.jsonl")
    for key in ("test_accuracy", "local_train_loss", "num_trained"):  # Step: rounds trained.
      assert events[key] == {r["round"] + 1: pytest.approx(r[key]) for r in recs}, key
    assert events["cumulative_cost/train_samples"][3] == pytest.approx(
        recs[2]["cumulative_cost"]["train_samples"])


def read_wandb_run(folder) -> tuple[str, dict, dict]:
  """An offline W&B run's (name, config, {key: {step: value}}), read from its record log as W&B
  writes it (a 7-byte header, then 32 KiB blocks of records each with a crc32, length and
  full / first / middle / last type) and parsed with W&B's own protobuf messages."""
  import glob  # pylint: disable=import-outside-toplevel
  import struct  # pylint: disable=import-outside-toplevel

  from wandb.proto import wandb_internal_pb2  # pylint: disable=import-outside-toplevel
  (path,) = glob.glob(os.path.join(folder, "wandb", "offline-run-*", "run-*.wandb"))
  buf = open(path, "rb").read()
  assert buf[:4] == b":W&B", path
  pos, pending, name, config, history = 7, b"", None, {}, {}
  while pos + 7 <= len(buf):
    left = 32768 - pos % 32768
    _, length, kind = struct.unpack("<IHB", buf[pos:pos + 7]) if left >= 7 else (0, 0, 0)
    if kind == 0:  # Padding at a block's end.
      pos += left
      continue
    data, pos = buf[pos + 7:pos + 7 + length], pos + 7 + length
    pending = data if kind in (1, 2) else pending + data
    if kind in (2, 3):
      continue
    record = wandb_internal_pb2.Record()
    record.ParseFromString(pending)
    if record.WhichOneof("record_type") == "run":
      name = record.run.display_name
      config = {u.key: json.loads(u.value_json) for u in record.run.config.update}
    elif record.WhichOneof("record_type") == "history":
      for item in record.history.item:
        key = item.key or "/".join(item.nested_key)
        history.setdefault(key, {})[record.history.step.num] = json.loads(item.value_json)
  return name, config, history


def test_wandb_logs_each_run_as_its_metrics_files(tmp_path):
  """--wandb (offline): one W&B run per run of the job, named as its progress line, its config
  the run's settings, its history the records' scalars round by round."""
  pytest.importorskip("wandb", reason="the wandb extra (the README's test command installs it)")
  args = ["--rounds=3", "--num_clients=10", "--num_available=5", "--clients_per_round=2",
          "--seeds=0,1", "--wandb", f"--out_dir={tmp_path}/job"]
  (result,) = run_cases("run", [args], str(tmp_path), str(tmp_path))
  assert result["kind"] == "none", result
  for seed in (0, 1):
    name, config, history = read_wandb_run(tmp_path / "job" / f"seed{seed}")
    recs = records(tmp_path / "job" / f"seed{seed}" / "metrics.jsonl")
    assert name == f"FedAvg s{seed}" and config["seed"] == seed and config["num_clients"] == 10
    for key in ("test_accuracy", "local_train_loss", "num_trained"):  # Step: rounds trained.
      assert history[key] == {r["round"] + 1: pytest.approx(r[key]) for r in recs}, key
    assert history["cumulative_cost/train_samples"][3] == pytest.approx(
        recs[2]["cumulative_cost"]["train_samples"])


def test_wandb_settings_without_wandb_are_refused(tmp_path):
  (result,) = run_cases("run", [["--rounds=1", "--wandb_project=mine", f"--out_dir={tmp_path}/j"]],
                        str(tmp_path), str(tmp_path))
  assert result["kind"] == "UsageError" and ("--wandb_project=mine has no effect with --nowandb "
                                             "(it applies with --wandb)") in result[
      "message"] and not result["ran"], result


def test_the_tensorboard_extra_installs_the_viewer_the_docs_run():
  """`pip install -e '.[tensorboard]'` (the test command installs it) brings `tensorboard`, which
  docs/workflow.md tells users to run, beside the writer."""
  proc = subprocess.run([sys.executable, "-m", "tensorboard.main", "--version"],
                        capture_output=True, text=True, timeout=HANG_GUARD_S)
  assert proc.returncode == 0 and proc.stdout.strip()[0].isdigit(), proc.stdout + proc.stderr


def test_make_store_help_lists_only_what_it_uses():
  proc = subprocess.run([sys.executable, "-m", "experiments.make_store", "--help"], cwd=REPO,
                        capture_output=True, text=True, timeout=HANG_GUARD_S)
  listed = {line.split(":")[0].strip().lstrip("-").replace("[no]", "")
            for line in proc.stdout.splitlines() if line.startswith("  --")}
  assert {"dataset", "store_out", "synth_clients", "seeds", "overwrite"} <= listed, listed
  assert not listed & {"clients_per_round", "rounds", "server_opt", "selector"}, listed
  assert len(listed) <= 25  # The data's flags (datasets, partitioners), the store's, the seeds.


TINY = ["--rounds=3", "--seeds=0,1", "--plot"]
FIGURE_CASES = [  # (launcher, args, figure file, panels, methods in the legend)
    ("filfl", ["--num_clients=12", "--num_available=6", "--clients_per_round=2"], "filfl.png",
     4, ["FedAvg", "FilFL-DGF", "FilFL-RGF"]),
    ("fedalign", ["--num_clients=10"], "fedalign.png", 6, ["FedALIGN", "None", "All"]),
    ("fedsrc", ["--num_clients=20", "--clients_per_round=6", "--splits=iid",
                "--methods=fedsrc,fedavg"], "fedsrc.png", None, ["FedSRC", "FedAvg"]),
    ("uacs", ["--scenarios=1", "--num_boundary=2", "--samples_per_client=20"], "uacs.png", 3,
     ["Entropy+Eps-Greedy", "Entropy Based", "Random", "Gradient Norm"]),
    ("run", ["--num_clients=10", "--num_available=5", "--clients_per_round=2"], "curves.png", 3,
     ["FedAvg"]),
]


@pytest.mark.parametrize("launcher,args,name,panels,methods", FIGURE_CASES,
                         ids=[c[0] for c in FIGURE_CASES])
def test_each_launchers_figure_reads_at_a_glance(tmp_path, launcher, args, name, panels,
                                                 methods):
  """Drawn on a tiny job and read through matplotlib: a title with the setup and the seeds, at
  most four panels a row, every panel titled with labelled axes (rounds trained on the x of the
  per-round panels), one legend off the data naming every method; `--resume` on the finished job
  draws the same figure from what it reads back."""
  job = TINY + args + [f"--out_dir={tmp_path}/job"]
  result, resumed = run_cases(launcher, [job, job + ["--resume"]], str(tmp_path), str(tmp_path))
  assert result["kind"] == "none", result
  assert resumed["kind"] == "none" and resumed["figures"] == result["figures"], resumed
  figure = result["figures"][name]
  assert "2 seeds" in figure["title"] and ("N = " in figure["title"] or "UACS" in figure["title"])
  if launcher == "filfl":  # Its filter period h, said in words.
    assert "FilFL filters every h = 5 rounds" in figure["title"], figure["title"]
  if panels is not None:
    assert len(figure["panels"]) == panels, figure
  for panel in figure["panels"]:
    assert panel["title"] and panel["xlabel"] and panel["ylabel"], panel
  per_round = [p for p in figure["panels"] if "accuracy" in p["title"]]
  assert per_round and all(p["xlabel"] == "rounds trained" for p in per_round), figure
  assert figure["legends"] and figure["legends"][0] == methods, figure


def test_a_diverging_sweep_value_leaves_the_others_summarized(tmp_path):
  """A sweep where one learning rate diverges: the other value's run finishes, the summary and
  job.json are written (the stopped run marked in both), compare lists it apart, and the job
  exits 1 naming it."""
  out = tmp_path / "div"
  proc = subprocess.run([sys.executable, "-m", "experiments.run", "--num_clients=12",
                         "--num_available=6", "--clients_per_round=3", "--rounds=3", "--seeds=0",
                         "--sweep=lr:0.1,1e30", f"--out_dir={out}"], cwd=REPO,
                        capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
  assert proc.returncode == 1 and "lr=1e+30" in proc.stderr, proc.stderr
  summary = (out / "summary.md").read_text(encoding="utf-8")
  assert "| FedAvg lr=0.1 | 1 |" in summary
  assert "FedAvg lr=1e+30 (1 stopped, after round 1)" in summary
  runs = json.loads((out / "job.json").read_text(encoding="utf-8"))["runs"]
  assert [bool(r.get("stopped")) for r in runs] == [False, True]
  assert len(records(out / "lr=0.1" / "seed0" / "metrics.jsonl")) == 3
  from experiments import compare  # pylint: disable=import-outside-toplevel
  assert sorted(compare.read_job(str(out))) == ["FedAvg lr=0.1", "FedAvg lr=1e+30 (stopped)"]


def test_compare_keeps_jobs_of_one_basename_and_dotted_folders_apart(tmp_path):
  """Two job folders named alike are two rows; without job.json, folders prox_mu=1.5 and
  prox_mu=15 stay two methods (the dots were stripped, merging them)."""
  from experiments import compare  # pylint: disable=import-outside-toplevel
  assert compare.job_names([str(tmp_path / "a" / "job"), str(tmp_path / "b" / "job")]) == [
      str(tmp_path / "a" / "job"), str(tmp_path / "b" / "job")]
  record = {"round": 0, "test_accuracy": 0.5, "test_loss": 1.0}
  for name in ("prox_mu=1.5", "prox_mu=15"):
    run = tmp_path / "job" / name / "seed0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps(record) + "\n", encoding="utf-8")
  assert sorted(compare.read_job(str(tmp_path / "job"))) == ["prox_mu=1.5", "prox_mu=15"]


def test_resume_with_an_added_seed_resumes_the_others(tmp_path):
  """--resume with one more seed: seed 0 continues from its checkpoint (its records unchanged),
  only seed 1 starts from round 0 (the whole job restarted from scratch before)."""
  out = tmp_path / "grow"
  base = [sys.executable, "-m", "experiments.run", "--num_clients=12", "--num_available=6",
          "--clients_per_round=3", "--rounds=3", "--checkpoint_every=1", f"--out_dir={out}"]
  first = subprocess.run(base + ["--seeds=0"], cwd=REPO, capture_output=True, text=True,
                         timeout=HANG_GUARD_S, check=False)
  assert first.returncode == 0, first.stderr
  before = records(out / "seed0" / "metrics.jsonl")
  again = subprocess.run(base + ["--seeds=0,1", "--rounds=4", "--resume"], cwd=REPO,
                         capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
  assert again.returncode == 0, again.stderr
  assert "resuming" in again.stdout and "starting them fresh" not in again.stdout
  after = records(out / "seed0" / "metrics.jsonl")
  # The per-client participation counts stand in a run's last record only: they move on.
  strip = lambda recs: [{k: v for k, v in r.items() if k not in ("wall_s", "participations")}
                        for r in recs]
  assert strip(after[:3]) == strip(before) and len(after) == 4
  assert "participations" in after[3] and "participations" not in after[2]
  assert len(records(out / "seed1" / "metrics.jsonl")) == 4


def test_what_conv_impl_auto_stood_for_is_printed_and_kept(tmp_path, capsys):
  """A convolutional job says what --conv_impl=auto resolved to on this machine, and run_info.json
  keeps it (issue 36)."""
  from experiments.launch import config, job  # pylint: disable=import-outside-toplevel
  from fedjax_sel.host import folder_lock  # pylint: disable=import-outside-toplevel
  from fedjax_sel.models import resolve_conv_impl  # pylint: disable=import-outside-toplevel
  out = tmp_path / "cnn"
  cfg = config.updated(config.JobConfig(), model="leaf_cnn", out_dir=str(out))
  job.start(cfg, [])
  folder_lock.release(str(out))
  want = resolve_conv_impl("auto")
  assert f"convolutions: --conv_impl=auto -> {want}" in capsys.readouterr().out
  assert json.loads((out / "run_info.json").read_text())["conv_impl"] == want


@pytest.mark.parametrize("launcher", ["run", "filfl", "fedalign", "uacs", "fedsrc"])
def test_help_is_short_grouped_and_exits_0(launcher):
  """`--help` prints the launcher's own page and its flags one line each, grouped by what they
  configure, and exits 0 (absl's exits 1 with every flag's whole help: --helpfull keeps that)."""
  proc = launch(f"experiments.{launcher}", "--help", check=False)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert len(lines) < 260 and "Data:" in lines and "Local training:" in lines
  assert any(line.startswith("  --seeds: ") for line in lines)
  assert lines[-1].startswith("--helpfull")


SWEEPABLE_TABLE = """
from absl import flags
from experiments import run
from experiments.launch import flag_binding
flags.FLAGS(["run"])
for name in list(flag_binding.SWEEP_FIELDS) + sorted(run.BINDING.settings):
  kind = flag_binding.sweep_kind(run.BINDING, name)
  if kind is not None:
    print(name, flag_binding.SWEEP_MARKS[kind], sep="|")
"""


def test_the_sweep_guide_lists_every_sweepable_setting_as_the_launcher_sweeps_it():
  proc = subprocess.run([sys.executable, "-c", SWEEPABLE_TABLE], cwd=REPO, capture_output=True,
                        text=True, timeout=HANG_GUARD_S, check=True)
  wanted = dict(line.split("|") for line in proc.stdout.strip().splitlines())
  guide = open(os.path.join(REPO, "docs", "guides", "sweep.md"), encoding="utf-8").read()
  listed = {m[0]: m[1] for m in re.findall(r"^\| `--(\w+)` \| [^|]+ \| ([^|]+) \|$", guide,
                                            flags=re.M)}
  assert {k: v.strip() for k, v in listed.items()} == wanted


def test_the_installed_command_runs_a_launcher_from_any_folder(tmp_path):
  """`pip install` gives `fedjax-sel LAUNCHER`: from a folder outside the clone it runs a selector
  sweep, and `python -m experiments.run` works there too."""
  command = os.path.join(os.path.dirname(sys.executable), "fedjax-sel")
  assert os.path.exists(command), "the README's install gives the fedjax-sel console script"
  small = ["--rounds=1", "--num_clients=12", "--num_available=6", "--clients_per_round=3"]
  proc = subprocess.run([command, "run", *small, "--selector=oort",
                         "--sweep=oort_exploration:0.3,0.9", "--out_dir=oort"], cwd=tmp_path,
                        capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert (tmp_path / "oort" / "oort_exploration=0.9" / "seed0" / "metrics.jsonl").exists()
  proc = subprocess.run([sys.executable, "-m", "experiments.run", *small, "--out_dir=plain"],
                        cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S,
                        check=False)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  listing = subprocess.run([command, "--help"], capture_output=True, text=True, check=True)
  assert all(name in listing.stdout for name in ("run", "filfl", "bench", "compare"))
