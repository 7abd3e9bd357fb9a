"""Aggregators: combine the stacked `[K, ...]` local models of the aggregated slots.

Each factory returns an `Aggregator(init, apply)`; `apply(state, global_params, client_params,
inputs)` returns the new global model; with no aggregated slot the global model is kept.

Examples:
  >>> import jax.numpy as jnp
  >>> from fedjax_sel.parts.types import AggregateInputs
  >>> agg = fedavg(weighting="examples")
  >>> new, _ = agg.apply((), jnp.zeros(2), jnp.array([[1., 1.], [4., 4.]]),
  ...                    AggregateInputs(jnp.array([True, True]), jnp.array([3, 1]), jnp.zeros(2)))
  >>> new.tolist()
  [1.75, 1.75]
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel import registry
from fedjax_sel.parts.types import AggregateInputs, Aggregator

WEIGHTINGS = ("uniform", "examples")


def normalized(weights: jax.Array) -> jax.Array:
  """`w / sum(w)`, or all zeros when the weights sum to 0."""
  total = jnp.sum(weights)
  return jnp.where(total > 0, weights / jnp.maximum(total, 1e-30), 0.0)


def weighted_mean(client_params, weights: jax.Array, fallback):
  """`sum_k w_k p_k / sum_k w_k`, or `fallback` when all weights are 0."""
  total = jnp.sum(weights)
  safe = normalized(weights)

  def avg(stack, old):
    # Zero-weight slots are zeroed, not multiplied by 0: a non-finite model they hold stays out.
    kept = jnp.where((safe > 0).reshape(-1, *([1] * (stack.ndim - 1))), stack, 0)
    mean = jnp.tensordot(safe, kept, axes=1)
    return jnp.where(total > 0, mean, old)

  return jax.tree.map(avg, client_params, fallback)


def sampled_update(global_params, client_params, mask: jax.Array, sampling_weights: jax.Array):
  """`w + sum_k c_k (w^k - w)` over the slots of `mask`: an unbiased sampler's estimator of full
  participation, with the selector's sampling weights c_k (`Selector.sampling_weights`).

  Examples:
    >>> import jax.numpy as jnp
    >>> sampled_update(jnp.zeros(1), jnp.array([[2.], [4.]]), jnp.array([True, True]),
    ...                jnp.array([0.5, 0.25])).tolist()
    [2.0]
  """
  c = jnp.where(mask, sampling_weights, 0.0).astype(jnp.float32)

  def leaf(stack, old):
    kept = jnp.where((c != 0).reshape(-1, *([1] * (stack.ndim - 1))), stack, 0)
    moved = jnp.tensordot(c, kept.astype(jnp.float32), axes=1) + (1.0 - jnp.sum(c)) * old
    return moved.astype(old.dtype)

  return jax.tree.map(leaf, client_params, global_params)


def fedavg(weighting: str = "examples") -> Aggregator:
  """FedAvg: mean of the aggregated models, uniform or weighted by m_k; after a selector with
  sampling weights (an unbiased sampler), that sampler's estimator `sampled_update` instead."""
  if weighting not in WEIGHTINGS:
    raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")

  def weights(mask: jax.Array, num_examples: jax.Array) -> jax.Array:
    w = mask.astype(jnp.float32)
    if weighting == "examples":
      w = w * num_examples.astype(jnp.float32)
    return w

  def apply(state, global_params, client_params, inputs: AggregateInputs):
    if inputs.sampling_weights is not None:
      return sampled_update(global_params, client_params, inputs.mask,
                            inputs.sampling_weights), state
    return weighted_mean(client_params, weights(inputs.mask, inputs.num_examples),
                         global_params), state

  return Aggregator(init=lambda n, params: (), apply=apply,
                    linear_weights=lambda mask, n: normalized(weights(mask, n)),
                    spec={"name": "fedavg", "weighting": weighting},
                    applies_sampling_weights=True)


