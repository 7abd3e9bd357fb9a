"""FilFL client filtering (docs/papers/filfl.md): greedy DGF / RGF in one jit, exhaustive OPT, and
the weak-submodularity check.

The objective over subsets S of the available clients is R(S) = C - F^P(mean_{k in S} w^k), with
F^P the mean loss on the server's public set and R(empty) = 0 (`empty_value="zero"`, the default and
the reference code's choice) or C - F^P(w_t) (`"global"`: averaging no update leaves w_t).
docs/papers/filfl.md ("R of the empty set") gives the measurement behind the default: with
heterogeneity only, "global" kept ~5 of 25 clients and could return the empty set for rounds in a
row.

`greedy_filter` is usable on its own from research code: stacked client models, a mask, a public
batch and a loss function in; the kept mask and per-step gains out. The whole greedy pass is one
`lax.scan` over the clients with running parameter sums for X and Y; each step evaluates its two
candidate averages as one batched forward pass.

Example (three one-vector "models"; the public loss is the distance to a target):
  >>> import jax, jax.numpy as jnp
  >>> loss_fn = lambda p: jnp.sum((p["w"] - jnp.array([1.0, -1.0])) ** 2)
  >>> clients = {"w": jnp.array([[1.0, -1.0], [0.8, -1.2], [5.0, 5.0]])}
  >>> out = greedy_filter(loss_fn, clients, jnp.ones(3, bool), {"w": jnp.zeros(2)},
  ...                     jax.random.PRNGKey(0), mode="dgf")
  >>> out.kept.tolist()
  [True, True, False]
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel import registry
from fedjax_sel.parts.types import Filter, PartCosts

Params = Any
# params -> mean loss on the public set (a scalar).
PublicLoss = Callable[[Params], jax.Array]
MODES = ("dgf", "rgf")
EMPTY_VALUES = ("global", "zero")
ORDERS = ("random", "index")


class GreedyResult(NamedTuple):
  """Output of one greedy pass over n client slots.

  Attributes:
    kept: `[n]` bool, X_n (invalid slots are never kept).
    order: `[n]` slot visited at each step (invalid slots last).
    gain_add: `[n]` a_i = R(X u {u_i}) - R(X), per step (0 for invalid steps).
    gain_remove: `[n]` b_i = R(Y minus u_i) - R(Y), per step.
    keep_prob: `[n]` RGF's keep probability (1/0 for DGF's decision).
    value: R(X_n).
    value_all: R(S_t), all valid slots.
    value_empty: R(empty).
    num_evals: public-set evaluations performed.
  """

  kept: jax.Array
  order: jax.Array
  gain_add: jax.Array
  gain_remove: jax.Array
  keep_prob: jax.Array
  value: jax.Array
  value_all: jax.Array
  value_empty: jax.Array
  num_evals: jax.Array


def _check(mode: str, empty_value: str, order: str) -> None:
  for name, value, accepted in (("mode", mode, MODES), ("empty_value", empty_value, EMPTY_VALUES),
                                ("order", order, ORDERS)):
    if value not in accepted:
      raise ValueError(f"filter {name} must be one of {accepted}, got {value!r}")


def _scale(tree, s):
  return jax.tree.map(lambda a: a * s, tree)


def greedy_filter(loss_fn: PublicLoss, client_params: Params, valid: jax.Array,
                  global_params: Params, key: jax.Array, *, mode: str = "dgf",
                  empty_value: str = "zero", const: float = 10.0,
                  order: str = "random", randomized: jax.Array | None = None) -> GreedyResult:
  """Algorithm 1 of FilFL (DGF or RGF) over stacked `client_params [n, ...]`.

  Args:
    loss_fn: params -> mean loss on the public set.
    client_params: stacked local models w^k, `[n, ...]`.
    valid: `[n]` bool, which slots are available clients.
    global_params: w_t (used for R(empty) with `empty_value="global"`).
    key: randomness of the client order and of RGF's coin flips.
    mode: "dgf" (deterministic) or "rgf" (randomized).
    empty_value: "zero" (R(empty) = 0, default) or "global" (R(empty) = C - F^P(w_t)).
    const: C of R(S) = C - F^P.
    order: "random" (a permutation drawn from `key`) or "index".
    randomized: a bool scalar, possibly traced, that chooses RGF (True) or DGF in place of `mode`:
      one compiled program then serves both (the engine's filter passes its state's).

  Returns:
    A `GreedyResult`.
  """
  _check(mode, empty_value, order)
  if randomized is None:
    randomized = mode == "rgf"
  n = valid.shape[0]
  valid = valid.astype(bool)
  order_key, coin_key = jax.random.split(key)
  if order == "random":
    rank = jax.random.uniform(order_key, (n,))
  else:
    rank = jnp.arange(n, dtype=jnp.float32) / n
  visit = jnp.argsort(jnp.where(valid, rank, 2.0))
  r_of = lambda p: const - loss_fn(p)
  r_of_pair = jax.vmap(r_of)
  if empty_value == "global":
    r_empty = r_of(global_params)
  else:
    r_empty = jnp.zeros((), jnp.float32)
  zero = jax.tree.map(lambda a: jnp.zeros(a.shape[1:], a.dtype), client_params)
  w = valid.astype(jnp.float32)
  y_sum = jax.tree.map(lambda a: jnp.tensordot(w, a, axes=1), client_params)
  y_count = jnp.sum(w)
  r_all = jnp.where(y_count > 0, r_of(_scale(y_sum, 1.0 / jnp.maximum(y_count, 1.0))), r_empty)

  def step(carry, i):
    x_sum, x_count, r_x, y_sum, y_count, r_y = carry
    u = visit[i]
    live = valid[u]
    w_u = jax.tree.map(lambda a: a[u], client_params)
    # Both candidate averages in one pass over the parameters (no separate X u {u}, Y minus u).
    sx, sy = 1.0 / (x_count + 1.0), 1.0 / jnp.maximum(y_count - 1.0, 1.0)
    cand = jax.tree.map(lambda xs, ys, wu: jnp.stack([(xs + wu) * sx, (ys - wu) * sy]),
                        x_sum, y_sum, w_u)
    # Slots past the available clients cost no forward pass.
    r_pair = jax.lax.cond(live, r_of_pair, lambda c: jnp.zeros((2,), jnp.float32), cand)
    r_x_new = r_pair[0]
    r_y_new = jnp.where(y_count - 1.0 > 0, r_pair[1], r_empty)
    a = r_x_new - r_x
    b = r_y_new - r_y
    # DGF keeps u_i when a > b; RGF with probability a+ / (a+ + b+) (1 when both are 0).
    ap, bp = jnp.maximum(a, 0.0), jnp.maximum(b, 0.0)
    p_rgf = jnp.where((ap == 0) & (bp == 0), 1.0, ap / jnp.maximum(ap + bp, 1e-30))
    keep = jnp.where(randomized, jax.random.uniform(jax.random.fold_in(coin_key, i)) < p_rgf,
                     a > b)
    p = jnp.where(randomized, p_rgf, keep.astype(jnp.float32))
    keep = keep & live
    drop = (~keep) & live
    x_sum = jax.tree.map(lambda xs, wu: jnp.where(keep, xs + wu, xs), x_sum, w_u)
    y_sum = jax.tree.map(lambda ys, wu: jnp.where(drop, ys - wu, ys), y_sum, w_u)
    carry = (x_sum, x_count + keep, jnp.where(keep, r_x_new, r_x),
             y_sum, y_count - drop, jnp.where(drop, r_y_new, r_y))
    return carry, (keep, jnp.where(live, a, 0.0), jnp.where(live, b, 0.0), jnp.where(live, p, 0.0))

  init = (zero, jnp.zeros((), jnp.float32), r_empty, y_sum, y_count, r_all)
  carry, (keep, gain_a, gain_b, prob) = jax.lax.scan(step, init, jnp.arange(n))
  kept = jnp.zeros((n,), bool).at[visit].set(keep)
  evals = 2.0 * y_count + 1.0 + (1.0 if empty_value == "global" else 0.0)
  return GreedyResult(kept, visit, gain_a, gain_b, prob, carry[2], r_all, r_empty, evals)


def subset_masks(n: int) -> np.ndarray:
  """All 2^n - 1 non-empty subsets of n slots as `[2^n - 1, n]` bool, in (size, lexicographic)
  order."""
  rows = []
  for size in range(1, n + 1):
    for combo in itertools.combinations(range(n), size):
      row = np.zeros(n, bool)
      row[list(combo)] = True
      rows.append(row)
  return np.array(rows, dtype=bool).reshape(-1, n)


def subset_values(loss_fn: PublicLoss, client_params: Params, masks: jax.Array, *,
                  const: float = 10.0, chunk_size: int = 256) -> jax.Array:
  """R of each subset in `masks [M, n]` (non-empty rows), as batched candidate averages.

  Candidates are evaluated `chunk_size` at a time (`lax.map` over chunks, `vmap` inside), so memory
  stays at `chunk_size` averaged models.
  """
  m = masks.shape[0]
  size = min(chunk_size, m)
  n_chunks = -(-m // size)
  padded = jnp.concatenate([masks.astype(jnp.float32),
                            jnp.ones((n_chunks * size - m, masks.shape[1]), jnp.float32)])
  weights = padded / jnp.maximum(padded.sum(1, keepdims=True), 1.0)

  def chunk(wc):
    means = jax.tree.map(lambda a: jnp.tensordot(wc, a, axes=1), client_params)
    return const - jax.vmap(loss_fn)(means)

  values = jax.lax.map(chunk, weights.reshape(n_chunks, size, -1))
  return values.reshape(-1)[:m]


class OptResult(NamedTuple):
  """Best non-empty subset: `kept [n]`, its value R(OPT), and how many subsets were evaluated."""

  kept: jax.Array
  value: jax.Array
  num_evals: int


def opt_filter(loss_fn: PublicLoss, client_params: Params, n: int, *, const: float = 10.0,
               chunk_size: int = 256) -> OptResult:
  """Exhaustive search over all non-empty subsets of n slots (n <= ~16); ties go to the first
  subset in (size, lexicographic) order."""
  if not 1 <= n <= 20:
    raise ValueError(f"OPT enumerates 2^n - 1 subsets; n must be in 1..20, got {n}")
  masks = jnp.asarray(subset_masks(n))
  values = subset_values(loss_fn, client_params, masks, const=const, chunk_size=chunk_size)
  best = jnp.argmax(values)
  return OptResult(masks[best], values[best], int(masks.shape[0]))


def submodularity_check(loss_fn: PublicLoss, client_params: Params, valid: jax.Array,
                        key: jax.Array, gammas: tuple[float, ...], *, samples: int = 20,
                        const: float = 10.0) -> jax.Array:
  """Share of sampled disjoint (A, B) with sum_{e in B} [R(A u {e}) - R(A)] >= gamma [R(A u B) -
  R(A)], per gamma (paper Appendix D.1); `[len(gammas)]` fractions in [0, 1].

  Each valid slot goes to A, B or neither with probability 1/3 each; A must be non-empty; samples
  with empty B are redrawn implicitly by counting only samples with non-empty A and B.
  """
  n = valid.shape[0]

  def one(k):
    side = jax.random.randint(k, (n,), 0, 3)
    a = (side == 0) & valid
    b = (side == 1) & valid
    singles = a[None, :] | (jnp.eye(n, dtype=bool) & b[:, None])
    masks = jnp.concatenate([a[None], (a | b)[None], singles])
    values = subset_values(loss_fn, client_params, masks, const=const, chunk_size=n + 2)
    r_a, r_ab, r_single = values[0], values[1], values[2:]
    lhs = jnp.sum(jnp.where(b, r_single - r_a, 0.0))
    rhs = r_ab - r_a
    ok = jnp.array([lhs >= g * rhs for g in gammas])
    return ok, jnp.any(a) & jnp.any(b)

  ok, counted = jax.vmap(one)(jax.random.split(key, samples))
  return jnp.sum(ok & counted[:, None], axis=0) / jnp.maximum(jnp.sum(counted), 1)


class FilterConfig(NamedTuple):
  """FilFL filter settings (static).

  Attributes:
    mode: "dgf" or "rgf".
    period: h, filter every h rounds (and whenever availability changes).
    empty_value: "zero" (default) or "global".
    const: C.
    order: "random" or "index".
    opt: also run OPT on the same models and report the approximation ratio (n <= 16).
    submod_samples: if > 0, run the weak-submodularity check with that many samples.
    gammas: the gammas of the check.
  """

  mode: str = "dgf"
  period: int = 5
  empty_value: str = "zero"
  const: float = 10.0
  order: str = "random"
  opt: bool = False
  submod_samples: int = 0
  gammas: tuple[float, ...] = (0.5, 0.75, 0.9, 1.0)


def filfl_filter(public_loss: Callable[[Params, jax.Array, jax.Array], jax.Array],
                 config: FilterConfig) -> Filter:
  """The FilFL filter as an engine `Filter`: every available client trains first, then the greedy
  pass keeps the subset whose averaged model has the lowest public loss on the server's public
  set (`inputs.public_x`, `inputs.public_y`: the dataset's, passed to the compiled round).

  Args:
    public_loss: (params, x, y) -> mean loss.
    config: `FilterConfig`.
  """
  _check(config.mode, config.empty_value, config.order)
  if config.period < 1:
    raise ValueError(f"filter period h must be >= 1, got {config.period}")
  # The mode is the filter's state (a bool: RGF), not a constant of the round: `apply` reads the
  # other settings only, so DGF's and RGF's rounds have one program key and are traced and
  # compiled once.
  rule = config._replace(mode=None)

  def apply(state, key, inputs, mask, local):
    del mask
    slots, valid, res = local
    m = inputs.public_y.shape[0]
    loss_fn = lambda p: public_loss(p, inputs.public_x, inputs.public_y)
    out = greedy_filter(loss_fn, res.params, valid, inputs.params, key, randomized=state,
                        empty_value=rule.empty_value, const=rule.const, order=rule.order)
    n_clients = inputs.available.shape[0]
    filtered = jnp.zeros((n_clients,), bool).at[slots].max(out.kept & valid)
    evals = out.num_evals
    info = {"R_filtered": out.value, "R_available": out.value_all, "R_empty": out.value_empty}
    if rule.opt:
      best = opt_filter(loss_fn, res.params, slots.shape[0], const=rule.const)
      info.update(R_opt=best.value, approx_ratio=out.value / best.value,
                  opt_size=jnp.sum(best.kept))
      evals = evals + best.num_evals
    if rule.submod_samples:
      pct = submodularity_check(loss_fn, res.params, valid, jax.random.fold_in(key, 1),
                                rule.gammas, samples=rule.submod_samples, const=rule.const)
      info["submod_verified"] = pct
      evals = evals + rule.submod_samples * (slots.shape[0] + 2)
    info["public_samples"] = evals * m
    return filtered, state, info

  randomized = config.mode == "rgf"
  return Filter(init=lambda n, params: jax.device_put(np.bool_(randomized)), apply=apply,
                period=config.period, trains_available=True, uses_public=True,
                costs=lambda info: PartCosts(server_public_samples=info["public_samples"]),
                spec={"name": config.mode, **config._asdict(),
                      "public_loss": getattr(public_loss, "__qualname__", "?")})


# --- Registered names (fedjax_sel.registry) ------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FilFLSettings:
  """FilFL's filter settings (the mode is the registered name, dgf or rgf)."""

  period: int = registry.setting(5, "h: filter every h rounds (and when availability changes).",
                                 flag="filter_period", within=">= 1")
  empty_value: str = registry.setting("zero", "R of the empty set: zero (the reference code's, "
                                      "default) or global (C - F^P(w_t): the unchanged model).",
                                      flag="empty_value", choices=EMPTY_VALUES)
  const: float = registry.setting(10.0, "The constant C of the filter objective R(S) = C - "
                                  "F^P(w_S).", flag="filter_const")
  order: str = registry.setting("random", "The greedy pass's client order, random or index.",
                                flag="filter_order", choices=ORDERS)
  opt: bool = registry.setting(False, "Also run OPT on each filtering round (n <= 16) and report "
                               "R(greedy)/R(OPT).", flag="opt")
  submod_samples: int = registry.setting(0, "Weak-submodularity check samples per filtering round.",
                                         flag="submod_samples", within=">= 0")
  gammas: tuple[float, ...] = registry.setting((0.5, 0.75, 0.9, 1.0), "Comma-separated gammas in "
                                               "(0, 1] of the weak-submodularity check "
                                               "(--submod_samples).", flag="gammas")

  def check(self, context: registry.BuildContext) -> None:
    if not np.isfinite(self.const):
      raise registry.SettingError("const", f"must be a finite number, got {self.const}")
    if not all(0 < g <= 1 for g in self.gammas):  # Also refuses NaN.
      raise registry.SettingError("gammas", f"must be in (0, 1], got {list(self.gammas)}")
    if self.opt and context.num_available > 16:
      raise registry.SettingError("opt", f"enumerates 2^n subsets: needs at most 16 clients "
                                  f"available, got n = {context.num_available}")

  def config(self, mode: str) -> FilterConfig:
    return FilterConfig(mode=mode, period=self.period, empty_value=self.empty_value,
                        const=self.const, order=self.order, opt=self.opt,
                        submod_samples=self.submod_samples, gammas=tuple(self.gammas))


def _public_filter(mode: str, settings: FilFLSettings, context: registry.BuildContext) -> Filter:
  from fedjax_sel.models import per_example_loss  # pylint: disable=import-outside-toplevel
  model = context.model

  def public_loss(p, x, y):
    return jnp.mean(per_example_loss(model, p, x, y))

  return filfl_filter(public_loss, settings.config(mode))


@registry.register("filter", "dgf", FilFLSettings, requires=("public",))
def _dgf(settings: FilFLSettings, context: registry.BuildContext) -> Filter:
  """FilFL's deterministic greedy filter on the server's public set."""
  return _public_filter("dgf", settings, context)


@registry.register("filter", "rgf", FilFLSettings, requires=("public",))
def _rgf(settings: FilFLSettings, context: registry.BuildContext) -> Filter:
  """FilFL's randomized greedy filter on the server's public set."""
  return _public_filter("rgf", settings, context)
