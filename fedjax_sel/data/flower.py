"""Flower Datasets' partitions as our clients (the optional `flower` extra:
`pip install -e '.[flower]'`).

A `flwr_datasets` partitioner (`IidPartitioner`, `DirichletPartitioner`, `ShardPartitioner`,
`PathologicalPartitioner`, `NaturalIdPartitioner`, ...), given its dataset, holds
`num_partitions` partitions; `from_partitioner` reads each partition's feature and label columns
into one client's arrays, and `flower_dataset` splits them into our train / validation / test
pools. Nothing here imports Flower: any object with `num_partitions` and `load_partition(i)`
returning columns by name works.

Examples:
  >>> class Two:  # Stands for a flwr_datasets partitioner over a 4-example dataset.
  ...   num_partitions = 2
  ...   def load_partition(self, i):
  ...     return {"x": [[0.0], [1.0]] if i == 0 else [[2.0], [3.0]], "label": [0, 1]}
  >>> xs, ys = from_partitioner(Two(), "x", "label")
  >>> [x.ravel().tolist() for x in xs], [y.tolist() for y in ys]
  ([[0.0, 1.0], [2.0, 3.0]], [[0, 1], [0, 1]])
"""

from __future__ import annotations

import numpy as np

from fedjax_sel.data.federated import FederatedDataset, split_clients


def _held(values: np.ndarray) -> str:
  """What an array of a column's values holds, in words."""
  return {"U": "strings", "S": "byte strings",
          "O": "Python objects (None, nested lists of several lengths or mixed types)"}.get(
              values.dtype.kind, f"{values.dtype} values")


def _column(part, i: int, column: str) -> np.ndarray:
  """Partition `i`'s `column` as a NumPy array, of whatever dtype its values make."""
  try:
    return np.asarray(part[column])
  except (ValueError, TypeError) as e:  # Ragged rows, say.
    raise ValueError(f"Flower partition {i}: column {column!r} is not an array ({e})") from e


def _features(part, i: int, column: str) -> np.ndarray:
  """Partition `i`'s features as float32; ValueError unless they are numbers."""
  x = _column(part, i, column)
  if x.dtype.kind not in "biuf":
    raise ValueError(f"Flower partition {i}: column {column!r} holds {_held(x)}, expected numbers "
                     "(features are read as float32)")
  return x.astype(np.float32)


def _labels(part, i: int, column: str) -> np.ndarray:
  """Partition `i`'s labels as int32; ValueError unless they are whole numbers (floats are
  accepted only where each is whole: a fractional label would be truncated)."""
  y = _column(part, i, column)
  if y.dtype.kind == "f" and np.any(y != np.round(y)):
    raise ValueError(f"Flower partition {i}: column {column!r} holds "
                     f"{y[y != np.round(y)][0]}, expected integer class ids (a fractional "
                     "label would be truncated)")
  if y.dtype.kind not in "biuf":
    raise ValueError(f"Flower partition {i}: column {column!r} holds {_held(y)}, expected "
                     "integer class ids")
  return y.astype(np.int32)


def from_partitioner(partitioner, features: str = "x",
                     label: str = "label") -> tuple[list[np.ndarray], list[np.ndarray]]:
  """(xs, ys): each partition's `features` column as float32 and `label` column as int32.

  Raises:
    ValueError: naming the partition and the column it lacks, a column whose values are not
      numbers (features) or whole numbers (labels), or a partition without examples.
  """
  xs, ys = [], []
  for i in range(partitioner.num_partitions):
    part = partitioner.load_partition(i)
    names = list(getattr(part, "column_names", None) or part)  # A datasets.Dataset, or a dict.
    for column in (features, label):
      if column not in names:
        raise ValueError(f"Flower partition {i} has no column {column!r} (it has {names})")
    x, y = _features(part, i, features), _labels(part, i, label)
    if not len(y):
      raise ValueError(f"Flower partition {i} holds no example")
    xs.append(x)
    ys.append(y)
  return xs, ys


def flower_dataset(partitioner, num_classes: int, *, features: str = "x", label: str = "label",
                   val_fraction: float = 0.0, test_fraction: float = 0.2, seed: int = 0,
                   name: str = "flower") -> FederatedDataset:
  """A `FederatedDataset` of a Flower partitioner's partitions, one client each, split per
  client into train / validation / test (`split_clients`)."""
  xs, ys = from_partitioner(partitioner, features, label)
  return split_clients(xs, ys, num_classes=num_classes, val_fraction=val_fraction,
                       test_fraction=test_fraction, seed=seed, name=name)
