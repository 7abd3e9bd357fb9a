"""Selectors: pure functions over client-state arrays that pick at most K clients from a mask.

Each factory returns a `Selector(init, select, needs)`; `select(state, key, inputs, mask)` returns a
`[N]` bool mask with `min(K, |mask|)` clients, all inside `mask`, K being `inputs.k` (the engine's:
no factory takes K).

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from fedjax_sel.parts.types import RoundInputs
  >>> sel = random_selector()
  >>> mask = jnp.array([True, False, True, True])
  >>> inputs = RoundInputs.create(jnp.ones(4), k=2)
  >>> chosen, _ = sel.select(sel.init(4, None), jax.random.PRNGKey(0), inputs, mask)
  >>> int(chosen.sum()), bool((chosen <= mask).all())
  (2, True)
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple


import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel import registry
from fedjax_sel.parts.types import Footprint, PartCosts, Scale, Selector


def top_k_mask(scores: jax.Array, mask: jax.Array, k: int) -> jax.Array:
  """`[N]` bool: the k highest `scores` inside `mask` (ties to the lower index), or all of `mask`
  when it holds fewer than k."""
  k = min(k, scores.shape[0])
  masked = jnp.where(mask, scores, -jnp.inf)
  _, idx = jax.lax.top_k(masked, k)
  take = jnp.arange(k) < jnp.sum(mask)
  return jnp.zeros(scores.shape, bool).at[idx].max(take)


def random_selector() -> Selector:
  """Uniform sample of K clients without replacement from the mask (RS)."""

  def select(state, key, inputs, mask):
    return top_k_mask(jax.random.uniform(key, mask.shape), mask, inputs.k), state

  return Selector(init=lambda n, params: (), select=select, spec={"name": "random"})


POC_VARIANTS = ("pow", "cpow", "rpow")


def weighted_sample_without_replacement(key: jax.Array, weights: jax.Array, mask: jax.Array,
                                        d: int) -> jax.Array:
  """`[N]` bool: d clients of `mask` drawn without replacement with probability proportional to
  `weights` (Gumbel top-k), or all of `mask` when it holds fewer than d."""
  gumbel = jax.random.gumbel(key, weights.shape)
  scores = jnp.log(jnp.maximum(weights, 1e-30)) + gumbel
  return top_k_mask(scores, mask & (weights > 0), d)


class PowerOfChoiceState(NamedTuple):
  """`[N]` bool: the round's d candidates (they alone evaluated the model)."""

  candidates: jax.Array


def poc_candidates(d: int | None, k: int) -> int:
  """Power-of-choice's d for K clients: `d`, or 2K when None; a ValueError when below K."""
  d = 2 * k if d is None else d
  if d < k:
    raise ValueError(f"power-of-choice needs K <= d, got K={k}, d={d}")
  return d


def power_of_choice(d: int | None = None, variant: str = "pow") -> Selector:
  """Power-of-choice (docs/papers/filfl.md, 'Selectors after the filter'): d candidates drawn with
  probability p_k = m_k / sum m, then the K with the highest loss at w_t (ties to the lower index).

  Args:
    d: candidates (default 2K), >= K (checked when the round is traced).
    variant: "pow" (loss on the full local data), "cpow" (loss on one mini-batch) or "rpow" (the
      stale loss from the client's last participation, +inf if it never took part).
  """
  if variant not in POC_VARIANTS:
    raise ValueError(f"poc_variant must be one of {POC_VARIANTS}, got {variant!r}")
  stat = {"pow": "loss", "cpow": "batch_loss", "rpow": None}[variant]

  def select(state, key, inputs, mask):
    del state
    candidates = weighted_sample_without_replacement(
        key, inputs.num_examples.astype(jnp.float32), mask, poc_candidates(d, inputs.k))
    loss = inputs.clients.last_loss if stat is None else inputs.stats[stat]
    return top_k_mask(loss, candidates, inputs.k), PowerOfChoiceState(candidates)

  # Only the d candidates evaluate the model (the engine charges the loss to them alone).
  return Selector(init=lambda n, params: PowerOfChoiceState(jnp.zeros((n,), bool)),
                  select=select, needs=(stat,) if stat else (),
                  report=lambda state: {"evaluated": state.candidates},
                  costs=lambda state: PartCosts(evaluated=state.candidates),
                  spec={"name": "poc", "d": d, "variant": variant})


