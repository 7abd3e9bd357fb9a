"""Bad inputs across the launchers, loaders and library API: each fails early with an error that
names the flag, file or argument, and no round runs. Plus resume, checkpoints and NaN guards."""

import io
import json
import os
import signal
import struct
import subprocess
import sys
import time
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjax_sel as fs
from fedjax_sel.data import sources
from fedjax_sel.engine.contracts import ContractError
from fedjax_sel.host import runner
from fedjax_sel.host import checkpoint
from fedjax_sel.parts.aggregators import coordinate_median
from fedjax_sel.parts.rules import fedsrc
from fedjax_sel.parts.selectors.baselines import all_selector, power_of_choice
from tests.bad_input_harness import run_cases
from tests.conftest import ragged_dataset
from tests.test_launchers import REPO
from tests.hang_guard import HANG_GUARD_S

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
  store.write_store(os.path.join(root, "store_offsets"), ragged_dataset([5, 6, 7]))
  offsets = np.load(os.path.join(root, "store_offsets", "train_offsets.npy"))
  offsets[1] += 1  # Same shape and dtype: only the values are wrong.
  np.save(os.path.join(root, "store_offsets", "train_offsets.npy"), offsets)
  with open(os.path.join(root, "a_file"), "w", encoding="utf-8") as f:
    f.write("not a folder")
  os.makedirs(os.path.join(root, "previous", "seed0"))
  with open(os.path.join(root, "previous", "seed0", "metrics.jsonl"), "w", encoding="utf-8") as f:
    f.write('{"round": 0}\n')
  build_bad_json_files(root)


def _json_with(blob: dict, path: str, value) -> dict:
  """A deep copy of `blob` with the field at dotted `path` set to `value`."""
  blob = json.loads(json.dumps(blob))
  *head, name = path.split(".")
  inner = blob
  for key in head:
    inner = inner[key]
  inner[name] = value
  return blob


def build_bad_json_files(root):
  """The JSON files the launchers read, each with one field of the wrong type or value: a
  replayed config.json, a job's job.json (experiments.compare), a benchmark scenarios file."""
  from experiments.launch import config  # pylint: disable=import-outside-toplevel
  job = config.to_dict(config.JobConfig())
  with open(os.path.join(REPO, "experiments", "bench_scenarios.json"), encoding="utf-8") as f:
    scenarios = json.load(f)
  run = {"launcher": "experiments.run", "label": "FedAvg s0", "method": "FedAvg", "seed": 0,
         "sweep": None, "folder": "seed0"}
  blobs = {"config_string.json": _json_with(job, "data.num_clients", "50"),
           "config_part.json": _json_with(job, "parts.selector", "poc"),
           "config_kind.json": _json_with(job, "parts.selecter", {"name": "poc"}),
           "scenarios_quick.json": _json_with(scenarios, "quick", "quick"),
           "scenarios_flag.json": _json_with(scenarios, "scenarios.diurnal", ["--rounds=2", 5]),
           "scenarios_target.json": _json_with(scenarios, "target", "0.8"),
           "job_seed/job.json": {"runs": [{**run, "seed": "0"}]},
           "job_runs/job.json": {"runs": {"0": run}}}
  for name, blob in blobs.items():
    os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
    with open(os.path.join(root, name), "w", encoding="utf-8") as f:
      json.dump(blob, f)


SMALL = ["--rounds=1", "--num_clients=10", "--num_available=5", "--clients_per_round=2"]
# (launcher, args, needle that the message must hold). `{tmp}` is the folder of bad files.
LAUNCHER_CASES = [
    ("run", ["--seeds", "0", "1", "2"], "unexpected arguments ['1', '2']"),
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
    ("run", ["--store_dir={tmp}/store_ok", "--num_clients=3", "--num_available=3",
             "--model=char_lstm"], "--model=char_lstm does not fit --store_dir="),
    ("run", ["--store=disk"], "--store"),
    ("run", ["--server_opt=adam", "--server_tau=0"], "--server_opt=adam"),
    ("run", ["--server_lr=nan"], "--server_lr"),
    ("run", ["--corrupt_kinds=shuffle,foo"], "--corrupt_kinds"),
    ("run", ["--deadline_s=5"], "--deadline_s=5.0 has no effect with --system_profile=none"),
    ("run", ["--system_profile={tmp}/nothing.csv"], "nothing.csv: no such file"),
    ("run", ["--system_profile=lognormal", "--speed_median=0"], "speed_median"),
    ("run", ["--system_profile=lognormal", "--bandwidth_sigma=nan"], "--bandwidth_sigma"),
    ("run", ["--availability=trace"], "--avail_trace"),
    ("run", ["--availability=trace", "--avail_trace={tmp}/nothing.csv"], "nothing.csv"),
    ("run", ["--availability=probability", "--avail_prob_range=0.9,0.1"], "--avail_prob_range"),
    ("run", ["--availability=diurnal", "--avail_capacity=1"], "--avail_capacity"),
    ("run", ["--server_opt=lamb"], "--server_opt"),
    ("run", ["--server_opt=momentum", "--server_momentum=2"], "server_momentum"),
    ("run", ["--store_dir={tmp}/store_offsets"], "client 1: offsets[1]"),
    ("run", ["--dataset=leaf", "--leaf_files={tmp}/leaf/few_users.json,{tmp}/leaf/few_users.json"],
     "given twice"),
    ("fedsrc", ["--methods=multi_krum", "--multi_krum_m=9"], "--multi_krum_m=9 cannot apply"),
    ("filfl", ["--filters=foo"], "--filters"),
    ("filfl", ["--gammas=nan"], "--gammas"),
    ("filfl", ["--gammas=2"], "--gammas"),
    ("filfl", ["--opt"], "--opt"),
    ("filfl", ["--selector=poc", "--poc_d=2"], "--poc_d"),
    ("filfl", ["--selector=poc", "--poc_d=40"], "--poc_d must be in 5..25"),
    ("run", ["--selector=poc", "--poc_d=9"], "--poc_d must be in 2..5"),
    ("fedalign", ["--participation=partial", "--others_per_round=40"],
     "--others_per_round=40 cannot apply"),
    ("filfl", ["--fedprox"], "--fedprox"),
    ("filfl", ["--filters=dgf", "--public_fraction=0"], "--public_fraction"),
    ("filfl", ["--corrupt_kinds=foo"], "--corrupt_kinds"),
    ("fedsrc", ["--corrupt_kinds=mislabel"], "--corrupt_kinds"),
    ("uacs", ["--corrupt_fraction=0.2"], "corrupt_fraction"),  # Not a flag of UACS-FL's.
    ("filfl", ["--filter_const=nan"], "--filter_const"),
    ("filfl", ["--preset=mnist"], "--preset"),
    ("fedalign", ["--preset=mnist"], "--preset"),
    ("filfl", ["--preset=femnist", "--leaf_files={tmp}/nothing/*.json"], "preprocess.sh"),
    ("fedalign", ["--eps0=nan"], "--eps0"),
    ("fedalign", ["--num_priority=0"], "priority"),
    ("fedsrc", ["--participation_target=nan"], "--participation_target"),
    ("fedsrc", ["--trim_beta=inf"], "--trim_beta"),
    ("fedsrc", ["--corrupt_fraction=1.0"], "--corrupt_fraction=1.0 corrupts all"),
    ("uacs", ["--explore_prob=2"], "--explore_prob"),
    ("uacs", ["--gap0=nan"], "--gap0"),
    # Every file a launcher reads is checked against its schema, naming the file and the field.
    ("run", ["--config={tmp}/config_string.json"],
     "config_string.json: data.num_clients must be an integer, got the string '50'"),
    ("run", ["--config={tmp}/config_part.json"],
     "config_part.json: parts.selector must be an object, got the string 'poc'"),
    ("run", ["--config={tmp}/config_kind.json"], "parts has unknown kinds ['selecter']"),
    ("bench", ["--scenarios_file={tmp}/scenarios_quick.json", "--quick"],
     "scenarios_quick.json: quick must be a list of strings, got the string 'quick'"),
    ("bench", ["--scenarios_file={tmp}/scenarios_flag.json"],
     "scenarios.diurnal[1] must be a string, got the number 5"),
    ("bench", ["--scenarios_file={tmp}/scenarios_target.json"],
     "target must be a number, got the string '0.8'"),
    ("compare", ["{tmp}/job_seed"], "job.json: runs[0].seed must be an integer, got the string"),
    ("compare", ["{tmp}/job_runs"], "job.json: runs must be a list of objects, got an object"),
    # A float flag where nan or infinity means nothing is refused as it is parsed.
    ("bench", ["--job_timeout_s=nan"], "--job_timeout_s=nan: must be a finite number above 0"),
    ("compare", ["--target=inf", "{tmp}/job_seed"], "--target=inf: must be a finite number"),
]
NO_OUT_DIR = ("compare",)  # Tools without --out_dir (they write no run).


