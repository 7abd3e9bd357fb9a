"""Client data off the device: pools in host memory or memory-mapped from disk, compacted per round.

The engine's default keeps every client's data on the device for the whole run. A population larger
than that (10^5-10^6 clients) stays in host memory or on disk instead, and each round the engine
transfers only the rows of the round's available clients (`compact`): a `ClientPool` over the same
N client ids whose unavailable clients hold no rows, padded to a static number of rows so the
compiled round never retraces. Nothing the parts read changes for an available client (its rows,
their order, m_k), so a run is the same as on the device.

On disk a store is a folder of `.npy` files read with `np.load(mmap_mode="r")` (numpy memmap: the
operating system pages in just the rows a round gathers; the format is numpy's own, needs no new
dependency and is readable by any tool) and a `store.json` naming the dataset, its shapes and a
digest, checked when the store is opened.

Example:
  >>> import numpy as np
  >>> pool = ClientPool.from_client_arrays([np.ones((3, 2)), np.zeros((1, 2)), np.ones((2, 2))],
  ...                                      [np.array([0, 1, 0]), np.array([1]), np.array([1, 1])])
  >>> small = compact(pool, np.array([0, 2]), capacity=6)
  >>> small.counts.tolist(), small.x.shape
  ([3, 0, 2], (6, 2))
"""

from __future__ import annotations

import json
import os

import numpy as np

from fedjax_sel.data.federated import ClientPool, FederatedDataset

STORE_FILE = "store.json"
POOL_FIELDS = ("x", "y", "client_id", "offsets", "counts")
SPLITS = ("train", "val", "test")


def capacity(pool: ClientPool, num_clients: int) -> int:
  """Rows a compact pool of any `num_clients` clients needs: the sum of the largest counts."""
  counts = np.sort(np.asarray(pool.counts))[::-1]
  return max(int(counts[:num_clients].sum()), 1)


def compact(pool: ClientPool, ids: np.ndarray, capacity: int) -> ClientPool:
  """The pool restricted to clients `ids` (sorted), in `capacity` rows.

  Clients keep their ids; the others get count 0; padding rows belong to client N (outside every
  per-client sum) and are never indexed by a client's offset and count.
  """
  ids = np.asarray(ids, np.int64)
  n = pool.counts.shape[0]
  counts = np.zeros((n,), np.int32)
  counts[ids] = np.asarray(pool.counts)[ids]
  starts = np.asarray(pool.offsets)[ids].astype(np.int64)
  sizes = counts[ids].astype(np.int64)
  total = int(sizes.sum())
  if total > capacity:
    raise ValueError(f"{len(ids)} clients hold {total} rows, more than the capacity {capacity}")
  offsets = np.zeros((n,), np.int32)
  offsets[ids] = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int32)
  rows = np.repeat(starts - offsets[ids], sizes) + np.arange(total)
  x = np.zeros((capacity, *pool.x.shape[1:]), pool.x.dtype)
  y = np.zeros((capacity,), np.int32)
  client_id = np.full((capacity,), n, np.int32)
  x[:total] = pool.x[rows]
  y[:total] = pool.y[rows]
  client_id[:total] = np.repeat(ids.astype(np.int32), sizes)
  return ClientPool(x, y, client_id, offsets, counts)


def client_chunks(num_clients: int, size: int):
  """Consecutive id ranges `[i, i + size)` covering `0..num_clients-1`."""
  for lo in range(0, num_clients, size):
    yield np.arange(lo, min(lo + size, num_clients))


def write_store(folder: str, data: FederatedDataset) -> None:
  """Writes `data` as a memory-mappable store (one `.npy` per array and `store.json`)."""
  os.makedirs(folder, exist_ok=True)
  shapes = {}
  for split in SPLITS:
    pool = getattr(data, split)
    for field in POOL_FIELDS:
      name = f"{split}_{field}.npy"
      arr = np.asarray(getattr(pool, field))
      np.save(os.path.join(folder, name), arr)
      shapes[name] = [list(arr.shape), str(arr.dtype)]
  for field in ("public_x", "public_y", "label_hist"):
    arr = np.asarray(getattr(data, field))
    np.save(os.path.join(folder, f"{field}.npy"), arr)
    shapes[f"{field}.npy"] = [list(arr.shape), str(arr.dtype)]
  meta = {"name": data.name, "num_clients": data.num_clients, "num_classes": data.num_classes,
          "feature_shape": list(data.feature_shape), "arrays": shapes}
  with open(os.path.join(folder, STORE_FILE), "w", encoding="utf-8") as f:
    json.dump(meta, f, indent=1)


def open_store(folder: str, expect_name: str | None = None) -> FederatedDataset:
  """A store written by `write_store` (or `synth_store`), its arrays memory-mapped.

  Raises:
    FileNotFoundError: no `store.json` in `folder`.
    ValueError: naming the path, when an array file is missing, truncated or not the shape and
      dtype `store.json` records, or the store holds another dataset than `expect_name`.
  """
  meta_path = os.path.join(folder, STORE_FILE)
  if not os.path.exists(meta_path):
    raise FileNotFoundError(f"{folder}: no {STORE_FILE}, not a fedjax_sel client store")
  with open(meta_path, encoding="utf-8") as f:
    meta = json.load(f)
  if expect_name is not None and not meta["name"].startswith(expect_name):
    raise ValueError(f"{folder} holds dataset {meta['name']!r}, not {expect_name!r}")
  arrays = {}
  for name, (shape, dtype) in meta["arrays"].items():
    path = os.path.join(folder, name)
    try:
      arr = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as e:
      raise ValueError(f"{path}: missing or truncated ({e})") from e
    if list(arr.shape) != shape or str(arr.dtype) != dtype:
      raise ValueError(f"{path} is {arr.dtype}{list(arr.shape)}, {meta_path} records "
                       f"{dtype}{shape}: the store is from another dataset or was overwritten")
    arrays[name[:-4]] = arr
  pools = {split: ClientPool(*(arrays[f"{split}_{f}"] for f in POOL_FIELDS)) for split in SPLITS}
  return FederatedDataset(pools["train"], pools["val"], pools["test"], arrays["public_x"],
                          arrays["public_y"], meta["num_classes"],
                          np.asarray(arrays["label_hist"]), meta["name"])
