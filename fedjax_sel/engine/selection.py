"""Who takes part in a round: the filter (on filtering rounds), the selector and the participation
rule, as one decision made by the same code in the round and in the host store's plan.

`choose` runs filter -> select -> participate and returns the `Filtered` set and the `Selection`;
`plan_rows` asks it (or, for a filter that trains every available client, the selection from the
kept set) which clients' rows a round will read, ahead of the round. Under a runs axis the
filtering decision is or-ed over the runs, so `lax.cond` takes one branch for the batch; a run that
did not need the filtering round keeps its filtered set.

Example:
  >>> import jax.numpy as jnp
  >>> from fedjax_sel.engine.state import EngineState
  >>> state = EngineState(*([None] * 7), jnp.array([True, False, True]), None, None)
  >>> avail, fresh = jnp.array([True, True, False]), jnp.array([False, True, True])
  >>> filtered_set(state, avail, jnp.asarray(False), fresh).tolist()
  [True, False, False]
  >>> filtered_set(state, avail, jnp.asarray(True), fresh).tolist()
  [False, True, False]
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel import keys as keylib
from fedjax_sel.engine.contracts import check_mask, count
from fedjax_sel.engine.description import RoundConfig
from fedjax_sel.engine.state import DataArrays, EngineState, RunValues
from fedjax_sel.engine.stats import round_inputs
from fedjax_sel.engine.training import Trained
from fedjax_sel.parts.types import RoundInputs


class Filtered(NamedTuple):
  """The set the selector chooses from.

  Attributes:
    mask: `[N]` bool, the filtered-in available clients (the available set without a filter).
    state: the filter's state after the round.
    info: the filter's report of the round (zeros when it did not run).
    outside: int32 clients the filter kept that were not available (a broken contract).
    own: bool, this run's filtering round (every `period` rounds and when availability changed).
  """

  mask: jax.Array
  state: Any
  info: dict
  outside: jax.Array
  own: jax.Array


class Selection(NamedTuple):
  """The selector's choice and the participation rule's masks.

  Attributes:
    chosen: `[N]` bool, the selected clients.
    selector_state: the selector's state after selecting.
    train_mask: `[N]` bool, selected clients that train.
    aggregate_mask: `[N]` bool, trained clients the server aggregates.
    participation_state: the rule's state after deciding.
    broken: contract counts of the selector and the rule.
  """

  chosen: jax.Array
  selector_state: Any
  train_mask: jax.Array
  aggregate_mask: jax.Array
  participation_state: Any
  broken: dict


def any_run(config: RoundConfig, flag: jax.Array) -> jax.Array:
  """`flag` or-ed over the runs axis (unbatched under it), so a `lax.cond` on it takes one branch
  for the whole batch."""
  return flag if config.runs_axis is None else jax.lax.pmax(flag, config.runs_axis)


def zeros_like_shapes(shapes):
  """Zeros of the shapes and dtypes of a `jax.eval_shape` result."""
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def select(config: RoundConfig, state: EngineState, inputs: RoundInputs, fmask, seed):
  """The selector's (choice among `fmask`, new state) this round, with the round's SELECT key."""
  return config.selector.select(state.selector_state,
                                keylib.round_key(seed, inputs.round, keylib.SELECT), inputs, fmask)


def apply_filter(config: RoundConfig, state: EngineState, inputs: RoundInputs, avail, seed,
                 local: Trained | None):
  """The filter's (filtered-in set, new state, info) this round, with the round's FILTER key."""
  return config.filter.apply(state.filter_state,
                             keylib.round_key(seed, inputs.round, keylib.FILTER), inputs, avail,
                             local)


def filtered_set(state: EngineState, avail, filter_round, fresh):
  """The set the selector chooses from: the filter's `fresh` set on the run's filtering rounds,
  else the kept one, both within the available clients."""
  return jnp.where(filter_round, fresh & avail, state.filtered & avail)


def filter_round_flag(config: RoundConfig, state: EngineState, avail) -> jax.Array:
  """This run's filtering decision: every `period` rounds and when availability changed."""
  changed = jnp.any(avail != state.prev_available)
  return (state.round % config.filter.period == 0) | changed


