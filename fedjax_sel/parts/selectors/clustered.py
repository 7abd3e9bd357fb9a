"""Clustered sampling (Fraboni et al., "Clustered Sampling: Low-Variance and Improved
Representativity for Clients Selection in Federated Learning", ICML 2021) as pure `Selector`s
(docs/papers/selection.md, 'Clustered sampling').

Both algorithms build K distributions over the clients, the rows of an `[K, N]` matrix R whose
rows sum to 1 and whose column k sums to `K p_k` (p_k the client's share of the data), then draw
one client from each row: in expectation client k is drawn `K p_k` times, as under MD sampling,
with a lower variance. Each draw weighs 1/K in the aggregate.

* Algorithm 1 (`clustered_size`): the clients, heaviest first, fill the K rows in turn, each row
  holding a mass of 1/K (a client may straddle two rows).
* Algorithm 2 (`clustered_similarity`): each client's representative gradient is its last
  update `w^k - w_t` (0 before it trains); the clients are clustered hierarchically (Ward) on
  the rows of their pairwise dissimilarity matrix (arccos of the cosine by default, or L1, or
  squared L2), and the tree cut into the largest subtrees holding at most 1/K of the data. The K
  heaviest clusters each make a row; the clients of the others, lightest cluster first and
  shuffled within a cluster, fill the rows' remaining mass in order.

Both work over the clients the round may choose from (the available or filtered-in ones), with
p_k their share of those clients' data. Algorithm 2 needs every such share at most 1/K (the
authors' code returns empty rows otherwise); a round where one is heavier uses Algorithm 1's rows
and says so in its report (`fallback`).

Examples:
  >>> import jax.numpy as jnp
  >>> rows = size_distributions(jnp.array([0.5, 0.3, 0.2]), jnp.ones(3, bool), 2)
  >>> np.asarray(rows, float).round(4).tolist()
  [[1.0, 0.0, 0.0], [0.0, 0.6, 0.4]]
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel import registry
from fedjax_sel.parts.selectors.baselines import stacked_rows
from fedjax_sel.parts.selectors.sampling import data_shares, draws_with_replacement
from fedjax_sel.parts.types import Footprint, RoundInputs, RoundOutcome, Scale, Selector

METRICS = ("arccos", "L1", "L2")


def line_fill(order: jax.Array, mass: jax.Array, edges: jax.Array) -> jax.Array:
  """`[B, N]`: the clients laid end to end on a line in `order` (`[N]` ids), client i taking
  `mass[i]`, cut into B bins at `edges` (`[B + 1]`, increasing): entry (b, i) is the length of
  client i's stretch inside bin b."""
  laid = mass[order]
  hi = jnp.cumsum(laid)
  lo = hi - laid
  overlap = jnp.maximum(0.0, jnp.minimum(hi[None, :], edges[1:, None])
                        - jnp.maximum(lo[None, :], edges[:-1, None]))
  return jnp.zeros((edges.shape[0] - 1, order.shape[0]), mass.dtype).at[:, order].set(overlap)


def _rows(r: jax.Array) -> jax.Array:
  return r / jnp.maximum(jnp.sum(r, axis=1, keepdims=True), 1e-30)


def size_distributions(p: jax.Array, mask: jax.Array, k: int) -> jax.Array:
  """Algorithm 1: `[K, N]` rows filled by the clients of `mask` heaviest first (ties to the
  higher index, as the authors' flipped argsort has them), each row a mass of 1/K of p."""
  p = jnp.where(mask, p, 0.0)
  order = jnp.argsort(p, stable=True)[::-1]
  return _rows(line_fill(order, k * p, jnp.arange(k + 1, dtype=p.dtype)))


def dissimilarity(table: jax.Array, metric: str) -> jax.Array:
  """`[N, N]` pairwise dissimilarity of the rows of `table`: the angle `arccos(cos)` (0 when
  either row is 0; the cosine clipped to [-1, 1]), the L1 distance, or the squared L2 one (the
  authors' names: cosine, L1, L2)."""
  if metric == "L1":
    return jax.lax.map(lambda row: jnp.sum(jnp.abs(table - row[None]), axis=1), table)
  gram = table @ table.T
  sq = jnp.diag(gram)
  if metric == "L2":
    return jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * gram, 0.0)
  norms = jnp.sqrt(sq)
  cos = gram / jnp.maximum(norms[:, None] * norms[None, :], 1e-30)
  zero = (sq[:, None] == 0) | (sq[None, :] == 0)
  return jnp.where(zero, 0.0, jnp.arccos(jnp.clip(cos, -1.0, 1.0)))


