"""Bad clients: corrupted labels or features on a chosen share of the clients
(docs/papers/fedsrc.md).

Kinds:
  shuffle: every label replaced by a uniformly random class (over all C classes).
  flip: every label set to one class drawn per client among those other than its most frequent
    training label (one wrong class per client, the same in its training and validation splits).
  noise: features x + N(0, 0.7^2), clipped back to the pool's feature range.

The training and validation splits of the bad clients are corrupted; test splits stay clean so that
the global model is always scored on true labels. The bad clients are returned as a mask.

Examples:
  >>> data, bad = corrupt_clients(data, fraction=0.3, kinds=("shuffle",), seed=0)  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np

from fedjax_sel.data.federated import ClientPool, FederatedDataset, label_histogram

KINDS = ("shuffle", "flip", "noise")
GOOD = "good"


def _corrupt_pool(pool: ClientPool, bad_kind: dict[int, str], wrong: dict[int, int],
                  num_classes: int, noise_std: float, lo: float, hi: float,
                  rng: np.random.Generator) -> ClientPool:
  def fn(k, x, y):
    kind = bad_kind.get(k)
    if kind == "shuffle":
      y = rng.integers(0, num_classes, len(y)).astype(np.int32)
    elif kind == "flip":
      y = np.full(len(y), wrong[k], np.int32)
    elif kind == "noise":
      x = np.clip(x + rng.normal(0.0, noise_std, x.shape), lo, hi).astype(np.float32)
    return x, y
  return pool.map_clients(fn)


def corrupt_clients(data: FederatedDataset, fraction: float, kinds: tuple[str, ...] = KINDS,
                    seed: int = 0, noise_std: float = 0.7) -> tuple[FederatedDataset, np.ndarray]:
  """Corrupts `round(fraction * N)` clients, the kinds split evenly among them.

  Returns:
    (the corrupted dataset, `[N]` bool mask of bad clients).
  """
  if not 0.0 <= fraction <= 1.0:
    raise ValueError(f"corrupt_fraction must be in [0, 1], got {fraction}")
  unknown = set(kinds) - set(KINDS)
  if unknown or not kinds:
    raise ValueError(f"corruption kinds must be a non-empty subset of {KINDS}, got {kinds}")
  n = data.num_clients
  rng = np.random.default_rng(seed)
  kind_of = _assign_kinds(n, fraction, kinds, rng)
  bad_kind = {int(k): str(kind_of[k]) for k in np.flatnonzero(kind_of != GOOD)}
  lo, hi = float(data.train.x.min()), float(data.train.x.max())
  # A flipped client's one wrong class: other than its most frequent training label.
  c = data.num_classes
  wrong = {k: int((np.asarray(data.label_hist[k]).argmax() + rng.integers(1, c)) % c)
           for k, kind in bad_kind.items() if kind == "flip"}
  train = _corrupt_pool(data.train, bad_kind, wrong, c, noise_std, lo, hi, rng)
  val = _corrupt_pool(data.val, bad_kind, wrong, c, noise_std, lo, hi, rng)
  return data._replace(train=train, val=val,
                       label_hist=label_histogram(train, data.num_classes)), kind_of != GOOD


def _assign_kinds(n: int, fraction: float, kinds: tuple[str, ...],
                  rng: np.random.Generator) -> np.ndarray:
  bad_ids = np.sort(rng.permutation(n)[:int(round(fraction * n))])
  kind_of = np.full(n, GOOD, dtype=object)
  for i, k in enumerate(bad_ids):
    kind_of[k] = kinds[i % len(kinds)]
  return kind_of.astype(str)


def corruption_kinds(num_clients: int, fraction: float, kinds: tuple[str, ...] = KINDS,
                     seed: int = 0) -> np.ndarray:
  """`[N]` str: each client's corruption kind ("good" for clean clients), as `corrupt_clients` with
  the same arguments assigns them."""
  return _assign_kinds(num_clients, fraction, kinds, np.random.default_rng(seed))


NOISE_PRESETS = {"low": (0.1, 0.1), "medium": (0.3, 0.3), "high": (0.5, 0.5)}
LABEL_NOISE_MODES = ("random", "flip")


def noisy_clients(data: FederatedDataset, clients: np.ndarray, label_noise: float,
                  irrelevant: float, seed: int = 0, mode: str = "random",
                  offset: float = 3.0) -> FederatedDataset:
  """FedALIGN's parameterized noise (docs/papers/fedalign.md) on the training and validation data of
  `clients` (`[N]` bool); test splits stay clean.

  Per client, a `label_noise` share of its examples gets a wrong label (`mode="random"`: a uniform
  class over all C, possibly the true one; `"flip"`: a different class), and a disjoint
  `irrelevant` share is replaced by points from an independent distribution: features
  N(offset, 1) per coordinate, labels uniform over the C classes.

  Examples:
    >>> import numpy as np
    >>> from fedjax_sel.data.builders import DatasetSpec, build_dataset
    >>> data = build_dataset(DatasetSpec("synth", num_clients=4), seed=0)
    >>> noisy = noisy_clients(data, np.array([False, True, True, True]), 0.5, 0.2, seed=0)
    >>> bool((noisy.train.client(0)[1] == data.train.client(0)[1]).all())
    True
  """
  for name, v in (("label_noise", label_noise), ("irrelevant_fraction", irrelevant)):
    if not 0.0 <= v <= 1.0:
      raise ValueError(f"{name} must be in [0, 1], got {v}")
  if label_noise + irrelevant > 1.0:
    raise ValueError(f"label_noise + irrelevant_fraction must be <= 1, got {label_noise} + "
                     f"{irrelevant}")
  if mode not in LABEL_NOISE_MODES:
    raise ValueError(f"label noise mode must be one of {LABEL_NOISE_MODES}, got {mode!r}")
  rng = np.random.default_rng(seed)
  c = data.num_classes

  def fn(k, x, y):
    if not clients[k] or not len(y):
      return x, y
    x, y = x.copy(), y.copy()
    perm = rng.permutation(len(y))
    n_lab, n_irr = int(round(label_noise * len(y))), int(round(irrelevant * len(y)))
    lab, irr = perm[:n_lab], perm[n_lab:n_lab + n_irr]
    if mode == "random":
      y[lab] = rng.integers(0, c, len(lab))
    else:
      y[lab] = (y[lab] + rng.integers(1, c, len(lab))) % c
    x[irr] = rng.normal(offset, 1.0, (len(irr), *x.shape[1:]))
    y[irr] = rng.integers(0, c, len(irr))
    return x.astype(np.float32), y.astype(np.int32)

  train, val = data.train.map_clients(fn), data.val.map_clients(fn)
  return data._replace(train=train, val=val, label_hist=label_histogram(train, c))
