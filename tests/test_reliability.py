"""Bad inputs across the launchers, loaders and library API: each fails early with an error that
names the flag, file or argument, and no round runs. Plus resume, checkpoints and NaN guards."""

import json
import os
import signal
import struct
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjax_sel as fs
from fedjax_sel import checkpoint, fedsrc
from fedjax_sel.data import sources
from tests.bad_input_harness import run_cases
from tests.conftest import ragged_dataset
from tests.test_launchers import REPO

FEMNIST_ROW = [0.5] * 784


def idx_bytes(array: np.ndarray) -> bytes:
  return struct.pack(">HBB", 0, 8, array.ndim) + struct.pack(">" + "I" * array.ndim,
                                                             *array.shape) + array.tobytes()


def write_idx_dir(folder, images, labels, images_name="train-images-idx3-ubyte"):
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, images_name), "wb") as f:
    f.write(images)
  with open(os.path.join(folder, "train-labels-idx1-ubyte"), "wb") as f:
    f.write(labels)


def femnist_users(n):
  return {"users": [f"u{i}" for i in range(n)], "num_samples": [2] * n,
          "user_data": {f"u{i}": {"x": [FEMNIST_ROW] * 2, "y": [1, 2]} for i in range(n)}}


def build_bad_files(root):
  """Every malformed file the table refers to, under `root`."""
  leaf = os.path.join(root, "leaf")
  os.makedirs(leaf)
  blobs = {"missing_keys": {"users": ["a"]},
           "empty_users": {"users": [], "num_samples": [], "user_data": {}},
           "absent_user": {**femnist_users(2), "user_data": femnist_users(1)["user_data"]},
           "bad_label": {**femnist_users(1), "user_data": {"u0": {"x": [FEMNIST_ROW] * 2,
                                                                  "y": [1, 70]}}},
           "few_users": femnist_users(3),
           "short_rows": {**femnist_users(1), "user_data": {"u0": {"x": [[0.1] * 10] * 2,
                                                                   "y": [1, 2]}}}}
  for name, blob in blobs.items():
    with open(os.path.join(leaf, name + ".json"), "w", encoding="utf-8") as f:
      json.dump(blob, f)
  with open(os.path.join(leaf, "not_json.json"), "w", encoding="utf-8") as f:
    f.write("{oops")
  images = np.zeros((10, 28, 28), np.uint8)
  labels = np.arange(10, dtype=np.uint8)
  write_idx_dir(os.path.join(root, "idx_empty"), b"", idx_bytes(labels))
  write_idx_dir(os.path.join(root, "idx_truncated"), idx_bytes(images)[:-100], idx_bytes(labels))
  write_idx_dir(os.path.join(root, "idx_mismatch"), idx_bytes(images), idx_bytes(labels[:9]))
  write_idx_dir(os.path.join(root, "idx_swapped"), idx_bytes(labels), idx_bytes(images))
  write_idx_dir(os.path.join(root, "idx_badgz"), b"plain bytes, not gzip",
                idx_bytes(labels), images_name="train-images-idx3-ubyte.gz")
  os.makedirs(os.path.join(root, "empty_tfds"))
  from fedjax_sel.data import store  # pylint: disable=import-outside-toplevel
  store.write_store(os.path.join(root, "store_truncated"), ragged_dataset([5, 6, 7]))
  path = os.path.join(root, "store_truncated", "train_x.npy")
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) - 16)
  store.write_store(os.path.join(root, "store_ok"), ragged_dataset([5, 6, 7]))
  with open(os.path.join(root, "a_file"), "w", encoding="utf-8") as f:
    f.write("not a folder")
  os.makedirs(os.path.join(root, "previous", "seed0"))
  with open(os.path.join(root, "previous", "seed0", "metrics.jsonl"), "w", encoding="utf-8") as f:
    f.write('{"round": 0}\n')