def _small(launcher, args):
  """The small job of experiments.run (its --num_available is the uniform availability's)."""
  if launcher != "run":
    return []
  other = any(a.startswith("--availability=") for a in args)
  return [a for a in SMALL if not (other and a.startswith("--num_available"))]


@pytest.fixture(scope="module")
def launcher_results(tmp_path_factory):
  """Runs every launcher case, one process per launcher, from a folder without data/."""
  root = str(tmp_path_factory.mktemp("bad"))
  build_bad_files(root)
  results = {}
  for launcher in sorted({c[0] for c in LAUNCHER_CASES}):
    cases = [_small(launcher, args) + [a.replace("{tmp}", root) for a in args] +
             ([f"--out_dir={root}/out_{i}"] if not any(a.startswith("--out_dir") for a in args)
              and launcher not in NO_OUT_DIR else [])
             for i, (name, args, _) in enumerate(LAUNCHER_CASES) if name == launcher]
    lines = run_cases(launcher, cases, root, root)
    results[launcher] = lines
  return results


@pytest.mark.xdist_group("bad_launcher_input")  # One worker runs the fixture's processes, once.
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
                availability=avail, selector=fs.random_selector(), aggregator=fs.fedavg(),
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
                                                                             fs.random_selector()),
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
                       (checkpoint.MAGIC + digest + b"\n" + payload[:-3], "truncated"),
                       (b"fedjax_sel checkpoint v1\n" + digest + b"\n" + payload,
                        "version 1 checkpoint; this fedjax_sel reads version "
                        f"{checkpoint.VERSION}: rerun")):
    path.write_bytes(blob)
    with pytest.raises(checkpoint.CheckpointError, match=needle) as info:
      fs.run(make_sim(), 4, str(run_dir), resume=True, progress=None)
    assert str(path) in str(info.value)
    assert not marker.exists()


def test_checkpoint_of_another_structure_is_refused(tmp_path):
  path = str(tmp_path / "c.msgpack")
  checkpoint.save(path, {"w": jnp.ones(3)}, {})
  advice = "another configuration, or by another version .* from its start with --overwrite"
  with pytest.raises(checkpoint.CheckpointError, match=advice):
    checkpoint.load(path, {"w": jnp.ones(4)})
  with pytest.raises(checkpoint.CheckpointError, match=advice):
    checkpoint.load(path, {"w": jnp.ones(3), "b": jnp.ones(1)})
  state, _ = checkpoint.load(path, {"w": jnp.zeros(3)})
  np.testing.assert_array_equal(state["w"], np.ones(3))


def test_a_setting_added_after_a_run_started_matches_only_at_its_default(tmp_path):
  """A checkpoint written before a setting existed resumes when the setting is at its default
  (the fingerprint's `defaults`), and is refused, naming it, at any other value."""
  path = str(tmp_path / "c.msgpack")
  checkpoint.save(path, {"w": jnp.ones(3)}, {"seed": 0, "lr": 0.1})
  now = {"seed": 0, "lr": 0.1, "new": 2, checkpoint.DEFAULTS: {"new": 2, "lr": 0.5}}
  checkpoint.load(path, {"w": jnp.zeros(3)}, now)
  with pytest.raises(checkpoint.CheckpointError, match="new: '\\(absent\\)' -> 3"):
    checkpoint.load(path, {"w": jnp.zeros(3)}, {**now, "new": 3})
  with pytest.raises(checkpoint.CheckpointError, match="new"):  # No default known: refused.
    checkpoint.load(path, {"w": jnp.zeros(3)}, {"seed": 0, "lr": 0.1, "new": 2})
  with pytest.raises(checkpoint.CheckpointError, match="lr: 0.1 -> 0.5"):  # Both sides hold it.
    checkpoint.load(path, {"w": jnp.zeros(3)}, {**now, "lr": 0.5})


def test_nonfinite_guard_stops_naming_the_round(tmp_path):
  with pytest.raises(runner.NonFiniteError, match="round 0: .*non-finite") as info:
    fs.run(make_sim(lr=3e38), 3, str(tmp_path), progress=None)
  assert "nonfinite='exclude'" in str(info.value)
  with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
    assert [json.loads(line)["round"] for line in f] == [0]  # The failing round is kept.


def test_nonfinite_guard_blames_the_server_step_when_the_clients_stayed_finite(tmp_path):
  """A server optimizer that overflows while every client trains to a finite loss: the message
  names the server's step (its learning rate, optimizer or aggregator), not the clients' rate."""
  sim = make_sim(server_optimizer=fs.server_sgd(lr=3e38))
  with pytest.raises(runner.NonFiniteError, match="server's step diverged: lower the server "
                     "learning rate") as info:
    fs.run(sim, 3, str(tmp_path), progress=None)
  assert "--lr)" not in str(info.value)


