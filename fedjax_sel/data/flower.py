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


def from_partitioner(partitioner, features: str = "x",
                     label: str = "label") -> tuple[list[np.ndarray], list[np.ndarray]]:
  """(xs, ys): each partition's `features` column as float32 and `label` column as int32.

  Raises:
    ValueError: naming the partition and the column it lacks, or a partition without examples.
  """
  xs, ys = [], []
  for i in range(partitioner.num_partitions):
    part = partitioner.load_partition(i)
    names = list(getattr(part, "column_names", None) or part)  # A datasets.Dataset, or a dict.
    for column in (features, label):
      if column not in names:
        raise ValueError(f"Flower partition {i} has no column {column!r} (it has {names})")
    x, y = np.asarray(part[features], np.float32), np.asarray(part[label], np.int32)
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
