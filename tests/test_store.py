"""The off-device client store: same runs as on the device; stores on disk checked when opened."""

import json
import os
import re

import jax
import numpy as np
import optax
import pytest

import fedjax_sel as fs
from fedjax_sel.data import store
from fedjax_sel.engine.state import to_host
from fedjax_sel.parts.filters import filfl as filtering
from tests.conftest import ragged_dataset


def sims(data, **kw):
  model = fs.build_model("mlp", data.feature_shape, data.num_classes, hidden=(16,))
  make = lambda where: fs.Simulator(
      model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=4),
      fs.uniform_availability(data.num_clients, 5, period=2), fs.random_selector(),
      fs.fedavg(), 3, 0, store=where, eval_mask=np.arange(data.num_clients) % 3 > 0, **kw)
  return make("device"), make("host")


def assert_same_runs(a, b, rounds=4):
  sa, sb = a.init(), b.init()
  for _ in range(rounds):
    sa, ma = a.step(sa)
    sb, mb = b.step(sb)
    ha, hb = to_host(ma), to_host(mb)
    for key in ("selected", "trained_clients", "aggregated_clients", "filtered_in"):
      if key in ha:
        assert ha[key].tolist() == hb[key].tolist(), key
    np.testing.assert_allclose(ha["local_train_loss"], hb["local_train_loss"], rtol=1e-6)
    np.testing.assert_allclose(ha["cost"]["train_samples"], hb["cost"]["train_samples"])
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7), sa.params,
               sb.params)
  ea, eb = a.evaluate(sa.params), b.evaluate(sb.params)
  assert set(ea) == set(eb)
  for key in ea:  # Per-client sums in another order: float rounding only.
    for x, y in zip(jax.tree.leaves(ea[key]), jax.tree.leaves(eb[key])):
      np.testing.assert_allclose(float(x), float(y), rtol=1e-5, err_msg=key)


def test_host_store_gives_the_same_run_as_the_device():
  data = ragged_dataset([23, 5, 40, 1, 17, 9, 31, 12, 3, 28, 14, 7])
  device, host = sims(data)
  assert host.spec.on_host and not device.spec.on_host
  assert_same_runs(device, host)


@pytest.mark.slow  # Covered by faster tests in the default suite; `pytest -m slow`.
def test_host_store_same_filfl_run():
  data = ragged_dataset([23, 5, 40, 6, 17, 9, 31, 12, 8, 28])
  rng = np.random.default_rng(9)
  data = data._replace(public_x=rng.normal(size=(30, 6)).astype(np.float32),
                       public_y=rng.integers(0, 4, 30).astype(np.int32))
  model = fs.build_model("mlp", data.feature_shape, data.num_classes, hidden=(16,))
  pub = lambda p, x, y: jax.numpy.mean(fs.models.per_example_loss(model, p, x, y))
  filt = filtering.filfl_filter(pub, filtering.FilterConfig("dgf"))
  assert_same_runs(*sims(data, filter=filt))


def test_memory_mapped_store_round_trip_and_checks(tmp_path):
  data = ragged_dataset([23, 5, 40, 6])
  folder = str(tmp_path / "store")
  store.write_store(folder, data)
  opened = store.open_store(folder)
  assert isinstance(opened.train.x, np.memmap)
  jax.tree.map(np.testing.assert_array_equal, tuple(opened.train), tuple(data.train))
  assert opened.feature_shape == data.feature_shape and opened.num_classes == data.num_classes
  with pytest.raises(ValueError, match="holds dataset"):
    store.open_store(folder, expect_name="femnist")
  path = os.path.join(folder, "train_x.npy")
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) - 64)
  with pytest.raises(ValueError, match="train_x.npy"):
    store.open_store(folder)
  store.write_store(folder, data)
  store.write_store(str(tmp_path / "other"), ragged_dataset([3, 3]))
  os.replace(str(tmp_path / "other" / "train_y.npy"), os.path.join(folder, "train_y.npy"))
  with pytest.raises(ValueError, match="train_y.npy.*another dataset"):
    store.open_store(folder)
  with pytest.raises(FileNotFoundError, match="store.json"):
    store.open_store(str(tmp_path))


def _edit_meta(folder, **fields):
  path = os.path.join(folder, store.STORE_FILE)
  with open(path, encoding="utf-8") as f:
    meta = json.load(f)
  with open(path, "w", encoding="utf-8") as f:
    json.dump({**meta, **fields}, f)
  return path