def test_nonfinite_guard_blames_the_clients_steps_without_a_server_optimizer(tmp_path):
  """One local step at a huge learning rate: the clients' losses (taken before the step) stay
  finite, the model they reach does not evaluate. Without a server optimizer there is no server
  step to blame: the message names the client learning rate, not --server_lr."""
  sim = _resumable(local=fs.LocalHParams(batch_size=4, num_steps=1),
                   lr_schedule=fs.constant_lr(3e38))
  with pytest.raises(runner.NonFiniteError, match="their last local steps diverged: lower the "
                     "client learning rate") as info:
    fs.run(sim, 3, str(tmp_path), progress=None)
  assert "server_lr" not in str(info.value)


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
                     fs.uniform_availability(4, 4), all_selector(), fs.fedavg(), 4, 0,
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
                      fs.uniform_availability(4, 4), all_selector(), fs.fedavg(), 4, 0)
  _, metrics = stop.step(stop.init())
  assert not bool(metrics["model_finite"])


def test_round_in_which_nobody_trained_shows_as_such():
  line = runner.progress_line("x ", 0, 3, {"local_train_loss": 0.0, "num_selected": 2,
                                              "num_trained": 0, "wall_s": 1.0})
  assert "no client trained" in line and "train 0.0000" not in line
  recs = [{"round": 0, "num_trained": 0, "test_accuracy": 0.5, "test_loss": 1.0,
           "train_loss": 1.0, "wall_s": 1.0,
           "cumulative_cost": {"train_samples": 0, "uploads": 0}}]
  assert "| 0 | 0 | 1 | 0 | 1.0 |" in fs.summary_table([("r", recs)])


def test_a_trimmed_mean_that_trims_nobody_warns():
  from fedjax_sel import registry  # pylint: disable=import-outside-toplevel
  from fedjax_sel.parts.aggregators import TrimmedMeanSettings  # pylint: disable=import-outside-toplevel
  context = registry.BuildContext(k=10, rounds=1, seed=0, num_clients=20)
  with pytest.warns(UserWarning, match=r"beta=0.05 \(--trim_beta\) trims no client of K = 10"):
    TrimmedMeanSettings(beta=0.05).check(context)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    TrimmedMeanSettings(beta=0.1).check(context)  # Trims one a side: no warning.


def test_a_model_too_large_for_memory_is_refused_from_its_shapes():
  """Refused from the shapes, before anything is allocated (it used to hang), with the
  estimate."""
  from fedjax_sel.engine.checks import check_model_fits  # pylint: disable=import-outside-toplevel
  model = fs.build_model("mlp", (8, 8, 1), 10, hidden=(1000, 1000))
  assert check_model_fits(model, memory=2**30) == 4 * (64 * 1000 + 1000 + 1000 * 1000 + 1000
                                                       + 1000 * 10 + 10)
  with pytest.raises(ValueError, match=r"0.0 GiB of parameters; a round holds at least three "
                     r"copies .* more than the device's 0.0 GiB"):
    check_model_fits(model, memory=2**20)


def test_a_deadline_every_client_misses_shows_nothing_aggregated(tmp_path):
  """Trained clients all past the deadline: the progress line and the summary say that nothing
  was aggregated (the round is not reported as a normal one)."""
  data = fs.build_dataset(fs.DatasetSpec("digits", num_clients=10), seed=0)
  sim = fs.Simulator(fs.build_model("logreg", data.feature_shape, data.num_classes), data,
                     lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=10),
                     fs.uniform_availability(10, 10), fs.random_selector(), fs.fedavg(), 3,
                     seed=0, system_profile=fs.lognormal_profiles(10), deadline_s=1e-6)
  out = io.StringIO()
  recs = fs.run(sim, 2, progress=out)
  lines = [line for line in out.getvalue().splitlines() if "[" in line]
  assert all(r["num_trained"] == 3 and r["num_aggregated"] == 0 for r in recs)
  assert all("nothing aggregated (3 past the deadline)" in line for line in lines)
  assert "| 0 | 2 | " in fs.summary_table([("r", recs)])


def test_power_of_choice_charges_only_its_candidates():
  from fedjax_sel.parts.selectors.baselines import power_of_choice  # pylint: disable=import-outside-toplevel
  data = ragged_dataset([20, 12, 9, 15, 30, 11])
  sim = make_sim(data, selector=power_of_choice(d=3, variant="pow"))
  state, metrics = sim.step(sim.init())
  candidates = np.array(sim.config.selector.report(state.selector_state)["evaluated"])
  assert candidates.sum() == 3
  assert float(metrics["cost"]["client_eval_samples"]) == float(
      np.asarray(data.train.counts)[candidates].sum())
  assert float(metrics["cost"]["downloads"]) == 3


