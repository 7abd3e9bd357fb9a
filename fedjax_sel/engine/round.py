"""One round as a pure function of (static config, state, data, run values): the engine's core
(docs/engine.md).

A round runs these stages, each a function below (the part types are in `components.py`):
availability -> client stats -> filter -> select -> participate -> train -> aggregate -> client
state -> costs -> metrics. `round_step(config, state, data, run)` composes them. Everything that
can differ between runs of one job is an argument: the run's seed, learning rate and FedProx mu
(`RunValues`), the clients' data and the public set (`DataArrays`), and the parts' own state
(`EngineState`, where a part keeps values such as the entropy selector's eps). The `RoundConfig`
holds only what fixes the program (model, parts, K, n, capacities); `program_key(config)` is its
structural signature, so every run with an equal config reuses one compiled round (`programs.py`),
and a leading runs axis can batch runs (`runs.py`).

Under a runs axis (`config.runs_axis`), the round's schedule decisions are taken once for the
batch: a filtering round happens when any run needs one (`lax.pmax` over the axis keeps the
predicate unbatched, so `lax.cond` runs one branch, not both), and a run that did not need it
keeps its filtered set and is charged as on an ordinary round.

Example (the `Simulator` of `engine.py`'s example: its compiled round is reused here):
  >>> import optax
  >>> from fedjax_sel import Simulator, build_dataset, build_model, DatasetSpec, fedavg
  >>> from fedjax_sel import random_selector, uniform_availability, LocalHParams
  >>> data = build_dataset(DatasetSpec("digits", num_clients=20), seed=0)
  >>> sim = Simulator(build_model("logreg", data.feature_shape, data.num_classes), data,
  ...                 lambda lr: optax.sgd(lr), LocalHParams(batch_size=10),
  ...                 uniform_availability(20, 10), random_selector(5), fedavg(), 5, seed=0)
  >>> state, metrics = round_step(sim.config, sim.init(), sim.arrays, sim.run_values)
  >>> int(metrics["num_trained"])
  5
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel import keys as keylib
from fedjax_sel.client.evaluation import client_gradients, client_metrics
from fedjax_sel.client.local_training import (LocalHParams, LocalResult, OptimizerFactory,
                                              local_train)
from fedjax_sel.client.system import client_times
from fedjax_sel.data.federated import ClientPool, rows_with_replacement
from fedjax_sel.engine.signature import signature
from fedjax_sel.models.bundle import (Model, example_metrics, per_example_loss, trainable,
                                      with_trainable)
from fedjax_sel.parts.availability import Availability
from fedjax_sel.parts.types import (SPLIT_STATS, AggregateInputs, Aggregator, ClientState, Filter,
                                    Participation, RoundInputs, RoundOutcome, Selector, Stats,
                                    part_name)


class Costs(NamedTuple):
  """Cumulative cost counters (docs/workflow.md, "Outputs", lists them in the metrics).

  Attributes:
    client_eval_samples: samples evaluated by clients (forward passes for selection / rules).
    client_grad_samples: samples whose loss gradient clients computed for selection (a forward and
      a backward pass each: gradient norms, DivFL proxies).
    train_samples: training samples processed by clients.
    uploads: models uploaded to the server.
    downloads: models downloaded by clients.
    server_public_samples: samples of the public set evaluated by the server (filtering).
    sim_time_s: simulated seconds (`system.py`; 0 without a clock).
  """

  client_eval_samples: jax.Array
  client_grad_samples: jax.Array
  train_samples: jax.Array
  uploads: jax.Array
  downloads: jax.Array
  server_public_samples: jax.Array
  sim_time_s: jax.Array

  @staticmethod
  def zeros() -> Costs:
    return Costs(*(jnp.zeros((), jnp.float32) for _ in Costs._fields))


class EngineState(NamedTuple):
  """Everything a run carries from round to round (a pytree: checkpoint it to resume)."""

  round: jax.Array
  params: Any
  clients: ClientState
  filter_state: Any
  selector_state: Any
  participation_state: Any
  aggregator_state: Any
  filtered: jax.Array
  prev_available: jax.Array
  costs: Costs
  server_state: Any = ()
  inflight: Any = ()


class DataArrays(NamedTuple):
  """The data a compiled round reads, passed as arguments (never captured as constants).

  Attributes:
    train, val, test: the clients' pools (device arrays; a job's runs pad them to one capacity).
    public_x, public_y: the server's public set.
    label_hist: `[N, C]` training label histogram per client.
    counts: `[3, N]` every client's train / validation / test example counts.
    eval_mask: `[N]` bool, the clients of the `clean_*` evaluation metrics.
  """

  train: ClientPool
  val: ClientPool
  test: ClientPool
  public_x: jax.Array
  public_y: jax.Array
  label_hist: jax.Array
  counts: jax.Array
  eval_mask: jax.Array


class RunValues(NamedTuple):
  """What distinguishes one run of a program from another: scalars a runs axis batches.

  Attributes:
    seed: int32; every key derives from (seed, round, purpose, client id).
    lr: float32 base client learning rate (the config's `lr_factor(t)` multiplies it).
    prox_mu: float32 FedProx coefficient (used when the config's `proximal` is on).
  """

  seed: jax.Array
  lr: jax.Array
  prox_mu: jax.Array


class RoundConfig(NamedTuple):
  """What fixes the compiled round (static; see `program_key`).

  Attributes:
    model, optimizer, local: the model bundle, client optimizer factory and local settings
      (`local.chunk_size` resolved; `local.prox_mu` is 0: mu is a run value, `RunValues.prox_mu`).
    availability, selector, aggregator, filter, participation: the parts (filter may be None).
    k: K training slots.
    needs: the stats the parts read, sorted.
    stream: fold a linear aggregate out of local training (no K local models held).
    exclude_nonfinite: leave non-finite local models out of the aggregate.
    max_count: the largest client's training examples (a capacity: >= every run's).
    eval_batch_size: batch of the vectorized evaluations.
    lr_factor: round -> multiplier of the run's learning rate.
    clean_metrics: evaluation also reports `clean_*` metrics over `eval_mask`.
    client_sharding: NamedSharding of a clients axis over devices, or None.
    runs_axis: the vmapped runs axis name when runs are batched, else None.
    server_optimizer: a `server_optimizers.ServerOptimizer` stepping the global model with the
      pseudo-gradient `w_t - aggregate`, or None (the aggregate is the new global model).
    proximal: whether local training adds FedProx's proximal term (static; its mu is the run
      value `RunValues.prox_mu`, so runs with different mu share one program).
    clock: a `system.Clock` timing the clients and the round (with its deadline dropping
      stragglers), or None (no simulated time).
    asynchrony: a `parts.asynchronous.AsyncSpec` for the asynchronous mode (a step is then
      `engine/asynchronous.py`'s server step and `k` the buffer size), or None (rounds).
  """

  model: Model
  optimizer: OptimizerFactory
  local: LocalHParams
  availability: Availability
  selector: Selector
  aggregator: Aggregator
  filter: Filter | None
  participation: Participation
  k: int
  needs: tuple[str, ...]
  stream: bool
  exclude_nonfinite: bool
  max_count: int
  eval_batch_size: int
  lr_factor: Callable[[jax.Array], jax.Array]
  clean_metrics: bool
  client_sharding: Any = None
  runs_axis: str | None = None
  server_optimizer: Any = None
  clock: Any = None
  proximal: bool = False
  asynchrony: Any = None


def program_key(config: RoundConfig) -> Any:
  """The structural signature of a config (`signature.py`); parts' `init` functions are left
  out: they run outside the round."""
  parts = {name: getattr(config, name) for name in ("selector", "aggregator", "filter",
                                                    "participation")}
  # A part's spec describes it for fingerprints; it may hold run values (eps) the state carries.
  stripped = {name: p if p is None else p._replace(init=None, spec=None)
              for name, p in parts.items()}
  return signature(config._replace(model=config.model._replace(init=None), **stripped))


# The parts' contracts counted inside the round: metric key -> (part, what breaks it). A round with
# a non-zero count stops the run (`engine.check_contracts`), naming the part and the round.
CONTRACTS = {
    "filter_outside_available": ("filter", "kept clients that are not available"),
    "selector_outside_filtered": ("selector", ("chose clients outside the available, "
                                               "filtered-in set it was given")),
    "selector_over_k": ("selector", "chose more than K clients"),
    "rule_outside_selected": ("participation", ("trained or aggregated clients that were not "
                                                "selected")),
}


class ContractError(ValueError):
  """A part returned a mask that breaks its contract (`components.py`)."""


def check_mask(config: RoundConfig, role: str, what: str, mask, n: int) -> None:
  """At trace time: a part's `what` mask is `[N]` bool, else `ContractError` naming the part."""
  shape, dtype = tuple(jnp.shape(mask)), jnp.result_type(mask)
  if shape != (n,) or dtype != jnp.bool_:
    raise ContractError(f"the {role} {part_name(getattr(config, role))!r} returned {what} of "
                        f"shape {shape} and dtype {dtype}; a part's masks are [N] = ({n},) bool")


def _count(mask) -> jax.Array:
  return jnp.sum(mask).astype(jnp.int32)


def _any_run(config: RoundConfig, flag: jax.Array) -> jax.Array:
  """`flag` or-ed over the runs axis (unbatched under it), so a `lax.cond` on it takes one branch
  for the whole batch."""
  return flag if config.runs_axis is None else jax.lax.pmax(flag, config.runs_axis)


# --- Stages -------------------------------------------------------------------------------------

def client_stats(config: RoundConfig, params, arrays: DataArrays, t, seed, ids=None) -> dict:
  """The `[N]` stats the parts need, from the clients in `arrays`; with `ids` (a chunk of client
  ids, N for padding) the per-client gradient and mini-batch stats run for those clients only
  (the others read 0)."""
  n = arrays.counts.shape[1]
  stats = {}
  wanted = set(config.needs)
  if wanted & SPLIT_STATS["train"]:
    m = client_metrics(config.model, params, arrays.train, config.eval_batch_size)
    stats.update(loss=m.loss, accuracy=m.accuracy, entropy=m.entropy)
  for split, pool in (("val", arrays.val), ("test", arrays.test)):
    if wanted & SPLIT_STATS[split]:
      m = client_metrics(config.model, params, pool, config.eval_batch_size)
      stats.update({f"{split}_loss": m.loss, f"{split}_accuracy": m.accuracy})
  who = jnp.arange(n, dtype=jnp.int32) if ids is None else ids
  scatter = (lambda v: v) if ids is None else (
      lambda v: jnp.zeros((n, *v.shape[1:]), v.dtype).at[ids].set(v, mode="drop"))
  if "batch_loss" in wanted:
    stats["batch_loss"] = scatter(batch_loss(config, params, arrays.train, t, seed, who))
  if "grad" in wanted:
    stats["grad"] = jax.tree.map(scatter, client_gradients(config.model, params, arrays.train,
                                                           who))
  if "grad_norm" in wanted:
    stats["grad_norm"] = scatter(client_gradients(config.model, params, arrays.train, who,
                                                  norm_only=True))
  return {k: stats[k] for k in config.needs}


def batch_loss(config: RoundConfig, params, pool: ClientPool, t, seed, ids) -> jax.Array:
  """Loss of each client of `ids` on one random mini-batch of B of its training examples."""
  b = config.local.batch_size
  keys = keylib.client_keys(keylib.round_key(seed, t, keylib.STATS), ids)
  u = jax.vmap(lambda k: jax.random.uniform(k, (b,)))(keys)
  offsets, counts = pool.offsets[ids], pool.counts[ids]
  rows = rows_with_replacement(u, offsets[:, None], counts[:, None], pool.x.shape[0])
  losses = jax.vmap(lambda r: per_example_loss(config.model, params, pool.x[r], pool.y[r]))(rows)
  return jnp.where(counts > 0, jnp.mean(losses, axis=1), 0.0)


def round_inputs(config: RoundConfig, state: EngineState, arrays: DataArrays, run: RunValues,
                 stats=None) -> RoundInputs:
  """What the parts read this round (stats computed unless given, e.g. streamed by the host)."""
  t, params = state.round, state.params
  if stats is None:
    stats = client_stats(config, params, arrays, t, run.seed)
  return RoundInputs(t, params, config.availability.sample(run.seed, t), Stats(stats),
                     state.clients,
                     arrays.counts[0], arrays.label_hist,
                     lambda ids: client_gradients(config.model, params, arrays.train, ids),
                     arrays.public_x, arrays.public_y,
                     lambda r: config.availability.sample(run.seed, r),
                     lambda mask: update_norms(config, params, arrays, run, t, mask), config.k)


def update_norms(config: RoundConfig, params, arrays: DataArrays, run: RunValues, t,
                 mask) -> tuple[jax.Array, jax.Array]:
  """`([N] norms, [N] samples)`: the clients of `mask` (at most K) trained in K slots with the
  round's keys, the norm of each one's update of the trainable weights and its samples."""
  lr = run.lr * config.lr_factor(t)
  slots, valid, res = train_slots(config, params, arrays, run, mask, config.k, t, lr)
  start = trainable(config.model, params)
  moved = jax.tree.map(lambda w, g: (w - g[None]).astype(jnp.float32),
                       trainable(config.model, res.params), start)
  norms = jnp.sqrt(sum(jnp.sum(a.reshape(a.shape[0], -1) ** 2, axis=1)
                       for a in jax.tree.leaves(moved)))
  n = mask.shape[0]
  return (jnp.zeros((n,), jnp.float32).at[slots].max(jnp.where(valid, norms, 0.0)),
          per_client(mask, slots, valid, res.samples))


def sampling_weights(config: RoundConfig, selector_state) -> jax.Array | None:
  """`[N]` the selector's sampling weights after its selection, when it reports them and the
  aggregator applies them; else None (the aggregator weighs the chosen clients itself)."""
  if config.selector.sampling_weights is None or not config.aggregator.applies_sampling_weights:
    return None
  return config.selector.sampling_weights(selector_state).astype(jnp.float32)


def train_slots(config: RoundConfig, params, arrays: DataArrays, run: RunValues, mask, size, t,
                lr, aggregate_mask=None, weights=None) -> tuple[jax.Array, jax.Array, LocalResult]:
  """Trains the clients of `mask` in `size` slots; with `aggregate_mask` (streaming mode) the
  result's params are the linear aggregate of the clients in `mask & aggregate_mask`: by the
  aggregator's weights, or `sum_k c_k w^k` by the selector's sampling weights `weights` (`[N]`)."""
  slots, valid = _nonzero_slots(mask, size)
  keys = keylib.client_keys(keylib.round_key(run.seed, t, keylib.TRAIN), slots)
  combine = None
  if aggregate_mask is not None:
    if weights is None:
      combine = config.aggregator.linear_weights(valid & aggregate_mask[slots],
                                                 arrays.train.counts[slots])
    else:
      combine = jnp.where(valid & aggregate_mask[slots], weights[slots], 0.0)
  res = local_train(config.model, config.optimizer, config.local, params, arrays.train, slots,
                    valid, keys, lr, config.max_count, config.client_sharding, combine,
                    prox_mu=run.prox_mu if config.proximal else None)
  return slots, valid, res


def select(config: RoundConfig, state: EngineState, inputs: RoundInputs, fmask, seed):
  """The selector's (choice among `fmask`, new state) this round, with the round's SELECT key:
  the one selection decision, made by the round and, ahead of it, by host-store planning."""
  return config.selector.select(state.selector_state,
                                keylib.round_key(seed, inputs.round, keylib.SELECT), inputs, fmask)


def apply_filter(config: RoundConfig, state: EngineState, inputs: RoundInputs, avail, seed,
                 local):
  """The filter's (filtered-in set, new state, info) this round, with the round's FILTER key."""
  return config.filter.apply(state.filter_state,
                             keylib.round_key(seed, inputs.round, keylib.FILTER), inputs, avail,
                             local)


def filtered_set(state: EngineState, avail, filter_round, fresh):
  """The set the selector chooses from: the filter's `fresh` set on the run's filtering rounds,
  else the kept one, both within the available clients."""
  return jnp.where(filter_round, fresh & avail, state.filtered & avail)


def select_and_participate(config: RoundConfig, state: EngineState, inputs: RoundInputs, fmask,
                           seed):
  """(chosen, selector state, train mask, aggregate mask, rule state, contract counts) of the
  round."""
  t = inputs.round
  n = fmask.shape[0]
  chosen, sel_state = select(config, state, inputs, fmask, seed)
  check_mask(config, "selector", "its choice", chosen, n)
  train_m, agg_m, part_state = config.participation.apply(
      state.participation_state, keylib.round_key(seed, t, keylib.PARTICIPATE), inputs, chosen)
  check_mask(config, "participation", "its train mask", train_m, n)
  check_mask(config, "participation", "its aggregate mask", agg_m, n)
  broken = {"selector_outside_filtered": _count(chosen & ~fmask),
            "selector_over_k": jnp.maximum(_count(chosen) - config.k, 0),
            "rule_outside_selected": _count((train_m | agg_m) & ~chosen)}
  return chosen, sel_state, train_m & chosen, agg_m & train_m & chosen, part_state, broken


class _Picked(NamedTuple):
  """What the filter / select / train part of a round produced (both `lax.cond` branches)."""

  fmask: jax.Array
  filter_state: Any
  info: dict
  chosen: jax.Array
  selector_state: Any
  train_mask: jax.Array
  aggregate_mask: jax.Array
  participation_state: Any
  slots: jax.Array
  valid: jax.Array
  result: LocalResult
  train_samples: jax.Array
  uploads: jax.Array
  downloads: jax.Array
  broken: dict
  client_samples: jax.Array


def filter_round_flag(config: RoundConfig, state: EngineState, avail) -> jax.Array:
  """This run's filtering decision: every `period` rounds and when availability changed."""
  changed = jnp.any(avail != state.prev_available)
  return (state.round % config.filter.period == 0) | changed


def _pick(config: RoundConfig, state: EngineState, arrays: DataArrays, run: RunValues,
          inputs: RoundInputs, lr) -> tuple[_Picked, jax.Array]:
  """Filter (on filtering rounds), select, participate and train; returns the picks and this
  run's filter-round flag.

  Local training is traced once per round program, outside the filter's `lax.cond`: the filter
  branch holds only the filter and the selection after it. With a filter that trains every
  available client (FilFL), the round trains n slots: on a filtering round every available
  client, else the clients selected from the kept filtered-in set (the other slots take no step).
  """
  t, params, avail = state.round, state.params, inputs.available
  n_avail = config.availability.num_available
  filt = config.filter
  none = jnp.zeros((), jnp.int32)
  if filt is None:
    selection = select_and_participate(config, state, inputs, avail, run.seed)
    return _train_picked(config, state, arrays, run, lr, avail, state.filter_state, {}, none,
                         selection, None, jnp.asarray(False)), jnp.asarray(False)

  own = filter_round_flag(config, state, avail)
  filtering = _any_run(config, own)
  reused = state.filtered & avail
  reuse_selection = lambda: select_and_participate(config, state, inputs, reused, run.seed)
  local = None
  if filt.trains_available:
    # The selection from the kept set decides who trains on other rounds (not computed on
    # filtering rounds, whose selection follows the filter).
    kept = jax.lax.cond(filtering, lambda: _zeros(jax.eval_shape(reuse_selection)),
                        reuse_selection)
    local = train_slots(config, params, arrays, run, jnp.where(filtering, avail, kept[2]),
                        n_avail, t, lr)
    if config.exclude_nonfinite:
      finite, clean = _without_nonfinite(local[2], params)
      local = (local[0], local[1] & finite, clean)
    reuse_selection = lambda: kept

  def filter_branch():
    fmask, fstate, info = apply_filter(config, state, inputs, avail, run.seed, local)
    check_mask(config, "filter", "its filtered-in set", fmask, avail.shape[0])
    outside = jnp.where(own, _count(fmask & ~avail), 0)
    fmask = filtered_set(state, avail, own, fmask)
    fstate = jax.tree.map(lambda a, b: jnp.where(own, a, b), fstate, state.filter_state)
    info = jax.tree.map(lambda a: jnp.where(own, a, jnp.zeros_like(a)), info)
    return (fmask, fstate, info, outside,
            select_and_participate(config, state, inputs, fmask, run.seed))

  info_zeros = _zeros(jax.eval_shape(filter_branch)[2])
  reuse = lambda: (reused, state.filter_state, info_zeros, none, reuse_selection())
  fmask, fstate, info, outside, selection = jax.lax.cond(filtering, filter_branch, reuse)
  return _train_picked(config, state, arrays, run, lr, fmask, fstate, info, outside, selection,
                       local, own), own


def _train_picked(config: RoundConfig, state: EngineState, arrays: DataArrays, run: RunValues,
                  lr, fmask, fstate, info, outside, selection, local, trained_all) -> _Picked:
  """The round's picks with the selected clients' local results: trained now in K slots, or with
  `local` (every available client trained for the filter) gathered from those."""
  chosen, sel_state, train_m, agg_m, part_state, broken = selection
  broken = {**broken, "filter_outside_available": outside}
  if local is None:
    slots, valid, res = train_slots(config, state.params, arrays, run, train_m, config.k,
                                    state.round, lr, agg_m if config.stream else None,
                                    sampling_weights(config, sel_state))
    trained_models = jnp.sum(valid)
    train_samples = jnp.sum(res.samples)
    client_samples = per_client(fmask, slots, valid, res.samples)
  else:  # Aggregate the already-trained models of the selected clients (no retraining).
    slots_n, valid_n, res_n = local
    slots, valid = _nonzero_slots(train_m, config.k)
    n = fmask.shape[0]
    # Each trained client's slot (slots past the trained ones repeat client 0: left out).
    where = jnp.zeros((n,), jnp.int32).at[jnp.where(valid_n, slots_n, n)].set(
        jnp.arange(slots_n.shape[0]), mode="drop")
    res = jax.tree.map(lambda a: a[where[slots]], res_n)
    res = res._replace(train_loss=jnp.where(valid, res.train_loss, 0.0),
                       samples=jnp.where(valid, res.samples, 0.0),
                       train_loss_sq=jnp.where(valid, res.train_loss_sq, 0.0))
    # A run of a batch that did not need this filtering round pays for its K clients only.
    trained_models = jnp.where(trained_all, jnp.sum(valid_n), jnp.sum(valid))
    train_samples = jnp.where(trained_all, jnp.sum(res_n.samples), jnp.sum(res.samples))
    client_samples = jnp.where(trained_all, per_client(fmask, slots_n, valid_n, res_n.samples),
                               per_client(fmask, slots, valid, res.samples))
  return _Picked(fmask, fstate, info, chosen, sel_state, train_m, agg_m, part_state, slots, valid,
                 res, train_samples.astype(jnp.float32), trained_models.astype(jnp.float32),
                 jnp.maximum(trained_models, jnp.sum(chosen)).astype(jnp.float32), broken,
                 client_samples)


def per_client(like, slots, valid, values) -> jax.Array:
  """`[N]` float32: each valid slot's value at its client (0 elsewhere)."""
  return jnp.zeros(like.shape, jnp.float32).at[slots].add(
      jnp.where(valid, values, 0.0).astype(jnp.float32))


def selector_gradients(config: RoundConfig, sel_state, n: int) -> tuple[jax.Array, jax.Array]:
  """(gradient samples the selector charged after `observe`, gradients computed this round: N per
  gradient stat the parts read, plus the selector's own)."""
  costs = config.selector.costs(sel_state)
  computed = (n * len({"grad", "grad_norm"} & set(config.needs))
              + jnp.asarray(costs.gradients_computed, jnp.int32))
  return jnp.asarray(costs.gradient_samples, jnp.float32), computed


def all_finite(tree) -> jax.Array:
  """Whether every value of every leaf of `tree` is finite."""
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in jax.tree.leaves(tree)]))