@pytest.mark.parametrize("fields,needle", [
    # int() truncated 4.9 to 4 and parsed "4", before; a number as the name raised AttributeError.
    ({"num_classes": 4.9}, "field 'num_classes' is float 4.9, expected an integer >= 0"),
    ({"num_classes": "4"}, "field 'num_classes' is str '4', expected an integer >= 0"),
    ({"num_clients": True}, "field 'num_clients' is bool True, expected an integer >= 0"),
    ({"feature_shape": [6.0]}, "field 'feature_shape' is float 6.0, expected an integer >= 0"),
    ({"feature_shape": 6}, "field 'feature_shape' is int 6, expected a list of integers"),
    ({"name": 5}, "field 'name' is int 5, expected a string"),
])
def test_a_store_description_of_wrong_types_is_refused_naming_the_field(tmp_path, fields, needle):
  folder = str(tmp_path / "store")
  store.write_store(folder, ragged_dataset([5, 3]))
  path = _edit_meta(folder, **fields)
  with pytest.raises(ValueError, match=f"^{re.escape(path)}: {needle}"):
    store.open_store(folder, expect_name="")


def test_a_store_whose_features_are_not_numbers_is_refused_naming_the_file(tmp_path):
  folder = str(tmp_path / "store")
  data = ragged_dataset([5, 3])
  store.write_store(folder, data._replace(train=data.train._replace(
      x=np.asarray(data.train.x).astype("U8"))))  # Opened, and read as strings, before.
  with pytest.raises(ValueError, match="train_x.npy holds <U8 features, expected numbers"):
    store.open_store(folder)


def test_compact_pool_keeps_each_available_clients_rows():
  data = ragged_dataset([4, 0, 3, 5])
  pool = data.train
  small = store.compact(pool, np.array([0, 3]), store.capacity(pool, 2))
  for k in (0, 3):
    lo, n = small.offsets[k], small.counts[k]
    np.testing.assert_array_equal(small.x[lo:lo + n], pool.client(k)[0])
  assert small.counts[2] == 0 and (small.client_id[small.counts.sum():] == 4).all()


def test_synth_store_generator_follows_the_definition(tmp_path):
  """Client sizes n_k >= 50 (capped), the 90/10 split, labels = argmax of a client's own linear
  model (so a client's data are far more separable by one linear map than the pooled data), and
  the store equals a simulator's device data."""
  data = store.synth_store(str(tmp_path / "s"), 300, seed=1, max_samples=80, block=64)
  sizes = np.asarray(data.train.counts) + np.asarray(data.test.counts)
  assert sizes.min() >= 50 and sizes.max() <= 80 and len(sizes) == 300
  np.testing.assert_array_equal(np.asarray(data.test.counts), np.round(0.1 * sizes))
  assert (np.asarray(data.train.client_id)[np.asarray(data.train.offsets)] == np.arange(300)).all()
  np.testing.assert_array_equal(data.label_hist.sum(1), np.asarray(data.train.counts))
  x, y = data.train.client(7)
  fit = np.linalg.lstsq(np.c_[x, np.ones(len(x))], np.eye(10)[y], rcond=None)[0]
  own = (np.argmax(np.c_[x, np.ones(len(x))] @ fit, 1) == y).mean()
  assert own > 0.6
  again = store.synth_store(str(tmp_path / "t"), 300, seed=1, max_samples=80, block=64)
  np.testing.assert_array_equal(np.asarray(again.train.x), np.asarray(data.train.x))


@pytest.mark.parametrize("rule", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_chosen_rows_mode_with_all_client_statistics_gives_the_same_run(rule):
  """Entropy selection over every client (n = N): stats streamed in chunks of K clients, the
  round's choice planned from them, only the chosen clients' rows on the device; with FedSRC's
  rule reading the chosen clients' test loss too (every client then needs a test split: the
  1-example client grows to 3)."""
  from fedjax_sel.parts.rules import fedsrc
  from fedjax_sel.parts.selectors import uacs  # pylint: disable=import-outside-toplevel
  data = ragged_dataset([23, 5, 40, 3 if rule else 1, 17, 9, 31, 12, 3, 28, 14, 7])
  model = fs.build_model("mlp", data.feature_shape, data.num_classes, hidden=(16,))
  part = fedsrc.fedsrc_rule(fedsrc.FedSRCConfig()) if rule else None
  make = lambda where: fs.Simulator(
      model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=4),
      fs.uniform_availability(12, 12), uacs.entropy_selector(eps=0.3), fs.fedavg(), 3, 0,
      store=where, host_rows="chosen", participation=part)
  device, host = make("device"), make("host")
  placement = host.placement
  assert placement.host_rows == "chosen"
  assert placement._capacity["train"] < data.train.x.shape[0]  # pylint: disable=protected-access
  assert_same_runs(device, host)


def test_make_store_then_run_from_it_on_the_host(tmp_path):
  from tests.test_launchers import launch  # pylint: disable=import-outside-toplevel
  launch("experiments.make_store", "--synth_clients=300", "--synth_max_samples=30",
         f"--store_out={tmp_path}/s")
  proc = launch("experiments.run", f"--store_dir={tmp_path}/s", "--store=host", "--model=logreg",
                "--num_available=40", "--clients_per_round=5", "--rounds=2",
                f"--out_dir={tmp_path}/run")
  assert "N=300" in proc.stdout and "[   2/2]" in proc.stdout