def facility_location_greedy(proxies: jax.Array, ground: jax.Array, k: int) -> jax.Array:
  """`[N]` bool: K clients of `ground` chosen greedily to minimise
  sum_{j in ground} min_{i in A} ||g_j - g_i|| (DivFL); ties to the lower index.

  Args:
    proxies: `[N, D]` gradient proxies.
    ground: `[N]` bool ground set (candidates and clients to cover).
    k: K.
  """
  sq = jnp.sum(proxies ** 2, axis=1)
  dist = jnp.sqrt(jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * proxies @ proxies.T, 0.0))
  big = jnp.max(jnp.where(ground[:, None] & ground[None, :], dist, 0.0)) * 2.0 + 1.0
  covered = jnp.where(ground, big, 0.0)  # Current min distance of each ground client to A.

  def step(carry, _):
    covered, chosen = carry
    # cost[i] = sum_j min(covered_j, d(j, i)) for candidate i.
    cost = jnp.sum(jnp.where(ground[:, None], jnp.minimum(covered[:, None], dist), 0.0), axis=0)
    cost = jnp.where(ground & ~chosen, cost, jnp.inf)
    i = jnp.argmin(cost)
    ok = jnp.isfinite(cost[i])
    covered = jnp.where(ok, jnp.minimum(covered, dist[:, i]), covered)
    chosen = chosen.at[i].set(chosen[i] | ok)
    return (covered, chosen), None

  (_, chosen), _ = jax.lax.scan(step, (covered, jnp.zeros(ground.shape, bool)), None,
                                length=min(k, ground.shape[0]))
  return chosen


def stacked_rows(tree) -> jax.Array:
  """`[M, D]`: a pytree of stacked `[M, ...]` leaves (M clients' gradients or models), one row
  of all its values per client."""
  return jnp.concatenate([a.reshape(a.shape[0], -1) for a in jax.tree.leaves(tree)], axis=1)


DIVFL_PROXIES = ("gradient", "update")


class DivFLState(NamedTuple):
  """DivFL's stale proxies and what refreshing them cost this round.

  Attributes:
    table: `[N, D]` each client's gradient proxy (flattened).
    gradients_computed: int32 gradients asked of `inputs.gradients` this round.
    gradient_samples: float32 training samples of the clients whose gradient was used.
  """

  table: jax.Array
  gradients_computed: jax.Array
  gradient_samples: jax.Array


def divfl_footprint(scale: Scale) -> Footprint:
  """DivFL's round (every round): the `[N, N]` distances of the `[N, D]` table (2 N^2 D flops;
  written and their maximum taken, 16 N^2 bytes), then K greedy steps, each reading them (4 N^2
  bytes). Its buffers hold 8 N^2 bytes (measured at N = 1000-4000) and the table, in and out."""
  n, d = scale.num_clients, scale.model_size
  return Footprint(flops=2.0 * n * n * d, traffic=4.0 * (scale.k + 4) * n * n,
                   memory=8.0 * n * n + 8.0 * n * d,
                   step="every round: the [N, N] distances of the clients' gradient table",
                   cheaper="power of choice or entropy selection, which read [N] statistics")


def divfl(proxy: str = "gradient") -> Selector:
  """DivFL (docs/papers/filfl.md, 'Selectors after the filter'): a stale table of gradient proxies
  for all N clients, greedy facility location over the mask.

  The table is filled for every client from the full-batch gradients at round 0 (the round index
  decides, not the state: the selector starts with the run), then refreshed
  only for the clients that trained in a round: with their gradient at w_t (`proxy="gradient"`) or
  their local update w^k - w_t (`proxy="update"`). Gradients are asked of `inputs.gradients` for
  just those rows (N on the filling round, the K slots after it), not for all N every round; the
  report gives that count (`gradients_computed`, simulation work) and the training samples of the
  clients whose gradient was used (`gradient_samples`, the clients' cost: all clients at round 0,
  the trained ones after).
  """
  if proxy not in DIVFL_PROXIES:
    raise ValueError(f"divfl_proxy must be one of {DIVFL_PROXIES}, got {proxy!r}")

  def init(n, params):
    dim = sum(int(np.size(a)) for a in jax.tree.leaves(params))
    return DivFLState(jnp.zeros((n, dim), jnp.float32), jnp.zeros((), jnp.int32),
                      jnp.zeros((), jnp.float32))

  def filling(inputs):
    # A function of the round alone (not of the state), so that under a runs axis the branch is
    # taken once for the whole batch instead of both branches being computed.
    return jnp.asarray(inputs.round) == 0

  def select(state, key, inputs, mask):
    del key
    n = mask.shape[0]
    fill = filling(inputs)
    every = jnp.arange(n, dtype=jnp.int32)
    table = jax.lax.cond(fill, lambda: stacked_rows(inputs.gradients(every)),
                         lambda: state.table)
    return facility_location_greedy(table, mask, inputs.k), DivFLState(
        table, jnp.where(fill, n, 0).astype(jnp.int32),
        jnp.where(fill, jnp.sum(inputs.num_examples), 0).astype(jnp.float32))

  def observe(state, inputs, outcome):
    table = state.table
    slots = outcome.slots
    fresh = filling(inputs)
    if proxy == "gradient":  # Rows filled this round already hold the gradients at w_t.
      rows = jax.lax.cond(fresh, lambda: table[slots],
                          lambda: stacked_rows(inputs.gradients(slots)))
      refreshed = jnp.where(fresh, 0, slots.shape[0])
      samples = jnp.where(fresh, 0.0,
                          jnp.sum(jnp.where(outcome.trained, inputs.num_examples[slots], 0)))
    else:
      rows = stacked_rows(jax.tree.map(lambda p, g: p - g[None], outcome.params, inputs.params))
      refreshed, samples = 0, 0.0
    new_rows = jnp.where(outcome.trained[:, None], rows, table[slots])
    return DivFLState(table.at[slots].set(new_rows), state.gradients_computed + refreshed,
                      state.gradient_samples + samples)

  return Selector(init=init, select=select, observe=observe,
                  reads_local_models=proxy == "update",
                  report=lambda state: {"gradients_computed": state.gradients_computed,
                                        "gradient_samples": state.gradient_samples},
                  costs=lambda state: PartCosts(gradients_computed=state.gradients_computed,
                                                gradient_samples=state.gradient_samples),
                  footprint=divfl_footprint, spec={"name": "divfl", "proxy": proxy})