def _zeros(shapes):
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def aggregate(config: RoundConfig, state: EngineState, picked: _Picked, arrays: DataArrays,
              on_time=None):
  """(new global model, aggregator state, slots trained, slots finite, slots aggregated, local
  models or None, the local result after the non-finite guard); `on_time` (`[N]` bool) leaves
  the stragglers of a deadline out of the aggregate."""
  params, res, slots = state.params, picked.result, picked.slots
  trained = picked.valid & picked.train_mask[slots]
  finite = jnp.ones_like(trained)
  if config.exclude_nonfinite:
    finite, res = _without_nonfinite(res, params)
  aggregated = trained & picked.aggregate_mask[slots] & finite
  if on_time is not None:
    aggregated &= on_time[slots]
  num_examples = arrays.train.counts[slots]
  weights = sampling_weights(config, picked.selector_state)
  if config.stream:
    if weights is None:
      any_weight = jnp.sum(config.aggregator.linear_weights(aggregated, num_examples)) > 0
      new_params = jax.tree.map(lambda a, g: jnp.where(any_weight, a, g), res.params, params)
    else:  # The streamed sum_k c_k w^k, plus the global model's share (1 - sum_k c_k).
      rest = 1.0 - jnp.sum(jnp.where(aggregated, weights[slots], 0.0))
      new_params = jax.tree.map(lambda a, g: (a + rest * g).astype(g.dtype), res.params, params)
    return new_params, state.aggregator_state, trained, finite, aggregated, None, res
  new_params, agg_state = config.aggregator.apply(
      state.aggregator_state, params, res.params,
      AggregateInputs(aggregated, num_examples, res.train_loss,
                      None if weights is None else weights[slots]))
  return new_params, agg_state, trained, finite, aggregated, res.params, res


