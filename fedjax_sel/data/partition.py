"""Partitioners: split a centralized labelled pool over N clients (seeded).

Each returns a list of N index arrays into the pool; every example goes to at most one client.

Examples:
  >>> import numpy as np
  >>> y = np.repeat(np.arange(4), 10)
  >>> parts = uni_class(y, num_clients=4, num_classes=4, seed=0)
  >>> [sorted(set(y[p].tolist())) for p in parts]
  [[0], [1], [2], [3]]
"""

from __future__ import annotations

import numpy as np

PARTITIONS = ("iid", "dirichlet", "uni_class", "dominant", "k_classes", "shards",
              "inner_dirichlet", "lognormal_sizes", "power_law_sizes")


def _check_clients(num_examples: int, num_clients: int) -> None:
  if num_clients < 1:
    raise ValueError(f"num_clients must be >= 1, got {num_clients}")
  if num_clients > num_examples:
    raise ValueError(f"num_clients={num_clients} exceeds the {num_examples} examples available; "
                     f"accepted: 1..{num_examples}")


def iid(y: np.ndarray, num_clients: int, seed: int) -> list[np.ndarray]:
  """Shuffles the pool and deals it into N near-equal parts."""
  _check_clients(len(y), num_clients)
  perm = np.random.default_rng(seed).permutation(len(y))
  return [np.sort(p) for p in np.array_split(perm, num_clients)]


def dirichlet(y: np.ndarray, num_clients: int, num_classes: int, alpha: float, seed: int,
              min_size: int = 2, max_tries: int = 100) -> list[np.ndarray]:
  """Per class, proportions over clients ~ Dirichlet(alpha); redrawn until every client has
  at least `min_size` examples."""
  _check_clients(len(y), num_clients)
  if alpha <= 0:
    raise ValueError(f"dirichlet alpha must be > 0, got {alpha}")
  if num_clients * min_size > len(y):
    raise ValueError(f"num_clients={num_clients} with min_size={min_size} needs "
                     f"{num_clients * min_size} examples, only {len(y)} available")
  rng = np.random.default_rng(seed)
  for _ in range(max_tries):
    parts = [[] for _ in range(num_clients)]
    for c in range(num_classes):
      idx = rng.permutation(np.flatnonzero(y == c))
      props = rng.dirichlet(np.full(num_clients, alpha))
      cuts = (np.cumsum(props)[:-1] * len(idx)).astype(int)
      for k, chunk in enumerate(np.split(idx, cuts)):
        parts[k].extend(chunk.tolist())
    if min(len(p) for p in parts) >= min_size:
      return [np.sort(np.array(p, dtype=np.int64)) for p in parts]
  raise ValueError(f"dirichlet(alpha={alpha}) could not give every one of {num_clients} clients "
                   f"{min_size} examples in {max_tries} draws; raise alpha or lower num_clients")


def _deal_classes(y: np.ndarray, owners: list[list[int]], num_classes: int,
                  rng: np.random.Generator) -> list[np.ndarray]:
  """Splits each class evenly among the clients listed as its owners."""
  parts = [[] for _ in range(len(owners))]
  holders = [[k for k, cls in enumerate(owners) if c in cls] for c in range(num_classes)]
  for c, ks in enumerate(holders):
    if not ks:
      continue
    idx = rng.permutation(np.flatnonzero(y == c))
    if len(idx) < len(ks):
      raise ValueError(f"class {c} has {len(idx)} examples for {len(ks)} clients that must hold "
                       f"it; "
                       "lower num_clients or classes per client")
    for k, chunk in zip(ks, np.array_split(idx, len(ks))):
      parts[k].extend(chunk.tolist())
  return [np.sort(np.array(p, dtype=np.int64)) for p in parts]


def uni_class(y: np.ndarray, num_clients: int, num_classes: int, seed: int) -> list[np.ndarray]:
  """Client k holds only class `k mod num_classes` (FedALIGN's shards)."""
  _check_clients(len(y), num_clients)
  owners = [[k % num_classes] for k in range(num_clients)]
  return _deal_classes(y, owners, num_classes, np.random.default_rng(seed))


def k_classes(y: np.ndarray, num_clients: int, num_classes: int, k: int,
              seed: int) -> list[np.ndarray]:
  """Each client holds k distinct classes (client j gets classes j, j+1, ..., j+k-1 mod C after a
  seeded class permutation), each class split evenly among its holders."""
  _check_clients(len(y), num_clients)
  if not 1 <= k <= num_classes:
    raise ValueError(f"classes_per_client must be in 1..{num_classes}, got {k}")
  rng = np.random.default_rng(seed)
  cls = rng.permutation(num_classes)
  owners = [[int(cls[(j + i) % num_classes]) for i in range(k)] for j in range(num_clients)]
  return _deal_classes(y, owners, num_classes, rng)


