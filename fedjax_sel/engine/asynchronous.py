"""The asynchronous mode: one server step of FedBuff or FedAsync on the simulated clock, as a pure
function of (static config, state, data, run values) (docs/papers/asynchronous.md).

C clients train at once (`AsyncSpec.concurrency`); the server steps when K updates have arrived
(K: the config's clients_per_round, the buffer size). The in-flight table (`InFlight`) holds, per
slot, the client, when it started and finishes, the global model's version it trained from, and
its update, computed when it was dispatched and held until its finish time: the step is static
(C slots, K training slots), with no event loop. Step t, at simulated time T:

1. Refill: the free slots are filled from the clients available at T (availability index
   floor(T / window_s)) and not in flight, by the selector, K per call (its key: round t's SELECT
   key, folded with the call's index after the first), up to ceil(C / K) calls; of a call that
   chose more clients than slots are free, a uniformly drawn subset. Each dispatched client
   trains from w_t (round t's TRAIN keys) and finishes at T + its time on the clock (its
   training samples and two model transfers, `system.client_times`).
2. Events: the in-flight updates in order of finish time (ties: the lower client id first). A
   client not available at the index of its finish time went away before uploading: dropped, its
   slot freed. The step takes events up to the K-th update that arrives (every event when fewer
   than K would arrive) and the clock moves to that event's time.
3. Aggregate: each arrived update's staleness tau = t - version weighs it by s(tau)
   (`parts/asynchronous.py`); the aggregator combines the candidates (FedBuff: `w + s_i delta_i`;
   FedAsync: the local models, then mixed in with alpha s); a server optimizer takes the result as
   any round's aggregate; the selector and the client arrays observe the arrived clients.

With C = K, no staleness discount (every tau is 0) and every client available, each step
dispatches, trains and aggregates exactly the clients of synchronous round t, with its keys:
the mode is synchronous FedAvg (tests/test_asynchronous.py).

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
from fedjax_sel.client.system import client_times
from fedjax_sel.engine.aggregation import server_step, update_clients
from fedjax_sel.engine.contracts import check_mask
from fedjax_sel.engine.costs import selector_gradients, stat_costs
from fedjax_sel.engine.description import RoundConfig
from fedjax_sel.engine.metrics import RoundFacts, mean_loss, round_metrics
from fedjax_sel.engine.state import Costs, DataArrays, EngineState, RunValues
from fedjax_sel.engine.stats import round_inputs
from fedjax_sel.engine.training import per_client, train_slots
from fedjax_sel.parts import asynchronous as rules
from fedjax_sel.parts.types import AggregateInputs, RoundInputs, RoundOutcome

REFILL = 1  # Folded into round t's SELECT key for the step's second and later selector calls.


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


def window(spec: rules.AsyncSpec, seconds) -> jax.Array:
  """The availability index of simulated time `seconds`."""
  return jnp.floor(jnp.asarray(seconds, jnp.float32) / jnp.float32(spec.window_s)).astype(
      jnp.int32)


def _in_flight(fl: InFlight, n: int) -> jax.Array:
  """`[N]` bool: the clients some slot holds."""
  return jnp.zeros((n,), bool).at[fl.client].max(fl.active)


def _at_most(chosen: jax.Array, room: jax.Array, key: jax.Array, k: int) -> jax.Array:
  """`chosen` (at most `k` clients) when it holds at most `room` of them, else a uniformly drawn
  `room`: those with the lowest uniform draws of `key`."""
  u = jax.random.uniform(key, chosen.shape)
  scores, ids = jax.lax.top_k(jnp.where(chosen, -u, -jnp.inf), k)
  take = (jnp.arange(k) < room) & jnp.isfinite(scores)
  return jnp.zeros(chosen.shape, bool).at[ids].max(take)


class _Refill(NamedTuple):
  calls: jax.Array
  fl: InFlight
  selector_state: Any
  dispatched: jax.Array
  train_samples: jax.Array
  broken_outside: jax.Array
  broken_over: jax.Array


def refill(config: RoundConfig, fl: InFlight, selector_state, inputs: RoundInputs, arrays,
           run, lr) -> _Refill:
  """Step 1: fill the free slots with clients the selector chooses, each trained from w_t."""
  spec, k, n = config.asynchrony, config.k, inputs.available.shape[0]
  t, params = inputs.round, inputs.params
  base_key = keylib.round_key(run.seed, t, keylib.SELECT)
  max_calls = -(-spec.concurrency // k)

  def wanted(r: _Refill):
    free = jnp.sum(~r.fl.active)
    candidates = inputs.available & ~_in_flight(r.fl, n)
    return (r.calls < max_calls) & (free > 0) & jnp.any(candidates)

  def call(r: _Refill) -> _Refill:
    fl = r.fl
    candidates = inputs.available & ~_in_flight(fl, n)
    key = jnp.where(r.calls == 0, base_key,
                    jax.random.fold_in(jax.random.fold_in(base_key, REFILL), r.calls))
    chosen, sel_state = config.selector.select(r.selector_state, key, inputs, candidates)
    check_mask(config, "selector", "its choice", chosen, n)
    outside = jnp.sum(chosen & ~candidates).astype(jnp.int32)
    over = jnp.maximum(jnp.sum(chosen).astype(jnp.int32) - k, 0)
    chosen &= candidates
    free = ~fl.active
    chosen = _at_most(chosen, jnp.sum(free), jax.random.fold_in(key, keylib.SELECT), k)
    slots, valid, res = train_slots(config, params, arrays, run, chosen, k, t, lr)
    times = client_times(config.clock, per_client(chosen, slots, valid, res.samples), 0.0, 0.0,
                         2.0 * jnp.zeros((n,), jnp.float32).at[slots].max(valid))
    # Slot i of the training goes into the i-th free slot of the table.
    place = jnp.nonzero(free, size=k, fill_value=spec.concurrency)[0]
    place = jnp.where(valid, place, spec.concurrency)
    put = lambda table, values: table.at[place].set(values.astype(table.dtype), mode="drop")
    if spec.rule == "fedbuff":
      update = jax.tree.map(lambda x, w: (x - w[None]).astype(w.dtype), res.params, params)
    else:
      update = res.params
    fl = fl._replace(
        client=put(fl.client, slots), active=put(fl.active, valid), start=put(fl.start,
                                                                            jnp.full(k, fl.now)),
        finish=put(fl.finish, fl.now + times[slots]), version=put(fl.version, jnp.full(k, t)),
        update=jax.tree.map(put, fl.update, update), samples=put(fl.samples, res.samples),
        loss=put(fl.loss, res.train_loss),
        loss_sq=put(fl.loss_sq, jnp.zeros(k) if res.train_loss_sq is None else res.train_loss_sq))
    return _Refill(r.calls + 1, fl, sel_state, r.dispatched | chosen,
                   r.train_samples + jnp.sum(res.samples), r.broken_outside + outside,
                   r.broken_over + over)

  zero = jnp.zeros((), jnp.int32)
  start = _Refill(zero, fl, selector_state, jnp.zeros((n,), bool), jnp.zeros((), jnp.float32),
                  zero, zero)
  return jax.lax.while_loop(wanted, call, start)


def available_at_finish(config: RoundConfig, fl: InFlight, seed) -> jax.Array:
  """`[C]` bool: each slot's client is available at its finish time's index. The availability
  model is evaluated once per distinct index among the active slots (a few per step: finish
  times lie close together), not once per slot."""
  c = fl.client.shape[0]
  windows = jnp.where(fl.active, window(config.asynchrony, fl.finish), jnp.iinfo(jnp.int32).max)
  distinct = jnp.unique(windows, size=c, fill_value=jnp.iinfo(jnp.int32).max)
  count = jnp.sum(distinct < jnp.iinfo(jnp.int32).max)

  def one(carry):
    i, out = carry
    mask = config.availability.sample(seed, distinct[i])
    return i + 1, jnp.where(windows == distinct[i], mask[fl.client], out)

  return jax.lax.while_loop(lambda carry: carry[0] < count, one,
                            (jnp.zeros((), jnp.int32), jnp.zeros((c,), bool)))[1]


class _Events(NamedTuple):
  consumed: jax.Array
  arrived: jax.Array
  dropped: jax.Array
  now: jax.Array


def events(config: RoundConfig, fl: InFlight, seed) -> _Events:
  """Step 2: the in-flight slots in order of (finish time, client id); each is an arrival when
  its client is available at its finish time's index, else a drop; the events up to the K-th
  arrival are this step's (`[C]` masks), and the clock moves to the last one's time."""
  k = config.k
  finish = jnp.where(fl.active, fl.finish, jnp.inf)
  order = jnp.lexsort((fl.client, finish))
  arrives = fl.active & available_at_finish(config, fl, seed)
  ordered = arrives[order].astype(jnp.int32)
  before = jnp.cumsum(ordered) - ordered  # Arrivals strictly earlier in the order.
  consumed = jnp.zeros_like(fl.active).at[order].set(fl.active[order] & (before < k))
  now = jnp.maximum(fl.now, jnp.max(jnp.where(consumed, fl.finish, -jnp.inf)))
  return _Events(consumed, consumed & arrives, consumed & ~arrives, now)


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

  filled = refill(config, fl, state.selector_state, inputs, arrays, run, lr)
  fl = filled.fl
  concurrency = jnp.sum(fl.active)
  ev = events(config, fl, run.seed)
  tau = jnp.where(ev.arrived, t - fl.version, 0)
  weights = rules.staleness_weight(spec, tau)
  num_examples = arrays.train.counts[fl.client]
  candidates = rules.candidate_models(spec, params, fl.update, weights)
  aggregate, agg_state = config.aggregator.apply(
      state.aggregator_state, params, candidates,
      AggregateInputs(ev.arrived, num_examples, fl.loss))
  anyone = jnp.any(ev.arrived)
  aggregate = jax.tree.map(lambda a, w: jnp.where(anyone, a, w), aggregate, params)
  new_params, server_state = server_step(config, state,
                                             rules.mix(spec, params, aggregate, ev.arrived,
                                                       weights))

  times = jnp.zeros((n,), jnp.float32).at[fl.client].max(
      jnp.where(ev.arrived, fl.finish - fl.start, 0.0))
  outcome = RoundOutcome(fl.client, ev.arrived, ev.arrived, fl.loss,
                         candidates if config.selector.reads_local_models else None, new_params,
                         fl.loss_sq, times)
  sel_state = config.selector.observe(filled.selector_state, inputs, outcome)
  part_state = config.participation.observe(state.participation_state, inputs, outcome)
  did = jnp.zeros((n,), bool).at[fl.client].max(ev.arrived)
  left = jnp.zeros((n,), bool).at[fl.client].max(ev.consumed)
  clients = update_clients(state.clients, t, left, did, fl.client, ev.arrived, fl.loss)

  evaluated = config.selector.costs(filled.selector_state).evaluated
  evals, grads, evaluators, _, _ = stat_costs(config, arrays, avail, filled.dispatched,
                                                  avail if evaluated is None else evaluated)
  selector_grads, gradients_computed = selector_gradients(config, sel_state, n)
  grads += selector_grads
  elapsed = ev.now - state.inflight.now
  round_costs = Costs(
      client_eval_samples=evals, client_grad_samples=grads,
      train_samples=filled.train_samples, uploads=jnp.sum(ev.arrived).astype(jnp.float32),
      downloads=jnp.sum(filled.dispatched | evaluators).astype(jnp.float32),
      server_public_samples=jnp.zeros((), jnp.float32), sim_time_s=elapsed)
  costs = jax.tree.map(jnp.add, state.costs, round_costs)
  metrics = round_metrics(config, RoundFacts(
      round=t, lr=lr, available=avail, filtered=avail, selected=filled.dispatched,
      trained_clients=did, aggregated_clients=did, num_trained=jnp.sum(filled.dispatched),
      num_aggregated=jnp.sum(ev.arrived), filter_round=jnp.asarray(False),
      local_train_loss=mean_loss(fl.loss, jnp.where(ev.arrived, fl.samples, 0.0)),
      nonfinite_clients=jnp.zeros((), jnp.int32), new_params=new_params,
      round_costs=round_costs, costs=costs, filter_info={},
      rule_report=config.participation.report(part_state),
      selector_report=config.selector.report(sel_state), gradients_computed=gradients_computed,
      broken={"filter_outside_available": jnp.zeros((), jnp.int32),
              "selector_outside_filtered": filled.broken_outside,
              "selector_over_k": filled.broken_over,
              "rule_outside_selected": jnp.zeros((), jnp.int32)},
      round_time_s=elapsed, stragglers=jnp.zeros((), jnp.int32)))
  metrics.update(sim_time_s=ev.now,
                 staleness_mean=jnp.sum(tau) / jnp.maximum(jnp.sum(ev.arrived), 1),
                 staleness_max=jnp.max(tau), dropped=jnp.sum(ev.dropped), concurrency=concurrency,
                 selector_calls=filled.calls)
  fl = fl._replace(active=fl.active & ~ev.consumed, now=ev.now)
  new_state = EngineState(t + 1, new_params, clients, state.filter_state, sel_state,
                              part_state, agg_state, avail, avail, costs, server_state, fl)
  return new_state, metrics