def ward_clusters(obs: jax.Array, p: jax.Array, mask: jax.Array, cap: float) -> jax.Array:
  """`[N]` flat cluster labels: Ward's agglomeration (Euclidean, Lance-Williams updates) of the
  rows of `obs` over the clients of `mask`, cut into the largest subtrees whose mass `p` is at most
  `cap`; each label is a member's id (clients outside `mask` stay alone). Ties merge the pair of
  lowest indices first."""
  n = obs.shape[0]
  sq = jnp.sum(obs * obs, axis=1)
  d = jnp.sqrt(jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * obs @ obs.T, 0.0))
  eye = jnp.eye(n, dtype=bool)
  limit = cap * (1.0 + 1e-6)

  def merge(_, carry):
    d, size, mass, active, label = carry
    live = active[:, None] & active[None, :] & ~eye
    flat = jnp.argmin(jnp.where(live, d, jnp.inf))
    a, b = flat // n, flat % n
    ok = live[a, b]
    dab, sa, sb = d[a, b], size[a], size[b]
    sv = size
    new = jnp.sqrt(jnp.maximum(((sv + sa) * d[a] ** 2 + (sv + sb) * d[b] ** 2 - sv * dab ** 2)
                               / (sa + sb + sv), 0.0))
    new = jnp.where(jnp.arange(n) == a, 0.0, new)
    d = jnp.where(ok, d.at[a, :].set(new).at[:, a].set(new), d)
    joined = ok & (mass[a] + mass[b] <= limit)
    label = jnp.where(joined & (label == label[b]), label[a], label)
    size = jnp.where(ok, size.at[a].add(sb), size)
    mass = jnp.where(ok, mass.at[a].add(mass[b]), mass)
    active = jnp.where(ok, active.at[b].set(False), active)
    return d, size, mass, active, label

  carry = (d, jnp.ones((n,), obs.dtype), jnp.where(mask, p, 0.0), mask,
           jnp.arange(n, dtype=jnp.int32))
  return jax.lax.fori_loop(0, n - 1, merge, carry)[4]


def similarity_distributions(dissim: jax.Array, p: jax.Array, mask: jax.Array, k: int,
                             shuffle: jax.Array | None = None) -> jax.Array:
  """Algorithm 2's `[K, N]` rows from the `[N, N]` dissimilarities (Ward on their rows over
  `mask`), every p_k of `mask` at most 1/K; `shuffle` (`[N]` floats) orders the clients within
  a cluster (None: by id)."""
  n = p.shape[0]
  p = jnp.where(mask, p, 0.0)
  obs = jnp.where(mask[None, :] & mask[:, None], dissim, 0.0)
  label = ward_clusters(obs, p, mask, 1.0 / k)
  mass = jax.ops.segment_sum(p, label, num_segments=n)            # each cluster's p
  members = jax.ops.segment_sum(mask.astype(jnp.int32), label, num_segments=n)
  real = members > 0
  count = jnp.sum(real)
  # Clusters by increasing mass (the authors' argsort); the K heaviest are kept, one per row.
  order = jnp.argsort(jnp.where(real, mass, jnp.inf), stable=True)
  rank = jnp.zeros((n,), jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32))
  row = rank - (count - k)                                         # the kept clusters' rows
  kept = real & (row >= 0)
  client_row = row[label]
  in_kept = mask & kept[label]
  fixed = jnp.zeros((k, n), p.dtype).at[jnp.where(in_kept, client_row, k), jnp.arange(n)].set(
      k * p, mode="drop")
  # The other clusters' clients, lightest cluster first, fill the rows' remaining mass in turn.
  within = jnp.arange(n, dtype=p.dtype) / n if shuffle is None else shuffle
  rest = mask & ~kept[label]
  key = jnp.where(rest, rank[label].astype(p.dtype) + within * 0.5, jnp.inf)
  sequence = jnp.argsort(key, stable=True)
  room = jnp.maximum(1.0 - jnp.sum(fixed, axis=1), 0.0)
  edges = jnp.concatenate([jnp.zeros((1,), p.dtype), jnp.cumsum(room)])
  return _rows(fixed + line_fill(sequence, jnp.where(rest, k * p, 0.0), edges))


def similarity_footprint(scale: Scale, metric: str) -> Footprint:
  """Algorithm 2's round (every round): the `[N, N]` dissimilarities of the `[N, D]` table (its
  Gram matrix, 2 N^2 D flops; L1 reads the table once per client, 4 N^2 D bytes), Ward's
  distances between their rows (2 N^3 flops), then N - 1 merges, each passing over the `[N, N]`
  distances five times (about 36 bytes an entry as XLA's CPU compiler fuses the loop). Its
  buffers hold 13 N^2 bytes (measured at N = 500-2000) and the table, in and out of the round.

  Example:
    >>> f = similarity_footprint(Scale(num_clients=1000, num_available=100, k=10,
    ...                                model_size=650), "arccos")
    >>> f"{f.flops:.2e} flops, {f.traffic:.2e} bytes moved, {f.memory / 1e6:.0f} MB"
    '3.30e+09 flops, 3.60e+10 bytes moved, 18 MB'
  """
  n, d = scale.num_clients, scale.model_size
  gram = 0.0 if metric == "L1" else 2.0 * n * n * d
  return Footprint(flops=gram + 2.0 * n ** 3,
                   traffic=36.0 * n * n * (n - 1) + (4.0 * n * n * d if metric == "L1" else 0.0),
                   memory=13.0 * n * n + 8.0 * n * d,
                   step=f"every round: Ward's {n - 1} merges over the [N, N] distances of the "
                        "clients' last updates",
                   cheaper="clustered_size (Algorithm 1), which samples by data size in O(N log N)")


