"""Client data off the device: pools in host memory or memory-mapped from disk, compacted per round.

The engine's default keeps every client's data on the device for the whole run. A population larger
than that (10^5-10^6 clients) stays in host memory or on disk instead, and each round the engine
transfers only the rows of the round's available clients (`compact`): a `ClientPool` over the same
N client ids whose unavailable clients hold no rows, padded to a static number of rows so the
compiled round never retraces. Nothing the parts read changes for an available client (its rows,
their order, m_k), so a run is the same as on the device.

On disk a store is a folder of `.npy` files read with `np.load(mmap_mode="r")` (numpy memmap: the
operating system pages in just the rows a round gathers; the format is numpy's own, needs no new
dependency and is readable by any tool) and a `store.json` naming the dataset and each array's
shape and dtype. Opening a store checks that every array agrees with `store.json` and that the
data add up (`integrity.py`): the index arrays, each row's owner, the labels and the label
histogram. The features, the bulk of a store, are checked as rows are first read (the host
placement checks each round's rows before it trains on them).

Examples:
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

from fedjax_sel.data import integrity
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


def _field(path: str, name: str, value, ok: bool, expected: str) -> None:
  """ValueError naming the file and its field `name`, unless `ok` (`value` is `expected`)."""
  if not ok:
    raise ValueError(f"{path}: field {name!r} is {type(value).__name__} {value!r:.60}, expected "
                     f"{expected}")


def open_store(folder: str, expect_name: str | None = None) -> FederatedDataset:
  """A store written by `write_store` (or `synth_store`), its arrays memory-mapped.

  Raises:
    FileNotFoundError: no `store.json` in `folder`.
    ValueError: naming the path, when an array file is missing, truncated or not the shape and
      dtype `store.json` records, features are not numbers, a `store.json` field is not of its
      type (counts and dimensions JSON integers: 10.5 or "10" are refused, not truncated or
      parsed), or the store holds another dataset than `expect_name`.
    integrity.DataError: naming the file, the client and the value, when the index arrays, row
      owners, labels or label histogram do not add up.
  """
  meta_path = os.path.join(folder, STORE_FILE)
  if not os.path.exists(meta_path):
    raise FileNotFoundError(f"{folder}: no {STORE_FILE}, not a fedjax_sel client store")
  try:
    with open(meta_path, encoding="utf-8") as f:
      meta = json.load(f)
    meta["arrays"] = {str(k): (list(v[0]), str(v[1])) for k, v in meta["arrays"].items()}
    dataset, num_clients, num_classes, feature_shape = (
        meta[k] for k in ("name", "num_clients", "num_classes", "feature_shape"))
  except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, IndexError,
          AttributeError) as e:
    raise ValueError(f"{meta_path}: not a readable store description ({type(e).__name__}: {e})"
                     ) from e
  _field(meta_path, "name", dataset, isinstance(dataset, str), "a string")
  _field(meta_path, "feature_shape", feature_shape, isinstance(feature_shape, list),
         "a list of integers >= 0")
  for field, value in (("num_clients", num_clients), ("num_classes", num_classes),
                       *(("feature_shape", d) for d in feature_shape)):
    _field(meta_path, field, value, isinstance(value, int) and not isinstance(value, bool)
           and value >= 0, "an integer >= 0")
  missing = sorted(({f"{s}_{f}.npy" for s in SPLITS for f in POOL_FIELDS}
                    | {"public_x.npy", "public_y.npy", "label_hist.npy"}) - set(meta["arrays"]))
  if missing:
    raise ValueError(f"{meta_path} lists no {', '.join(missing)}: not a complete client store")
  if expect_name is not None and not dataset.startswith(expect_name):
    raise ValueError(f"{folder} holds dataset {dataset!r}, not {expect_name!r}")
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
    if name.endswith("_x.npy") and arr.dtype.kind not in "biuf":
      raise ValueError(f"{path} holds {arr.dtype} features, expected numbers (the writers write "
                       "float32)")
    arrays[name[:-4]] = arr
  pools = {split: ClientPool(*(arrays[f"{split}_{f}"] for f in POOL_FIELDS)) for split in SPLITS}
  for split, pool in pools.items():
    if list(pool.x.shape[1:]) != feature_shape:
      raise ValueError(f"{os.path.join(folder, split + '_x.npy')} holds features of shape "
                       f"{list(pool.x.shape[1:])}, {meta_path} records {feature_shape}")
    where = os.path.join(folder, f"{split}_*.npy")
    integrity.check_index(pool, where, num_clients)
    integrity.check_owners(pool, where)
    integrity.check_rows(pool, where, num_classes, features=False)
  data = FederatedDataset(pools["train"], pools["val"], pools["test"], arrays["public_x"],
                          arrays["public_y"], num_classes, np.asarray(arrays["label_hist"]),
                          dataset)
  integrity.check_dataset(data, folder, rows=False)
  hist = np.zeros((num_clients, num_classes), np.int64)
  train = pools["train"]
  for lo in range(0, train.y.shape[0], integrity.SCAN_ROWS):
    np.add.at(hist, (np.asarray(train.client_id[lo:lo + integrity.SCAN_ROWS]),
                     np.asarray(train.y[lo:lo + integrity.SCAN_ROWS])), 1)
  if np.any(hist != data.label_hist):
    k = int(np.flatnonzero(np.any(hist != data.label_hist, axis=1))[0])
    raise integrity.DataError(f"{os.path.join(folder, 'label_hist.npy')}: client {k} counts "
                              f"{data.label_hist[k].tolist()}, its training labels "
                              f"{hist[k].tolist()}")
  return data


class StoreWriter:
  """Writes a store row block by row block, never holding a split in memory: the train and test
  pools of clients whose example counts are known up front (no validation split, no public set).

  Examples:
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> writer = StoreWriter(folder, {"train": np.array([2, 1]), "test": np.array([0, 1])}, (3,), 4)
    >>> writer.put("train", 0, np.ones((2, 3)), np.array([1, 3]))
    >>> writer.put("train", 1, np.zeros((1, 3)), np.array([0]))
    >>> writer.put("test", 1, np.zeros((1, 3)), np.array([2]))
    >>> writer.close("toy").label_hist.tolist()
    [[0, 1, 0, 1], [1, 0, 0, 0]]
  """

  def __init__(self, folder: str, counts: dict, feature_shape: tuple[int, ...], num_classes: int):
    os.makedirs(folder, exist_ok=True)
    self.folder, self.feature_shape, self.num_classes = folder, tuple(feature_shape), num_classes
    self.shapes = {}
    self.pools = {}
    self.num_clients = len(counts["train"])
    for split in ("train", "test"):
      n = np.asarray(counts[split], np.int64)
      total = int(n.sum())
      self.pools[split] = {
          "x": self._memmap(f"{split}_x", (total, *self.feature_shape), np.float32),
          "y": self._memmap(f"{split}_y", (total,), np.int32),
          "client_id": self._memmap(f"{split}_client_id", (total,), np.int32),
          "counts": n.astype(np.int32),
          "offsets": np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int32)}
    self.label_hist = np.zeros((self.num_clients, num_classes), np.int32)

  def _memmap(self, name, shape, dtype):
    self.shapes[f"{name}.npy"] = [list(shape), np.dtype(dtype).name]
    return np.lib.format.open_memmap(os.path.join(self.folder, f"{name}.npy"), mode="w+",
                                     dtype=dtype, shape=shape)

  def write(self, split: str, start: int, x: np.ndarray, y: np.ndarray, owners: np.ndarray):
    """Rows `start ..` of `split`: features, labels and owning client ids."""
    p = self.pools[split]
    end = start + len(y)
    p["x"][start:end] = x
    p["y"][start:end] = y
    p["client_id"][start:end] = owners
    if split == "train":
      np.add.at(self.label_hist, (owners, y), 1)

  def put(self, split: str, k: int, x: np.ndarray, y: np.ndarray):
    """Client `k`'s rows of `split` (as many as its count says)."""
    if len(y) != self.pools[split]["counts"][k]:
      raise ValueError(f"client {k}: {len(y)} {split} rows, {self.pools[split]['counts'][k]} "
                       "counted")
    self.write(split, int(self.pools[split]["offsets"][k]), x, y, np.full(len(y), k, np.int32))

  def close(self, name: str) -> FederatedDataset:
    """Writes the index arrays, the empty validation and public sets, the label histogram and
    `store.json`; opens the store (checked as `open_store` checks every store)."""
    n, dim = self.num_clients, self.feature_shape
    for split, p in self.pools.items():
      for field in ("x", "y", "client_id"):
        p[field].flush()
      for field in ("offsets", "counts"):
        np.save(os.path.join(self.folder, f"{split}_{field}.npy"), p[field])
        self.shapes[f"{split}_{field}.npy"] = [[n], "int32"]
    empty = {"val_x": np.zeros((0, *dim), np.float32), "val_y": np.zeros((0,), np.int32),
             "val_client_id": np.zeros((0,), np.int32),
             "val_offsets": np.zeros((n,), np.int32), "val_counts": np.zeros((n,), np.int32),
             "public_x": np.zeros((0, *dim), np.float32), "public_y": np.zeros((0,), np.int32),
             "label_hist": self.label_hist}
    for field, arr in empty.items():
      np.save(os.path.join(self.folder, f"{field}.npy"), arr)
      self.shapes[f"{field}.npy"] = [list(arr.shape), arr.dtype.name]
    meta = {"name": name, "num_clients": n, "num_classes": self.num_classes,
            "feature_shape": list(dim), "arrays": self.shapes}
    with open(os.path.join(self.folder, STORE_FILE), "w", encoding="utf-8") as f:
      json.dump(meta, f, indent=1)
    return open_store(self.folder)


