"""TiFL (Chai et al., "TiFL: A Tier-based Federated Learning System", HPDC 2020) as a pure
`Selector` on the simulated clock (docs/papers/selection.md, 'TiFL').

The clients are profiled once (their expected round alone, `timing.py`) and split by latency into
M tiers of (nearly) equal size, the fastest first. Each tier holds credits, the rounds it may
still be chosen (`ceil(T / M)` each). A round draws one tier among those with credits, by the
tiers' probabilities (uniform at first), spends one of its credits, and takes K clients of it
uniformly (those available; fewer if fewer are). Every I rounds the probabilities follow the
tiers' accuracies (ChangeProbs): among the n tiers with credits, the least accurate gets n / D,
the next (n - 1) / D, ..., the most accurate 1 / D (D = n (n + 1) / 2). A tier's accuracy is the
mean over its clients of the global model's accuracy on their training data, evaluated by the
available clients on those rounds (charged to them then).

Examples:
  >>> import jax.numpy as jnp
  >>> tier_probabilities(jnp.array([0.9, 0.5, 0.7]), jnp.array([3, 3, 0])).tolist()
  [0.3333333432674408, 0.6666666865348816, 0.0]
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel import registry
from fedjax_sel.parts.selectors.baselines import top_k_mask
from fedjax_sel.parts.selectors.timing import context_times
from fedjax_sel.parts.types import PartCosts, RoundInputs, Selector


def latency_tiers(latency, num_tiers: int) -> np.ndarray:
  """`[N]` int tier of each client: sorted by latency (stable), cut into chunks of
  `ceil(N / M)`, the fastest tier 0 (fltk's `create_tiers`; FLGo's equal split when M divides
  N)."""
  order = np.argsort(np.asarray(latency), kind="stable")
  chunk = math.ceil(len(order) / num_tiers)
  tiers = np.zeros(len(order), np.int32)
  tiers[order] = np.arange(len(order)) // chunk
  return tiers


def tier_probabilities(accuracy: jax.Array, credits: jax.Array) -> jax.Array:
  """`[M]` ChangeProbs: the tiers with credits by increasing accuracy (ties to the lower tier)
  get n/D, (n-1)/D, ..., 1/D; the others 0."""
  live = credits > 0
  n = jnp.sum(live)
  order = jnp.argsort(jnp.where(live, accuracy, jnp.inf), stable=True)
  rank = jnp.zeros(accuracy.shape, jnp.int32).at[order].set(
      jnp.arange(accuracy.shape[0], dtype=jnp.int32))
  d = n * (n + 1) / 2
  return jnp.where(live, (n - rank) / jnp.maximum(d, 1), 0.0).astype(jnp.float32)


class TiFLState(NamedTuple):
  """TiFL's state.

  Attributes:
    tiers: `[N]` each client's tier.
    probs: `[M]` the tiers' probabilities.
    credits: `[M]` the rounds each tier may still be chosen.
    accuracy: `[M]` the tiers' accuracies at their last evaluation.
    tier: the tier chosen this round.
    evaluated: `[N]` the clients that evaluated the model this round.
  """

  tiers: jax.Array
  probs: jax.Array
  credits: jax.Array
  accuracy: jax.Array
  tier: jax.Array
  evaluated: jax.Array


def tifl_selector(latency, rounds: int, num_tiers: int = 5, interval: int = 10) -> Selector:
  """TiFL for K clients.

  Args:
    latency: `[N]` each client's profiled round latency (seconds).
    rounds: T, the run's rounds (credits `ceil(T / M)` per tier).
    num_tiers: M, at most N.
    interval: I, rounds between probability updates.
  """
  latency = np.asarray(latency, np.float32)
  n = latency.shape[0]
  if rounds < 1 or interval < 1:
    raise ValueError(f"tifl needs rounds and interval >= 1, got {rounds}, {interval}")
  if not 1 <= num_tiers <= n:
    raise ValueError(f"tifl tiers must be in 1..N = {n}, got {num_tiers}")
  tiers = latency_tiers(latency, num_tiers)
  m = int(tiers.max()) + 1  # ceil chunks may leave fewer non-empty tiers than asked.
  credit = math.ceil(rounds / m)

  def init(num_clients, params):
    del params
    if num_clients != n:
      raise ValueError(f"tifl was given {n} latencies for {num_clients} clients")
    return TiFLState(jnp.asarray(tiers), jnp.full((m,), 1.0 / m, jnp.float32),
                     jnp.full((m,), credit, jnp.int32), jnp.zeros((m,), jnp.float32),
                     jnp.int32(0), jnp.zeros((n,), bool))

  def select(state, key, inputs: RoundInputs, mask):
    t = jnp.asarray(inputs.round, jnp.int32)
    update = (t % interval == 0) & (t >= interval)
    # The tiers' accuracies, from the clients that can evaluate this round.
    acc = inputs.stats["accuracy"]
    total = jax.ops.segment_sum(jnp.where(mask, acc, 0.0), state.tiers, num_segments=m)
    count = jax.ops.segment_sum(mask.astype(jnp.float32), state.tiers, num_segments=m)
    accuracy = jnp.where(update & (count > 0), total / jnp.maximum(count, 1.0), state.accuracy)
    probs = jnp.where(update, tier_probabilities(accuracy, state.credits), state.probs)
    k_tier, k_clients = jax.random.split(key)
    live = state.credits > 0
    p = jnp.where(live, probs, 0.0)
    p = jnp.where(jnp.sum(p) > 0, p, live.astype(jnp.float32))
    tier = jax.random.categorical(k_tier, jnp.log(p))
    chosen = top_k_mask(jax.random.uniform(k_clients, mask.shape), mask & (state.tiers == tier),
                        inputs.k)
    return chosen, state._replace(probs=probs, credits=state.credits.at[tier].add(-1),
                                  accuracy=accuracy, tier=tier, evaluated=mask & update)

  return Selector(init=init, select=select, needs=("accuracy",),
                  report=lambda state: {"tier": state.tier},
                  costs=lambda state: PartCosts(evaluated=state.evaluated),
                  spec={"name": "tifl", "rounds": rounds, "tiers": num_tiers,
                        "interval": interval})


@dataclasses.dataclass(frozen=True)
class TiFLSettings:
  """TiFL (Chai et al. 2020), FLGo's defaults."""

  tiers: int = registry.setting(5, "Latency tiers M, in 1..N.")
  interval: int = registry.setting(10, "Rounds between updates of the tiers' probabilities from "
                                   "their accuracies (I).", within=">= 1")

  def check(self, context: registry.BuildContext) -> None:
    if not 1 <= self.tiers <= max(context.num_clients, 1):
      raise registry.SettingError("tiers", f"must be in 1..{context.num_clients} (N), got "
                                  f"{self.tiers}")


@registry.register("selector", "tifl", TiFLSettings, requires=("clock",),
                   reads="stats")
def _tifl(settings: TiFLSettings, context: registry.BuildContext) -> Selector:
  """TiFL: latency tiers, one tier a round chosen by accuracy and credits."""
  times = context_times(context, "tifl")
  return tifl_selector(times.round, max(context.rounds, 1), settings.tiers, settings.interval)