# --- Robust aggregators (docs/papers/fedsrc.md) -----------------------------------------------
# They see all K slots and the mask of the slots to aggregate; masked-out slots never influence the
# result. A sampler's sampling weights are ignored: the chosen clients are aggregated as a set
# (a median or Krum of reweighted updates is no longer robust; docs/papers/selection.md).
# Statistics run in float32 and the result is cast back to each leaf's dtype (bfloat16
# models sort and average in float32). With no aggregated slot the global model is kept.

TRIM_ROUNDINGS = ("floor", "ceil")


# Slots up to which a sort along them is a network of compare-exchanges, elementwise over the
# coordinates, instead of XLA's sort (on CPU a comparator call per comparison: FedSRC's median
# and trimmed-mean rounds took 90 ms against FedAvg's 32 at K = 10).
NETWORK_SLOTS = 32


def _sort_key(bits: jax.Array) -> jax.Array:
  """A float32's bits as an unsigned key in `jnp.sort`'s order on CPU: NaN last, and zeros and
  subnormals equal (XLA:CPU compares with subnormals as zero)."""
  top = jnp.uint32(0x80000000)
  key = jnp.where(bits >= top, ~bits, bits | top)
  key = jnp.where((bits & jnp.uint32(0x7F800000)) == 0, top, key)
  return jnp.where((bits & jnp.uint32(0x7FFFFFFF)) > jnp.uint32(0x7F800000),
                   jnp.uint32(0xFFFFFFFF), key)


def sort_slots(stack: jax.Array) -> jax.Array:
  """`jnp.sort(stack, axis=0)` of a float32 stack, bit for bit: on CPU, for up to
  `NETWORK_SLOTS` slots, an odd-even transposition network (K rounds of adjacent compare-exchanges,
  in a loop, that swap only a pair strictly out of order, so equal values keep their order, as
  `jnp.sort`'s stable sort keeps them). Values and keys move as unsigned integers: no float
  operation touches them, so none is flushed.

  Example:
    >>> sort_slots(jnp.array([[3.0, -0.0], [1.0, jnp.nan], [2.0, 0.0]])).tolist()
    [[1.0, -0.0], [2.0, 0.0], [3.0, nan]]
  """
  k = stack.shape[0]
  if (k > NETWORK_SLOTS or not k or stack.dtype != jnp.float32
      or jax.default_backend() != "cpu"):
    return jnp.sort(stack, axis=0)
  bits = jax.lax.bitcast_convert_type(stack, jnp.uint32)

  def exchange(rows_and_keys, start):
    """One phase: the pairs (start, start + 1), (start + 2, start + 3), ... compare-exchanged."""
    n = (k - start) // 2
    if n == 0:
      return rows_and_keys
    end = start + 2 * n
    keys = rows_and_keys[1]
    swap = keys[start + 1:end:2] < keys[start:end:2]

    def moved(rows):
      a, b = rows[start:end:2], rows[start + 1:end:2]
      pairs = jnp.stack([jnp.where(swap, b, a), jnp.where(swap, a, b)], axis=1)
      return jnp.concatenate([rows[:start], pairs.reshape(2 * n, *rows.shape[1:]), rows[end:]])

    return tuple(moved(rows) for rows in rows_and_keys)

  # (k + 1) // 2 pairs of phases: at least the k rounds the network needs.
  bits, _ = jax.lax.fori_loop(0, (k + 1) // 2, lambda _, x: exchange(exchange(x, 0), 1),
                              (bits, _sort_key(bits)))
  return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _masked_sorted(stack: jax.Array, mask: jax.Array) -> jax.Array:
  """`stack [K, ...]` sorted along the slots with masked-out slots last (+inf), in float32."""
  m = mask.reshape(-1, *([1] * (stack.ndim - 1)))
  return sort_slots(jnp.where(m, stack.astype(jnp.float32), jnp.inf))


def _take_rank(sorted_stack: jax.Array, rank: jax.Array) -> jax.Array:
  return jax.lax.dynamic_index_in_dim(sorted_stack, rank, axis=0, keepdims=False)


