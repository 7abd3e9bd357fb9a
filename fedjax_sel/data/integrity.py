"""Checks that federated data add up before anything trains on them.

A `ClientPool` is only as good as its index arrays: client k owns rows `offsets[k] : offsets[k] +
counts[k]`, so an offset or count that is off by one trains a client on its neighbour's rows, and a
label outside the classes or a NaN feature poisons every model it reaches. These checks refuse such
data, naming the argument or file, the client and the value:

- `check_pool`: the index arrays (counts >= 0, offsets the running sum of counts, every client's
  rows inside the pool, each row's `client_id` its owner's), and with `rows=True` the rows' values
  (integer labels in `0..num_classes-1`, finite features).
- `check_dataset`: every split and the public set, the splits agreeing on N and the feature shape,
  and the label histogram equal to the training labels'.
- `check_rows`: the values of rows as they are read (the host store checks what each round gathers,
  so a population too large to scan at start is still checked before it trains).

Where each runs: `Simulator` checks device-placed data whole when it is built; a memory-mapped store
(`store.open_store`) has its index arrays, owners and labels checked when opened (integer scans,
cheap beside the features) and its features when rows are first read (`placement.HostPlacement`).

Examples:
  >>> import numpy as np
  >>> from fedjax_sel.data.federated import ClientPool
  >>> pool = ClientPool.from_client_arrays([np.ones((2, 3)), np.ones((1, 3))],
  ...                                      [np.array([0, 1]), np.array([2])])
  >>> check_pool(pool, "train", num_classes=3)
  >>> try:
  ...   check_pool(pool._replace(offsets=np.array([0, 1], np.int32)), "train", num_classes=3)
  ... except DataError as e:
  ...   print(e)  # doctest: +NORMALIZE_WHITESPACE
  train: client 1: offsets[1] = 1, but the counts before it sum to 2 (offsets must be the running
  sum of counts)
"""

from __future__ import annotations

import numpy as np

from fedjax_sel.data.federated import ClientPool, FederatedDataset

# Rows per block of a value scan (bounds the temporaries of memory-mapped pools).
SCAN_ROWS = 1 << 20


class DataError(ValueError):
  """Client data that do not add up; the message names where, the client and the value."""


def _integer(name: str, a, where: str) -> np.ndarray:
  a = np.asarray(a)
  if not np.issubdtype(a.dtype, np.integer):
    raise DataError(f"{where}: {name} must hold integers, got dtype {a.dtype}")
  return a


def _first(bad: np.ndarray) -> int:
  return int(np.flatnonzero(bad)[0])


def check_index(pool: ClientPool, where: str, num_clients: int | None = None) -> None:
  """The per-client index arrays (`[N]`): shapes, counts >= 0, offsets the running sum of counts,
  every client's rows inside the pool."""
  counts = _integer("counts", pool.counts, where)
  offsets = _integer("offsets", pool.offsets, where)
  if counts.ndim != 1 or offsets.shape != counts.shape:
    raise DataError(f"{where}: counts and offsets must both be [N], got shapes {counts.shape} and "
                    f"{offsets.shape}")
  if num_clients is not None and counts.shape[0] != num_clients:
    raise DataError(f"{where}: holds {counts.shape[0]} clients, the training split {num_clients}")
  rows = np.shape(pool.x)[0] if np.ndim(pool.x) else 0
  for name in ("y", "client_id"):
    if np.shape(getattr(pool, name)) != (rows,):
      raise DataError(f"{where}: {name} must have one entry per row of x ({rows}), got shape "
                      f"{np.shape(getattr(pool, name))}")
  if np.any(counts < 0):
    k = _first(counts < 0)
    raise DataError(f"{where}: client {k}: counts[{k}] = {counts[k]} is negative")
  starts = np.concatenate([[0], np.cumsum(counts.astype(np.int64))[:-1]])
  if np.any(offsets != starts):
    k = _first(offsets != starts)
    raise DataError(f"{where}: client {k}: offsets[{k}] = {offsets[k]}, but the counts before it "
                    f"sum to {starts[k]} (offsets must be the running sum of counts)")
  total = int(counts.astype(np.int64).sum())
  if total > rows:
    raise DataError(f"{where}: the counts sum to {total} rows, the pool holds {rows}")


def check_owners(pool: ClientPool, where: str) -> None:
  """Each row's `client_id` is the client whose offset and count cover it (rows past the clients'
  belong to client N, the padding owner)."""
  counts = np.asarray(pool.counts).astype(np.int64)
  n, total = counts.shape[0], int(counts.sum())
  client_id = _integer("client_id", pool.client_id, where)
  ends = np.cumsum(counts)
  for lo in range(0, client_id.shape[0], SCAN_ROWS):
    hi = min(lo + SCAN_ROWS, client_id.shape[0])
    owner = np.searchsorted(ends, np.arange(lo, hi), side="right")  # N past the last client.
    got = np.asarray(client_id[lo:hi])
    if np.any(got != np.minimum(owner, n)):
      r = lo + _first(got != np.minimum(owner, n))
      expected = int(min(owner[r - lo], n))
      what = f"client {expected}'s" if r < total else "padding (client N)"
      raise DataError(f"{where}: row {r} is {what} but its client_id is {int(client_id[r])} "
                      "(offsets, counts and client_id disagree)")