def run_filfl(out, *extra, workers=2):
  return subprocess.Popen(
      [sys.executable, "-m", "experiments.filfl", "--rounds=4", "--seeds=0,1", "--num_clients=12",
       "--num_available=6", "--clients_per_round=2", "--filters=none,dgf", "--checkpoint_every=2",
       f"--concurrent_batches={workers}", f"--out_dir={out}", *extra], cwd=REPO,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("workers", [2, pytest.param(1, marks=pytest.mark.slow)])
def test_killed_multi_run_job_resumes_to_the_same_outputs(tmp_path, workers):
  """SIGKILL a 4-run FilFL job (two batches of two seeds: FedAvg's and DGF's, at once with
  `workers` 2, one after another with 1) midway through DGF's batch; resuming it with a changed
  --lr is refused naming the flag; resuming it with --plot gives the summary, CSV and every run's
  metrics of an uninterrupted job (wall times aside)."""
  whole = run_filfl(tmp_path / "whole", workers=workers)
  assert whole.wait(600) == 0, whole.stdout.read()
  # Loads what the whole job compiled (persistent cache).
  job = run_filfl(tmp_path / "cut", workers=workers)
  third = tmp_path / "cut" / "dgf" / "seed0" / "metrics.jsonl"
  deadline = time.time() + 600
  while not (third.exists() and third.read_text(encoding="utf-8").count("\n") >= 2):
    assert time.time() < deadline and job.poll() is None, "the job ended before it was killed"
    time.sleep(0.05)
  job.send_signal(signal.SIGKILL)
  job.wait()
  changed = run_filfl(tmp_path / "cut", "--resume", "--lr=0.05", workers=workers)  # Refused.
  assert changed.wait(600) != 0 and "lr: 0.1 -> 0.05" in changed.stdout.read()
  resumed = run_filfl(tmp_path / "cut", "--resume", "--plot", workers=workers)
  out = resumed.stdout.read()
  assert resumed.wait(600) == 0, out
  if workers == 1:
    assert "nothing to compute" in out  # The first batch was done.
  assert "resuming 2 runs" in out or "starting them fresh" in out  # The second was cut.
  for run in ("none/seed0", "none/seed1", "dgf/seed0", "dgf/seed1"):
    read = lambda root: strip([json.loads(line) for line in
                               (root / run / "metrics.jsonl").read_text(encoding="utf-8")
                               .split("\n")
                               if line])
    assert read(tmp_path / "cut") == read(tmp_path / "whole"), run
  drop_wall = lambda text: [line.rsplit("|", 2)[0] for line in text.splitlines()]
  assert drop_wall((tmp_path / "cut" / "summary.md").read_text(encoding="utf-8")) == drop_wall(
      (tmp_path / "whole" / "summary.md").read_text(encoding="utf-8"))
  assert (tmp_path / "cut" / "filtered_bad.csv").read_text(encoding="utf-8") == (
      tmp_path / "whole" / "filtered_bad.csv").read_text(encoding="utf-8")
  assert (tmp_path / "cut" / "filfl.png").exists()


# --- Reliability II: data that do not add up, part contracts, API, LEAF, locks, full disks -----

def _store(root, name, edit=None, meta=None):
  """A store of a small dataset under `root/name`, with `edit(arrays)` applied to its arrays (same
  shapes and dtypes) and `meta(dict)` to its store.json."""
  from fedjax_sel.data import store  # pylint: disable=import-outside-toplevel
  folder = os.path.join(root, name)
  store.write_store(folder, ragged_dataset([9, 7, 11, 5]))
  if edit is not None:
    arrays = {f[:-4]: np.load(os.path.join(folder, f)) for f in os.listdir(folder)
              if f.endswith(".npy")}
    edit(arrays)
    for key, value in arrays.items():
      np.save(os.path.join(folder, key + ".npy"), value)
  if meta is not None:
    path = os.path.join(folder, "store.json")
    with open(path, encoding="utf-8") as f:
      blob = json.load(f)
    meta(blob)
    with open(path, "w", encoding="utf-8") as f:
      json.dump(blob, f)
  return folder


def _set(key, index, value):
  def edit(arrays):
    arrays[key][index] = value
  return edit


def _shift_counts(arrays):  # Counts and offsets edited together: only the row owners disagree.
  arrays["train_counts"][0] += 1
  arrays["train_counts"][1] -= 1
  arrays["train_offsets"][1] += 1


STORE_CASES = [  # (name, edit, meta, error, needle)
    ("offset edited", _set("train_offsets", 2, 3), None, "DataError", r"client 2: offsets\[2\]"),
    ("count edited", _set("train_counts", 1, 2), None, "DataError", r"client 2: offsets\[2\]"),
    ("negative count", _set("test_counts", 0, -1), None, "DataError", "counts.0. = -1"),
    ("counts and offsets edited together", _shift_counts, None, "DataError", "client_id"),
    ("client_id edited", _set("train_client_id", 3, 2), None, "DataError", "row 3"),
    ("label beyond the classes", _set("train_y", 4, 9), None, "DataError", "label 9"),
    ("negative label", _set("val_y", 0, -1) if False else _set("test_y", 1, -1), None,
     "DataError", "label -1"),
    ("label swapped within the classes", _set("train_y", 0, 3), None, "DataError",
     "label_hist.npy: client 0"),
    ("label_hist edited", _set("label_hist", (1, 0), 40), None, "DataError", "label_hist"),
    ("store.json num_classes", None, lambda m: m.update(num_classes=2), "DataError",
     "outside the 2 classes"),
    ("store.json num_clients", None, lambda m: m.update(num_clients=5), "DataError",
     "holds 4 clients"),
    ("store.json feature_shape", None, lambda m: m.update(feature_shape=[7]), "ValueError",
     "records \\[7\\]"),
    ("store.json misses an array", None, lambda m: m["arrays"].pop("train_y.npy"), "ValueError",
     "lists no train_y.npy"),
    ("store.json unreadable", None, lambda m: m.update(arrays=3), "ValueError",
     "not a readable store description"),
]


@pytest.mark.parametrize("name,edit,meta,error,needle", STORE_CASES,
                         ids=[c[0] for c in STORE_CASES])
def test_store_that_does_not_add_up_is_refused_at_open(tmp_path, name, edit, meta, error, needle):
  from fedjax_sel.data import store  # pylint: disable=import-outside-toplevel
  folder = _store(str(tmp_path), "s", edit, meta)
  with pytest.raises(ValueError, match=needle) as info:
    store.open_store(folder)
  assert type(info.value).__name__ == error, (name, info.value)
  assert folder in str(info.value)


def test_store_with_a_nan_feature_is_refused_before_its_rows_train(tmp_path):
  """Features, the bulk of a store, are checked as rows are read: the host placement refuses the
  round before training, naming the split and the client; nothing of a round was written."""
  from fedjax_sel.data import store  # pylint: disable=import-outside-toplevel
  folder = _store(str(tmp_path), "s", _set("train_x", (12, 2), np.nan))
  data = store.open_store(folder)  # Opens: the integer arrays add up.
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  for where in ("host", "device"):
    def build(where=where):
      return fs.Simulator(model, data, lambda rate: optax.sgd(rate), fs.LocalHParams(batch_size=4),
                          fs.uniform_availability(4, 4), all_selector(),
                          fs.fedavg(), 4, 0, store=where)
    out = tmp_path / where
    with pytest.raises(fs.data.integrity.DataError, match="client 2: row 12 has a non-finite"):
      fs.run(build(), 2, str(out), progress=None)
    assert not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text()


def _edited(**changes):
  """The make_sim dataset with its training pool's fields replaced (the API's own pools)."""
  data = ragged_dataset([20, 12, 9, 15, 30, 11])
  train = data.train
  fields = {k: np.array(getattr(train, k)) for k in train._fields}
  for key, (index, value) in changes.items():
    fields[key][index] = value
  return data._replace(train=train._replace(**fields))


def _sim_of(data, **kw):
  return lambda: make_sim(data, **kw)


def _model(**kw):
  data = ragged_dataset([20, 12, 9, 15, 30, 11])
  model = fs.build_model(kw.pop("name", "logreg"), kw.pop("shape", data.feature_shape),
                         kw.pop("classes", data.num_classes))
  return lambda: fs.Simulator(model, data, lambda rate: optax.sgd(rate),
                              fs.LocalHParams(batch_size=4), fs.uniform_availability(6, 4),
                              fs.random_selector(), fs.fedavg(), 2, 0, **kw)


def _wrong_init_params():
  data = ragged_dataset([20, 12, 9, 15, 30, 11])
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  params = jax.tree.map(lambda a: jnp.zeros((a.shape[0] + 1, *a.shape[1:])),
                        model.init(jax.random.PRNGKey(0)))
  return _model(init_params=params)


API_II_CASES = [  # (name, call, error, needle): the library checks what the launchers check.
    ("pool offset edited", _sim_of(_edited(offsets=(3, 40))), ValueError,
     r"data.train: client 3: offsets\[3\] = 40"),
    ("pool count edited", _sim_of(_edited(counts=(0, 21))), ValueError,
     r"data.train: client 1: offsets\[1\]"),
    ("pool label -1", _sim_of(_edited(y=(5, -1))), ValueError, "data.train: client 0: row 5 has "
     "label -1"),
    ("pool label beyond the classes", _sim_of(_edited(y=(30, 4))), ValueError, "label 4, outside"),
    ("pool NaN feature", _sim_of(_edited(x=((25, 0), np.nan))), ValueError, "non-finite feature"),
    ("pool infinite feature", _sim_of(_edited(x=((2, 3), np.inf))), ValueError, "non-finite"),
    ("pool client_id edited", _sim_of(_edited(client_id=(0, 1))), ValueError, "client_id"),
    ("negative learning rate", _sim_of(None, lr=-0.1), ValueError, "gradient ascent"),
    ("NaN learning rate", _sim_of(None, lr=float("nan")), ValueError, "lr_schedule"),
    ("schedule negative at round 0", _model(lr_schedule=lambda t: -0.1 + 0.0 * t), ValueError,
     "lr_schedule"),
    ("eval_mask selects nobody", _model(eval_mask=np.zeros(6, bool)), ValueError,
     "eval_mask selects no client"),
    ("model of other classes", _model(classes=7), ValueError, "predicts 7 classes, the dataset "
                                                              "has 4"),
    ("model of another input shape", _model(name="mlp", shape=(3,)), ValueError,
     "cannot take the dataset's inputs"),
    ("init_params of other shapes", _wrong_init_params(), ValueError, "init_params"),
]


@pytest.mark.parametrize("name,call,error,needle", API_II_CASES, ids=[c[0] for c in API_II_CASES])
def test_library_refuses_what_the_launchers_refuse(name, call, error, needle):
  del name
  with pytest.raises(error, match=needle):
    call()


def _selector(fn, spec=None):
  return fs.Selector(init=lambda n, p: (), select=lambda s, key, inputs, mask: (fn(mask), s),
                     spec=spec or {"name": "broken"})


def _rule(fn):
  return fs.Participation(init=lambda n, params: (),
                          apply=lambda s, key, inputs, chosen: (*fn(chosen), s),
                          spec={"name": "broken_rule"})


def _everyone_but_first(mask):
  return jnp.ones_like(mask).at[0].set(False) | mask


def _top(count):
  return lambda mask: jnp.zeros_like(mask).at[jnp.nonzero(mask, size=count)[0]].set(True)


CONTRACT_CASES = [  # (name, Simulator keyword arguments, error needle)
    ("selector chooses more than K", {"selector": _selector(_top(3))}, "chose more than K"),
    ("selector chooses unavailable clients", {"selector": _selector(lambda m: jnp.ones_like(m))},
     "outside the available, filtered-in set"),
    ("selector returns an int mask", {"selector": _selector(lambda m: m.astype(jnp.int32))},
     "dtype int32"),
    ("selector returns a short mask", {"selector": _selector(lambda m: m[:3])},
     r"shape \(3,\)"),
    ("rule trains an unselected client", {"participation": _rule(lambda c: (c | ~c, c))},
     "trained or aggregated clients that were not selected"),
    ("rule aggregates an unselected client", {"participation": _rule(lambda c: (c, ~c))},
     "not selected"),
    ("rule returns a float mask", {"participation": _rule(lambda c: (c.astype(float), c))},
     "dtype float"),
]


@pytest.mark.parametrize("name,kw,needle", CONTRACT_CASES, ids=[c[0] for c in CONTRACT_CASES])
def test_part_breaking_its_contract_stops_the_run_naming_it(tmp_path, name, kw, needle):
  """The round refuses a broken mask: the run stops in round 0 naming the part, and no round's
  record or checkpoint is written."""
  del name
  with pytest.raises(ContractError, match=needle) as info:
    fs.run(make_sim(**kw), 2, str(tmp_path), progress=None)
  assert "broken" in str(info.value)
  assert not (tmp_path / "checkpoint.msgpack").exists()
  metrics = tmp_path / "metrics.jsonl"
  assert not metrics.exists() or not metrics.read_text(encoding="utf-8")


def test_an_error_inside_a_users_part_names_the_part():
  """A shape error raised by JAX while a user's selector is traced carries a note naming the
  selector and its function (and a structurally equal part still shares one program)."""
  def select(state, key, inputs, mask):
    scores = inputs.num_examples @ jnp.ones((3,))  # [N] @ [3]: a shape error.
    return mask & (scores > 0), state
  bad = fs.Selector(init=lambda n, params: (), select=select, spec={"name": "my_scores"})
  sim = make_sim(selector=bad)
  with pytest.raises(TypeError) as info:
    sim.step(sim.init())
  assert "raised by the selector 'my_scores' in its select" in info.value.__notes__
  assert make_sim(seed=1).placement.keyed.key == make_sim(seed=2).placement.keyed.key


def test_filter_keeping_unavailable_clients_stops_the_run():
  data = ragged_dataset([20, 12, 9, 15, 30, 11])
  keep_all = fs.Filter(init=lambda n, params: (), apply=lambda s, key, inputs, mask, local: (
      jnp.ones_like(mask), s, {}), spec={"name": "keeps_everyone"})
  sim = make_sim(data, filter=keep_all)
  with pytest.raises(ContractError, match="round 0: the filter 'keeps_everyone' kept "
                     "clients that are not available"):
    sim.step(sim.init())


def test_batched_runs_name_the_run_that_broke_a_contract():
  data = ragged_dataset([20, 12, 9, 15, 30, 11])
  bad = _selector(_top(3), {"name": "three"})
  batch = fs.RunBatch([make_sim(data, seed=s, selector=bad).spec for s in (0, 1)])
  with pytest.raises(ContractError, match="round 0, run 0: the selector 'three'"):
    batch.step(batch.init())


RESUME_CASES = [  # (name, keyword arguments of the resumed run, needle of the refusal)
    ("aggregator changed", {"aggregator": coordinate_median()},
     "parts.aggregator.name: 'fedavg' -> 'median'"),
    ("aggregator setting changed", {"aggregator": fs.fedavg("uniform")},
     "parts.aggregator.weighting: 'examples' -> 'uniform'"),
    ("selector changed", {"selector": power_of_choice(4)}, "parts.selector.name: .* -> 'poc'"),
    ("clients per round changed", {"clients_per_round": 3}, "clients_per_round: 2 -> 3"),
    ("schedule changed", {"lr_schedule": fs.step_decay_lr(0.1, 0.5, 2)}, "lr_schedule"),
    ("local steps changed", {"local": fs.LocalHParams(batch_size=4, num_steps=3)}, "local"),
]


def _resumable(**kw):
  data = ragged_dataset([20, 12, 9, 15, 30, 11])
  args = dict(model=fs.build_model("logreg", data.feature_shape, data.num_classes), data=data,
              optimizer=lambda rate: optax.sgd(rate), local=fs.LocalHParams(batch_size=4),
              availability=fs.uniform_availability(6, 4), selector=fs.random_selector(),
              aggregator=fs.fedavg(), clients_per_round=2, seed=0,
              lr_schedule=fs.constant_lr(0.1))
  args.update(kw)
  return fs.Simulator(**args)


@pytest.mark.parametrize("name,kw,needle", RESUME_CASES, ids=[c[0] for c in RESUME_CASES])
def test_api_resume_with_a_changed_part_is_refused_naming_it(tmp_path, name, kw, needle):
  del name
  fs.run(_resumable(), 2, str(tmp_path), progress=None)
  before = (tmp_path / "metrics.jsonl").read_text(encoding="utf-8")
  with pytest.raises(checkpoint.CheckpointError, match=needle):
    fs.run(_resumable(**kw), 4, str(tmp_path), resume=True, progress=None)
  assert (tmp_path / "metrics.jsonl").read_text(encoding="utf-8") == before  # Nothing lost.
  fs.run(_resumable(), 3, str(tmp_path), resume=True, progress=None)  # The same setup resumes.


def test_a_batchs_extras_read_their_own_runs_state():
  # Each run's extra sees its run's slice of a field it reads (`runner.RunView`), read when it
  # reads it: here the round index and the global model after the round.
  batch = fs.RunBatch([make_sim(seed=s).spec for s in (0, 1)])
  seen = [[], []]

  def extra(i):
    def read(state, record):
      seen[i].append((int(state.round), jax.tree.map(np.asarray, state.params)))
      return {"extra_round": record["round"]}
    return read

  records = fs.run_batch(batch, 2, progress=None, extras=[extra(0), extra(1)])
  assert [r["extra_round"] for r in records[0]] == [0, 1]
  states = batch.init()
  for t in range(2):
    states, _ = batch.step(states)
    for i in (0, 1):
      assert seen[i][t][0] == t + 1
      chex.assert_trees_all_equal(seen[i][t][1], jax.tree.map(lambda a: np.asarray(a[i]),
                                                              states.params))


def test_fingerprint_draws_equal_the_schedule_and_availability_computed_op_by_op():
  # The fingerprint computes its learning rates and availability draws as one program; a run
  # fingerprinted before (each operation run eagerly) must still resume, so the digests agree.
  sim = _resumable(lr_schedule=fs.step_decay_lr(0.05, 0.998, 10), seed=7,
                   availability=fs.probability_availability(np.linspace(0.2, 0.9, 6)))
  spec, config = sim.spec, sim.spec.config
  with jax.disable_jit():
    rounds = jnp.arange(runner.LR_HORIZON, dtype=jnp.int32)
    lrs = [spec.run_values.lr * config.lr_factor(t) for t in rounds[:50]]
    avail = [config.availability.sample(spec.run_values.seed, t)
             for t in rounds[:runner.AVAILABILITY_HORIZON]]
    all_lrs = spec.run_values.lr * jax.vmap(config.lr_factor)(rounds)
  np.testing.assert_array_equal(np.asarray(all_lrs[:50]), np.stack(lrs))
  got = runner.run_fingerprint(spec)
  assert got["lr_schedule"] == runner._digest(all_lrs)
  assert got["availability_draws"] == runner._digest(np.stack(avail))


def test_a_users_part_without_a_spec_is_fingerprinted_by_name_with_a_warning(tmp_path):
  mine = fs.Selector(init=lambda n, p: (), select=lambda s, key, inputs, mask: (
      fs.top_k_mask(jnp.arange(mask.shape[0], dtype=jnp.float32), mask, 2), s))
  with pytest.warns(UserWarning, match="settings are not covered"):
    fs.run(make_sim(selector=mine), 1, str(tmp_path), progress=None)
  with pytest.raises(checkpoint.CheckpointError, match="selector"):
    fs.run(make_sim(), 2, str(tmp_path), resume=True, progress=None)


def _leaf(root, name, blob):
  path = os.path.join(root, name + ".json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump(blob, f)
  return path


LEAF_CASES = [  # (name, files: [(file name, blob)], needle)
    ("fractional label", [("frac", {**femnist_users(1), "user_data": {
        "u0": {"x": [FEMNIST_ROW] * 2, "y": [1.5, 2]}}})], "fractional label"),
    ("user listed twice", [("twice", {"users": ["u0", "u0"], "num_samples": [2, 2],
                                      "user_data": femnist_users(1)["user_data"]})],
     "listed twice"),
    ("user in two files", [("a", femnist_users(2)), ("b", femnist_users(3))], "also in"),
    ("NaN pixel", [("nan", {**femnist_users(1), "user_data": {
        "u0": {"x": [[float("nan")] * 784] * 2, "y": [1, 2]}}})], "non-finite"),
    ("Shakespeare label of two characters", [("text", {
        "users": ["s"], "num_samples": [1], "user_data": {"s": {"x": ["a" * 80], "y": ["ab"]}}})],
     "single characters"),
]


@pytest.mark.parametrize("name,files,needle", LEAF_CASES, ids=[c[0] for c in LEAF_CASES])
def test_leaf_inputs_are_read_strictly(tmp_path, name, files, needle):
  del name
  paths = [_leaf(str(tmp_path), file_name, blob) for file_name, blob in files]
  with pytest.raises(ValueError, match=needle) as info:
    sources.load_leaf_json(paths)
  assert any(p in str(info.value) for p in paths)


def test_the_same_leaf_file_given_twice_is_refused(tmp_path):
  path = _leaf(str(tmp_path), "users", femnist_users(3))
  with pytest.raises(ValueError, match="given twice"):
    sources.leaf_paths([path, str(tmp_path / "*.json")])


def _job(out, *extra):
  return subprocess.Popen(
      [sys.executable, "-m", "experiments.run", "--num_clients=10", "--num_available=5",
       "--clients_per_round=2", "--seeds=0", f"--out_dir={out}", *extra], cwd=REPO,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_second_job_on_one_out_dir_is_refused_while_the_first_runs(tmp_path):
  first = _job(tmp_path, "--rounds=100000", "--eval_every=1000", "--checkpoint_every=1000")
  metrics = tmp_path / "seed0" / "metrics.jsonl"
  deadline = time.time() + 300
  while not (metrics.exists() and metrics.read_text(encoding="utf-8").count("\n") >= 1):
    assert time.time() < deadline and first.poll() is None, first.stdout.read()
    time.sleep(0.05)
  second = _job(tmp_path, "--rounds=2", "--overwrite")
  out = second.stdout.read()
  first.send_signal(signal.SIGKILL)
  first.wait()
  assert second.wait(300) == 1 and "is in use by another job" in out, out
  assert f"process {first.pid}" in out
  from fedjax_sel.host import folder_lock  # pylint: disable=import-outside-toplevel
  folder_lock.hold(str(tmp_path))  # The kernel dropped the killed job's lock.
  folder_lock.release(str(tmp_path))


RESUME_FLAGS = (("--num_clients", "12"), ("--hidden", "16"), ("--model", "logreg"),
                ("--dataset", "synth"), ("--selector", "poc"), ("--aggregator", "median"))


def test_resume_after_a_flag_changed_names_the_flag(tmp_path):
  """Flags that change the state's shapes or the parts' specs too: the refusal names the flag
  and its old and new values, not an array nor the two specs."""
  base = ["--num_clients=10", "--num_available=5", "--clients_per_round=2", "--seeds=0",
          f"--out_dir={tmp_path}/job"]
  cases = [base + ["--rounds=2"]] + [base + ["--rounds=3", "--resume", f"{flag}={value}"]
                                      for flag, value in RESUME_FLAGS]
  first, *resumed = run_cases("run", cases, str(tmp_path), str(tmp_path))
  assert first["kind"] == "none" and first["ran"], first
  for (flag, _), result in zip(RESUME_FLAGS, resumed):
    assert result["kind"] == "SystemExit" and f"{flag}:" in result["message"], result
    assert "--resume refused" in result["message"] and "array" not in result["message"]
    assert "{" not in result["message"] and "the method's parts" not in result["message"], result


def _enospc(*_):
  import errno  # pylint: disable=import-outside-toplevel
  raise OSError(errno.ENOSPC, "No space left on device")


def test_full_disk_on_a_checkpoint_names_it_and_keeps_finished_rounds(tmp_path, monkeypatch):
  """An injected ENOSPC at the checkpoint's fsync: one error naming the file, no temporary file
  left, and the rounds finished before it resume."""
  real_fsync, calls = os.fsync, []

  def fsync(fd):  # The first checkpoint (and its folder) is written; the second finds no space.
    calls.append(fd)
    return real_fsync(fd) if len(calls) <= 2 else _enospc()

  monkeypatch.setattr(os, "fsync", fsync)
  with pytest.raises(checkpoint.WriteError, match="cannot write .*checkpoint.msgpack: No space"):
    fs.run(make_sim(), 4, str(tmp_path), checkpoint_every=2, progress=None)
  monkeypatch.undo()
  assert not list(tmp_path.glob("*.tmp"))
  resumed = fs.run(make_sim(), 4, str(tmp_path), checkpoint_every=2, resume=True, progress=None)
  assert [r["round"] for r in resumed] == [0, 1, 2, 3]


def test_full_disk_on_the_metrics_names_them(tmp_path, monkeypatch):
  class FullFile:
    def __init__(self, *_, **__):
      pass

    def write(self, _):
      _enospc()

    def close(self):
      _enospc()

  real_open = open
  monkeypatch.setattr("builtins.open", lambda path, mode="r", *a, **k: FullFile() if str(
      path).endswith("metrics.jsonl") and "a" in mode else real_open(path, mode, *a, **k))
  with pytest.raises(checkpoint.WriteError, match="metrics.jsonl: No space left .* rounds before "
                     "round 0 are kept"):
    fs.run(make_sim(), 2, str(tmp_path), progress=None)


def test_full_tmpfs_ends_the_launcher_in_one_line(tmp_path):
  """On a real 300 KB filesystem (a tmpfs; needs root to mount): the job runs until the disk is
  full, then prints one line naming the file, leaves no temporary file, and keeps its rounds."""
  small = tmp_path / "small"
  small.mkdir()
  if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(small)],
                    capture_output=True, check=False).returncode:
    pytest.skip("cannot mount a tmpfs here (not root); the injected-ENOSPC tests cover the logic")
  try:
    job = _job(small / "job", "--rounds=5000", "--eval_every=100", "--checkpoint_every=50",
               "--model=logreg")
    out = job.stdout.read()
    assert job.wait(300) == 1, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("error: ") and "No space left on device" in last, out
    assert "Traceback" not in out
    assert not list((small / "job").rglob("*.tmp"))
    lines = (small / "job" / "seed0" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) > 50
  finally:
    subprocess.run(["umount", str(small)], check=False)


def test_a_folder_without_room_for_a_checkpoint_is_refused_before_any_round(tmp_path,
                                                                            monkeypatch):
  import collections  # pylint: disable=import-outside-toplevel
  usage = collections.namedtuple("usage", "total used free")
  monkeypatch.setattr(runner.shutil, "disk_usage", lambda _: usage(1000, 1000, 1000))
  with pytest.raises(checkpoint.WriteError, match="MiB free"):
    fs.run(make_sim(), 2, str(tmp_path), progress=None)
  assert not (tmp_path / "metrics.jsonl").exists()


def test_flipped_clients_keep_one_wrong_class_in_training_and_validation():
  from fedjax_sel.data import corruption  # pylint: disable=import-outside-toplevel
  xs = [np.zeros((30, 2), np.float32) for _ in range(12)]
  ys = [np.full(30, k % 4) for k in range(12)]
  data = fs.data.split_clients(xs, ys, num_classes=4, val_fraction=0.3, test_fraction=0.1, seed=0)
  bad_data, bad = corruption.corrupt_clients(data, 1.0, ("flip",), seed=3)
  for k in np.flatnonzero(bad):
    train, val = set(bad_data.train.client(k)[1].tolist()), set(bad_data.val.client(k)[1].tolist())
    assert len(train) == 1 and train == val and train != {k % 4}, k


def test_dominant_partition_gives_every_client_its_dominant_class():
  from fedjax_sel.data import partition  # pylint: disable=import-outside-toplevel
  y = sources.load_digits().y
  for n in (20, 50, 99):
    size = len(y) // n
    for k, part in enumerate(partition.dominant(y, n, 10, 0.8, seed=0)):
      hist = np.bincount(y[part], minlength=10)
      assert len(part) == size and hist[k % 10] == round(0.8 * size), (n, k)


def test_dominant_partition_fills_the_last_clients_like_the_first():
  """With the pool used up (as FedSRC's Fashion-MNIST setting does), the last clients still get
  their full size, their own class exactly at the fraction, and every other class; and where
  only a client's own class is left, a swap fills it (three classes, many seeds)."""
  from fedjax_sel.data import partition  # pylint: disable=import-outside-toplevel
  y = np.repeat(np.arange(10), 6000)  # Fashion-MNIST's 60,000 in 100 clients of 600.
  hist = np.stack([np.bincount(y[p], minlength=10)
                   for p in partition.dominant(y, 100, 10, 0.8, seed=0)])
  assert (hist.sum(1) == 600).all() and (hist[np.arange(100), np.arange(100) % 10] == 480).all()
  assert ((hist > 0).sum(1) == 10).all()  # 120 others over 9 classes: every class, to the last.
  small = np.repeat(np.arange(3), 4)
  for seed in range(40):
    parts = partition.dominant(small, 3, 3, 0.5, seed=seed)
    assert sorted(np.concatenate(parts).tolist()) == list(range(12)), seed
    for k, part in enumerate(parts):
      assert np.bincount(small[part], minlength=3)[k] == 2 and len(part) == 4, (seed, k)
  with pytest.raises(ValueError, match="all of client 0's own class 0"):
    partition.dominant(np.array([0] * 8 + [1] * 4), 2, 2, 0.5, seed=0)


def test_drawn_priority_clients_hold_distinct_classes():
  from fedjax_sel.parts.rules import fedalign  # pylint: disable=import-outside-toplevel
  hist = np.zeros((30, 10), int)
  hist[np.arange(30), np.arange(30) % 10] = 5
  for seed in range(20):
    mask = fedalign.choose_priority(30, count=10, seed=seed, label_hist=hist)
    assert sorted((np.arange(30) % 10)[mask].tolist()) == list(range(10)), seed


def test_there_are_at_least_forty_new_reliability_cases():
  new = (len(STORE_CASES) + len(API_II_CASES) + len(CONTRACT_CASES) + len(RESUME_CASES)
         + len(LEAF_CASES) + 3 + 2 + 1 + 1 + 1 + 4)  # Launcher cases added, tests below.
  assert new >= 40


def test_a_stat_read_without_declaring_it_names_what_to_declare():
  """A selector reading inputs.stats["loss"] without needs=("loss",) is told what to declare."""
  data = ragged_dataset([20, 12, 9, 15])
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  undeclared = fs.Selector(init=lambda n, params: (),
                           select=lambda s, key, inputs, mask: (
                               fs.top_k_mask(inputs.stats["loss"], mask, 2), s))
  sim = fs.Simulator(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=4),
                     fs.uniform_availability(4, 4), undeclared, fs.fedavg(), 2, 0)
  with pytest.raises(KeyError, match=r"declare it in the part that reads it, needs=\('loss',\)"):
    sim.step(sim.init())


