"""One metrics builder for every composition of a round (synchronous, filtered, asynchronous).

A composition states what its round did as a `RoundFacts`; `round_metrics` turns that into the
metrics dict every consumer reads (the host loop's records, the contracts' check, the figures), so
that a metric means the same thing whichever composition produced it.

Example:
  >>> import jax.numpy as jnp
  >>> float(mean_loss(jnp.array([1.0, 3.0, 9.0]), jnp.array([1.0, 3.0, 0.0])))
  2.5
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.engine.description import RoundConfig
from fedjax_sel.engine.state import Costs
from fedjax_sel.engine.training import all_finite


class RoundFacts(NamedTuple):
  """What one round (or server step) did.

  Attributes:
    round: the round index t.
    lr: the clients' learning rate this round.
    available: `[N]` bool, the available clients.
    filtered: `[N]` bool, the set the selector chose from.
    selected: `[N]` bool, the clients chosen (dispatched, in the asynchronous mode).
    trained_clients: `[N]` bool, clients that trained and uploaded.
    aggregated_clients: `[N]` bool, clients whose model entered the aggregate.
    num_trained, num_aggregated: counts of the training and aggregated slots.
    filter_round: bool, the filter ran this round.
    local_train_loss: the trained clients' mean training loss, by samples.
    nonfinite_clients: clients left out for a non-finite model or loss.
    new_params: the new global model.
    round_costs, costs: this round's and the cumulative `Costs`.
    filter_info: the filter's report (`{}` without one).
    rule_report, selector_report: the participation rule's and the selector's reports.
    gradients_computed: gradients the clients computed for the parts this round.
    broken: the contract counts (`contracts.CONTRACTS`).
    round_time_s: simulated seconds of the round.
    stragglers: trained clients that missed the deadline.
  """

  round: jax.Array
  lr: jax.Array
  available: jax.Array
  filtered: jax.Array
  selected: jax.Array
  trained_clients: jax.Array
  aggregated_clients: jax.Array
  num_trained: jax.Array
  num_aggregated: jax.Array
  filter_round: jax.Array
  local_train_loss: jax.Array
  nonfinite_clients: jax.Array
  new_params: Any
  round_costs: Costs
  costs: Costs
  filter_info: dict
  rule_report: Any
  selector_report: Any
  gradients_computed: jax.Array
  broken: dict
  round_time_s: jax.Array
  stragglers: jax.Array


def round_metrics(config: RoundConfig, facts: RoundFacts) -> dict:
  """The round's metrics dict (docs/workflow.md, "Outputs", names them)."""
  metrics = {
      "round": facts.round,
      "lr": facts.lr,
      "num_available": jnp.sum(facts.available),
      "fewer_than_k_available": jnp.sum(facts.available) < config.k,
      "round_time_s": facts.round_time_s,
      "stragglers": facts.stragglers,
      "num_filtered": jnp.sum(facts.filtered),
      "num_selected": jnp.sum(facts.selected),
      "num_trained": facts.num_trained,
      "num_aggregated": facts.num_aggregated,
      "filter_round": facts.filter_round,
      "local_train_loss": facts.local_train_loss,
      "nonfinite_clients": facts.nonfinite_clients,
      "model_finite": all_finite(facts.new_params),
      "cost": facts.round_costs._asdict(),
      "cumulative_cost": facts.costs._asdict(),
      "filter": facts.filter_info,
      "selected": facts.selected,
      "trained_clients": facts.trained_clients,
      "aggregated_clients": facts.aggregated_clients,
      "rule": facts.rule_report,
      "selector": facts.selector_report,
      "gradients_computed": facts.gradients_computed,
      "contract": facts.broken,
  }
  if config.filter is not None:
    metrics["filtered_in"] = facts.filtered
  return metrics


def mean_loss(loss, samples) -> jax.Array:
  """The mean of per-client losses weighted by samples (clients with none left out)."""
  return jnp.sum(jnp.where(samples > 0, loss, 0.0) * samples) / jnp.maximum(jnp.sum(samples), 1.0)
