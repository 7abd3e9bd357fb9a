"""Partitioners beyond the papers' (`data/partition.py`), each against its definition: sizes,
label histograms, disjointness, seeds."""

import numpy as np
import pytest

import fedjax_sel as fs
from fedjax_sel.data import partition as part

Y = np.repeat(np.arange(10), 100)  # 10 classes x 100 examples.


def _disjoint(parts, n):
  flat = np.concatenate(parts)
  assert len(np.unique(flat)) == len(flat) and flat.max() < n


def test_shards_hold_label_sorted_shards():
  parts = part.shards(Y, num_clients=10, shards_per_client=2, seed=0)
  _disjoint(parts, len(Y))
  assert [len(p) for p in parts] == [100] * 10  # 20 shards of 50.
  # Shards of 50 inside classes of 100: each shard is one class, so a client holds <= 2 classes.
  assert all(len(np.unique(Y[p])) <= 2 for p in parts)
  assert sum(len(np.unique(Y[p])) for p in parts) > 10  # Not each client one whole class.
  assert all((a == b).all() for a, b in zip(parts, part.shards(Y, 10, 2, seed=0)))
  with pytest.raises(ValueError, match="shards_per_client must be in 1..100"):
    part.shards(Y, 10, 101, seed=0)


def test_inner_dirichlet_keeps_sizes_and_skews_labels_by_alpha():
  skewed = part.inner_dirichlet(Y, num_clients=20, num_classes=10, alpha=0.05, seed=0)
  even = part.inner_dirichlet(Y, num_clients=20, num_classes=10, alpha=100.0, seed=0)
  for parts in (skewed, even):
    _disjoint(parts, len(Y))
    assert [len(p) for p in parts] == [50] * 20
  top = lambda parts: np.mean([np.bincount(Y[p], minlength=10).max() / len(p) for p in parts])
  assert top(skewed) > 0.6 and top(even) < 0.35
  sizes = np.array([30] * 10 + [70] * 10)
  fixed = part.inner_dirichlet(Y, 20, 10, 0.5, seed=1, sizes=sizes)
  assert [len(p) for p in fixed] == sizes.tolist()


@pytest.mark.parametrize("name", ["lognormal_sizes", "power_law_sizes"])
def test_quantity_skew_sizes_sum_and_spread(name):
  narrow = part.partition(name, Y, 20, 10, seed=0, size_skew=0.2 if name[0] == "l" else 20.0)
  wide = part.partition(name, Y, 20, 10, seed=0, size_skew=2.0 if name[0] == "l" else 0.8)
  for parts in (narrow, wide):
    _disjoint(parts, len(Y))
    sizes = np.array([len(p) for p in parts])
    assert sizes.sum() == len(Y) and sizes.min() >= 1
  cv = lambda parts: np.std([len(p) for p in parts]) / np.mean([len(p) for p in parts])
  assert cv(wide) > 2 * cv(narrow)
  # Labels stay IID: the big clients' label shares are near the pool's tenth.
  big = max(wide, key=len)
  assert np.abs(np.bincount(Y[big], minlength=10) / len(big) - 0.1).max() < 0.08


def test_natural_id_groups_by_value():
  groups = np.array([3, 1, 3, 2, 1, 3])
  assert [p.tolist() for p in part.natural_id(groups)] == [[1, 4], [3], [0, 2, 5]]


@pytest.mark.parametrize("name", ["shards", "inner_dirichlet", "lognormal_sizes",
                                  "power_law_sizes"])
def test_named_partitions_build_datasets(name):
  data = fs.build_dataset(fs.DatasetSpec("digits", num_clients=20, partition=name), seed=0)
  assert data.num_clients == 20 and int(np.sum(data.train.counts)) > 1000