def synth_store(folder: str, num_clients: int, *, alpha: float = 1.0, beta: float = 1.0,
                seed: int = 0, max_samples: int | None = None, test_fraction: float = 0.1,
                block: int = 2000, dim: int = 60, num_classes: int = 10) -> FederatedDataset:
  """Writes a SYNTH(alpha, beta) population of `num_clients` clients straight to a store on disk
  and opens it; for 10^5-10^6 clients, which `sources.synthetic` would build in memory one client
  at a time.

  The distribution is SYNTH's (docs/data.md: u_k, B_k, W_k, b_k, v_k, x ~ N(v_k, diag(j^-1.2)),
  y = argmax(x W_k + b_k), n_k = int(lognormal(4, 2)) + 50, capped at `max_samples`), drawn
  `block` clients at a time with vectorized numpy from per-block seeds (so not the same draws as
  `sources.synthetic` for the same seed). Each client's first `n_k - round(test_fraction n_k)`
  examples train, the rest test; no validation split, no public set.
  """
  if num_clients < 1 or block < 1:
    raise ValueError(f"num_clients and block must be >= 1, got {num_clients}, {block}")
  if not 0.0 <= test_fraction < 1.0:
    raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
  sizes = np.random.default_rng([seed, 0]).lognormal(4, 2, num_clients).astype(np.int64) + 50
  if max_samples is not None:
    sizes = np.minimum(sizes, max_samples)
  n_test = np.minimum(np.round(test_fraction * sizes).astype(np.int64), sizes - 1)
  n_train = sizes - n_test
  writer = StoreWriter(folder, {"train": n_train, "test": n_test}, (dim,), num_classes)
  std_x = np.power(np.arange(1, dim + 1, dtype=np.float64), -1.2) ** 0.5
  for b, lo in enumerate(range(0, num_clients, block)):
    hi = min(lo + block, num_clients)
    rng = np.random.default_rng([seed, 1, b])
    count = hi - lo
    u, big_b = rng.normal(0, alpha, count), rng.normal(0, beta, count)
    v = rng.normal(big_b[:, None], 1, (count, dim))
    w = rng.normal(u[:, None, None], 1, (count, dim, num_classes))
    bias = rng.normal(u[:, None], 1, (count, num_classes))
    owner = np.repeat(np.arange(count), sizes[lo:hi])
    x = v[owner] + rng.standard_normal((len(owner), dim)) * std_x
    y = np.argmax(np.einsum("rd,rdc->rc", x, w[owner]) + bias[owner], axis=1).astype(np.int32)
    first = np.concatenate([[0], np.cumsum(sizes[lo:hi])[:-1]])
    position = np.arange(len(owner)) - first[owner]
    is_train = position < n_train[lo:hi][owner]
    for split, rows in (("train", is_train), ("test", ~is_train)):
      writer.write(split, int(writer.pools[split]["offsets"][lo]), x[rows], y[rows],
                   owner[rows] + lo)
  return writer.close(f"synth({alpha},{beta})x{num_clients}")
