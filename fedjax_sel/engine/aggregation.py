"""The server's side of a round: the aggregate of the trained clients, the server optimizer's
step, and the persistent client arrays after the round.

Example:
  >>> import jax.numpy as jnp
  >>> from fedjax_sel.parts.types import ClientState
  >>> c = update_clients(ClientState.create(3), 0, jnp.array([True, True, False]),
  ...                    jnp.array([True, False, False]), jnp.array([0]), jnp.array([True]),
  ...                    jnp.array([0.5]))
  >>> c.participations.tolist(), c.consecutive_skips.tolist()
  ([1, 0, 0], [0, 1, 0])
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.client.local_training import LocalResult
from fedjax_sel.engine.cohort import Cohort
from fedjax_sel.engine.description import RoundConfig
from fedjax_sel.engine.state import DataArrays, EngineState
from fedjax_sel.engine.training import sampling_weights, without_nonfinite
from fedjax_sel.keys import AGGREGATE, round_key
from fedjax_sel.models.bundle import trainable, with_trainable
from fedjax_sel.parts.types import AggregateInputs, ClientState


class Aggregated(NamedTuple):
  """The aggregation of a round.

  Attributes:
    params: the aggregate (the new global model before the server optimizer).
    aggregator_state: the aggregator's state after it.
    trained: `[K]` bool, the slot trained.
    finite: `[K]` bool, the slot's model and loss are finite (all True unless excluded).
    aggregated: `[K]` bool, the slot's model entered the aggregate.
    local_models: the stacked `[K, ...]` local models, or None when streamed.
    result: the slots' `LocalResult` after the non-finite guard.
  """

  params: Any
  aggregator_state: Any
  trained: jax.Array
  finite: jax.Array
  aggregated: jax.Array
  local_models: Any
  result: LocalResult


def aggregate(config: RoundConfig, state: EngineState, cohort: Cohort, arrays: DataArrays,
              on_time=None, seed=None) -> Aggregated:
  """The cohort's aggregate; `on_time` (`[N]` bool) leaves the stragglers of a deadline out;
  `seed`, the run's, gives the aggregator its keys (`AggregateInputs.keys`)."""
  params = state.params
  slots, valid, res = cohort.trained
  selection = cohort.selection
  trained = valid & selection.train_mask[slots]
  finite = jnp.ones_like(trained)
  if config.exclude_nonfinite:
    finite, res = without_nonfinite(res, params)
  aggregated = trained & selection.aggregate_mask[slots] & finite
  if on_time is not None:
    aggregated &= on_time[slots]
  num_examples = arrays.train.counts[slots]
  weights = sampling_weights(config, selection.selector_state)
  if config.stream:
    if weights is None:
      any_weight = jnp.sum(config.aggregator.linear_weights(aggregated, num_examples)) > 0
      new_params = jax.tree.map(lambda a, g: jnp.where(any_weight, a, g), res.params, params)
    else:  # The streamed sum_k c_k w^k, plus the global model's share (1 - sum_k c_k).
      rest = 1.0 - jnp.sum(jnp.where(aggregated, weights[slots], 0.0))
      new_params = jax.tree.map(lambda a, g: (a + rest * g).astype(g.dtype), res.params, params)
    return Aggregated(new_params, state.aggregator_state, trained, finite, aggregated, None, res)
  new_params, agg_state = config.aggregator.apply(
      state.aggregator_state, params, res.params,
      AggregateInputs(aggregated, num_examples, res.train_loss,
                      None if weights is None else weights[slots], state.round, slots,
                      None if seed is None else functools.partial(round_key, seed,
                                                                  purpose=AGGREGATE)))
  return Aggregated(new_params, agg_state, trained, finite, aggregated, res.params, res)


class ServerStep(NamedTuple):
  """The server's step: the new global model w_{t+1} and the server optimizer's state."""

  params: Any
  server_state: Any


def server_step(config: RoundConfig, state: EngineState, aggregate_params) -> ServerStep:
  """The aggregate itself without a server optimizer, else `w_t + update(w_t - aggregate)` on the
  trainable weights (other model state, such as BatchNorm statistics, from the aggregate)."""
  if config.server_optimizer is None:
    return ServerStep(aggregate_params, state.server_state)
  model, params = config.model, state.params
  weights = trainable(model, params)
  pseudo_grad = jax.tree.map(jnp.subtract, weights, trainable(model, aggregate_params))
  updates, server_state = config.server_optimizer.transform.update(pseudo_grad,
                                                                   state.server_state, weights)
  stepped = jax.tree.map(lambda w, u: (w + u).astype(w.dtype), weights, updates)
  return ServerStep(with_trainable(model, aggregate_params, stepped), server_state)


def update_clients(clients: ClientState, t, chosen, did, slots, trained,
                   train_loss) -> ClientState:
  """The persistent client arrays after the round; `did`: `[N]` bool, trained and uploaded."""
  loss = clients.last_loss.at[slots].set(jnp.where(trained, train_loss, clients.last_loss[slots]))
  skipped = chosen & ~did
  return ClientState(
      last_loss=loss,
      last_round=jnp.where(did, t, clients.last_round),
      participations=clients.participations + did.astype(jnp.int32),
      consecutive_skips=jnp.where(did, 0, clients.consecutive_skips + skipped.astype(jnp.int32)))