SMALL = ["--rounds=1", "--num_clients=10", "--num_available=5", "--clients_per_round=2"]
# (launcher, args, needle that the message must hold). `{tmp}` is the folder of bad files.
LAUNCHER_CASES = [
    ("run", ["--lr=nan"], "--lr"),
    ("run", ["--lr=inf"], "--lr"),
    ("run", ["--lr=-1"], "--lr"),
    ("run", ["--lr=abc"], "--lr"),
    ("run", ["--weight_decay=inf"], "--weight_decay"),
    ("run", ["--dataset=synth", "--synth_alpha=nan"], "--synth_alpha"),
    ("run", ["--momentum=nan"], "--momentum"),
    ("run", ["--prox_mu=inf"], "--prox_mu"),
    ("run", ["--lr_decay=nan"], "--lr_decay"),
    ("run", ["--test_fraction=nan"], "--test_fraction"),
    ("run", ["--dirichlet_alpha=0"], "dirichlet_alpha"),
    ("run", ["--seeds=1,1"], "--seeds"),
    ("run", ["--seeds=-1"], "--seeds"),
    ("run", ["--seeds=a"], "--seeds"),
    ("run", ["--model=char_lstm"], "--model"),
    ("run", ["--model=leaf_cnn"], "--model"),
    ("run", ["--dataset=synth", "--model=leaf_cnn"], "--model"),
    ("run", ["--dataset=synth", "--model=resnet18"], "--model"),
    ("run", ["--clients_per_round=30", "--num_available=25"], "--clients_per_round"),
    ("run", ["--num_available=60"], "--num_available"),
    ("run", ["--public_fraction=0.95"], "public_fraction"),
    ("run", ["--public_fraction=0.6", "--test_fraction=0.5", "--num_clients=400"],
     "--public_fraction"),
    ("run", ["--rounds=0"], "rounds"),
    ("run", ["--local_epochs=0"], "local_epochs"),
    ("run", ["--batch_size=0"], "batch_size"),
    ("run", ["--hidden=a"], "--hidden"),
    ("run", ["--hidden=0"], "--hidden"),
    ("run", ["--partition=k_classes", "--classes_per_client=12"], "classes_per_client"),
    ("run", ["--dataset=imagenet"], "--dataset"),
    ("run", ["--norm=layer"], "--norm"),
    ("run", ["--nonfinite=ignore"], "--nonfinite"),
    ("run", ["--out_dir={tmp}/a_file"], "--out_dir"),
    ("run", ["--out_dir={tmp}/a_file/sub"], "--out_dir"),
    ("run", ["--out_dir={tmp}/previous"], "--overwrite"),
    ("run", ["--dataset=fashion_mnist", "--data_dir=/nonexistent"], "--data_dir"),
    ("run", ["--dataset=leaf"], "leaf_files"),
    ("run", ["--dataset=leaf", "--leaf_files={tmp}/nothing/*.json"], "nothing/*.json"),
    ("run", ["--dataset=leaf", "--leaf_files={tmp}/leaf/missing_keys.json"], "missing_keys.json"),
    ("run", ["--dataset=leaf", "--leaf_files={tmp}/leaf/empty_users.json"], "empty_users.json"),
    ("run", ["--dataset=leaf", "--leaf_files={tmp}/leaf/absent_user.json"], "absent_user.json"),
    ("run", ["--dataset=leaf", "--leaf_files={tmp}/leaf/bad_label.json"], "bad_label.json"),
    ("run", ["--dataset=leaf", "--leaf_files={tmp}/leaf/few_users.json"], "few_users.json"),
    ("run", ["--dataset=leaf", "--leaf_files={tmp}/leaf/short_rows.json"], "short_rows.json"),
    ("run", ["--dataset=leaf", "--leaf_files={tmp}/leaf/not_json.json"], "not_json.json"),
    ("run", ["--dataset=fashion_mnist", "--data_dir={tmp}/idx_empty"], "train-images-idx3-ubyte"),
    ("run", ["--dataset=fashion_mnist", "--data_dir={tmp}/idx_truncated"], "truncated"),
    ("run", ["--dataset=fashion_mnist", "--data_dir={tmp}/idx_mismatch"], "9 labels"),
    ("run", ["--dataset=fashion_mnist", "--data_dir={tmp}/idx_swapped"], "swapped"),
    ("run", ["--dataset=fashion_mnist", "--data_dir={tmp}/idx_badgz"], "gzip"),
    ("run", ["--dataset=tfds", "--tfds_name=cifar10", "--data_dir={tmp}/empty_tfds"],
     "not prepared"),
    ("run", ["--store_dir={tmp}/store_truncated"], "train_x.npy"),
    ("run", ["--store_dir={tmp}/empty_tfds"], "store.json"),
    ("run", ["--store_dir={tmp}/store_ok", "--num_clients=7"], "holds 3 clients"),
    ("run", ["--store=disk"], "--store"),
    ("filfl", ["--filters=foo"], "--filters"),
    ("filfl", ["--gammas=nan"], "--gammas"),
    ("filfl", ["--gammas=2"], "--gammas"),
    ("filfl", ["--opt"], "--opt"),
    ("filfl", ["--selector=poc", "--poc_d=2"], "--poc_d"),
    ("filfl", ["--fedprox"], "--fedprox"),
    ("filfl", ["--filters=dgf", "--public_fraction=0"], "--public_fraction"),
    ("filfl", ["--corrupt_kinds=foo"], "--corrupt_kinds"),
    ("filfl", ["--filter_const=nan"], "--filter_const"),
    ("filfl", ["--preset=mnist"], "--preset"),
    ("filfl", ["--preset=femnist", "--leaf_files={tmp}/nothing/*.json"], "preprocess.sh"),
    ("fedalign", ["--eps0=nan"], "--eps0"),
    ("fedalign", ["--num_priority=0"], "priority"),
    ("fedsrc", ["--participation_target=nan"], "--participation_target"),
    ("fedsrc", ["--trim_beta=inf"], "--trim_beta"),
    ("uacs", ["--explore_prob=2"], "--explore_prob"),
    ("uacs", ["--gap0=nan"], "--gap0"),
]