def select_and_participate(config: RoundConfig, state: EngineState, inputs: RoundInputs, fmask,
                           seed) -> Selection:
  """The selection among `fmask` and the participation rule's decision on it."""
  t = inputs.round
  n = fmask.shape[0]
  chosen, sel_state = select(config, state, inputs, fmask, seed)
  check_mask(config, "selector", "its choice", chosen, n)
  train_m, agg_m, part_state = config.participation.apply(
      state.participation_state, keylib.round_key(seed, t, keylib.PARTICIPATE), inputs, chosen)
  check_mask(config, "participation", "its train mask", train_m, n)
  check_mask(config, "participation", "its aggregate mask", agg_m, n)
  broken = {"selector_outside_filtered": count(chosen & ~fmask),
            "selector_over_k": jnp.maximum(count(chosen) - config.k, 0),
            "rule_outside_selected": count((train_m | agg_m) & ~chosen)}
  return Selection(chosen, sel_state, train_m & chosen, agg_m & train_m & chosen, part_state,
                   broken)


def choose(config: RoundConfig, state: EngineState, inputs: RoundInputs, run: RunValues,
           local: Trained | None = None,
           kept: Selection | None = None) -> tuple[Filtered, Selection]:
  """Filter (on filtering rounds), select and participate.

  Args:
    config: the round's description.
    state: the run's state at the round's start.
    inputs: what the parts read this round.
    run: the run's values (its seed keys the filter, the selector and the rule).
    local: every available client's local training, for a filter that reads it (FilFL).
    kept: the selection from the kept filtered-in set, when the caller already made it (FilFL's
      train-all mode decides with it who trains on other rounds).

  Returns:
    The `Filtered` set and the `Selection` among it.
  """
  avail = inputs.available
  if config.filter is None:
    none = jnp.zeros((), jnp.int32)
    return (Filtered(avail, state.filter_state, {}, none, jnp.asarray(False)),
            select_and_participate(config, state, inputs, avail, run.seed))
  own = filter_round_flag(config, state, avail)
  reused = state.filtered & avail
  reuse_selection = (lambda: kept) if kept is not None else (
      lambda: select_and_participate(config, state, inputs, reused, run.seed))

  def filter_branch():
    fmask, fstate, info = apply_filter(config, state, inputs, avail, run.seed, local)
    check_mask(config, "filter", "its filtered-in set", fmask, avail.shape[0])
    outside = jnp.where(own, count(fmask & ~avail), 0)
    fmask = filtered_set(state, avail, own, fmask)
    fstate = jax.tree.map(lambda a, b: jnp.where(own, a, b), fstate, state.filter_state)
    info = jax.tree.map(lambda a: jnp.where(own, a, jnp.zeros_like(a)), info)
    return (Filtered(fmask, fstate, info, outside, own),
            select_and_participate(config, state, inputs, fmask, run.seed))

  info_zeros = zeros_like_shapes(jax.eval_shape(filter_branch)[0].info)
  none = jnp.zeros((), jnp.int32)
  reuse = lambda: (Filtered(reused, state.filter_state, info_zeros, none, own), reuse_selection())
  return jax.lax.cond(any_run(config, own), filter_branch, reuse)


def kept_selection(config: RoundConfig, state: EngineState, inputs: RoundInputs,
                   run: RunValues) -> Selection:
  """The selection from the kept filtered-in set (the one a non-filtering round makes)."""
  return select_and_participate(config, state, inputs, state.filtered & inputs.available,
                                run.seed)


def plan_rows(config: RoundConfig, state: EngineState, arrays: DataArrays, run: RunValues,
              stats) -> jax.Array:
  """`[N]` bool: the clients whose rows the round will train on (host store, rows of the chosen
  clients only), decided by the round's own selection code with its state, keys and stats: every
  available client on a filtering round of a filter that trains them all, else the selection."""
  inputs = round_inputs(config, state, arrays, run, stats)
  filt = config.filter
  if filt is not None and filt.trains_available:
    return jnp.where(filter_round_flag(config, state, inputs.available), inputs.available,
                     kept_selection(config, state, inputs, run).chosen)
  return choose(config, state, inputs, run)[1].chosen
