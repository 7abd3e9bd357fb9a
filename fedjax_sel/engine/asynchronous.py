"""The asynchronous mode: one server step of FedBuff or FedAsync on the simulated clock, as a pure
function of (static config, state, data, run values) (docs/papers/asynchronous.md).

C clients train at once (`AsyncSpec.concurrency`); the server steps when K updates have arrived
(K: the config's clients_per_round, the buffer size). A server step t:

1. Plays its events in FedBuff's order (`async_schedule.py`): every arrival or drop frees its slot,
   refilled at once at that time from the clients available then; the K-th arrival ends the step.
   Finish times do not depend on the model, so this needs no training.
2. Trains the clients it dispatched, all from w_t (the server has not stepped meanwhile), K at a
   time in a loop (one chunk in steady state), with round t's TRAIN keys (a client dispatched
   twice in a step folds in its occurrence).
3. Aggregates the buffer: each arrival's staleness tau = t - version weighs it by s(tau)
   (`parts/asynchronous.py`); the aggregator combines the candidates (FedBuff: `w + s_i delta_i`;
   FedAsync: the local models, then mixed in with alpha s); a server optimizer takes the result as
   any round's aggregate; the selector and the client arrays observe the arrived clients.
The in-flight table (`InFlight`) keeps, per slot, the client, when it started and finishes, the
model version it trained from and its update until it arrives.

Example:
  >>> import optax
  >>> from fedjax_sel import (DatasetSpec, build_dataset, build_model, fedavg, fedbuff,
  ...                         lognormal_profiles, random_selector, uniform_availability)
  >>> from fedjax_sel import LocalHParams, Simulator
  >>> data = build_dataset(DatasetSpec("digits", num_clients=20), seed=0)
  >>> sim = Simulator(build_model("logreg", data.feature_shape, data.num_classes), data,
  ...                 lambda lr: optax.sgd(lr), LocalHParams(batch_size=10),
  ...                 uniform_availability(20, 20), random_selector(), fedavg(), 2, seed=0,
  ...                 system_profile=lognormal_profiles(20), asynchrony=fedbuff(6))
  >>> state, metrics = sim.step(sim.init())
  >>> int(metrics["concurrency"]), int(metrics["num_aggregated"]), int(metrics["staleness_max"])
  (6, 2, 0)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel import keys as keylib
from fedjax_sel.client.local_training import local_train, samples_per_client
from fedjax_sel.client.system import client_times
from fedjax_sel.engine.aggregation import server_step, update_clients
from fedjax_sel.engine.async_schedule import Schedule, schedule, window
from fedjax_sel.engine.costs import selector_gradients, stat_costs
from fedjax_sel.engine.description import RoundConfig
from fedjax_sel.engine.metrics import RoundFacts, mean_loss, round_metrics
from fedjax_sel.engine.state import Costs, DataArrays, EngineState, RunValues
from fedjax_sel.engine.stats import round_inputs
from fedjax_sel.parts import asynchronous as rules
from fedjax_sel.parts.types import AggregateInputs, RoundOutcome


class InFlight(NamedTuple):
  """The C slots of clients training at once, and the simulated time.

  Attributes:
    client: `[C]` int32 client id of each slot.
    active: `[C]` bool, the slot holds a client that has not finished.
    start, finish: `[C]` float32 simulated seconds when it was dispatched and finishes.
    version: `[C]` int32 the global model's version (server step) it trained from.
    update: `[C, ...]` its delta from that model (FedBuff) or its local model (FedAsync).
    samples: `[C]` float32 training samples it processed.
    loss, loss_sq: `[C]` float32 its mean training loss and mean squared per-sample loss.
    now: float32 the simulated time of the last server step.
  """

  client: jax.Array
  active: jax.Array
  start: jax.Array
  finish: jax.Array
  version: jax.Array
  update: Any
  samples: jax.Array
  loss: jax.Array
  loss_sq: jax.Array
  now: jax.Array

  @staticmethod
  def create(concurrency: int, params) -> InFlight:
    """Every slot free, at time 0."""
    c = concurrency
    zeros = lambda dtype=jnp.float32: jnp.zeros((c,), dtype)
    update = jax.tree.map(lambda p: jnp.zeros((c, *jnp.shape(p)), jnp.result_type(p)), params)
    return InFlight(zeros(jnp.int32), zeros(bool), zeros(), zeros(), zeros(jnp.int32), update,
                    zeros(), zeros(), zeros(), jnp.zeros((), jnp.float32))


class Trained(NamedTuple):
  """What this step's dispatched clients computed, where the step needs it.

  Attributes:
    table: `[C]` the in-flight table's update, samples, loss and loss_sq after the step.
    buffer: `[K]` the same of each arrival.
  """

  table: tuple
  buffer: tuple


def _train_dispatched(config: RoundConfig, fl: InFlight, s: Schedule, params, arrays: DataArrays,
                      run: RunValues, t, lr) -> Trained:
  """Trains the step's dispatched clients from w_t, K at a time, and puts each one's update,
  samples and losses in its slot (if it is still in flight) and in the buffer (if it arrived);
  the slots and arrivals of earlier dispatches keep the table's."""
  k, c = config.k, fl.client.shape[0]
  d = s.dispatched_clients.shape[0]
  slot_of = jnp.full((d,), c, jnp.int32).at[jnp.where(s.source >= 0, s.source, d)].set(
      jnp.arange(c, dtype=jnp.int32), mode="drop")
  arrival_of = jnp.full((d,), k, jnp.int32).at[
      jnp.where(s.buffer_dispatch >= 0, s.buffer_dispatch, d)].set(
          jnp.arange(k, dtype=jnp.int32), mode="drop")
  ids = s.dispatched_clients
  # A client dispatched again in the step trains with its key folded with its occurrence.
  earlier = jnp.arange(d)[None, :] < jnp.arange(d)[:, None]
  occurrence = jnp.sum(earlier & (ids[None, :] == ids[:, None]), axis=1)
  base = keylib.round_key(run.seed, t, keylib.TRAIN)

  def chunk(carry):
    i, table, buffer = carry
    at = i * k + jnp.arange(k)
    valid = at < s.num_dispatched
    at = jnp.clip(at, 0, d - 1)  # Past the dispatches: any entry, masked by `valid`.
    clients = ids[at]
    keys = keylib.client_keys(base, clients)
    again = occurrence[at]
    keys = jnp.where((again > 0)[:, None], jax.vmap(jax.random.fold_in)(keys, again), keys)
    res = local_train(config.model, config.optimizer, config.local, params, arrays.train,
                      clients, valid, keys, lr, config.max_count, config.client_sharding,
                      prox_mu=run.prox_mu if config.proximal else None)
    if config.asynchrony.rule == "fedbuff":
      update = jax.tree.map(lambda x, w: (x - w[None]).astype(w.dtype), res.params, params)
    else:
      update = res.params
    values = (update, res.samples, res.train_loss,
              jnp.zeros(k) if res.train_loss_sq is None else res.train_loss_sq)
    put = lambda where: lambda tab, v: tab.at[where].set(v.astype(tab.dtype), mode="drop")
    to_slot = put(jnp.where(valid, slot_of[at], c))
    to_arrival = put(jnp.where(valid, arrival_of[at], k))
    return (i + 1, jax.tree.map(to_slot, table, values),
            jax.tree.map(to_arrival, buffer, values))

  table = (fl.update, fl.samples, fl.loss, fl.loss_sq)
  # The arrivals of earlier dispatches: their slot's values, read before any refill replaced them.
  old = jnp.clip(s.buffer_slot, 0, c - 1)
  buffer = jax.tree.map(lambda a: a[old], table)
  chunks = -(-s.num_dispatched // k)
  _, table, buffer = jax.lax.while_loop(lambda carry: carry[0] < chunks, chunk,
                                        (jnp.zeros((), jnp.int32), table, buffer))
  return Trained(table, buffer)


def async_step(config: RoundConfig, state: EngineState, arrays: DataArrays,
               run: RunValues, stats=None) -> tuple[EngineState, dict]:
  """One server step: `(state of version t, ...) -> (state of version t + 1, metrics)`."""
  spec = config.asynchrony
  t, params, fl = state.round, state.params, state.inflight
  n = arrays.counts.shape[1]
  lr = run.lr * config.lr_factor(t)
  here = window(spec, fl.now)
  base = round_inputs(config, state, arrays, run, stats)
  # Availability by simulated time; a part that looks r rounds ahead looks r windows ahead.
  inputs = base._replace(
      available=config.availability.sample(run.seed, here),
      available_at=lambda r: config.availability.sample(run.seed, here + (r - t)))
  avail = inputs.available
  client_samples = samples_per_client(arrays.train.counts, config.local)
  durations = client_times(config.clock, client_samples, 0.0, 0.0,
                           jnp.full((n,), 2.0, jnp.float32))
  s = schedule(config, fl, inputs, state.selector_state, run.seed, durations)
  trained = _train_dispatched(config, fl, s, params, arrays, run, t, lr)
  update, samples, loss, loss_sq = trained.buffer
  arrived = jnp.arange(config.k) < s.num_arrived
  tau = jnp.where(arrived, t - s.buffer_version, 0)
  weights = rules.staleness_weight(spec, tau)
  candidates = rules.candidate_models(spec, params, update, weights)
  aggregate, agg_state = config.aggregator.apply(
      state.aggregator_state, params, candidates,
      AggregateInputs(arrived, arrays.train.counts[s.buffer_client], loss))
  anyone = jnp.any(arrived)
  aggregate = jax.tree.map(lambda a, w: jnp.where(anyone, a, w), aggregate, params)
  new_params, server_state = server_step(config, state,
                                         rules.mix(spec, params, aggregate, arrived, weights))

  times = jnp.zeros((n,), jnp.float32).at[s.buffer_client].max(
      jnp.where(arrived, s.buffer_finish - s.buffer_start, 0.0))
  outcome = RoundOutcome(s.buffer_client, arrived, arrived, loss,
                         candidates if config.selector.reads_local_models else None, new_params,
                         loss_sq, times)
  sel_state = config.selector.observe(s.selector_state, inputs, outcome)
  part_state = config.participation.observe(state.participation_state, inputs, outcome)
  did = jnp.zeros((n,), bool).at[s.buffer_client].max(arrived)
  clients = update_clients(state.clients, t, s.consumed, did, s.buffer_client, arrived, loss)

  evaluated = config.selector.costs(s.selector_state).evaluated
  work = stat_costs(config, arrays, avail, s.dispatched, avail if evaluated is None else evaluated)
  selector_grads, gradients_computed = selector_gradients(config, sel_state, n)
  elapsed = s.now - fl.now
  dispatched_samples = jnp.sum(jnp.where(
      jnp.arange(s.dispatched_clients.shape[0]) < s.num_dispatched,
      client_samples[s.dispatched_clients], 0.0))
  round_costs = Costs(
      client_eval_samples=work.evals, client_grad_samples=work.grads + selector_grads,
      train_samples=dispatched_samples, uploads=jnp.sum(arrived).astype(jnp.float32),
      downloads=(s.num_dispatched + jnp.sum(work.evaluators & ~s.dispatched)).astype(
          jnp.float32),
      server_public_samples=jnp.zeros((), jnp.float32), sim_time_s=elapsed)
  costs = jax.tree.map(jnp.add, state.costs, round_costs)
  metrics = round_metrics(config, RoundFacts(
      round=t, lr=lr, available=avail, filtered=avail, selected=s.dispatched,
      trained_clients=did, aggregated_clients=did, num_trained=s.num_dispatched,
      num_aggregated=s.num_arrived, filter_round=jnp.asarray(False),
      local_train_loss=mean_loss(loss, jnp.where(arrived, samples, 0.0)),
      nonfinite_clients=jnp.zeros((), jnp.int32), new_params=new_params,
      round_costs=round_costs, costs=costs, filter_info={},
      rule_report=config.participation.report(part_state),
      selector_report=config.selector.report(sel_state), gradients_computed=gradients_computed,
      broken={"filter_outside_available": jnp.zeros((), jnp.int32),
              "selector_outside_filtered": s.outside, "selector_over_k": s.over,
              "rule_outside_selected": jnp.zeros((), jnp.int32)},
      round_time_s=elapsed, stragglers=jnp.zeros((), jnp.int32)))
  metrics.update(sim_time_s=s.now,
                 staleness_mean=jnp.sum(tau) / jnp.maximum(jnp.sum(arrived), 1),
                 staleness_max=jnp.max(tau), dropped=s.dropped, stale_dropped=s.stale_dropped,
                 concurrency=s.concurrency, selector_calls=s.calls,
                 arrivals=jnp.where(arrived, s.buffer_client, -1))
  table_update, table_samples, table_loss, table_loss_sq = trained.table
  fl = InFlight(s.client, s.active, s.start, s.finish, s.version, table_update, table_samples,
                table_loss, table_loss_sq, s.now)
  new_state = EngineState(t + 1, new_params, clients, state.filter_state, sel_state,
                          part_state, agg_state, avail, avail, costs, server_state, fl)
  return new_state, metrics