def _median_of_sorted(s: jax.Array, mask: jax.Array) -> jax.Array:
  """The median of the `mask` slots from their sorted stack `s` (masked-out slots last)."""
  n = jnp.sum(mask)
  lo, hi = (n - 1) // 2, n // 2
  return 0.5 * (_take_rank(s, jnp.maximum(lo, 0)) + _take_rank(s, jnp.maximum(hi, 0)))


def _masked_median_leaf(stack: jax.Array, mask: jax.Array) -> jax.Array:
  return _median_of_sorted(_masked_sorted(stack, mask), mask)


def _sorted_statistic(stat):
  """An aggregator's apply from `stat(sorted [K, ...], mask) -> float32 leaf`, a statistic of each
  leaf's slots sorted (masked-out slots last), with the dtype cast and the empty case. The slots
  are sorted once for the whole model, every leaf's coordinates side by side (one sort to
  compile), and the statistic is taken leaf by leaf."""
  def apply(state, global_params, client_params, inputs: AggregateInputs):
    mask = inputs.mask
    some = jnp.any(mask)
    stacks, tree = jax.tree.flatten(client_params)
    k = stacks[0].shape[0]
    flat = jnp.concatenate([st.reshape(k, -1).astype(jnp.float32) for st in stacks], axis=1)
    ends = np.cumsum([int(np.prod(st.shape[1:])) for st in stacks])[:-1]
    ordered = jnp.split(_masked_sorted(flat, mask), ends, axis=1)
    new = [jnp.where(some, stat(s.reshape(st.shape), mask), g).astype(g.dtype)
           for s, st, g in zip(ordered, stacks, jax.tree.leaves(global_params))]
    return jax.tree.unflatten(tree, new), state
  return apply


def coordinate_median() -> Aggregator:
  """Coordinate-wise median of the aggregated models (mean of the two middle values for even n).

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedjax_sel.parts.types import AggregateInputs
    >>> stack = jnp.array([[1.], [9.], [3.], [100.]])
    >>> new, _ = coordinate_median().apply((), jnp.zeros(1), stack, AggregateInputs(
    ...     jnp.array([True, True, True, False]), jnp.ones(4), jnp.zeros(4)))
    >>> new.tolist()
    [3.0]
  """
  return Aggregator(init=lambda n, params: (), apply=_sorted_statistic(_median_of_sorted),
                    spec={"name": "median"})