def round_clock(config: RoundConfig, picked: _Picked, evaluators, client_evals, client_grads):
  """(`[N]` on time, the round's seconds, stragglers, `[N]` each client's seconds) by the config's
  clock (`system.py`): every client that downloaded (evaluated or was selected) or uploaded
  (trained) is timed; the round lasts as long as the slowest, or the deadline, past which trained
  clients are stragglers. Without a clock: (None, 0, 0, None)."""
  clock = config.clock
  if clock is None:
    return None, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32), None
  uploaded = picked.client_samples > 0
  downloaded = evaluators | picked.chosen | uploaded
  times = client_times(clock, picked.client_samples, client_evals, client_grads,
                       downloaded.astype(jnp.float32) + uploaded.astype(jnp.float32))
  timed = downloaded | uploaded
  slowest = jnp.max(jnp.where(timed, times, 0.0))
  if clock.deadline_s is None:
    return None, slowest, jnp.zeros((), jnp.int32), times
  on_time = times <= clock.deadline_s
  return (on_time, jnp.minimum(slowest, jnp.float32(clock.deadline_s)),
          _count(uploaded & ~on_time), times)


def server_step(config: RoundConfig, state: EngineState, aggregate_params):
  """(new global model, server optimizer state): the aggregate itself without a server optimizer,
  else `w_t + update(w_t - aggregate)` on the trainable weights (other model state, such as
  BatchNorm statistics, from the aggregate)."""
  if config.server_optimizer is None:
    return aggregate_params, state.server_state
  model, params = config.model, state.params
  weights = trainable(model, params)
  pseudo_grad = jax.tree.map(jnp.subtract, weights, trainable(model, aggregate_params))
  updates, server_state = config.server_optimizer.transform.update(pseudo_grad,
                                                                   state.server_state, weights)
  stepped = jax.tree.map(lambda w, u: (w + u).astype(w.dtype), weights, updates)
  return with_trainable(model, aggregate_params, stepped), server_state


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