@pytest.fixture(scope="module")
def launcher_results(tmp_path_factory):
  """Runs every launcher case, one process per launcher, from a folder without data/."""
  root = str(tmp_path_factory.mktemp("bad"))
  build_bad_files(root)
  results = {}
  for launcher in sorted({c[0] for c in LAUNCHER_CASES}):
    cases = [(SMALL if launcher == "run" else []) + [a.replace("{tmp}", root) for a in args] +
             ([f"--out_dir={root}/out_{i}"] if not any(a.startswith("--out_dir") for a in args)
              else [])
             for i, (name, args, _) in enumerate(LAUNCHER_CASES) if name == launcher]
    lines = run_cases(launcher, cases, root, root)
    results[launcher] = lines
  return results


@pytest.mark.parametrize("index", range(len(LAUNCHER_CASES)),
                         ids=[f"{c[0]}:{' '.join(c[1])}" for c in LAUNCHER_CASES])
def test_bad_launcher_input_fails_early_naming_it(launcher_results, index):
  launcher, args, needle = LAUNCHER_CASES[index]
  position = [i for i, c in enumerate(LAUNCHER_CASES) if c[0] == launcher].index(index)
  result = launcher_results[launcher][position]
  assert result["kind"] in ("UsageError", "FlagsError"), result
  assert needle in result["message"], result
  assert not result["ran"], result


def api_cases():
  data = ragged_dataset([20, 12, 9, 15])
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  sgd = lambda lr: optax.sgd(lr)
  avail = fs.uniform_availability(4, 4)

  def sim(**kw):
    args = dict(model=model, data=data, optimizer=sgd, local=fs.LocalHParams(batch_size=4),
                availability=avail, selector=fs.random_selector(2), aggregator=fs.fedavg(),
                clients_per_round=2, seed=0)
    args.update(kw)
    return lambda: fs.Simulator(**args)

  return [
      ("optimizer object", sim(optimizer=optax.sgd(0.1)), TypeError, "optimizer"),
      ("optimizer not callable", sim(optimizer=0.1), TypeError, "optimizer"),
      ("float seed", sim(seed=1.5), TypeError, "seed"),
      ("string seed", sim(seed="0"), TypeError, "seed"),
      ("eval_mask length", sim(eval_mask=np.ones(3, bool)), ValueError, "eval_mask"),
      ("availability size", sim(availability=fs.uniform_availability(6, 4)), ValueError,
       "availability"),
      ("num_epochs 0", sim(local=fs.LocalHParams(batch_size=4, num_epochs=0)), ValueError,
       "num_epochs"),
      ("num_steps 0", sim(local=fs.LocalHParams(batch_size=4, num_steps=0)), ValueError,
       "num_steps"),
      ("batch_size 0", sim(local=fs.LocalHParams(batch_size=0)), ValueError, "batch_size"),
      ("K above n", sim(clients_per_round=5), ValueError, "clients_per_round"),
      ("nonfinite mode", sim(nonfinite="ignore"), ValueError, "nonfinite"),
      ("rule reads absent val split",
       sim(participation=fedsrc.fedsrc_rule(fedsrc.FedSRCConfig(decision_stat="val_loss"))),
       ValueError, "val_loss is read .* 4 of 4 clients hold no val data"),
      ("run rounds 0", lambda: fs.run(None, 0), ValueError, "rounds"),
      ("run rounds float", lambda: fs.run(None, 2.5), ValueError, "rounds"),
      ("run eval_every 0", lambda: fs.run(None, 2, eval_every=0), ValueError, "eval_every"),
      ("dataset name", lambda: fs.build_dataset(fs.DatasetSpec("imagenet"), 0), ValueError,
       "imagenet"),
      ("public_size 0", lambda: fs.build_dataset(fs.DatasetSpec(public_size=0), 0), ValueError,
       "public_size"),
      ("model name", lambda: fs.build_model("vgg", (8,), 2), ValueError, "vgg"),
      ("norm", lambda: fs.build_model("resnet18", (8, 8, 3), 2, norm="layer"), ValueError, "norm"),
      ("idx foreign file", lambda: sources.read_idx(__file__), ValueError, "test_reliability.py"),
      ("leaf missing file", lambda: sources.leaf_paths(["/nonexistent.json"]), FileNotFoundError,
       "/nonexistent.json"),
  ]


