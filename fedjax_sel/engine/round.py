"""One round as a pure function of (static config, state, data, run values): the engine's core
(docs/engine.md, "The round").

`round_step` composes the stages, each a function of its own module that returns a NamedTuple:

  inputs (`stats.round_inputs`) -> cohort plan (`cohort.plan_cohort`: filter, select,
  participate) -> training (`training.train`) -> cohort (`cohort.finish_cohort`) -> stat costs
  and clock (`costs`) -> aggregate and server step (`aggregation`) -> the parts observe -> client
  arrays and costs -> metrics (`metrics.round_metrics`).

The round is also three programs: `round_plan` (up to the training request), `training.train`
(compiled once per `training.TrainingConfig`, shared by every selector, filter, rule and
aggregator that trains the same way) and `round_finish`; the placements run them one by one when
asked to (`stages=True`), so a job of methods that train alike compiles one training.

Everything that can differ between runs of one job is an argument (`state.RunValues`,
`state.DataArrays`, the parts' state in `state.EngineState`); the `RoundConfig` holds only what
fixes the program, so every run with an equal `description.program_key` reuses one compiled round
(`programs.py`) and a leading runs axis can batch runs (`runs.py`). `step_function` picks the
composition once per config: this synchronous round (with or without a filter) or the
asynchronous server step (`asynchronous.py`).

Example:
  >>> import optax
  >>> from fedjax_sel import (DatasetSpec, LocalHParams, build_dataset, build_model, build_run,
  ...                         fedavg, random_selector, uniform_availability)
  >>> from fedjax_sel.engine import placement
  >>> data = build_dataset(DatasetSpec("digits", num_clients=20), seed=0)
  >>> spec = build_run(build_model("logreg", data.feature_shape, data.num_classes), data,
  ...                  lambda lr: optax.sgd(lr), LocalHParams(batch_size=10),
  ...                  uniform_availability(20, 10), random_selector(), fedavg(), 5, seed=0)
  >>> placed = placement.place(spec)
  >>> step = jax.jit(lambda state, arrays, run: round_step(spec.config, state, arrays, run))
  >>> state, metrics = step(spec.initial_state(), placed.arrays, spec.run_values)
  >>> int(metrics["num_trained"])
  5
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.engine.aggregation import aggregate, server_step, update_clients
from fedjax_sel.engine.asynchronous import async_step
from fedjax_sel.engine.cohort import CohortPlan, finish_cohort, plan_cohort
from fedjax_sel.engine.costs import round_clock, selector_gradients, stat_costs
from fedjax_sel.engine.description import RoundConfig
from fedjax_sel.engine.metrics import RoundFacts, mean_loss, round_metrics
from fedjax_sel.engine.state import Costs, DataArrays, EngineState, RunValues
from fedjax_sel.engine.stats import round_inputs
from fedjax_sel.engine.training import Trained, train, training_config
from fedjax_sel.parts.types import RoundOutcome


class RoundPlan(NamedTuple):
  """A round up to its training (`round_plan`): the stats the parts read, the client learning
  rate and the cohort's plan (`cohort.CohortPlan`, its `request` the training to run)."""

  stats: dict
  lr: jax.Array
  cohort: CohortPlan


def round_plan(config: RoundConfig, state: EngineState, arrays: DataArrays, run: RunValues,
               stats=None) -> RoundPlan:
  """The round's first stage: stats, filter and selection (as far as they come before training)
  and the training request; `stats` when streamed by the host store."""
  lr = run.lr * config.lr_factor(state.round)
  inputs = round_inputs(config, state, arrays, run, stats)
  return RoundPlan(dict(inputs.stats), lr, plan_cohort(config, state, arrays, run, inputs, lr))


def round_step(config: RoundConfig, state: EngineState, arrays: DataArrays, run: RunValues,
               stats=None) -> tuple[EngineState, dict]:
  """One round: `(state w_t, ...) -> (state w_{t+1}, metrics)`; `stats` when streamed by the
  host store. The three stages in one program: `round_plan`, `training.train` of its request,
  `round_finish`."""
  plan = round_plan(config, state, arrays, run, stats)
  trained = train(training_config(config), state.params, arrays.train, run.seed, run.prox_mu,
                  state.round, plan.cohort.request)
  return round_finish(config, state, arrays, run, plan, trained)


