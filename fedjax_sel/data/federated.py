"""Federated data held as flat example pools with per-client offsets.

Every split of every client lives in one flat array (`x [total, ...]`), ordered by client;
client k owns rows `offsets[k] : offsets[k] + counts[k]`. Storage carries no padding at all, so
skewed client sizes cost nothing; batches are gathered by index with an example mask, and the
compute loops bound their padding by processing clients sorted by size (see `local_training`).

Examples:
  >>> import numpy as np
  >>> pool = ClientPool.from_client_arrays(
  ...     [np.zeros((3, 2)), np.ones((1, 2))], [np.array([0, 1, 1]), np.array([2])])
  >>> pool.counts.tolist(), pool.offsets.tolist(), pool.max_count
  ([3, 1], [0, 3], 3)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class ClientPool(NamedTuple):
  """One split (train, validation or test) of all N clients, flattened.

  Attributes:
    x: `[total, ...]` features of every client's examples, client by client.
    y: `[total]` int32 labels.
    client_id: `[total]` int32 owner of each row.
    offsets: `[N]` int32 first row of each client.
    counts: `[N]` int32 number of rows of each client.
  """

  x: np.ndarray
  y: np.ndarray
  client_id: np.ndarray
  offsets: np.ndarray
  counts: np.ndarray

  @property
  def num_clients(self) -> int:
    return int(self.counts.shape[0])

  @property
  def max_count(self) -> int:
    """Largest client: the static length of per-client index tables."""
    return int(np.max(self.counts)) if self.counts.size else 0

  @staticmethod
  def from_client_arrays(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray]) -> ClientPool:
    """Builds a pool from per-client `(x_k, y_k)` arrays (clients may be empty)."""
    if len(xs) != len(ys):
      raise ValueError(f"xs and ys must have the same number of clients, got {len(xs)} and "
                       f"{len(ys)}")
    counts = np.array([len(y) for y in ys], dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
    x = np.concatenate([np.asarray(a, dtype=np.float32) for a in xs], axis=0)
    y = np.concatenate([np.asarray(a) for a in ys], axis=0).astype(np.int32)
    client_id = np.repeat(np.arange(len(ys), dtype=np.int32), counts)
    return ClientPool(x, y, client_id, offsets, counts)

  def client(self, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Client k's `(x, y)` as numpy arrays (for tests and reference loops)."""
    lo, n = int(self.offsets[k]), int(self.counts[k])
    return np.asarray(self.x[lo:lo + n]), np.asarray(self.y[lo:lo + n])

  def map_clients(self, fn) -> ClientPool:
    """Rebuilds the pool with `fn(k, x_k, y_k) -> (x_k, y_k)` applied to every client."""
    pairs = [fn(k, *self.client(k)) for k in range(self.num_clients)]
    return ClientPool.from_client_arrays([p[0] for p in pairs], [p[1] for p in pairs])


class FederatedDataset(NamedTuple):
  """Per-client train / validation / test pools, a server-held public set and metadata.

  Attributes:
    train, val, test: `ClientPool`s over the same N clients.
    public_x, public_y: the server's public set `[m, ...]`, `[m]` (may be empty).
    num_classes: number of labels.
    label_hist: `[N, num_classes]` int32 histogram of each client's training labels.
    name: a short description used in logs.
  """

  train: ClientPool
  val: ClientPool
  test: ClientPool
  public_x: np.ndarray
  public_y: np.ndarray
  num_classes: int
  label_hist: np.ndarray
  name: str = "federated"

  @property
  def num_clients(self) -> int:
    return self.train.num_clients

  @property
  def feature_shape(self) -> tuple[int, ...]:
    return tuple(self.train.x.shape[1:])


def label_histogram(pool: ClientPool, num_classes: int) -> np.ndarray:
  """`[N, num_classes]` counts of each client's labels."""
  hist = np.zeros((pool.num_clients, num_classes), dtype=np.int32)
  np.add.at(hist, (pool.client_id, pool.y), 1)
  return hist