def _or(value, default):
  return default if value is None else value


def stat_costs(config: RoundConfig, arrays: DataArrays, avail, chosen,
               sel_evaluated) -> tuple[jax.Array, ...]:
  """Samples clients evaluated (forward) and differentiated (forward and backward) to compute
  this round's stats, the `[N]` clients that evaluated for the selector or filter, and the `[N]`
  evaluated and differentiated samples of each client: a stat
  the filter reads costs every available client; one the selector reads, the clients its costs
  name as `evaluated` (power-of-choice's d candidates; default every available client); one
  only the participation rule reads, the selected clients (they alone decide)."""
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
  return evals, grads, evaluators, per_client[False], per_client[True]


# --- The round ----------------------------------------------------------------------------------

def round_step(config: RoundConfig, state: EngineState, arrays: DataArrays, run: RunValues,
               stats=None) -> tuple[EngineState, dict]:
  """One round: `(state w_t, ...) -> (state w_{t+1}, metrics)`; `stats` when streamed by the
  host store."""
  t = state.round
  n = arrays.counts.shape[1]
  lr = run.lr * config.lr_factor(t)
  inputs = round_inputs(config, state, arrays, run, stats)
  avail = inputs.available
  picked, filter_round = _pick(config, state, arrays, run, inputs, lr)
  # Power-of-choice's `evaluated` candidates are fixed when it selects (before `observe`).
  evals, grads, evaluators, client_evals, client_grads = stat_costs(
      config, arrays, avail, picked.chosen,
      _or(config.selector.costs(picked.selector_state).evaluated, avail))
  on_time, round_time, stragglers, times = round_clock(config, picked, evaluators,
                                                       client_evals, client_grads)
  new_params, agg_state, trained, finite, aggregated, local_models, res = aggregate(
      config, state, picked, arrays, on_time)
  new_params, server_state = server_step(config, state, new_params)
  chosen, slots = picked.chosen, picked.slots

  outcome = RoundOutcome(slots, trained, aggregated, res.train_loss, local_models, new_params,
                         res.train_loss_sq, times)
  sel_state = config.selector.observe(picked.selector_state, inputs, outcome)
  part_state = config.participation.observe(picked.participation_state, inputs, outcome)
  did = jnp.zeros((n,), bool).at[slots].max(trained)
  clients = update_clients(state.clients, t, chosen, did, slots, trained, res.train_loss)

  selector_grads, gradients_computed = selector_gradients(config, sel_state, n)
  grads += selector_grads
  # The clients that evaluated the model for the selector's or filter's stats downloaded it.
  downloads = jnp.maximum(picked.downloads, jnp.sum(evaluators).astype(jnp.float32))
  round_costs = Costs(
      client_eval_samples=evals, client_grad_samples=grads, train_samples=picked.train_samples,
      uploads=picked.uploads, downloads=downloads,
      server_public_samples=jnp.asarray(
          0.0 if config.filter is None else config.filter.costs(picked.info).server_public_samples,
          jnp.float32),
      sim_time_s=round_time)
  costs = jax.tree.map(jnp.add, state.costs, round_costs)

  w = jnp.where(trained & finite, res.samples, 0.0)
  agg = jnp.zeros((n,), bool).at[slots].max(aggregated)
  metrics = {
      "round": t,
      "lr": lr,
      "num_available": jnp.sum(avail),
      "fewer_than_k_available": jnp.sum(avail) < config.k,
      "round_time_s": round_time,
      "stragglers": stragglers,
      "num_filtered": jnp.sum(picked.fmask),
      "num_selected": jnp.sum(chosen),
      "num_trained": jnp.sum(trained),
      "num_aggregated": jnp.sum(aggregated),
      "filter_round": filter_round,
      "local_train_loss": jnp.sum(jnp.where(w > 0, res.train_loss, 0.0) * w)
                          / jnp.maximum(jnp.sum(w), 1.0),
      "nonfinite_clients": jnp.sum(trained & ~finite),
      "model_finite": all_finite(new_params),
      "cost": round_costs._asdict(),
      "cumulative_cost": costs._asdict(),
      "filter": picked.info,
      "selected": chosen,
      "trained_clients": did,
      "aggregated_clients": agg,
      "rule": config.participation.report(part_state),
      "selector": config.selector.report(sel_state),
      "gradients_computed": gradients_computed,
      "contract": picked.broken,
  }
  if config.filter is not None:
    metrics["filtered_in"] = picked.fmask
  new_state = EngineState(t + 1, new_params, clients, picked.filter_state, sel_state, part_state,
                          agg_state, picked.fmask, avail, costs, server_state)
  return new_state, metrics