def all_selector() -> Selector:
  """Every client of the mask (full participation)."""
  return Selector(init=lambda n, params: (), select=lambda state, key, inputs, mask: (mask, state),
                  spec={"name": "all"})


class GroupState(NamedTuple):
  """`[N]` int32: each client's group."""

  groups: jax.Array


def group_random_selector(groups, sizes: tuple[int, ...]) -> Selector:
  """A uniform sample of `sizes[g]` clients from each group g of the mask (all of a group that
  holds fewer); `groups` is an `[N]` int array of group ids 0..G-1 (e.g. FedALIGN's priority and
  non-priority clients under partial participation), kept in the selector's state.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> sel = group_random_selector(jnp.array([0, 0, 1, 1, 1]), (1, 2))
    >>> chosen, _ = sel.select(sel.init(5, None), jax.random.PRNGKey(0), None, jnp.ones(5, bool))
    >>> int(chosen[:2].sum()), int(chosen[2:].sum())
    (1, 2)
  """
  if any(s < 0 for s in sizes):
    raise ValueError(f"group sample sizes must be >= 0, got {sizes}")
  groups = np.asarray(groups, np.int32)

  def select(state, key, inputs, mask):
    del inputs
    u = jax.random.uniform(key, mask.shape)
    chosen = jnp.zeros(mask.shape, bool)
    for g, size in enumerate(sizes):
      if size:
        chosen |= top_k_mask(u, mask & (state.groups == g), size)
    return chosen, state

  return Selector(init=lambda n, params: GroupState(jnp.asarray(groups)), select=select,
                  spec={"name": "group_random", "sizes": [int(s) for s in sizes],
                        "groups": groups.tolist()})


# --- Registered names (fedjax_sel.registry) ------------------------------------------------------

@registry.register("selector", "random", reads="nothing")
def _random(settings, context: registry.BuildContext) -> Selector:
  """Uniform K clients without replacement (RS)."""
  del settings, context
  return random_selector()


@dataclasses.dataclass(frozen=True)
class PowerOfChoiceSettings:
  """Power of choice (Cho et al. 2022)."""

  d: int | None = registry.setting(None, "Candidates d (default 2K).", flag="poc_d")
  variant: str = registry.setting("pow", "The loss a candidate reports: pow (all its training "
                                  "data), cpow (one mini-batch), rpow (its last reported training "
                                  "loss).", flag="poc_variant", choices=POC_VARIANTS)

  def check(self, context: registry.BuildContext) -> None:
    if self.d is not None and not context.k <= self.d <= context.num_available:
      raise registry.SettingError("d", f"must be in {context.k}..{context.num_available} (K to "
                                  f"the clients available at once), got {self.d}")


@registry.register("selector", "poc", PowerOfChoiceSettings, reads="stats")
def _poc(settings: PowerOfChoiceSettings, context: registry.BuildContext) -> Selector:
  """Power of choice: d candidates by data size, the K with the highest loss."""
  del context
  return power_of_choice(**dataclasses.asdict(settings))


@dataclasses.dataclass(frozen=True)
class DivFLSettings:
  """DivFL (Balakrishnan et al. 2022)."""

  proxy: str = registry.setting("gradient", "How a trained client's row of the gradient table is "
                                "refreshed: gradient (at w_t) or update (w^k - w_t).",
                                flag="divfl_proxy", choices=DIVFL_PROXIES)


@registry.register("selector", "divfl", DivFLSettings, reads="private")
def _divfl(settings: DivFLSettings, context: registry.BuildContext) -> Selector:
  """DivFL: facility location over the clients' gradients."""
  del context
  return divfl(**dataclasses.asdict(settings))