def test_run_batch_refuses_one_folder_for_two_runs(tmp_path):
  """Two runs given one folder would interleave one metrics.jsonl and one checkpoint."""
  data = ragged_dataset([20, 12, 9, 15])
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  specs = [fs.build_run(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=4),
                         fs.uniform_availability(4, 4), fs.random_selector(), fs.fedavg(), 2, s)
           for s in (0, 1)]
  with pytest.raises(ValueError, match="out_dirs must be distinct folders"):
    fs.run_batch(fs.RunBatch(specs), 2, [str(tmp_path / "d"), str(tmp_path / "d")], progress=None)


def test_a_profile_csv_with_a_byte_order_mark_is_read(tmp_path):
  from fedjax_sel.client import system  # pylint: disable=import-outside-toplevel
  path = tmp_path / "profile.csv"
  path.write_text("\ufeffclient,speed,bandwidth\n0,10,1000\n1,20,2000\n", encoding="utf-8")
  profile = system.read_profiles(str(path), 2)
  assert profile.speed.tolist() == [10.0, 20.0]


def test_a_corrupt_older_checkpoint_does_not_block_a_resume(tmp_path):
  """The checkpoint kept before the latest (.prev) is corrupt: the run resumes from the latest."""
  run_dir = tmp_path / "run"
  fs.run(make_sim(), 2, str(run_dir), checkpoint_every=1, progress=None)
  prev = run_dir / "checkpoint.msgpack.prev"
  assert prev.exists()
  prev.write_bytes(prev.read_bytes()[:40])
  records = fs.run(make_sim(), 3, str(run_dir), resume=True, progress=None)
  assert [r["round"] for r in records] == [0, 1, 2]