def plan_rows(config: RoundConfig, state: EngineState, arrays: DataArrays, run: RunValues,
              stats) -> jax.Array:
  """`[N]` bool: the clients whose rows the round will train on (host store, rows of the chosen
  clients only): every available client on a round when FilFL trains them all, else the
  selector's choice, made as the round will make it (same state, keys and stats)."""
  inputs = round_inputs(config, state, arrays, run, stats)
  avail = inputs.available
  filt, fmask = config.filter, avail
  if filt is not None:
    filter_round = filter_round_flag(config, state, avail)
    fresh = avail
    if not filt.trains_available:
      fresh = apply_filter(config, state, inputs, avail, run.seed, None)[0]
    fmask = filtered_set(state, avail, filter_round, fresh)
  chosen, _ = select(config, state, inputs, fmask, run.seed)
  if filt is not None and filt.trains_available:
    return jnp.where(filter_round, avail, chosen)
  return chosen


def evaluate(config: RoundConfig, params, arrays: DataArrays) -> dict:
  """Global model metrics: pooled test and train loss / accuracy (and over `eval_mask`), and on
  the public set when there is one."""
  per_split = {split: client_metrics(config.model, params, pool, config.eval_batch_size)
               for split, pool in (("test", arrays.test), ("train", arrays.train))}
  out = pooled_metrics(config, per_split, arrays.eval_mask)
  if arrays.public_y.shape[0]:
    out.update(public_metrics(config.model, params, arrays.public_x, arrays.public_y))
  return out


