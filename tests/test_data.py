"""Partitioners, splits, SYNTH statistics and the offline loaders (on fixtures built here)."""

import gzip
import json
import os
import re
import struct

import numpy as np
import pytest

import fedjax_sel as fs
from fedjax_sel.data import partition as P
from fedjax_sel.data import sources
from fedjax_sel.data.federated import label_histogram, split_clients

Y = np.repeat(np.arange(10), 100)


def _classes(parts):
  return [set(Y[p].tolist()) for p in parts]


def _check_disjoint(parts):
  flat = np.concatenate(parts)
  assert len(flat) == len(set(flat.tolist()))


def test_iid_sizes_and_coverage():
  parts = P.iid(Y, 7, seed=0)
  _check_disjoint(parts)
  assert sum(map(len, parts)) == len(Y)
  assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_uni_class_each_client_holds_one_class():
  parts = P.uni_class(Y, 20, 10, seed=0)
  _check_disjoint(parts)
  assert [c for c in _classes(parts)] == [{k % 10} for k in range(20)]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_k_classes_exactly_k(k):
  parts = P.k_classes(Y, 15, 10, k, seed=1)
  _check_disjoint(parts)
  assert all(len(c) == k for c in _classes(parts))


def test_dominant_fraction():
  parts = P.dominant(Y, 10, 10, 0.8, seed=0)
  _check_disjoint(parts)
  for k, p in enumerate(parts):
    assert np.mean(Y[p] == k % 10) == pytest.approx(0.8, abs=0.02)


def test_dirichlet_skew_follows_alpha():
  def mean_max_share(alpha):
    parts = P.dirichlet(Y, 10, 10, alpha, seed=0)
    _check_disjoint(parts)
    hist = np.stack([np.bincount(Y[p], minlength=10) for p in parts])
    return np.mean(hist.max(1) / hist.sum(1))
  assert mean_max_share(0.1) > mean_max_share(1.0) > mean_max_share(100.0)
  assert mean_max_share(100.0) < 0.2


def test_partitions_are_seeded():
  for name in P.PARTITIONS:
    a = P.partition(name, Y, 10, 10, seed=3)
    b = P.partition(name, Y, 10, 10, seed=3)
    assert all((x == y).all() for x, y in zip(a, b))


@pytest.mark.parametrize("call,match", [
    (lambda: P.iid(Y, 2000, 0), "num_clients"),
    (lambda: P.k_classes(Y, 10, 10, 11, 0), "classes_per_client"),
    (lambda: P.dominant(Y, 11, 10, 1.0, 0), "dominant_fraction"),
    (lambda: P.uni_class(Y[:150], 30, 10, 0), "class 2 has 0 examples"),
    (lambda: P.partition("bogus", Y, 10, 10, 0), "accepted"),
])
def test_impossible_partitions_raise(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def test_split_clients_and_label_histogram():
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(n, 3)) for n in (10, 1, 5)]
  ys = [rng.integers(0, 4, n) for n in (10, 1, 5)]
  d = split_clients(xs, ys, num_classes=4, val_fraction=0.2, test_fraction=0.2, seed=0)
  assert d.train.counts.tolist() == [6, 1, 3]
  assert d.val.counts.tolist() == [2, 0, 1] and d.test.counts.tolist() == [2, 0, 1]
  assert (d.label_hist == label_histogram(d.train, 4)).all()
  assert d.label_hist.sum() == 10
  for k in range(3):
    rows = np.concatenate([d.train.client(k)[0], d.val.client(k)[0], d.test.client(k)[0]])
    assert sorted(map(tuple, rows.round(6))) == sorted(map(tuple,
                                                           xs[k].astype(np.float32).round(6)))


def test_synth_statistics_match_definition():
  xs, ys = sources.synthetic(0.0, 0.0, 300, seed=0, max_samples=400)
  sizes = np.array([len(y) for y in ys])
  assert sizes.min() >= 50 and sizes.max() <= 400
  assert all(x.shape[1] == 60 for x in xs) and set(np.concatenate(ys).tolist()) <= set(range(10))
  # beta = 0: v_k ~ N(0, 1), so client means of a coordinate spread with std ~1.
  means = np.array([x[:, 0].mean() for x in xs])
  assert means.std() == pytest.approx(1.0, abs=0.15)
  # Within a client, coordinate j has variance j^-1.2.
  big = np.concatenate([x - x.mean(0) for x in xs])
  var = big.var(0)
  np.testing.assert_allclose(var[[0, 9, 59]], np.power([1, 10, 60], -1.2), rtol=0.1)
  # beta controls the spread of client means: B_k ~ N(0, beta^2) adds to v_k's variance.
  xs3, _ = sources.synthetic(0.0, 3.0, 300, seed=0, max_samples=100)
  assert np.std([x[:, 0].mean() for x in xs3]) == pytest.approx(np.sqrt(10.0), rel=0.15)
  # alpha: heterogeneity of the labelling models; alpha = 0 vs large alpha changes label skew.
  sizes_default = [len(y) for y in sources.synthetic(1, 1, 50, seed=1)[1]]
  assert min(sizes_default) >= 50


