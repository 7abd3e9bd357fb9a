"""Launchers end to end in subprocesses: outputs written, bad flags rejected before compute."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(module, *args, check=True):
  proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True,
                        text=True, timeout=600)
  if check and proc.returncode:
    raise AssertionError(proc.stdout + proc.stderr)
  return proc


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


@pytest.mark.parametrize("args,needle", [
    (["--dataset=imagenet"], "--dataset"),
    (["--clients_per_round=30", "--num_available=25"], "--clients_per_round"),
    (["--lr=-0.1"], "--lr"),
    (["--partition=k_classes", "--classes_per_client=12"], "classes_per_client"),
    (["--partition=uni_class", "--num_clients=1700", "--num_available=30"], "--num_clients"),
    (["--dataset=fashion_mnist", "--data_dir=/nonexistent"], "--data_dir"),
])
def test_bad_flags_fail_before_compute(args, needle):
  proc = launch("experiments.run", *args, check=False)
  assert proc.returncode != 0
  out = proc.stdout + proc.stderr
  assert needle in out
  assert "[   1/" not in out  # No round ran.


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
  assert {"R_filtered", "R_available", "R_empty", "R_opt", "approx_ratio", "submod_verified"} <= set(info)
  assert info["R_opt"] >= info["R_filtered"] - 1e-6 or first["num_filtered"] == 0
  assert len(info["submod_verified"]) == 4
  assert (out / "filfl.png").exists() and (out / "filtered_bad.csv").exists()


@pytest.mark.parametrize("args,needle", [
    (["--filters=foo"], "--filters"),
    (["--opt"], "--num_available"),
    (["--public_fraction=0"], "--public_fraction"),
    (["--selector=poc", "--poc_d=2"], "--poc_d"),
])
def test_filfl_bad_flags_fail_before_compute(args, needle):
  proc = launch("experiments.filfl", *args, check=False)
  assert proc.returncode != 0 and needle in proc.stdout + proc.stderr
  assert "[   1/" not in proc.stdout