API_CASES = api_cases()


@pytest.mark.parametrize("name,call,error,needle", API_CASES, ids=[c[0] for c in API_CASES])
def test_bad_library_argument_raises_named_error(name, call, error, needle):
  del name
  with pytest.raises(error, match=needle):
    call()


def test_there_are_at_least_sixty_bad_inputs():
  assert len(LAUNCHER_CASES) + len(API_CASES) >= 60


# --- Resume, checkpoints, guards -------------------------------------------------------------

def make_sim(data=None, lr=0.1, seed=0, **kw):
  data = data or ragged_dataset([20, 12, 9, 15, 30, 11])
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  return fs.Simulator(model, data, lambda rate: optax.sgd(rate), fs.LocalHParams(batch_size=4),
                      fs.uniform_availability(data.num_clients, 4), kw.pop("selector",
                                                                             fs.random_selector(2)),
                      fs.fedavg(), 2, seed, lr_schedule=fs.constant_lr(lr), **kw)


def strip(records):
  return [{k: v for k, v in r.items() if k != "wall_s"} for r in records]


def test_resume_returns_whole_history_and_finished_runs_compute_nothing(tmp_path):
  full = fs.run(make_sim(), 5, str(tmp_path / "full"), checkpoint_every=2, progress=None)
  fs.run(make_sim(), 3, str(tmp_path / "part"), checkpoint_every=2, progress=None)
  metrics = tmp_path / "part" / "metrics.jsonl"
  with open(metrics, "a", encoding="utf-8") as f:
    f.write('{"round": 3, "torn')  # A kill in the middle of a line.
  resumed = fs.run(make_sim(), 5, str(tmp_path / "part"), checkpoint_every=2, resume=True,
                   progress=None)
  assert strip(resumed) == strip(full)
  sim = make_sim()
  sim.step = None  # Resuming a finished run must not compute a round.
  again = fs.run(sim, 5, str(tmp_path / "part"), resume=True, progress=None)
  assert strip(again) == strip(full)
  with open(metrics, encoding="utf-8") as f:
    assert [json.loads(line)["round"] for line in f] == list(range(5))


def test_resume_refuses_other_settings_and_data(tmp_path):
  fs.run(make_sim(), 2, str(tmp_path), progress=None, settings={"lr": 0.1, "partition": "iid"})
  with pytest.raises(checkpoint.CheckpointError, match=r"lr: 0\.1 -> 0\.2"):
    fs.run(make_sim(), 4, str(tmp_path), resume=True, progress=None,
           settings={"lr": 0.2, "partition": "iid"})
  with pytest.raises(checkpoint.CheckpointError, match="data:"):
    fs.run(make_sim(ragged_dataset([20, 12, 9, 15, 30, 11], seed=5)), 4, str(tmp_path),
           resume=True, progress=None, settings={"lr": 0.1, "partition": "iid"})
  with pytest.raises(checkpoint.CheckpointError, match="seed: 0 -> 1"):
    fs.run(make_sim(seed=1), 4, str(tmp_path), resume=True, progress=None,
           settings={"lr": 0.1, "partition": "iid"})
  with pytest.raises(FileExistsError, match="overwrite"):
    fs.run(make_sim(), 2, str(tmp_path), progress=None)


