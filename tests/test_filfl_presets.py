"""FilFL's paper setups (`--preset`) end to end for 2 rounds on data the test builds itself."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.test_launchers import REPO, launch
from tests.hang_guard import HANG_GUARD_S

SMALL = ["--num_clients=6", "--num_available=4", "--clients_per_round=2", "--rounds=2",
         "--seeds=0", "--filters=dgf", "--eval_every=1"]


def write_leaf(path, users, make_x, make_y, seed=0):
  rng = np.random.default_rng(seed)
  blob = {"users": [], "num_samples": [], "user_data": {}}
  for u in range(users):
    n = int(rng.integers(12, 20))
    blob["users"].append(f"u{u}")
    blob["num_samples"].append(n)
    blob["user_data"][f"u{u}"] = {"x": [make_x(rng) for _ in range(n)],
                                  "y": [make_y(rng) for _ in range(n)]}
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(blob), encoding="utf-8")


def first_record(out):
  with open(out / "dgf" / "seed0" / "metrics.jsonl", encoding="utf-8") as f:
    recs = [json.loads(line) for line in f]
  assert [r["round"] for r in recs] == [0, 1]
  assert recs[0]["filter_round"] and recs[0]["num_filtered"] >= 1
  assert all(np.isfinite(r["test_loss"]) for r in recs)
  return recs[0]


@pytest.mark.slow  # A CNN compile; the TFDS loader itself is tested on mock data by default.
def test_cifar10_preset_on_tfds_mock_data(tmp_path):
  """TFDS cifar10 (mock images), Dirichlet(0.5), 1% stratified public set, ResNet18 with
  BatchNorm (narrowed to 8 channels for CPU), the preset's E, B, lr schedule and weight decay."""
  out = tmp_path / "cifar"
  args = ["--preset=cifar10", "--resnet_width=8", "--chunk_size=4", "--local_epochs=1",
          f"--out_dir={out}", *SMALL]
  code = ("import sys, tensorflow_datasets as tfds\n"
          "from absl import app\n"
          "from experiments import filfl\n"
          "with tfds.testing.mock_data(num_examples=150):\n"
          f"  app.run(filfl.main, argv=['filfl'] + {args!r})\n")
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                        timeout=HANG_GUARD_S)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "tfds/dirichlet" in proc.stdout and "model=resnet18 (BatchNorm)" in proc.stdout
  assert "public m=10," in proc.stdout  # 1% of each class, at least one.
  rec = first_record(out)
  assert rec["lr"] == pytest.approx(0.1)


def test_femnist_preset_on_tiny_leaf_json(tmp_path):
  leaf = tmp_path / "femnist" / "all_data_0.json"
  write_leaf(leaf, 8, lambda r: r.random(784).round(3).tolist(), lambda r: int(r.integers(62)))
  out = tmp_path / "femnist_run"
  proc = launch("experiments.filfl", "--preset=femnist", f"--leaf_files={leaf.parent}/*.json",
                f"--out_dir={out}", *SMALL)
  assert "leaf, N=6" in proc.stdout and "model=leaf_cnn" in proc.stdout
  first_record(out)


def test_shakespeare_preset_on_tiny_leaf_json_and_public_text(tmp_path):
  chars = "abcdefgh ijklmnop,.ABC"
  text = lambda r, n: "".join(r.choice(list(chars), n))
  leaf = tmp_path / "shakespeare" / "all_data_0.json"
  write_leaf(leaf, 8, lambda r: text(r, 80), lambda r: text(r, 1))
  out = tmp_path / "shakespeare_run"
  proc = launch("experiments.filfl", "--preset=shakespeare", "--fedprox",
                f"--leaf_files={leaf}", f"--out_dir={out}", *SMALL)
  assert "model=char_lstm" in proc.stdout and "public m=34," in proc.stdout
  first_record(out)


@pytest.mark.parametrize("preset,needle", [("femnist", "preprocess.sh -s niid --sf 0.05"),
                                           ("shakespeare", "data/leaf/shakespeare/")])
def test_missing_preset_data_says_how_to_prepare_it(tmp_path, preset, needle):
  proc = subprocess.run([sys.executable, "-m", "experiments.filfl", f"--preset={preset}",
                         f"--out_dir={tmp_path}"], cwd=tmp_path, capture_output=True, text=True,
                        timeout=HANG_GUARD_S, env={**os.environ, "PYTHONPATH": REPO})
  assert proc.returncode != 0
  assert "no such file" in proc.stderr and needle in proc.stderr
  assert "[   1/" not in proc.stdout
