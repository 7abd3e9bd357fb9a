"""The asynchronous mode's event order, as FedBuff's and FedAsync's servers run it: who is
dispatched when, who arrives, who is dropped, before anything trains.

A client's finish time does not depend on the model (its clock time is its training samples, known
before it trains, and two model transfers), so a server step first plays its events here, then
trains the clients it dispatched (`asynchronous.py`). Step t starts at simulated time T_0 with the
global model w_t:

1. The free slots are filled at T_0 from the clients available then and not in flight.
2. Events pop in (finish time, client id) order. A client not available at its finish time's
   availability index went away before uploading: dropped. One whose update is staler than
   `AsyncSpec.max_staleness` is discarded (`stale_dropped`). Either way its slot is freed and
   refilled at once; neither counts toward the buffer.
3. An arrival joins the buffer and frees its slot, which is refilled at once, at the arrival's
   time, from the clients available then; the refilled client trains from w_t (the server has not
   stepped). The K-th arrival ends the step: its slot is refilled at the next step's start, from
   w_{t+1}. A client dispatched by an early arrival can finish inside the same buffer.

Each dispatch asks the selector once, with `RoundInputs.k = 1` and the clients available at that
time and not in flight as its mask: uniform selection is then FedBuff's uniform draw, and a ranking
selector (Oort, power of choice) dispatches its best candidate at that moment. A step plays at most
`MAX_EVENTS_PER_SLOT` x C events (only drops can make a step that long); one that reaches the cap
steps with the arrivals it has.

Example:
  >>> first_event(jnp.array([2.0, 1.0, 1.0]), jnp.array([4, 9, 3]), jnp.array([True, True, False]))
  Array(1, dtype=int32)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel import keys as keylib
from fedjax_sel.engine.checks import MAX_WINDOWS
from fedjax_sel.engine.contracts import check_mask, count
from fedjax_sel.engine.description import RoundConfig
from fedjax_sel.parts.asynchronous import AsyncSpec
from fedjax_sel.parts.types import RoundInputs

REFILL = 1  # Folded into round t's SELECT key for the step's second and later selector calls.
MAX_EVENTS_PER_SLOT = 4  # A step plays at most this many events per slot (C).


class Schedule(NamedTuple):
  """A step's event order.

  Attributes:
    client, active, start, finish, version: `[C]` the slots at the step's end (client id, in
      flight, dispatch and finish times, the global model version it trains from).
    source: `[C]` int32, the dispatch (index into `dispatched_clients`) of each slot's client, or
      -1 for a client dispatched in an earlier step (its update is in the in-flight table).
    dispatched_clients: `[D]` int32 the clients dispatched this step, in order (D = C + the event
      cap; `num_dispatched` of them are real).
    num_dispatched: int32.
    buffer_slot, buffer_dispatch: `[K]` int32 where each arrival's update is: the in-flight
      table's slot (an earlier dispatch) or this step's dispatch index; -1 for the other.
    buffer_client, buffer_version, buffer_start, buffer_finish: `[K]` the arrivals, in order.
    num_arrived: int32 arrivals (K unless the step ran out of clients or events).
    consumed: `[N]` bool, clients whose event (arrival or drop) this step played.
    dispatched: `[N]` bool, clients dispatched this step.
    dropped, stale_dropped: int32 drops (away at finish time) and discarded stale updates.
    concurrency: int32 clients in flight after the step's first refill.
    now: float32 the step's time (its last event's).
    selector_state: the selector's state after its calls.
    calls: int32 selector calls.
    outside, over: int32 the selector's broken contracts (clients outside its mask; more than 1).
    in_flight: `[N]` bool, the clients the slots hold.
    window: int32 the availability index of `available`.
    available: `[N]` bool, the clients available at `window` (evaluated once per index the step
      meets, not once per event).
  """

  client: jax.Array
  active: jax.Array
  start: jax.Array
  finish: jax.Array
  version: jax.Array
  source: jax.Array
  dispatched_clients: jax.Array
  num_dispatched: jax.Array
  buffer_slot: jax.Array
  buffer_dispatch: jax.Array
  buffer_client: jax.Array
  buffer_version: jax.Array
  buffer_start: jax.Array
  buffer_finish: jax.Array
  num_arrived: jax.Array
  consumed: jax.Array
  dispatched: jax.Array
  dropped: jax.Array
  stale_dropped: jax.Array
  concurrency: jax.Array
  now: jax.Array
  selector_state: Any
  calls: jax.Array
  outside: jax.Array
  over: jax.Array
  in_flight: jax.Array
  window: jax.Array
  available: jax.Array


def window(spec: AsyncSpec, seconds) -> jax.Array:
  """The availability index of simulated time `seconds`: exact up to `checks.MAX_WINDOWS`, which
  `checks.check_clock` keeps a run within; held there past it, never wrapped into negatives."""
  index = jnp.floor(jnp.asarray(seconds, jnp.float32) / jnp.float32(spec.window_s))
  return jnp.minimum(index, MAX_WINDOWS).astype(jnp.int32)


def first_event(finish: jax.Array, client: jax.Array, active: jax.Array) -> jax.Array:
  """The active slot that finishes first (ties: the lower client id)."""
  order = jnp.lexsort((client, jnp.where(active, finish, jnp.inf)))
  return order[0].astype(jnp.int32)


def _at(config: RoundConfig, s: Schedule, seed, time) -> Schedule:
  """`s` with the availability of simulated `time` (evaluated only when its index changed)."""
  index = window(config.asynchrony, time)
  moved = index != s.window
  # Under a runs axis the predicate is or-ed over the runs (`lax.cond` then takes one branch).
  anyone = moved if config.runs_axis is None else jax.lax.pmax(moved, config.runs_axis)
  available = jax.lax.cond(
      anyone, lambda: jnp.where(moved, config.availability.sample(seed, index), s.available),
      lambda: s.available)
  return s._replace(window=index, available=available)


def _fill(config: RoundConfig, s: Schedule, inputs: RoundInputs, seed, base_key, durations,
          t, time) -> Schedule:
  """Fills the free slots at simulated `time`, one selector call per dispatch, while clients are
  available and not in flight (and the selector chooses one)."""
  n = durations.shape[0]
  s = _at(config, s, seed, time)
  call_inputs = inputs._replace(available=s.available, k=1)

  def wanted(carry):
    s, stuck = carry
    return ~stuck & jnp.any(~s.active) & jnp.any(s.available & ~s.in_flight)

  def dispatch(carry):
    s, _ = carry
    candidates = s.available & ~s.in_flight
    key = jnp.where(s.calls == 0, base_key,
                    jax.random.fold_in(jax.random.fold_in(base_key, REFILL), s.calls))
    chosen, sel_state = config.selector.select(s.selector_state, key, call_inputs, candidates)
    check_mask(config, "selector", "its choice", chosen, n)
    outside, over = count(chosen & ~candidates), jnp.maximum(count(chosen) - 1, 0)
    chosen &= candidates
    # Of a choice of several, one uniformly drawn.
    u = jax.random.uniform(jax.random.fold_in(key, keylib.SELECT), (n,))
    client = jnp.argmin(jnp.where(chosen, u, jnp.inf)).astype(jnp.int32)
    picked = jnp.any(chosen)
    slot = jnp.argmin(s.active).astype(jnp.int32)  # The first free slot.
    at = jnp.where(picked, slot, s.active.shape[0])
    put = lambda table, value: table.at[at].set(value, mode="drop")
    i = s.num_dispatched
    s = s._replace(
        client=put(s.client, client), active=put(s.active, True), start=put(s.start, time),
        finish=put(s.finish, time + durations[client]), version=put(s.version, t),
        source=put(s.source, i),
        dispatched_clients=s.dispatched_clients.at[
            jnp.where(picked, i, s.dispatched_clients.shape[0])].set(client, mode="drop"),
        num_dispatched=i + picked.astype(jnp.int32),
        dispatched=s.dispatched.at[client].max(picked), selector_state=sel_state,
        in_flight=s.in_flight.at[client].max(picked),
        calls=s.calls + 1, outside=s.outside + outside, over=s.over + over)
    return s, ~picked

  return jax.lax.while_loop(wanted, dispatch, (s, jnp.asarray(False)))[0]


def schedule(config: RoundConfig, fl, inputs: RoundInputs, selector_state, seed,
             durations) -> Schedule:
  """Step t's event order (see the module's docstring) from the in-flight table `fl`."""
  spec, k = config.asynchrony, config.k
  c, n = fl.client.shape[0], durations.shape[0]
  t = inputs.round
  max_events = MAX_EVENTS_PER_SLOT * c
  zero = jnp.zeros((), jnp.int32)
  s = Schedule(
      client=fl.client, active=fl.active, start=fl.start, finish=fl.finish, version=fl.version,
      source=jnp.full((c,), -1, jnp.int32),
      dispatched_clients=jnp.zeros((c + max_events,), jnp.int32), num_dispatched=zero,
      buffer_slot=jnp.full((k,), -1, jnp.int32), buffer_dispatch=jnp.full((k,), -1, jnp.int32),
      buffer_client=jnp.zeros((k,), jnp.int32), buffer_version=jnp.zeros((k,), jnp.int32),
      buffer_start=jnp.zeros((k,), jnp.float32), buffer_finish=jnp.zeros((k,), jnp.float32),
      num_arrived=zero, consumed=jnp.zeros((n,), bool), dispatched=jnp.zeros((n,), bool),
      dropped=zero, stale_dropped=zero, concurrency=zero, now=fl.now,
      selector_state=selector_state, calls=zero, outside=zero, over=zero,
      in_flight=jnp.zeros((n,), bool).at[fl.client].max(fl.active),
      window=jnp.full((), -1, jnp.int32), available=jnp.zeros((n,), bool))
  base_key = keylib.round_key(seed, t, keylib.SELECT)
  s = _fill(config, s, inputs, seed, base_key, durations, t, fl.now)
  s = s._replace(concurrency=count(s.active))
  max_staleness = jnp.inf if spec.max_staleness is None else spec.max_staleness

  def wanted(carry):
    s, events = carry
    return (s.num_arrived < k) & jnp.any(s.active) & (events < max_events)

  def event(carry):
    s, events = carry
    e = first_event(s.finish, s.client, s.active)
    time, client = s.finish[e], s.client[e]
    tau = t - s.version[e]
    s = _at(config, s, seed, time)
    present = s.available[client]
    stale = present & (tau > max_staleness)
    arrives = present & ~stale
    i = jnp.where(arrives, s.num_arrived, k)
    put = lambda table, value: table.at[i].set(value, mode="drop")
    old = s.source[e] < 0
    s = s._replace(
        active=s.active.at[e].set(False), now=jnp.maximum(s.now, time),
        buffer_slot=put(s.buffer_slot, jnp.where(old, e, -1)),
        buffer_dispatch=put(s.buffer_dispatch, jnp.where(old, -1, s.source[e])),
        buffer_client=put(s.buffer_client, client), buffer_version=put(s.buffer_version,
                                                                        s.version[e]),
        buffer_start=put(s.buffer_start, s.start[e]), buffer_finish=put(s.buffer_finish, time),
        num_arrived=s.num_arrived + arrives.astype(jnp.int32),
        consumed=s.consumed.at[client].set(True), in_flight=s.in_flight.at[client].set(False),
        dropped=s.dropped + (~present).astype(jnp.int32),
        stale_dropped=s.stale_dropped + stale.astype(jnp.int32))
    # Refilled at once, unless this was the K-th arrival (then at the next step's start).
    s = jax.lax.cond(s.num_arrived < k,
                     lambda s: _fill(config, s, inputs, seed, base_key, durations, t, time),
                     lambda s: s, s)
    return s, events + 1

  return jax.lax.while_loop(wanted, event, (s, zero))[0]