def check_rows(pool: ClientPool, where: str, num_classes: int, *, features: bool = True,
               owners=None) -> None:
  """Every row's label is an integer in `0..num_classes-1` and (with `features`) its features are
  finite; `owners` (`[rows]`, default `client_id`; False for rows of no client) names a bad row's
  client."""
  rows = np.shape(pool.y)[0]
  y = np.asarray(pool.y[:0])
  if not np.issubdtype(y.dtype, np.integer):
    raise DataError(f"{where}: labels must be integers, got dtype {y.dtype}")
  floating = np.issubdtype(np.asarray(pool.x[:0]).dtype, np.floating)
  owners = pool.client_id if owners is None else owners
  who = lambda r: "" if owners is False else f"client {int(owners[r])}: "
  for lo in range(0, rows, SCAN_ROWS):
    hi = min(lo + SCAN_ROWS, rows)
    labels = np.asarray(pool.y[lo:hi])
    bad = (labels < 0) | (labels >= num_classes)
    if np.any(bad):
      r = lo + _first(bad)
      raise DataError(f"{where}: {who(r)}row {r} has label {int(pool.y[r])}, "
                      f"outside the {num_classes} classes 0..{num_classes - 1}")
    if floating and features:
      x = np.asarray(pool.x[lo:hi])
      bad = ~np.isfinite(x.reshape(x.shape[0], -1)).all(axis=1)
      if np.any(bad):
        r = lo + _first(bad)
        raise DataError(f"{where}: {who(r)}row {r} has a non-finite feature "
                        f"({x[r - lo].ravel()[~np.isfinite(x[r - lo].ravel())][0]})")


def check_pool(pool: ClientPool, where: str, *, num_classes: int, num_clients: int | None = None,
               rows: bool = True) -> None:
  """Index arrays; with `rows`, every row's owner, label and features too.

  Raises:
    DataError: naming `where`, the client and the value that does not add up.
  """
  check_index(pool, where, num_clients)
  if rows:
    check_owners(pool, where)
    check_rows(pool, where, num_classes)


def check_dataset(data: FederatedDataset, where: str = "data", *, rows: bool = True) -> None:
  """Every split of `data` (`check_pool`), the splits' agreement and the label histogram; with
  `rows`, the values of every row and of the public set.

  Raises:
    DataError: naming `where.split`, the client and the value.
  """
  c = data.num_classes
  if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1:
    raise DataError(f"{where}.num_classes must be an integer >= 1, got {c!r}")
  n = data.num_clients
  feature = tuple(np.shape(data.train.x)[1:])
  for split in ("train", "val", "test"):
    pool = getattr(data, split)
    check_pool(pool, f"{where}.{split}", num_classes=c, num_clients=n, rows=rows)
    if np.shape(pool.x)[0] and tuple(np.shape(pool.x)[1:]) != feature:
      raise DataError(f"{where}.{split}: features of shape {tuple(np.shape(pool.x)[1:])}, the "
                      f"training split's are {feature}")
  hist = np.asarray(data.label_hist)
  if hist.shape != (n, c):
    raise DataError(f"{where}.label_hist must be [N, C] = [{n}, {c}], got {list(hist.shape)}")
  if rows:
    counted = np.zeros((n, c), np.int64)
    np.add.at(counted, (np.asarray(data.train.client_id[:int(np.sum(data.train.counts))]),
                        np.asarray(data.train.y[:int(np.sum(data.train.counts))])), 1)
    if np.any(counted != hist):
      k = int(np.flatnonzero(np.any(counted != hist, axis=1))[0])
      raise DataError(f"{where}.label_hist: client {k} counts {hist[k].tolist()}, its training "
                      f"labels {counted[k].tolist()}")
  elif np.any(hist.sum(axis=1) != np.asarray(data.train.counts)):
    k = _first(hist.sum(axis=1) != np.asarray(data.train.counts))
    raise DataError(f"{where}.label_hist: client {k} counts {int(hist[k].sum())} labels, it "
                    f"holds {int(data.train.counts[k])} training examples")
  m = np.shape(data.public_y)[0] if np.ndim(data.public_y) else 0
  if np.shape(data.public_x)[0] != m:
    raise DataError(f"{where}: public_x holds {np.shape(data.public_x)[0]} rows, public_y {m}")
  if m and tuple(np.shape(data.public_x)[1:]) != feature:
    raise DataError(f"{where}.public_x: features of shape {tuple(np.shape(data.public_x)[1:])}, "
                    f"the training split's are {feature}")
  if m and rows:
    public = ClientPool(data.public_x, data.public_y, np.zeros((m,), np.int32),
                        np.zeros((1,), np.int32), np.full((1,), m, np.int32))
    check_rows(public, f"{where}.public", c, owners=False)