def _write_idx(path, arr):
  with gzip.open(path, "wb") as f:
    f.write(struct.pack(">HBB", 0, 8, arr.ndim))
    f.write(struct.pack(">" + "I" * arr.ndim, *arr.shape))
    f.write(arr.astype(np.uint8).tobytes())


def test_idx_loader_on_fixture(tmp_path):
  imgs = np.random.default_rng(0).integers(0, 256, (12, 28, 28))
  labels = np.arange(12) % 10
  _write_idx(tmp_path / "train-images-idx3-ubyte.gz", imgs)
  _write_idx(tmp_path / "train-labels-idx1-ubyte.gz", labels)
  data = sources.load_idx(str(tmp_path), "train")
  assert data.x.shape == (12, 28, 28, 1) and data.num_classes == 10
  np.testing.assert_allclose(data.x[3, :, :, 0], imgs[3] / 255.0, rtol=1e-6)
  assert data.y.tolist() == labels.tolist()
  with pytest.raises(FileNotFoundError, match="data_dir"):
    sources.load_idx(str(tmp_path), "test")


@pytest.mark.skipif(not os.path.isdir(sources.FASHION_MNIST_DIR), reason="no Debian fashion-mnist")
def test_real_fashion_mnist_idx():
  data = sources.load_idx(sources.FASHION_MNIST_DIR, "test")
  assert data.x.shape == (10000, 28, 28, 1) and data.num_classes == 10
  assert np.bincount(data.y).tolist() == [1000] * 10


def test_leaf_json_femnist_and_shakespeare(tmp_path):
  femnist = {"users": ["a", "b"], "num_samples": [2, 1],
             "user_data": {"a": {"x": [[0.5] * 784, [0.0] * 784], "y": [3, 61]},
                           "b": {"x": [[1.0] * 784], "y": [7]}}}
  text = {"users": ["u"], "num_samples": [2],
          "user_data": {"u": {"x": ["a" * 79 + "b", "hello world!" + " " * 67 + "~"],
                              "y": ["c", "Z"]}}}
  for name, blob in (("f.json", femnist), ("s.json", text)):
    with open(tmp_path / name, "w", encoding="utf-8") as f:
      json.dump(blob, f)
  users, xs, ys = sources.load_leaf_json([str(tmp_path / "f.json")])
  assert users == ["a", "b"] and xs[0].shape == (2, 28, 28, 1) and ys[0].tolist() == [3, 61]
  _, xs, ys = sources.load_leaf_json([str(tmp_path / "s.json")])
  assert xs[0].shape == (2, 80)
  assert xs[0][1, -1] == sources.OOV_INDEX  # "~" is outside LEAF's vocabulary.
  assert ys[0].tolist() == [sources.LEAF_CHARS.index("c"), sources.LEAF_CHARS.index("Z")]
  data = fs.build_dataset(fs.DatasetSpec("leaf", num_clients=0,
                                         leaf_files=(str(tmp_path / "f.json"),),
                                         test_fraction=0.0), seed=0)
  assert data.num_clients == 2 and data.num_classes == 62
  # Text mostly outside the vocabulary is refused, naming the file (it would train to predict
  # the unknown character).
  foreign = {"users": ["u"], "num_samples": [1],
             "user_data": {"u": {"x": ["\u00e9" * 80], "y": ["\u00e9"]}}}
  with open(tmp_path / "foreign.json", "w", encoding="utf-8") as f:
    json.dump(foreign, f)
  with pytest.raises(ValueError, match=r"foreign\.json: 100% of its characters are outside"):
    sources.load_leaf_json([str(tmp_path / "foreign.json")])


@pytest.mark.parametrize("user,needle", [
    # np.asarray(..., float) parsed strings and booleans as numbers, before.
    ({"x": [[0.5] * 784] * 2, "y": ["3", "4"]}, "field 'y' holds strings, expected numbers"),
    ({"x": [[0.5] * 784] * 2, "y": [True, False]}, "field 'y' holds booleans, expected numbers"),
    ({"x": [["0.5"] * 784] * 2, "y": [3, 4]}, "field 'x' holds strings, expected numbers"),
    ({"x": [[None] * 784] * 2, "y": [3, 4]}, "field 'x' holds null or mixed values"),
])
def test_leaf_femnist_of_wrong_types_is_refused_naming_file_user_and_field(tmp_path, user, needle):
  path = str(tmp_path / "f.json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump({"users": ["u0"], "num_samples": [2], "user_data": {"u0": user}}, f)
  with pytest.raises(ValueError, match=f"^{re.escape(path)}: user u0: .*{needle}"):
    sources.load_leaf_json([path])


def test_tfds_mock_data_loader():
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=20):
    data = sources.load_tfds("mnist", "train")
  assert data.x.shape == (20, 28, 28, 1) and data.num_classes == 10
  assert data.x.max() <= 1.0