def trim_count(n: jax.Array, beta: float, rounding: str = "floor") -> jax.Array:
  """Values trimmed per side: `int(beta * n)` (canonical) or `ceil(beta * n)` (the reference
  code's), capped so that at least one value is left."""
  x = beta * n.astype(jnp.float32)
  t = jnp.floor(x) if rounding == "floor" else jnp.ceil(x)
  return jnp.minimum(t.astype(jnp.int32), (n - 1) // 2)


def trimmed_mean(beta: float = 0.3, rounding: str = "floor") -> Aggregator:
  """Coordinate-wise trimmed mean: per coordinate, drop the `t` largest and `t` smallest values of
  the n aggregated models (t from `trim_count`) and average the rest.

  Args:
    beta: share trimmed per side, in [0, 0.5).
    rounding: "floor" (t = int(beta * n), the textbook) or "ceil" (the FedSRC reference code's).
  """
  if registry.concrete(beta) and not 0.0 <= beta < 0.5:
    raise ValueError(f"trimmed-mean beta (share trimmed per side) must be in [0, 0.5), got {beta}")
  if rounding not in TRIM_ROUNDINGS:
    raise ValueError(f"trim rounding must be one of {TRIM_ROUNDINGS}, got {rounding!r}")

  def leaf(s, mask):
    n = jnp.sum(mask)
    t = trim_count(n, beta, rounding)
    rank = jnp.arange(s.shape[0]).reshape(-1, *([1] * (s.ndim - 1)))
    keep = (rank >= t) & (rank < n - t)
    return jnp.sum(jnp.where(keep, s, 0.0), axis=0) / jnp.maximum(n - 2 * t, 1)

  return Aggregator(init=lambda n, params: (), apply=_sorted_statistic(leaf),
                    spec={"name": "trimmed_mean", "beta": registry.plain(beta),
                          "rounding": rounding})


def flatten_stack(client_params) -> jax.Array:
  """Stacked `[K, ...]` models -> `[K, D]` float32 rows."""
  leaves = jax.tree.leaves(client_params)
  return jnp.concatenate([a.reshape(a.shape[0], -1).astype(jnp.float32) for a in leaves], axis=1)


def byzantine_count(n: jax.Array | int, f: float | int) -> jax.Array | int:
  """f as a count (int) or as a fraction of n (float in [0, 1))."""
  if isinstance(f, float):
    return jnp.floor(f * n).astype(jnp.int32) if isinstance(n, jax.Array) else int(f * n)
  return f


def check_krum(cohort: int, f: float | int) -> None:
  """Raises ValueError unless Krum's condition n >= 2f + 3 holds for a cohort of n models."""
  count = byzantine_count(cohort, f)
  if cohort < 2 * count + 3:
    raise ValueError(f"Krum needs n >= 2f + 3 aggregated models: n={cohort}, f={count} (from "
                     f"krum_f={f}); lower f to at most {(cohort - 3) // 2} or enlarge the cohort")


def krum_scores(rows: jax.Array, mask: jax.Array, f: float | int,
                normalize: bool = False) -> jax.Array:
  """`[K]` Krum scores: the sum of the squared L2 distances from each aggregated row to its
  n - f - 2 closest other aggregated rows (Blanchard et al. 2017); +inf for masked-out slots.

  When n < 2f + 3 in a round (a mask smaller than the cohort `check_krum` approved), at least one
  neighbour is still scored. `normalize=True` divides every row by its L2 norm first (the FedSRC
  reference code's distance, on directions only).
  """
  if normalize:
    rows = rows / jnp.maximum(jnp.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
  sq = jnp.sum(rows ** 2, axis=1)
  dist = jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * rows @ rows.T, 0.0)
  k = rows.shape[0]
  valid_pair = mask[:, None] & mask[None, :] & ~jnp.eye(k, dtype=bool)
  dist = jnp.sort(jnp.where(valid_pair, dist, jnp.inf), axis=1)
  n = jnp.sum(mask)
  closest = jnp.maximum(n - byzantine_count(n, f) - 2, 1)
  take = jnp.arange(k)[None, :] < closest
  scores = jnp.sum(jnp.where(take & jnp.isfinite(dist), dist, 0.0), axis=1)
  return jnp.where(mask, scores, jnp.inf)


def krum(f: float | int = 0.3, multi: int | None = None, normalize: bool = False) -> Aggregator:
  """Krum (`multi=None`: the single best-scored model) or Multi-Krum (the mean of the `multi`
  best-scored models; `multi=0` means n - f).

  Args:
    f: assumed Byzantine models, a count (int) or a fraction of the aggregated n (float).
    multi: Multi-Krum's m.
    normalize: score on L2-normalized models (the FedSRC reference code's variant).
  """
  if isinstance(f, float) and not 0.0 <= f < 0.5:
    raise ValueError(f"krum_f as a fraction must be in [0, 0.5), got {f}")
  if isinstance(f, int) and f < 0:
    raise ValueError(f"krum_f as a count must be >= 0, got {f}")
  if multi is not None and multi < 0:
    raise ValueError(f"multi_krum_m must be >= 0, got {multi}")

  def apply(state, global_params, client_params, inputs: AggregateInputs):
    scores = krum_scores(flatten_stack(client_params), inputs.mask, f, normalize)
    n = jnp.sum(inputs.mask)
    if multi is None:
      m = jnp.minimum(n, 1)
    elif multi == 0:
      m = jnp.maximum(n - byzantine_count(n, f), 1)
    else:
      m = jnp.minimum(n, multi)
    rank = jnp.argsort(jnp.argsort(scores, stable=True), stable=True)
    weights = (rank < m) & inputs.mask
    return weighted_mean(client_params, weights.astype(jnp.float32), global_params), state

  return Aggregator(init=lambda n, params: (), apply=apply,
                    spec={"name": "krum" if multi is None else "multi_krum", "f": f,
                          "multi": multi, "normalize": normalize})


def median_spread(values: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(median, sqrt(mean((v - median)^2))) of the masked values (0, 0 when none)."""
  med = _masked_median_leaf(values, mask)
  n = jnp.maximum(jnp.sum(mask), 1)
  spread = jnp.sqrt(jnp.sum(jnp.where(mask, (values - med) ** 2, 0.0)) / n)
  return jnp.where(jnp.any(mask), med, 0.0), spread


def fedasl_weights(losses: jax.Array, mask: jax.Array, alpha: float = 1.0,
                   beta: float = 0.2) -> jax.Array:
  """FedASL's normalized weights 1 / v_k: v_k = beta * s for clients whose training loss lies within
  alpha * s of the median loss, |L_k - median| outside; s = sqrt(mean((L - median)^2)). When s = 0
  every aggregated client lies at the median and the weights are uniform."""
  med, s = median_spread(losses.astype(jnp.float32), mask)
  dev = jnp.abs(losses - med)
  v = jnp.where(dev <= alpha * s, beta * s, dev)
  w = jnp.where(s > 0, 1.0 / jnp.maximum(v, 1e-30), 1.0)
  return normalized(jnp.where(mask, w, 0.0))


def fedasl(alpha: float = 1.0, beta: float = 0.2) -> Aggregator:
  """FedASL: a weighted mean whose weights shrink with the distance of a client's reported training
  loss from the median loss (`fedasl_weights`)."""
  if registry.concrete(alpha, beta) and not (
      0 < alpha < float("inf") and 0 < beta < float("inf")):
    raise ValueError(f"fedasl alpha and beta must be finite and > 0, got alpha={alpha}, "
                     f"beta={beta}")

  def apply(state, global_params, client_params, inputs: AggregateInputs):
    w = fedasl_weights(inputs.train_loss, inputs.mask, alpha, beta)
    return weighted_mean(client_params, w, global_params), state

  return Aggregator(init=lambda n, params: (), apply=apply,
                    spec={"name": "fedasl", "alpha": registry.plain(alpha),
                          "beta": registry.plain(beta)})


AGGREGATORS = ("fedavg", "median", "trimmed_mean", "krum", "multi_krum", "fedasl")


# --- Registered names (fedjax_sel.registry) ------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FedAvgSettings:
  """FedAvg's weights."""

  weighting: str = registry.setting("examples", "Weights of the trained models: uniform, or "
                                    "examples (each by its m_k).", flag="weighting",
                                    choices=WEIGHTINGS)


@registry.register("aggregator", "fedavg", FedAvgSettings, label="FedAvg")
def _fedavg(settings: FedAvgSettings, context: registry.BuildContext) -> Aggregator:
  """Weighted mean of the aggregated models (McMahan et al. 2017)."""
  del context
  return fedavg(settings.weighting)


@registry.register("aggregator", "median", label="Median")
def _median(settings, context: registry.BuildContext) -> Aggregator:
  """Coordinate-wise median (Yin et al. 2018)."""
  del settings, context
  return coordinate_median()


@dataclasses.dataclass(frozen=True)
class TrimmedMeanSettings(registry.Makes):
  """The trimmed mean's share and rounding."""

  beta: float = registry.setting(0.3, "Share trimmed per side.", flag="trim_beta",
                                 within="[0, 0.5)")
  rounding: str = registry.setting("floor", "int(beta*n) (floor, textbook) or ceil(beta*n) (the "
                                   "reference code's) per side.", flag="trim_rounding",
                                   choices=TRIM_ROUNDINGS)
  REFUSED = "beta"

  def make(self) -> Aggregator:
    return trimmed_mean(self.beta, self.rounding)

  def check(self, context: registry.BuildContext) -> None:
    super().check(context)
    n = context.k
    x = self.beta * n
    trimmed = min(math.floor(x) if self.rounding == "floor" else math.ceil(x), (n - 1) // 2)
    if self.beta > 0 and n > 2 and trimmed == 0:
      warnings.warn(f"the trimmed mean's beta={self.beta} (--trim_beta) trims no client of K = "
                    f"{n} ({self.rounding}(beta * K) = 0): it aggregates as FedAvg's mean; raise "
                    f"it to >= {1 / n:.3g} or use --trim_rounding=ceil", stacklevel=2)


registry.register_made("aggregator", "trimmed_mean", TrimmedMeanSettings,
                       "Coordinate-wise trimmed mean (Yin et al. 2018).", label="Trimmed mean")


def parse_f(text: str) -> float | int:
  """Krum's f as the command line gives it: a count ("2") or a fraction ("0.3")."""
  try:
    return float(text) if "." in text else int(text)
  except ValueError as e:
    raise registry.SettingError("f", f"must be a count or a fraction, got {text!r}") from e


@dataclasses.dataclass(frozen=True)
class KrumSettings:
  """Krum's assumed Byzantine count and distance (Blanchard et al. 2017)."""

  f: str = registry.setting("0.3", "Krum's assumed Byzantine models f: a count (e.g. 2) or a "
                            "fraction of the aggregated models (e.g. 0.3); needs n >= 2f + 3.",
                            flag="krum_f")
  normalized: bool = registry.setting(False, "Krum on L2-normalized models (the FedSRC reference "
                                      "code's distance).", flag="krum_normalized")

  def check(self, context: registry.BuildContext) -> None:
    f = parse_f(self.f)
    try:
      krum(f, normalize=self.normalized)
      check_krum(context.k, f)
    except ValueError as e:
      raise registry.SettingError("f", f"is refused with K = {context.k}: {e}") from e


@registry.register("aggregator", "krum", KrumSettings, label="Krum")
def _krum(settings: KrumSettings, context: registry.BuildContext) -> Aggregator:
  """Krum: the model closest to its n - f - 2 nearest neighbours."""
  del context
  return krum(parse_f(settings.f), normalize=settings.normalized)


@dataclasses.dataclass(frozen=True)
class MultiKrumSettings(KrumSettings):
  """Multi-Krum: Krum's settings and the number of models averaged."""

  m: int = registry.setting(0, "Models averaged (0 = n - f).", flag="multi_krum_m")

  def check(self, context: registry.BuildContext) -> None:
    super().check(context)
    most = context.k - byzantine_count(context.k, parse_f(self.f))
    if not 0 <= self.m <= most:
      raise registry.SettingError("m", f"={self.m} cannot apply: Multi-Krum averages at most n - "
                                  f"f = {most} of the K={context.k} models; accepted 0 (= n - f) "
                                  f"to {most}")


@registry.register("aggregator", "multi_krum", MultiKrumSettings, label="Multi-Krum")
def _multi_krum(settings: MultiKrumSettings, context: registry.BuildContext) -> Aggregator:
  """Multi-Krum: the mean of the m best-scored models."""
  del context
  return krum(parse_f(settings.f), multi=settings.m, normalize=settings.normalized)


@dataclasses.dataclass(frozen=True)
class FedASLSettings(registry.Makes):
  """FedASL's band and in-band weight."""

  alpha: float = registry.setting(1.0, "Band around the median loss, in sigmas.",
                                  flag="fedasl_alpha", within="> 0")
  beta: float = registry.setting(0.2, "Weight v_k of a client inside the band, in sigmas of the "
                                 "losses.", flag="fedasl_beta", within="> 0")
  REFUSED = "alpha"

  def make(self) -> Aggregator:
    return fedasl(self.alpha, self.beta)


registry.register_made("aggregator", "fedasl", FedASLSettings,
                       "FedASL: models weighted by their loss's distance to the median loss.",
                       label="FedASL")