def split_clients(
    xs: Sequence[np.ndarray],
    ys: Sequence[np.ndarray],
    *,
    num_classes: int,
    val_fraction: float = 0.0,
    test_fraction: float = 0.2,
    seed: int = 0,
    public: tuple[np.ndarray, np.ndarray] | None = None,
    name: str = "federated",
    tests: tuple[Sequence[np.ndarray], Sequence[np.ndarray]] | None = None,
) -> FederatedDataset:
  """Splits each client's examples into train / validation / test (shuffled, seeded).

  Each client keeps at least one training example; validation and test take
  `round(fraction * n_k)` of the rest (by default no validation split and a fifth for test, as
  `DatasetSpec`'s defaults). `tests`, a published per-client test split `(xs, ys)`,
  is the test pool instead (`test_fraction` must then be 0).
  """
  if tests is not None and test_fraction:
    raise ValueError(f"test_fraction must be 0 with a published test split, got {test_fraction}")
  for flag, frac in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
    if not 0.0 <= frac < 1.0:
      raise ValueError(f"{flag} must be in [0, 1), got {frac}")
  if val_fraction + test_fraction >= 1.0:
    raise ValueError("val_fraction + test_fraction must be < 1, got "
                     f"{val_fraction} + {test_fraction}")
  for k, y in enumerate(ys):
    labels = np.asarray(y)
    bad = labels[(labels < 0) | (labels >= num_classes)] if labels.size else labels
    if bad.size or (labels.size and labels.dtype.kind not in "iu"):
      value = bad[0] if bad.size else labels.dtype
      raise ValueError(f"client {k}: label {value} is not an integer class in 0.."
                       f"{num_classes - 1} (num_classes={num_classes})")
  rng = np.random.default_rng(seed)
  parts = {"train": ([], []), "val": ([], []), "test": ([], [])}
  for x, y in zip(xs, ys):
    perm = rng.permutation(len(y))
    n_test = min(int(round(test_fraction * len(y))), max(len(y) - 1, 0))
    n_val = min(int(round(val_fraction * len(y))), max(len(y) - 1 - n_test, 0))
    cuts = {"test": perm[:n_test], "val": perm[n_test:n_test + n_val],
            "train": perm[n_test + n_val:]}
    for split, idx in cuts.items():
      parts[split][0].append(np.asarray(x)[idx])
      parts[split][1].append(np.asarray(y)[idx])
  if tests is not None:
    parts["test"] = (list(tests[0]), list(tests[1]))
  pools = {k: ClientPool.from_client_arrays(*v) for k, v in parts.items()}
  feat = pools["train"].x.shape[1:]
  px, py = public if public is not None else (np.zeros((0, *feat), np.float32),
                                              np.zeros((0,), np.int32))
  return FederatedDataset(
      train=pools["train"], val=pools["val"], test=pools["test"],
      public_x=np.asarray(px, np.float32), public_y=np.asarray(py, np.int32),
      num_classes=num_classes, label_hist=label_histogram(pools["train"], num_classes), name=name)


def rows_with_replacement(u: jax.Array, offset: jax.Array, count: jax.Array,
                          total_rows: int) -> jax.Array:
  """Pool rows of a client drawn uniformly with replacement: `u` in [0, 1) (any shape, broadcast
  against the client's `offset` / `count`) -> rows in `offset .. offset + count - 1` (clipped into
  the pool for empty clients, whose draws must be masked)."""
  idx = jnp.minimum((u * count).astype(jnp.int32), jnp.maximum(count - 1, 0))
  return jnp.clip(offset + idx, 0, total_rows - 1)


def device_pool(pool: ClientPool) -> ClientPool:
  """The pool as device arrays (jit arguments rather than baked-in constants)."""
  return ClientPool(*(jax.device_put(np.asarray(a)) for a in pool))