def round_finish(config: RoundConfig, state: EngineState, arrays: DataArrays, run: RunValues,
                 plan: RoundPlan, trained: Trained) -> tuple[EngineState, dict]:
  """The round's last stage, from its plan and the planned training: the cohort, stat costs and
  clock, aggregate and server step, the parts' observations, client arrays and metrics."""
  t = state.round
  n = arrays.counts.shape[1]
  lr = plan.lr
  inputs = round_inputs(config, state, arrays, run, plan.stats)
  avail = inputs.available
  cohort = finish_cohort(config, state, run, inputs, plan.cohort, trained)
  selection, (slots, _, _) = cohort.selection, cohort.trained
  # Power-of-choice's `evaluated` candidates are fixed when it selects (before `observe`).
  evaluated = config.selector.costs(selection.selector_state).evaluated
  work = stat_costs(config, arrays, avail, selection.chosen,
                    avail if evaluated is None else evaluated)
  timing = round_clock(config, selection.chosen, cohort.client_samples, work)
  agg = aggregate(config, state, cohort, arrays, timing.on_time, run.seed)
  new_params, server_state = server_step(config, state, agg.params)
  res = agg.result

  outcome = RoundOutcome(slots, agg.trained, agg.aggregated, res.train_loss, agg.local_models,
                         new_params, res.train_loss_sq, timing.client_times)
  sel_state = config.selector.observe(selection.selector_state, inputs, outcome)
  part_state = config.participation.observe(selection.participation_state, inputs, outcome)
  did = jnp.zeros((n,), bool).at[slots].max(agg.trained)
  clients = update_clients(state.clients, t, selection.chosen, did, slots, agg.trained,
                           res.train_loss)

  selector_grads, gradients_computed = selector_gradients(config, sel_state, n)
  filt = config.filter
  round_costs = Costs(
      client_eval_samples=work.evals, client_grad_samples=work.grads + selector_grads,
      train_samples=cohort.train_samples, uploads=cohort.uploads,
      # The clients that evaluated the model for the selector's or filter's stats downloaded it.
      downloads=jnp.maximum(cohort.downloads, jnp.sum(work.evaluators).astype(jnp.float32)),
      server_public_samples=jnp.asarray(
          0.0 if filt is None else filt.costs(cohort.filtered.info).server_public_samples,
          jnp.float32),
      sim_time_s=timing.round_time_s)
  costs = jax.tree.map(jnp.add, state.costs, round_costs)
  fmask = cohort.filtered.mask
  metrics = round_metrics(config, RoundFacts(
      round=t, lr=lr, available=avail, filtered=fmask, selected=selection.chosen,
      trained_clients=did, aggregated_clients=jnp.zeros((n,), bool).at[slots].max(agg.aggregated),
      num_trained=jnp.sum(agg.trained), num_aggregated=jnp.sum(agg.aggregated),
      filter_round=cohort.filtered.own,
      local_train_loss=mean_loss(res.train_loss,
                                 jnp.where(agg.trained & agg.finite, res.samples, 0.0)),
      nonfinite_clients=jnp.sum(agg.trained & ~agg.finite), new_params=new_params,
      round_costs=round_costs, costs=costs, filter_info=cohort.filtered.info,
      rule_report=config.participation.report(part_state),
      selector_report=config.selector.report(sel_state), gradients_computed=gradients_computed,
      broken=cohort.broken, round_time_s=timing.round_time_s, stragglers=timing.stragglers))
  new_state = EngineState(t + 1, new_params, clients, cohort.filtered.state, sel_state,
                          part_state, agg.aggregator_state, fmask, avail, costs, server_state)
  return new_state, metrics


def step_function(config: RoundConfig):
  """The config's composition, picked once: the asynchronous server step (`asynchronous.py`) in
  the asynchronous mode, else `round_step` (with or without a filter)."""
  return round_step if config.asynchrony is None else async_step
