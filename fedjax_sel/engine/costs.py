"""What a round costs the clients: samples evaluated and differentiated for the parts' stats, the
selector's gradients, and the simulated time on the config's clock.

Example:
  >>> Timing.none().round_time_s.tolist()
  0.0
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.client.system import client_times
from fedjax_sel.engine.contracts import count
from fedjax_sel.engine.description import RoundConfig
from fedjax_sel.engine.state import DataArrays
from fedjax_sel.parts.types import SPLIT_STATS


class StatCosts(NamedTuple):
  """The samples clients evaluated and differentiated for this round's stats.

  Attributes:
    evals: float32 samples evaluated (forward passes).
    grads: float32 samples differentiated (a forward and a backward pass each).
    evaluators: `[N]` bool, the clients that evaluated for the selector or filter.
    client_evals, client_grads: `[N]` float32 each client's evaluated / differentiated samples.
  """

  evals: jax.Array
  grads: jax.Array
  evaluators: jax.Array
  client_evals: jax.Array
  client_grads: jax.Array


class Timing(NamedTuple):
  """The round on the clock.

  Attributes:
    on_time: `[N]` bool, finished by the deadline (None without a deadline).
    round_time_s: float32 the round's simulated seconds.
    stragglers: int32 trained clients that missed the deadline.
    client_times: `[N]` float32 each client's seconds (None without a clock).
  """

  on_time: jax.Array | None
  round_time_s: jax.Array
  stragglers: jax.Array
  client_times: jax.Array | None

  @staticmethod
  def none() -> Timing:
    """No clock: no time passes."""
    return Timing(None, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32), None)


def stat_costs(config: RoundConfig, arrays: DataArrays, avail, chosen,
               sel_evaluated) -> StatCosts:
  """The samples clients evaluated and differentiated to compute this round's stats: a stat the
  filter reads costs every available client; one the selector reads, the clients its costs name
  as `evaluated` (power-of-choice's d candidates; default every available client); one only the
  participation rule reads, the selected clients (they alone decide)."""
  evals = grads = jnp.zeros((), jnp.float32)
  evaluators = jnp.zeros_like(avail)
  per_client = {False: jnp.zeros(avail.shape, jnp.float32),
                True: jnp.zeros(avail.shape, jnp.float32)}
  needs = set(config.needs)
  filter_needs = set(config.filter.needs) if config.filter is not None else set()
  train, val, test = arrays.counts
  groups = ((SPLIT_STATS["train"], train, False), (SPLIT_STATS["val"], val, False),
            (SPLIT_STATS["test"], test, False),
            ({"batch_loss"}, jnp.where(train > 0, config.local.batch_size, 0), False),
            ({"grad", "grad_norm"}, train, True))
  for names, samples_of, backward in groups:
    wanted = names & needs
    if not wanted:
      continue
    who = jnp.zeros_like(avail)
    if wanted & filter_needs:
      who |= avail
    if wanted & set(config.selector.needs):
      who |= sel_evaluated & avail
    evaluators |= who
    if wanted & set(config.participation.needs):
      who |= chosen
    samples = jnp.sum(jnp.where(who, samples_of, 0)).astype(jnp.float32)
    per_client[backward] += jnp.where(who, samples_of, 0).astype(jnp.float32)
    if backward:
      grads += samples
    else:
      evals += samples
  return StatCosts(evals, grads, evaluators, per_client[False], per_client[True])


class SelectorGradients(NamedTuple):
  """The gradients computed for the parts this round.

  Attributes:
    samples: float32 gradient samples the selector charged after `observe`.
    computed: int32 gradients computed: N per gradient stat the parts read, plus the selector's.
  """

  samples: jax.Array
  computed: jax.Array


def selector_gradients(config: RoundConfig, sel_state, n: int) -> SelectorGradients:
  """The gradients the parts asked for this round (see `SelectorGradients`)."""
  costs = config.selector.costs(sel_state)
  computed = (n * len({"grad", "grad_norm"} & set(config.needs))
              + jnp.asarray(costs.gradients_computed, jnp.int32))
  return SelectorGradients(jnp.asarray(costs.gradient_samples, jnp.float32), computed)


def round_clock(config: RoundConfig, chosen, client_samples, work: StatCosts) -> Timing:
  """The round on the config's clock (`system.py`): every client that downloaded (evaluated or
  was selected) or uploaded (trained) is timed; the round lasts as long as the slowest, or the
  deadline, past which trained clients are stragglers."""
  clock = config.clock
  if clock is None:
    return Timing.none()
  uploaded = client_samples > 0
  downloaded = work.evaluators | chosen | uploaded
  times = client_times(clock, client_samples, work.client_evals, work.client_grads,
                       downloaded.astype(jnp.float32) + uploaded.astype(jnp.float32))
  timed = downloaded | uploaded
  slowest = jnp.max(jnp.where(timed, times, 0.0))
  if clock.deadline_s is None:
    return Timing(None, slowest, jnp.zeros((), jnp.int32), times)
  on_time = times <= clock.deadline_s
  return Timing(on_time, jnp.minimum(slowest, jnp.float32(clock.deadline_s)),
                count(uploaded & ~on_time), times)