def test_build_dataset_public_split_is_stratified():
  spec = fs.DatasetSpec("digits", num_clients=10, partition="iid", public_fraction=0.1)
  d = fs.build_dataset(spec, seed=0)
  assert np.bincount(d.public_y).min() >= 17 and np.bincount(d.public_y).max() <= 19
  total = d.train.x.shape[0] + d.test.x.shape[0] + d.public_x.shape[0]
  assert total == 1797


def test_char_windows():
  x, y = sources.char_windows("abcdefgh", window=3)
  assert x.shape == (5, 3) and y.tolist() == sources.encode_chars("defgh").tolist()


def test_corruption_kinds_split_evenly_and_flip_is_a_wrong_class():
  from fedjax_sel.data.corruption import corrupt_clients, corruption_kinds  # pylint: disable=import-outside-toplevel
  from fedjax_sel.data.federated import split_clients  # pylint: disable=import-outside-toplevel
  from tests.conftest import ragged_dataset  # pylint: disable=import-outside-toplevel
  base = ragged_dataset([40] * 20, num_classes=4, test_fraction=0.0)
  xs = [base.train.client(k)[0] for k in range(20)]
  ys = [base.train.client(k)[1] for k in range(20)]
  data = split_clients(xs, ys, num_classes=4, val_fraction=0.2, test_fraction=0.2, seed=0)
  bad_data, bad = corrupt_clients(data, 0.3, seed=5)
  # Validation splits (a client's own held-out data) are corrupted with it; test splits stay clean.
  for k in np.flatnonzero(bad):
    assert (bad_data.test.client(int(k))[1] == data.test.client(int(k))[1]).all()
  flip_val = [bad_data.val.client(int(k))[1] for k in np.flatnonzero(bad)]
  assert any(len(set(v.tolist())) == 1 for v in flip_val if len(v) > 1)
  kinds = corruption_kinds(20, 0.3, seed=5)
  assert (bad == (kinds != "good")).all() and bad.sum() == 6
  assert sorted(kinds[bad].tolist()) == ["flip"] * 2 + ["noise"] * 2 + ["shuffle"] * 2
  for k in np.flatnonzero(kinds == "flip"):
    _, y_old = data.train.client(int(k))
    _, y_new = bad_data.train.client(int(k))
    assert len(set(y_new.tolist())) == 1 and y_new[0] != np.bincount(y_old).argmax()
  for k in np.flatnonzero(kinds == "noise"):
    x_old, y_old = data.train.client(int(k))
    x_new, y_new = bad_data.train.client(int(k))
    assert (y_new == y_old).all() and not np.allclose(x_new, x_old)
    assert x_new.min() >= data.train.x.min() - 1e-6 and x_new.max() <= data.train.x.max() + 1e-6


def test_split_clients_refuses_a_label_outside_the_classes():
  """A label of 7 with num_classes=4 is refused naming the client and the value (it was a raw
  IndexError from the label histogram)."""
  xs = [np.zeros((3, 2), np.float32), np.zeros((2, 2), np.float32)]
  ys = [np.array([0, 1, 2]), np.array([3, 7])]
  with pytest.raises(ValueError, match=r"client 1: label 7 is not an integer class in 0..3"):
    split_clients(xs, ys, num_classes=4, val_fraction=0.0, test_fraction=0.2, seed=0)


def test_split_clients_defaults_to_the_dataset_specs_fractions():
  """`split_clients(xs, ys, num_classes=...)` alone: no validation split, a fifth for test (the
  `DatasetSpec` defaults), seeded at 0 (issue 36)."""
  xs, ys = [np.zeros((10, 2), np.float32)] * 3, [np.arange(10) % 2] * 3
  data = split_clients(xs, ys, num_classes=2)
  assert data.train.counts.tolist() == [8, 8, 8] and data.test.counts.tolist() == [2, 2, 2]
  assert data.val.counts.tolist() == [0, 0, 0]
  again = split_clients(xs, ys, num_classes=2, val_fraction=0.0, test_fraction=0.2, seed=0)
  np.testing.assert_array_equal(again.test.y, data.test.y)