def pooled_metrics(config: RoundConfig, per_split: dict, eval_mask) -> dict:
  """`{split}_loss` / `{split}_accuracy` pooled over every client's examples of each split's
  `ClientMetrics` (and `clean_...` over the `eval_mask` clients): the one pooling of the device and
  the host placements."""
  out = {}
  for split, m in per_split.items():
    out[f"{split}_loss"], out[f"{split}_accuracy"] = m.pooled()
    if config.clean_metrics:
      clean = m._replace(count=jnp.where(eval_mask, m.count, 0.0))
      out[f"clean_{split}_loss"], out[f"clean_{split}_accuracy"] = clean.pooled()
  if "test" in per_split:
    out["client_test_accuracy"] = client_spread(per_split["test"])
  return out


def client_spread(m) -> dict:
  """The global model's accuracy across the clients that hold examples of a split (each client's
  own accuracy, unweighted): mean, 10th percentile, worst and std."""
  acc = jnp.where(m.count > 0, m.accuracy, jnp.nan)
  return {"mean": jnp.nanmean(acc), "p10": jnp.nanpercentile(acc, 10.0), "worst": jnp.nanmin(acc),
          "std": jnp.nanstd(acc)}


def public_metrics(model: Model, params, x, y) -> dict:
  m = example_metrics(model, params, x, y)
  return {"public_loss": jnp.mean(m.loss), "public_accuracy": jnp.mean(m.correct)}


# --- Helpers ------------------------------------------------------------------------------------

def _finite_slots(res: LocalResult) -> jax.Array:
  """`[K]` bool: the slot's local model and training loss are all finite."""
  ok = jnp.isfinite(res.train_loss)
  for leaf in jax.tree.leaves(res.params):
    ok &= jnp.all(jnp.isfinite(leaf.reshape(leaf.shape[0], -1)), axis=1)
  return ok


def _without_nonfinite(res: LocalResult, global_params) -> tuple[jax.Array, LocalResult]:
  """(`[K]` finite mask, `res` with each non-finite slot's model replaced by the global model), so
  that no later average, median or distance sees a NaN; the slot's loss becomes NaN, which keeps
  it marked non-finite when the slots are gathered again."""
  finite = _finite_slots(res)
  params = jax.tree.map(
      lambda p, g: jnp.where(finite.reshape(-1, *([1] * g.ndim)), p, g[None]), res.params,
      global_params)
  return finite, res._replace(params=params, train_loss=jnp.where(finite, res.train_loss, jnp.nan))


def _nonzero_slots(mask: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
  slots = jnp.nonzero(mask, size=size, fill_value=0)[0].astype(jnp.int32)
  return slots, jnp.arange(size) < jnp.sum(mask)