def test_resume_without_checkpoint_says_it_starts_fresh(tmp_path, capsys):
  import sys as _sys  # pylint: disable=import-outside-toplevel
  recs = fs.run(make_sim(), 1, str(tmp_path / "new"), resume=True, progress=_sys.stdout)
  assert len(recs) == 1 and "no checkpoint" in capsys.readouterr().out


def test_crafted_checkpoint_cannot_run_code(tmp_path):
  """A pickle that would write a marker file when unpickled, in place of the checkpoint, with and
  without a valid header and checksum: resume refuses it and the code never runs."""
  import hashlib  # pylint: disable=import-outside-toplevel
  import pickle  # pylint: disable=import-outside-toplevel
  marker = tmp_path / "pwned"

  class Exploit:
    def __reduce__(self):
      return (open, (str(marker), "w"))

  payload = pickle.dumps(Exploit())
  run_dir = tmp_path / "run"
  fs.run(make_sim(), 2, str(run_dir), progress=None)
  path = run_dir / "checkpoint.msgpack"
  digest = hashlib.sha256(payload).hexdigest().encode()
  for blob, needle in ((payload, "not a fedjax_sel checkpoint"),
                       (checkpoint.MAGIC + digest + b"\n" + payload, "does not hold"),
                       (checkpoint.MAGIC + digest + b"\n" + payload[:-3], "truncated")):
    path.write_bytes(blob)
    with pytest.raises(checkpoint.CheckpointError, match=needle) as info:
      fs.run(make_sim(), 4, str(run_dir), resume=True, progress=None)
    assert str(path) in str(info.value)
    assert not marker.exists()


def test_checkpoint_of_another_structure_is_refused(tmp_path):
  path = str(tmp_path / "c.msgpack")
  checkpoint.save(path, {"w": jnp.ones(3)}, {})
  with pytest.raises(checkpoint.CheckpointError, match="another configuration"):
    checkpoint.load(path, {"w": jnp.ones(4)})
  with pytest.raises(checkpoint.CheckpointError, match="another configuration"):
    checkpoint.load(path, {"w": jnp.ones(3), "b": jnp.ones(1)})
  state, _ = checkpoint.load(path, {"w": jnp.zeros(3)})
  np.testing.assert_array_equal(state["w"], np.ones(3))


def test_nonfinite_guard_stops_naming_the_round(tmp_path):
  with pytest.raises(fs.runner.NonFiniteError, match="round 0: .*non-finite") as info:
    fs.run(make_sim(lr=3e38), 3, str(tmp_path), progress=None)
  assert "nonfinite='exclude'" in str(info.value)
  with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
    assert [json.loads(line)["round"] for line in f] == [0]  # The failing round is kept.


def test_nonfinite_exclude_mode_keeps_diverged_updates_out():
  """One client's features are so large (finite, so the data checks pass) that its local training
  overflows: its update is excluded and counted, and the global model is the mean of the others'
  (the same as a run where that client's weight is zero)."""
  data = ragged_dataset([20, 12, 9, 15])
  x = np.array(data.train.x)
  x[data.train.offsets[1]:data.train.offsets[1] + data.train.counts[1]] = 1e30
  bad = data._replace(train=data.train._replace(x=x))
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  sim = fs.Simulator(model, bad, lambda rate: optax.sgd(rate), fs.LocalHParams(batch_size=4),
                     fs.uniform_availability(4, 4), fs.selectors.all_selector(), fs.fedavg(), 4, 0,
                     nonfinite="exclude")
  state, metrics = sim.step(sim.init())
  assert int(metrics["nonfinite_clients"]) == 1 and bool(metrics["model_finite"])
  assert int(metrics["num_aggregated"]) == 3 and np.isfinite(float(metrics["local_train_loss"]))
  assert all(bool(jnp.isfinite(a).all()) for a in jax.tree.leaves(state.params))
  others = fs.Selector(init=lambda n, p: (), select=lambda s, key, inputs, mask: (
      jnp.array([True, False, True, True]), s))
  clean = fs.Simulator(model, data, lambda rate: optax.sgd(rate), fs.LocalHParams(batch_size=4),
                       fs.uniform_availability(4, 4), others, fs.fedavg(), 4, 0)
  want, _ = clean.step(clean.init())
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), state.params,
               want.params)
  stop = fs.Simulator(model, bad, lambda rate: optax.sgd(rate), fs.LocalHParams(batch_size=4),
                      fs.uniform_availability(4, 4), fs.selectors.all_selector(), fs.fedavg(), 4, 0)
  _, metrics = stop.step(stop.init())
  assert not bool(metrics["model_finite"])