def test_a_job_around_a_running_job_is_refused_before_compute(tmp_path):
  """Another process holds D/seed0: a job on D stops at once naming it (it died with a raw
  FolderInUse after loading its data, and would have mixed the two jobs' runs)."""
  inner = tmp_path / "D" / "seed0"
  holder = subprocess.Popen(
      [sys.executable, "-c", "import sys, time; from fedjax_sel.host import folder_lock; "
       f"folder_lock.hold({str(inner)!r}); print('held', flush=True); time.sleep(60)"],
      cwd=REPO, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    proc = subprocess.run([sys.executable, "-m", "experiments.run", "--rounds=1",
                           f"--out_dir={tmp_path / 'D'}"], cwd=REPO, capture_output=True,
                          text=True, timeout=HANG_GUARD_S, check=False)
  finally:
    holder.kill()
  assert proc.returncode == 1 and "is in use by another job" in proc.stderr, proc.stderr
  assert str(inner) in proc.stderr and "== " not in proc.stdout


def test_a_failed_check_of_a_cached_program_names_the_cache_folder(tmp_path, monkeypatch):
  """XLA's assertion on a program loaded from the persistent cache (two swapped entries stopped a
  job with a raw AssertionError) ends the launcher in one line naming the cache folder and what
  to do (issue 37)."""
  from experiments.launch import cli  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv("FEDJAX_SEL_CACHE_DIR", str(tmp_path / "cache"))

  def main(argv):
    del argv
    raise AssertionError("executable fingerprint mismatch")

  before = jax.config.jax_compilation_cache_dir
  try:
    with pytest.raises(SystemExit) as exit_info:
      cli.guarded(main)(["launcher"])
  finally:  # The cache folder of this test process stays what it was.
    jax.config.update("jax_compilation_cache_dir", before)
  message = str(exit_info.value.code)
  assert str(tmp_path / "cache") in message and "FEDJAX_SEL_CACHE_DIR=off" in message
  assert "fingerprint mismatch" in message


@pytest.mark.parametrize("where", ["a_file/sub", "a_file"])
def test_an_out_dir_that_cannot_be_a_folder_is_named_in_one_line(tmp_path, where):
  """A path that is not what it must be (a file where the job's folder or a parent of it goes)
  ends the launcher in one line naming it, before compute, no traceback."""
  (tmp_path / "a_file").write_text("not a folder", encoding="utf-8")
  proc = subprocess.run([sys.executable, "-m", "experiments.run", "--rounds=1",
                         f"--out_dir={tmp_path / where}"], cwd=REPO, capture_output=True,
                        text=True, timeout=HANG_GUARD_S)
  assert proc.returncode == 1, proc.stdout + proc.stderr
  assert "Traceback" not in proc.stderr and str(tmp_path) in proc.stderr, proc.stderr
  assert proc.stderr.strip().startswith("error: "), proc.stderr


def test_a_nan_row_of_a_host_store_stops_the_job_in_one_line(tmp_path):
  """A host store's features are checked as a round first reads them: a NaN row ends the job with
  one line naming the split, client and row (the rounds before it kept), not a traceback."""
  from fedjax_sel.data import store  # pylint: disable=import-outside-toplevel
  data = ragged_dataset([5, 6, 7])
  x = np.array(data.train.x)
  x[data.train.offsets[2]] = np.nan
  store.write_store(str(tmp_path / "store"), data._replace(train=data.train._replace(x=x)))
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.run", f"--store_dir={tmp_path / 'store'}",
       "--store=host", "--num_clients=3", "--num_available=3", "--clients_per_round=3",
       "--rounds=2", "--model=logreg", f"--out_dir={tmp_path / 'run'}"], cwd=REPO,
      capture_output=True, text=True, timeout=HANG_GUARD_S)
  assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
  assert "client 2: row" in proc.stderr and "non-finite feature (nan)" in proc.stderr, proc.stderr
  assert "--resume" in proc.stderr
