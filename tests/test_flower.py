"""Flower Datasets beside our partitioners (`data/flower.py`, `data/partition.py`): the adapter
on an in-memory dataset, and our partitioners against Flower's of the same name on the same
labels (where `flwr-datasets` is installed: `pip install -e '.[flower]'`)."""

import inspect
import os

import numpy as np
import pytest

import fedjax_sel as fs
from fedjax_sel.data import flower
from fedjax_sel.data import partition as part

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
Y = np.repeat(np.arange(10), 60)  # 10 classes x 60 examples.


def flwr(name):
  module = pytest.importorskip("flwr_datasets.partitioner")
  return getattr(module, name)


def dataset(extra=None):
  datasets = pytest.importorskip("datasets")
  rng = np.random.default_rng(0)
  columns = {"x": rng.normal(size=(len(Y), 6)).astype(np.float32).tolist(), "label": Y.tolist(),
             **(extra or {})}
  return datasets.Dataset.from_dict(columns)


def flower_parts(partitioner, data):
  partitioner.dataset = data.add_column("index", list(range(len(data))))
  return [np.sort(np.asarray(partitioner.load_partition(i)["index"]))
          for i in range(partitioner.num_partitions)]


def class_counts(parts, y=Y):
  """The multiset of per-client class-count vectors (each sorted), as sorted tuples."""
  return sorted(tuple(sorted(np.bincount(y[p], minlength=10).tolist())) for p in parts)


def test_the_adapter_reads_a_flower_partitioner_into_clients():
  iid = flwr("IidPartitioner")(num_partitions=5)
  iid.dataset = dataset()
  data = flower.flower_dataset(iid, 10, test_fraction=0.2, seed=0)
  assert data.num_clients == 5 and data.feature_shape == (6,)
  assert int(data.train.counts.sum() + data.test.counts.sum()) == len(Y)
  with pytest.raises(ValueError, match="partition 0 has no column 'pixels'"):
    flower.from_partitioner(iid, "pixels")


def test_the_adapter_needs_no_flower():
  class Fake:
    num_partitions = 3

    def load_partition(self, i):
      return {"x": np.full((4, 2), i, np.float32), "label": np.arange(4) % 2}

  data = fs.flower_dataset(Fake(), 2, test_fraction=0.25)  # Exported as fs.flower_dataset.
  assert data.num_clients == 3 and data.train.counts.tolist() == [3, 3, 3]


def test_the_data_page_gives_the_adapters_defaults():
  defaults = inspect.signature(fs.flower_dataset).parameters
  call = (f'fs.flower_dataset(partitioner, num_classes, features="{defaults["features"].default}", '
          f'label="{defaults["label"].default}")')
  for page in ("data.md", os.path.join("guides", "data.md")):
    with open(os.path.join(REPO, "docs", page), encoding="utf-8") as f:
      assert call in " ".join(f.read().split()), page


def test_iid_sizes_equal_flowers():
  ours = part.iid(Y, 7, seed=0)
  theirs = flower_parts(flwr("IidPartitioner")(num_partitions=7), dataset())
  assert sorted(len(p) for p in ours) == sorted(len(p) for p in theirs)


def test_natural_id_equals_flowers():
  writers = (np.arange(len(Y)) * 7) % 13
  ours = part.natural_id(writers)
  theirs = flower_parts(flwr("NaturalIdPartitioner")(partition_by="writer"),
                        dataset({"writer": writers.tolist()}))
  assert sorted(map(tuple, ours)) == sorted(map(tuple, theirs))


def test_k_classes_gives_the_class_counts_of_flowers_deterministic_pathological():
  ours = part.k_classes(Y, 10, 10, 3, seed=0)
  theirs = flower_parts(flwr("PathologicalPartitioner")(
      num_partitions=10, partition_by="label", num_classes_per_partition=3,
      class_assignment_mode="deterministic"), dataset())
  assert class_counts(ours) == class_counts(theirs)


def test_shards_give_the_class_counts_of_flowers_in_distribution():
  """Shards of 30 inside classes of 60: every client of both holds two pure shards; the number of
  clients whose two shards share a class differs only by the random dealing."""
  ours = part.shards(Y, 10, 2, seed=0)
  theirs = flower_parts(flwr("ShardPartitioner")(num_partitions=10, partition_by="label",
                                                 num_shards_per_partition=2, shard_size=30),
                        dataset())
  for parts in (ours, theirs):
    assert sorted(len(p) for p in parts) == [60] * 10
    assert all(sum(c > 0 for c in np.bincount(Y[p], minlength=10)) <= 2 for p in parts)
    assert all(set(np.bincount(Y[p], minlength=10)) <= {0, 30, 60} for p in parts)


def test_inner_dirichlet_keeps_the_sizes_flower_keeps():
  sizes = [50, 70, 30, 90, 60, 100]
  ours = part.inner_dirichlet(Y, 6, 10, 0.5, seed=0, sizes=np.array(sizes))
  theirs = flower_parts(flwr("InnerDirichletPartitioner")(
      partition_sizes=sizes, partition_by="label", alpha=0.5), dataset())
  assert [len(p) for p in ours] == [len(p) for p in theirs] == sizes


def test_flower_built_dataset_trains(tmp_path):
  del tmp_path
  shards = flwr("ShardPartitioner")(num_partitions=8, partition_by="label",
                                    num_shards_per_partition=2)
  shards.dataset = dataset()
  data = flower.flower_dataset(shards, 10)
  import optax  # pylint: disable=import-outside-toplevel
  sim = fs.Simulator(fs.build_model("logreg", data.feature_shape, 10), data,
                     lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=8),
                     fs.uniform_availability(8, 8), fs.random_selector(), fs.fedavg(), 4,
                     seed=0)
  assert len(fs.run(sim, 2, progress=None)) == 2


class _Columns:
  """One partition holding the columns given, as a partitioner's `load_partition` returns them."""

  num_partitions = 1

  def __init__(self, **columns):
    self.columns = columns

  def load_partition(self, i):
    del i
    return self.columns


@pytest.mark.parametrize("columns,needle", [
    # Each was converted by np.asarray(..., float32 / int32) before: truncated, parsed or NaN.
    ({"x": [[0.0], [1.0]], "label": [0.7, 1.0]},
     r"column 'label' holds 0.7, expected integer class ids \(a fractional label would be "
     "truncated"),
    ({"x": [[0.0], [1.0]], "label": ["3", "1"]}, "column 'label' holds strings, expected integer"),
    ({"x": [["0.5"], ["1"]], "label": [0, 1]}, "column 'x' holds strings, expected numbers"),
    ({"x": [[None], [1.0]], "label": [0, 1]}, "column 'x' holds Python objects .None"),
    ({"x": [[0.0, 1.0], [1.0]], "label": [0, 1]}, "column 'x' is not an array"),
])
def test_a_partition_whose_columns_are_not_numbers_is_refused_naming_it(columns, needle):
  with pytest.raises(ValueError, match=f"^Flower partition 0: {needle}"):
    flower.from_partitioner(_Columns(**columns))


def test_whole_float_labels_are_read_as_classes():
  _, ys = flower.from_partitioner(_Columns(x=[[0.0], [1.0]], label=[2.0, 0.0]))
  assert ys[0].tolist() == [2, 0] and ys[0].dtype == np.int32
