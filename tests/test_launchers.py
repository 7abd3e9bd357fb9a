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