def dominant(y: np.ndarray, num_clients: int, num_classes: int, fraction: float,
             seed: int) -> list[np.ndarray]:
  """Equal-size clients; client k draws `fraction` of its examples from class `k mod C` and the
  rest from the other classes (FedSRC's non-IID setting, fraction 0.8).

  Every client gets exactly `len(y) // N` examples, `round(fraction * size)` of its own class and
  none other of it. The rest are drawn one example a client at a time (the clients in a seeded
  order each pass), from another class chosen with probability proportional to what is left of it,
  so the classes run out together and the last clients get the same mix as the first; a client
  that finds only its own class left swaps with a client that can take that class.

  Raises:
    ValueError: naming the classes that cannot give every client its dominant examples, or when
      the remaining examples cannot fill the clients (too few outside some class).
  """
  _check_clients(len(y), num_clients)
  if not 0.0 <= fraction <= 1.0:
    raise ValueError(f"dominant_fraction must be in [0, 1], got {fraction}")
  rng = np.random.default_rng(seed)
  size = len(y) // num_clients
  n_dom = int(round(fraction * size))
  own = np.arange(num_clients) % num_classes
  pools = [list(rng.permutation(np.flatnonzero(y == c))) for c in range(num_classes)]
  need = np.bincount(own, minlength=num_classes) * n_dom
  short = [c for c in range(num_classes) if need[c] > len(pools[c])]
  if short:
    raise ValueError(f"dominant_fraction={fraction}: classes {short} have too few examples for "
                     f"{n_dom} dominant examples per client; lower the fraction or num_clients")
  # Reserve every client's dominant examples first, then deal the rest.
  mine = [[pools[own[k]].pop() for _ in range(n_dom)] for k in range(num_clients)]
  rest = [[] for _ in range(num_clients)]  # Each client's examples of other classes.
  for _ in range(size - n_dom):
    for k in rng.permutation(num_clients):
      left = np.array([len(p) for p in pools], np.float64)
      left[own[k]] = 0.0
      if left.sum() > 0:
        rest[k].append(pools[int(rng.choice(num_classes, p=left / left.sum()))].pop())
        continue
      # Only class own[k] is left: a client of another class gives k one of its examples of a
      # third class and takes one of own[k]'s instead.
      takers = [m for m in rng.permutation(num_clients) if own[m] != own[k]
                and any(y[i] != own[k] for i in rest[m])]
      if not takers:
        raise ValueError(f"dominant_fraction={fraction}: {len(pools[own[k]])} examples left, all "
                         f"of client {k}'s own class {own[k]}; lower num_clients or the fraction")
      m = takers[0]
      give = next(j for j, i in enumerate(rest[m]) if y[i] != own[k])
      rest[k].append(rest[m][give])
      rest[m][give] = pools[own[k]].pop()
  return [np.sort(np.array(m + r, dtype=np.int64)) for m, r in zip(mine, rest)]


def shards(y: np.ndarray, num_clients: int, shards_per_client: int,
           seed: int) -> list[np.ndarray]:
  """McMahan et al.'s shards (Flower's `ShardPartitioner`): the pool sorted by label (ties in a
  seeded random order) is cut into `num_clients * shards_per_client` equal shards (the remainder
  left out), dealt at random, `shards_per_client` to each client."""
  _check_clients(len(y), num_clients)
  total = num_clients * shards_per_client
  if shards_per_client < 1 or total > len(y):
    raise ValueError(f"shards_per_client must be in 1..{len(y) // num_clients} ({len(y)} examples "
                     f"over {num_clients} clients), got {shards_per_client}")
  rng = np.random.default_rng(seed)
  perm = rng.permutation(len(y))
  ordered = perm[np.argsort(y[perm], kind="stable")]
  size = len(y) // total
  cut = ordered[:total * size].reshape(total, size)[rng.permutation(total)]
  return [np.sort(cut[i * shards_per_client:(i + 1) * shards_per_client].ravel())
          for i in range(num_clients)]