def test_round_in_which_nobody_trained_shows_as_such():
  line = fs.runner.progress_line("x ", 0, 3, {"local_train_loss": 0.0, "num_selected": 2,
                                              "num_trained": 0, "wall_s": 1.0})
  assert "no client trained" in line and "train 0.0000" not in line
  recs = [{"round": 0, "num_trained": 0, "test_accuracy": 0.5, "test_loss": 1.0,
           "train_loss": 1.0, "wall_s": 1.0,
           "cumulative_cost": {"train_samples": 0, "uploads": 0}}]
  assert "| 0 | 0 | 1 | 1.0 |" in fs.summary_table([("r", recs)])


def test_power_of_choice_charges_only_its_candidates():
  from fedjax_sel.selectors import power_of_choice  # pylint: disable=import-outside-toplevel
  data = ragged_dataset([20, 12, 9, 15, 30, 11])
  sim = make_sim(data, selector=power_of_choice(2, d=3, variant="pow"))
  state, metrics = sim.step(sim.init())
  candidates = np.array(sim.selector.report(state.selector_state)["evaluated"])
  assert candidates.sum() == 3
  assert float(metrics["cost"]["client_eval_samples"]) == float(
      np.asarray(data.train.counts)[candidates].sum())
  assert float(metrics["cost"]["downloads"]) == 3


def run_filfl(out, *extra):
  return subprocess.Popen(
      [sys.executable, "-m", "experiments.filfl", "--rounds=4", "--seeds=0,1", "--num_clients=12",
       "--num_available=6", "--clients_per_round=2", "--filters=none,dgf", "--checkpoint_every=2",
       f"--out_dir={out}", *extra], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True)


def test_killed_multi_run_job_resumes_to_the_same_outputs(tmp_path):
  """SIGKILL a 4-run FilFL job (two batches of two seeds) midway through its second batch;
  resuming it with a changed --lr is refused naming the flag; resuming it with --plot gives the
  summary, CSV and every run's metrics of an uninterrupted job (wall times aside)."""
  whole = run_filfl(tmp_path / "whole")
  assert whole.wait(600) == 0, whole.stdout.read()
  job = run_filfl(tmp_path / "cut")  # Loads what the whole job compiled (persistent cache).
  third = tmp_path / "cut" / "dgf" / "seed0" / "metrics.jsonl"
  deadline = time.time() + 600
  while not (third.exists() and third.read_text(encoding="utf-8").count("\n") >= 2):
    assert time.time() < deadline and job.poll() is None, "the job ended before it was killed"
    time.sleep(0.05)
  job.send_signal(signal.SIGKILL)
  job.wait()
  changed = run_filfl(tmp_path / "cut", "--resume", "--lr=0.05")  # Refused, naming the flag.
  assert changed.wait(600) != 0 and "lr: 0.1 -> 0.05" in changed.stdout.read()
  resumed = run_filfl(tmp_path / "cut", "--resume", "--plot")
  out = resumed.stdout.read()
  assert resumed.wait(600) == 0, out
  assert "nothing to compute" in out  # The first batch was done.
  assert "resuming 2 runs" in out or "starting them fresh" in out  # The second was cut.
  for run in ("none/seed0", "none/seed1", "dgf/seed0", "dgf/seed1"):
    read = lambda root: strip([json.loads(line) for line in
                               (root / run / "metrics.jsonl").read_text(encoding="utf-8").split("\n")
                               if line])
    assert read(tmp_path / "cut") == read(tmp_path / "whole"), run
  drop_wall = lambda text: [line.rsplit("|", 2)[0] for line in text.splitlines()]
  assert drop_wall((tmp_path / "cut" / "summary.md").read_text(encoding="utf-8")) == drop_wall(
      (tmp_path / "whole" / "summary.md").read_text(encoding="utf-8"))
  assert (tmp_path / "cut" / "filtered_bad.csv").read_text(encoding="utf-8") == (
      tmp_path / "whole" / "filtered_bad.csv").read_text(encoding="utf-8")
  assert (tmp_path / "cut" / "filfl.png").exists()