class ClusteredState(NamedTuple):
  """Clustered sampling's state.

  Attributes:
    weights: `[N]` each client's sampling weight this round (draws / K).
    table: `[N, D]` representative gradients (Algorithm 2; `[N, 0]` for Algorithm 1).
    fallback: whether this round used Algorithm 1's rows (a client heavier than 1/K).
  """

  weights: jax.Array
  table: jax.Array
  fallback: jax.Array


def clustered_selector(algorithm: str = "similarity", metric: str = "arccos") -> Selector:
  """Clustered sampling for K draws (one per distribution).

  Args:
    algorithm: "size" (Algorithm 1) or "similarity" (Algorithm 2).
    metric: Algorithm 2's dissimilarity: "arccos" (the authors' default), "L1" or "L2"
      (squared).
  """
  if algorithm not in ("size", "similarity"):
    raise ValueError(f"clustered algorithm must be size or similarity, got {algorithm!r}")
  if metric not in METRICS:
    raise ValueError(f"clustered metric must be one of {METRICS}, got {metric!r}")
  similarity = algorithm == "similarity"

  def init(n, params):
    dim = sum(int(np.size(a)) for a in jax.tree.leaves(params)) if similarity else 0
    return ClusteredState(jnp.zeros((n,), jnp.float32), jnp.zeros((n, dim), jnp.float32),
                          jnp.asarray(False))

  def select(state, key, inputs: RoundInputs, mask):
    k = inputs.k
    p = data_shares(inputs.num_examples, mask)
    rows = size_distributions(p, mask, k)
    fallback = jnp.asarray(False)
    if similarity:
      k_shuffle, key = jax.random.split(key)
      fallback = jnp.max(p) > 1.0 / k * (1.0 + 1e-6)
      shuffle = jax.random.uniform(k_shuffle, mask.shape)
      rows = jax.lax.cond(
          fallback, lambda: rows,
          lambda: similarity_distributions(dissimilarity(state.table, metric), p, mask, k,
                                           shuffle))
    counts = jnp.where(jnp.any(mask), draws_with_replacement(key, rows), 0)
    return counts > 0, state._replace(weights=counts.astype(jnp.float32) / k, fallback=fallback)

  def observe(state, inputs: RoundInputs, outcome: RoundOutcome):
    if not similarity:
      return state
    slots = outcome.slots
    update = stacked_rows(jax.tree.map(lambda w, g: w - g[None], outcome.params, inputs.params))
    rows = jnp.where(outcome.trained[:, None], update, state.table[slots])
    return state._replace(table=state.table.at[slots].set(rows))

  return Selector(init=init, select=select, observe=observe, reads_local_models=similarity,
                  sampling_weights=lambda state: state.weights,
                  report=lambda state: {"distinct": jnp.sum(state.weights > 0),
                                        "fallback": state.fallback},
                  footprint=lambda scale: (similarity_footprint(scale, metric) if similarity
                                           else Footprint()),
                  spec={"name": f"clustered_{algorithm}",
                        **({"metric": metric} if similarity else {})})


@registry.register("selector", "clustered_size", reads="metadata")
def _clustered_size(settings, context: registry.BuildContext) -> Selector:
  """Clustered sampling, Algorithm 1: K distributions by sample size, one draw each."""
  del settings, context
  return clustered_selector("size")


@dataclasses.dataclass(frozen=True)
class ClusteredSimilaritySettings:
  """Clustered sampling, Algorithm 2 (Fraboni et al. 2021)."""

  metric: str = registry.setting("arccos", "Dissimilarity of the representative gradients: arccos "
                                 "(angle), L1, or L2 (squared).", flag="clustered_metric",
                                 choices=METRICS)


@registry.register("selector", "clustered_similarity", ClusteredSimilaritySettings,
                   reads="private")
def _clustered_similarity(settings: ClusteredSimilaritySettings,
                          context: registry.BuildContext) -> Selector:
  """Clustered sampling, Algorithm 2: Ward clusters of the clients' last updates."""
  del context
  return clustered_selector("similarity", settings.metric)