def inner_dirichlet(y: np.ndarray, num_clients: int, num_classes: int, alpha: float,
                    seed: int, sizes: np.ndarray | None = None) -> list[np.ndarray]:
  """Fixed client sizes, labels drawn per client (Flower's `InnerDirichletPartitioner`): client
  k draws a class distribution ~ Dirichlet(alpha) and then its `sizes[k]` examples one at a time
  from it, a class that runs out leaving the distribution (renormalized). Default sizes: the
  pool in N near-equal parts."""
  _check_clients(len(y), num_clients)
  if alpha <= 0:
    raise ValueError(f"dirichlet alpha must be > 0, got {alpha}")
  sizes = (np.array([len(a) for a in np.array_split(np.arange(len(y)), num_clients)])
           if sizes is None else np.asarray(sizes, np.int64))
  if sizes.shape != (num_clients,) or sizes.min() < 1 or sizes.sum() > len(y):
    raise ValueError(f"sizes must be {num_clients} counts >= 1 summing to at most {len(y)}, got "
                     f"{sizes.tolist()[:10]}")
  rng = np.random.default_rng(seed)
  pools = [list(rng.permutation(np.flatnonzero(y == c))) for c in range(num_classes)]
  parts = []
  for k in range(num_clients):
    probs = rng.dirichlet(np.full(num_classes, alpha))
    mine = []
    for u in rng.random(int(sizes[k])):
      live = np.array([len(p) > 0 for p in pools])
      p = np.where(live, probs, 0.0)
      if p.sum() <= 0:  # The classes this client favours ran out: the others, evenly.
        p = live.astype(np.float64)
      c = int(np.searchsorted(np.cumsum(p / p.sum()), u, side="right"))
      mine.append(pools[min(c, num_classes - 1)].pop())
    parts.append(np.sort(np.array(mine, dtype=np.int64)))
  return parts


def skewed_sizes(num_examples: int, num_clients: int, distribution: str, skew: float,
                 rng: np.random.Generator) -> np.ndarray:
  """N client sizes summing to `num_examples`, each >= 1: proportional to log-normal draws
  (sigma = `skew`) or to Pareto draws (power law, shape = `skew`: heavier tail when smaller)."""
  if skew <= 0:
    raise ValueError(f"size_skew must be > 0, got {skew}")
  draws = (rng.lognormal(0.0, skew, num_clients) if distribution == "lognormal"
           else 1.0 + rng.pareto(skew, num_clients))
  share = draws / draws.sum() * (num_examples - num_clients)
  sizes = 1 + np.floor(share).astype(np.int64)
  left = num_examples - sizes.sum()  # Largest remainders first.
  sizes[np.argsort(-(share - np.floor(share)), kind="stable")[:left]] += 1
  return sizes


def quantity_skew(y: np.ndarray, num_clients: int, distribution: str, skew: float,
                  seed: int) -> list[np.ndarray]:
  """IID labels, skewed sizes (`skewed_sizes`): the shuffled pool dealt in those sizes."""
  _check_clients(len(y), num_clients)
  rng = np.random.default_rng(seed)
  sizes = skewed_sizes(len(y), num_clients, distribution, skew, rng)
  perm = rng.permutation(len(y))
  return [np.sort(p) for p in np.split(perm, np.cumsum(sizes)[:-1])]


def natural_id(groups: np.ndarray) -> list[np.ndarray]:
  """One client per distinct value of `groups` (a writer, speaker or user id per example;
  Flower's `NaturalIdPartitioner`), in sorted order of the values.

  Examples:
    >>> [p.tolist() for p in natural_id(np.array(["b", "a", "b"]))]
    [[1], [0, 2]]
  """
  groups = np.asarray(groups)
  _, inverse = np.unique(groups, return_inverse=True)
  order = np.argsort(inverse, kind="stable")
  return np.split(order.astype(np.int64), np.cumsum(np.bincount(inverse))[:-1])


def partition(name: str, y: np.ndarray, num_clients: int, num_classes: int, seed: int, *,
              alpha: float = 0.5, k: int = 2, fraction: float = 0.8,
              shards_per_client: int = 2, size_skew: float = 1.0) -> list[np.ndarray]:
  """Dispatches to a partitioner by name (one of `PARTITIONS`)."""
  make = {
      "iid": lambda: iid(y, num_clients, seed),
      "dirichlet": lambda: dirichlet(y, num_clients, num_classes, alpha, seed),
      "uni_class": lambda: uni_class(y, num_clients, num_classes, seed),
      "dominant": lambda: dominant(y, num_clients, num_classes, fraction, seed),
      "k_classes": lambda: k_classes(y, num_clients, num_classes, k, seed),
      "shards": lambda: shards(y, num_clients, shards_per_client, seed),
      "inner_dirichlet": lambda: inner_dirichlet(y, num_clients, num_classes, alpha, seed),
      "lognormal_sizes": lambda: quantity_skew(y, num_clients, "lognormal", size_skew, seed),
      "power_law_sizes": lambda: quantity_skew(y, num_clients, "pareto", size_skew, seed),
  }
  if name not in make:
    raise ValueError(f"unknown partition {name!r}; accepted: {', '.join(PARTITIONS)}")
  return make[name]()
