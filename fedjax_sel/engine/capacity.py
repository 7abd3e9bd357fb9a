"""How much room a run's data take: the capacity a job's runs are padded to, and whether the data
fit the device.

Runs of one job padded to one `Capacity` have data of equal shapes, so they share one compiled
round (`runs.RunBatch`, the launchers); `fits_on_device` decides where `store="auto"` keeps them.

Examples:
  >>> import numpy as np
  >>> from fedjax_sel.data.federated import ClientPool
  >>> pool = ClientPool.from_client_arrays([np.ones((3, 2)), np.zeros((1, 2))],
  ...                                      [np.array([0, 1, 0]), np.array([1])])
  >>> padded_pool(pool, 6).x.shape, padded_pool(pool, 6).counts.tolist()
  ((6, 2), [3, 1])
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

import jax
import numpy as np

from fedjax_sel.data.federated import ClientPool, FederatedDataset
from fedjax_sel.data.store import compact

SPLITS = ("train", "val", "test")
# Share of device memory the clients' data may take before store="auto" keeps them on the host:
# accelerators need the rest for models and activations; on CPU the device copy sits beside the
# host's.
DEVICE_DATA_SHARE = {"cpu": 0.25, "other": 0.5}


class Capacity(NamedTuple):
  """Static sizes a job's runs share: rows of each split and the largest client's training rows.

  Examples:
    >>> from fedjax_sel import DatasetSpec, build_dataset
    >>> a, b = (build_dataset(DatasetSpec("digits", num_clients=10), seed=s) for s in (0, 1))
    >>> cap = Capacity.of([a, b])
    >>> cap.train >= max(a.train.x.shape[0], b.train.x.shape[0])
    True
  """

  train: int
  val: int
  test: int
  max_count: int

  @staticmethod
  def of(datasets: Sequence[FederatedDataset]) -> Capacity:
    """The smallest capacity that holds every dataset of `datasets`."""
    rows = {s: max(getattr(d, s).x.shape[0] for d in datasets) for s in SPLITS}
    return Capacity(**rows, max_count=max(d.train.max_count for d in datasets))

  def holds(self, data: FederatedDataset) -> bool:
    return (all(getattr(data, s).x.shape[0] <= getattr(self, s) for s in SPLITS)
            and data.train.max_count <= self.max_count)


def padded_pool(pool: ClientPool, rows: int) -> ClientPool:
  """`pool` in `rows` rows: padding rows belong to client N (outside every per-client sum) and no
  client's offset and count reach them, so nothing computed on the pool changes."""
  if pool.x.shape[0] == rows:
    return pool
  return compact(pool, np.arange(pool.num_clients), rows)


def data_bytes(data: FederatedDataset) -> int:
  """Bytes of every client's examples (train, validation and test)."""
  return sum(int(np.prod(p.x.shape)) * p.x.dtype.itemsize + p.y.shape[0] * 4
             for p in (data.train, data.val, data.test))


def fits_on_device(data: FederatedDataset, rows: dict | None = None, buffers: int = 1) -> bool:
  """Whether the data (or `buffers` copies of `rows[split]` rows of each split) fit the first
  device's share of memory (`DEVICE_DATA_SHARE`)."""
  size = data_bytes(data)
  if rows is not None:
    row_bytes = lambda p: int(np.prod(p.x.shape[1:])) * p.x.dtype.itemsize + 12
    size = buffers * sum(rows[s] * row_bytes(getattr(data, s)) for s in SPLITS)
  device = jax.devices()[0]
  if device.platform == "cpu":
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return size <= DEVICE_DATA_SHARE["cpu"] * memory
  memory = (device.memory_stats() or {}).get("bytes_limit", 16 * 2**30)
  return size <= DEVICE_DATA_SHARE["other"] * memory
