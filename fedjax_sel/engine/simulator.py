"""The `Simulator`: the host-side shell around one run's compiled round.

It checks the arguments, fixes the static `RoundConfig` (`round.py`), the run's `RunValues` (seed,
learning rate, FedProx mu) and where the data live (`placement.py`), and calls the compiled
programs (`programs.py`), which every `Simulator` of an equal config shares: a second seed of a
job compiles nothing. Nothing in a round returns to the host; the client axis of local training is
sharded over all local devices when there are several. Several runs advance together in one
compiled call with `runs.RunBatch`.

Examples:
  >>> import optax
  >>> from fedjax_sel import (DatasetSpec, build_dataset, build_model, fedavg, random_selector,
  ...                         uniform_availability)
  >>> data = build_dataset(DatasetSpec("digits", num_clients=20), seed=0)
  >>> model = build_model("logreg", data.feature_shape, data.num_classes)
  >>> sim = Simulator(model, data, lambda lr: optax.sgd(lr), LocalHParams(batch_size=10),
  ...                 uniform_availability(20, 10), random_selector(5), fedavg(), 5, seed=0)
  >>> state, metrics = sim.step(sim.init())
  >>> int(state.round), int(metrics["num_trained"])
  (1, 5)
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_sel.client.local_training import (CPU_TINY_STEP_FLOPS, LocalHParams, OptimizerFactory,
                                              StepCost, auto_chunk_size, default_memory_budget,
                                              step_cost)
from fedjax_sel.client.system import Clock, SystemProfile, check_profile
from fedjax_sel.data import integrity
from fedjax_sel.data.federated import FederatedDataset
from fedjax_sel.engine import executables, programs
from fedjax_sel.engine.asynchronous import InFlight
from fedjax_sel.engine.placement import Capacity, DevicePlacement, HostPlacement, fits_on_device
from fedjax_sel.engine.round import (CONTRACTS, ContractError, Costs, DataArrays, EngineState,
                                     RoundConfig, RunValues, program_key)
from fedjax_sel.engine.signature import Keyed, signature
from fedjax_sel.models.bundle import Model, model_bytes, trainable
from fedjax_sel.parts.asynchronous import AsyncSpec
from fedjax_sel.parts.availability import Availability
from fedjax_sel.parts.server_optimizers import ServerOptimizer
from fedjax_sel.parts.types import (SPLIT_STATS, STAT_NAMES, Aggregator, ClientState, Filter,
                                    Participation, Selector, everyone, part_name)

__all__ = ["Costs", "DataArrays", "EngineState", "LrSchedule", "Simulator", "constant_lr",
           "step_decay_lr", "to_host"]


def _one(t):
  del t
  return jnp.ones((), jnp.float32)


def _step_decay(t, decay, every):
  return jnp.power(jnp.float32(decay), (t // every).astype(jnp.float32))


class LrSchedule(NamedTuple):
  """Client learning rate of round t: `base * factor(t)`. The base is a run value (runs of one
  program may differ in it); the factor is part of the compiled program.

  Examples:
    >>> s = step_decay_lr(0.1, 0.5, every=10)
    >>> [round(float(s(t)), 4) for t in (0, 9, 10, 25)]
    [0.1, 0.1, 0.05, 0.025]
  """

  base: float
  factor: Callable[[jax.Array], jax.Array]

  def __call__(self, t) -> jax.Array:
    return jnp.float32(self.base) * self.factor(jnp.asarray(t))


def constant_lr(lr: float) -> LrSchedule:
  return LrSchedule(float(lr), _one)


def step_decay_lr(lr: float, decay: float, every: int) -> LrSchedule:
  """lr * decay ** (t // every), e.g. FilFL's x0.998 every 10 rounds."""
  return LrSchedule(float(lr), functools.partial(_step_decay, decay=float(decay), every=int(every)))


NONFINITE = ("stop", "exclude")
STORES = ("device", "host", "auto")
HOST_ROWS = ("auto", "available", "chosen")


def _check_arguments(data, optimizer, local, availability, seed, eval_mask, lr_schedule) -> None:
  """Named errors for arguments of the wrong kind or size, before anything compiles."""
  n = data.num_clients
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
    raise TypeError(f"seed must be an integer, got {seed!r}")
  if not 0 <= int(seed) < 2**31:
    raise ValueError(f"seed must be in 0..2**31-1, got {seed}")
  if isinstance(optimizer, optax.GradientTransformation) or not callable(optimizer):
    raise TypeError("optimizer must be a factory: learning rate -> optax transformation (e.g. "
                    f"`lambda lr: optax.sgd(lr)`), got {type(optimizer).__name__}")
  if lr_schedule is not None and not callable(lr_schedule):
    raise TypeError(f"lr_schedule must be an LrSchedule (constant_lr, step_decay_lr) or a "
                    f"callable round -> learning rate, got {type(lr_schedule).__name__}")
  if local.batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {local.batch_size}")
  if local.num_steps is None and local.num_epochs < 1:
    raise ValueError(f"num_epochs must be >= 1, got {local.num_epochs}")
  if local.num_steps is not None and local.num_steps < 1:
    raise ValueError(f"num_steps must be >= 1 (or None for epochs), got {local.num_steps}")
  shape = jax.eval_shape(lambda: availability.sample(0, jnp.int32(0))).shape
  if shape != (n,):
    raise ValueError(f"availability samples masks of shape {shape}, the dataset has {n} clients")
  if eval_mask is not None and np.shape(eval_mask) != (n,):
    raise ValueError(f"eval_mask must have one entry per client ({n}), got shape "
                     f"{np.shape(eval_mask)}")
  if eval_mask is not None and not np.any(np.asarray(eval_mask, bool)):
    raise ValueError("eval_mask selects no client: its clean_* metrics would read 0 every round; "
                     "pass None to skip them")
  if lr_schedule is not None:
    base = lr_schedule.base if isinstance(lr_schedule, LrSchedule) else 1.0
    first = float(np.asarray(lr_schedule(0)))
    if not (math.isfinite(base) and base >= 0 and math.isfinite(first) and first >= 0):
      raise ValueError(f"lr_schedule must give a finite learning rate >= 0, got base {base} and "
                       f"{first} at round 0 (a negative rate runs gradient ascent)")


def _check_k(selector, clients_per_round: int) -> None:
  """K is the simulator's: a selector built for another K (its spec's `k`, or UACS-FL's `m`) is
  refused, naming both."""
  spec = getattr(selector, "spec", None) or {}
  built = next((spec[key] for key in ("k", "m") if key in spec), None)
  if built is not None and int(built) != clients_per_round:
    raise ValueError(f"the selector {spec.get('name', '')!r} was built for K = {built} clients "
                     f"but clients_per_round = {clients_per_round}: build it with the "
                     "simulator's K")


def _check_asynchrony(spec, k: int, num_available: int, clock, filt, participation,
                      on_host: bool) -> None:
  """The asynchronous mode's requirements, else ValueError naming the argument."""
  if not isinstance(spec, AsyncSpec):
    raise TypeError(f"asynchrony must be an AsyncSpec (fedbuff, fedasync), got "
                    f"{type(spec).__name__}")
  if not k <= spec.concurrency <= num_available:
    raise ValueError(f"asynchrony.concurrency must be in {k}..{num_available} (clients_per_round, "
                     f"the buffer size, up to the clients available), got {spec.concurrency}")
  if clock is None:
    raise ValueError("asynchrony needs a system_profile: the clients' speeds order their updates")
  if clock.deadline_s is not None:
    raise ValueError("asynchrony takes no deadline_s: the server steps when K updates arrived")
  if filt is not None:
    raise ValueError(f"asynchrony takes no filter (got {part_name(filt)!r}): a filter decides on "
                     "a round's available set, which the asynchronous mode does not have")
  if participation is not None and part_name(participation) != "everyone":
    raise ValueError(f"asynchrony takes no participation rule (got {part_name(participation)!r})")
  if on_host:
    raise ValueError("asynchrony needs the device store (store='device')")


def device_memory_bytes() -> int:
  """The first device's memory: its allocator's limit on accelerators, physical memory on CPU."""
  device = jax.devices()[0]
  if device.platform != "cpu":
    return int((device.memory_stats() or {}).get("bytes_limit", 16 * 2**30))
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_model_fits(model: Model, memory: int | None = None) -> int:
  """The model's parameter bytes from its shapes (nothing allocated); ValueError when three copies
  (the global model, a client's model and its gradient, the least a round holds) exceed the
  device's memory, with the estimate."""
  size = model_bytes(jax.eval_shape(model.init, jax.random.PRNGKey(0)))
  memory = device_memory_bytes() if memory is None else memory
  if 3 * size > memory:
    raise ValueError(f"the model {model.name!r} has {size / 2**30:.1f} GiB of parameters; a round "
                     f"holds at least three copies ({3 * size / 2**30:.1f} GiB), more than the "
                     f"device's {memory / 2**30:.1f} GiB: choose a smaller model")
  return int(size)


def _check_model(model: Model, data: FederatedDataset, init_params) -> None:
  """The model takes the data's inputs and predicts its classes; `init_params` fit the model."""
  if model.num_classes != data.num_classes:
    raise ValueError(f"model {model.name!r} predicts {model.num_classes} classes, the dataset has "
                     f"{data.num_classes}")
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  inputs = jax.ShapeDtypeStruct((2, *data.feature_shape), np.asarray(data.train.x[:0]).dtype)
  try:
    logits = jax.eval_shape(model.apply, params, inputs)
  except Exception as e:  # pylint: disable=broad-except  # Any shape error of a user's model.
    raise ValueError(f"model {model.name!r} cannot take the dataset's inputs of shape "
                     f"{data.feature_shape} ({type(e).__name__}: {e})") from e
  if tuple(logits.shape) != (2, data.num_classes):
    raise ValueError(f"model {model.name!r} maps a batch of 2 inputs to logits of shape "
                     f"{tuple(logits.shape)}, expected (2, {data.num_classes})")
  if init_params is not None:
    want, got = jax.tree.structure(params), jax.tree.structure(init_params)
    if want != got:
      raise ValueError(f"init_params has another structure than model {model.name!r}'s "
                       f"parameters ({got} != {want})")
    for path, w, g in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                          jax.tree.leaves(params), jax.tree.leaves(init_params)):
      if tuple(np.shape(g)) != tuple(w.shape):
        raise ValueError(f"init_params{jax.tree_util.keystr(path[0])} has shape "
                         f"{tuple(np.shape(g))}, model {model.name!r} expects {tuple(w.shape)}")


def _check_split_stats(data, needs) -> None:
  """A stat over a client's validation or test split needs every client to hold one: a client
  with none would read loss 0 and pass any threshold unseen."""
  for split in ("val", "test"):
    read = sorted(needs & SPLIT_STATS[split])
    empty = int(np.sum(np.asarray(getattr(data, split).counts) == 0)) if read else 0
    if empty:
      raise ValueError(f"{', '.join(read)} is read by the filter, selector or participation rule, "
                       f"but {empty} of {data.num_clients} clients hold no {split} data (their "
                       f"{read[0]} would be 0); give every client a {split} split")


def client_step_cost(model: Model, optimizer: OptimizerFactory, local: LocalHParams,
                     feature_shape: tuple[int, ...]) -> StepCost:
  """`step_cost` of one client's local step, memoized by the signature of its inputs: the steps
  it compiles for XLA's cost analysis compile once per process, and the executable store keeps
  the cost for the next process."""
  key = (signature(model), signature(optimizer), signature(local._replace(
      chunk_size=None, prox_mu=0.0, memory_budget_bytes=None)), signature(tuple(feature_shape)))
  return _step_cost(Keyed(key, (model, optimizer, local, feature_shape)))


@functools.lru_cache(maxsize=64)
def _step_cost(key: Keyed) -> StepCost:
  model, optimizer, local, feature_shape = key.value
  tiny = CPU_TINY_STEP_FLOPS if jax.devices()[0].platform == "cpu" else 0.0

  def compute():
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    return step_cost(model, optimizer, local, params, feature_shape, bytes_from_flops=tiny)

  return StepCost(*executables.remembered("client_step_cost", (key.key, tiny), compute))


def _noted(kind: str, part):
  """`part` whose functions add a note naming the part and the function to any exception they
  raise (a shape error while the round is traced, a missing statistic), so that the traceback of
  a user's broken part says which part broke. The wrappers trace as the functions do, and parts
  equal in structure stay equal (one compiled program)."""
  if part is None:
    return None
  name = (part.spec or {}).get("name", type(part).__name__)

  def wrap(field, fn):
    def call(*args, **kwargs):
      try:
        return fn(*args, **kwargs)
      except Exception as e:
        e.add_note(f"raised by the {kind} {name!r} in its {field}")
        raise
    return call
  return part._replace(**{f: wrap(f, getattr(part, f)) for f in part._fields
                          if f != "spec" and callable(getattr(part, f))})


class Simulator:
  """A federated simulation with pluggable availability, filter, selector, rule and aggregator.

  Args:
    model: the model bundle.
    data: the federated dataset.
    optimizer: learning rate -> optax client optimizer.
    local: static local-training settings (its `prox_mu` is this run's FedProx mu).
    availability: S_t sampler.
    selector: picks A_t from the filtered-in set.
    aggregator: combines the trained models.
    clients_per_round: K, the number of training slots.
    seed: run seed; every key derives from (seed, round, purpose, client id).
    filter: optional filter of the available set (FilFL).
    participation: optional client-side rule (FedALIGN, FedSRC); default: everyone selected trains.
    lr_schedule: client learning rate per round: an `LrSchedule` (`constant_lr`, `step_decay_lr`;
      its base is a run value, so runs differing in it share a program) or any callable
      round -> learning rate; default `constant_lr(0.1)`.
    eval_batch_size: batch of the vectorized evaluations.
    init_params: optional initial global model (default: `model.init` from the seed).
    eval_mask: optional `[N]` bool; `evaluate` then also reports `clean_{train,test}_loss` /
      `clean_{train,test}_accuracy` over these clients' training and test data (e.g. the
      non-corrupted ones, or FedALIGN's priority clients).
    nonfinite: "stop" (default: a non-finite model or loss reaches the metrics, and `run` stops
      there) or "exclude" (a client whose local model or loss is not finite is left out of the
      aggregate and of FilFL's candidates, and counted in the `nonfinite_clients` metric: what a
      real server does with a diverged upload).
    store: where the clients' data live: "device" (all of it, the fast default when it fits),
      "host" (host memory or a memory-mapped store, `data/store.py`), or "auto" (host when the
      data exceed `placement.DEVICE_DATA_SHARE` of the device's memory). Evaluation then streams
      the population through the device in chunks.
    host_rows: with store="host", which rows reach the device each round: "available" (the
      round's available clients', prepared on a background thread while the previous round
      runs; per-client stats and gradients exist for them only, which is all that masked
      selection and the rules read; DivFL's first-round table covers only them), "chosen" (stats
      streamed over all N clients in chunks, the round's choice planned from them, then only the
      chosen clients' rows; a selector that reads client data beyond its stats, like DivFL, is
      refused when it chooses unplanned clients), or "auto" ("available" when two rounds of
      available rows fit the device's share, else "chosen").
    capacity: the `Capacity` (rows per split, largest client) the device arrays are padded to;
      default this dataset's own. Runs of a job padded to one capacity share one program
      (`runs.RunBatch` and the launchers do this).
    server_optimizer: optional `server_optimizers.ServerOptimizer` (FedAvgM, FedAdam, FedYogi,
      FedAdagrad, or any optax transform): the aggregate becomes a pseudo-gradient the server
      steps with; None (default) takes the aggregate as the new global model.
    system_profile: optional `system.SystemProfile` (per-client speed and bandwidth): each round
      is then timed (`round_time_s`, cumulative `sim_time_s`, `system.py`).
    deadline_s: with a profile, the server waits at most this many seconds per round; clients
      that trained but finish later are stragglers, left out of the aggregate.
    asynchrony: optional `AsyncSpec` (`fedbuff`, `fedasync`): the asynchronous mode
      (`engine/asynchronous.py`), where `step` is one server step, `clients_per_round` the buffer
      size K and `asynchrony.concurrency` the clients training at once; it needs a
      `system_profile`, no deadline, filter or participation rule, and the device store.
  """

  def __init__(self, model: Model, data: FederatedDataset, optimizer: OptimizerFactory,
               local: LocalHParams, availability: Availability, selector: Selector,
               aggregator: Aggregator, clients_per_round: int, seed: int,
               filter: Filter | None = None,  # pylint: disable=redefined-builtin
               participation: Participation | None = None,
               lr_schedule: Callable[[jax.Array], jax.Array] | None = None,
               eval_batch_size: int = 512, init_params: Any = None, eval_mask=None,
               nonfinite: str = "stop", store: str = "device", host_rows: str = "auto",
               capacity: Capacity | None = None, server_optimizer: ServerOptimizer | None = None,
               system_profile: SystemProfile | None = None, deadline_s: float | None = None,
               asynchrony: AsyncSpec | None = None):
    n = data.num_clients
    for name, value, accepted in (("store", store, STORES), ("host_rows", host_rows, HOST_ROWS),
                                  ("nonfinite", nonfinite, NONFINITE)):
      if value not in accepted:
        raise ValueError(f"{name} must be one of {accepted}, got {value!r}")
    _check_arguments(data, optimizer, local, availability, seed, eval_mask, lr_schedule)
    size = check_model_fits(model)
    _check_model(model, data, init_params)
    on_host = store == "host" or (store == "auto" and not fits_on_device(data))
    # Device data are checked whole; the host placement checks rows as it reads them.
    integrity.check_dataset(data, "data", rows=not on_host)
    if not 1 <= clients_per_round <= availability.num_available:
      raise ValueError(f"clients_per_round (K) must be in 1..{availability.num_available} "
                       f"(clients available per round), got {clients_per_round}")
    _check_k(selector, clients_per_round)
    if capacity is not None and not capacity.holds(data):
      raise ValueError(f"capacity {capacity} is smaller than the dataset (train / val / test rows "
                       f"{[getattr(data, s).x.shape[0] for s in ('train', 'val', 'test')]}, "
                       f"largest client {data.train.max_count})")
    participation = participation or everyone()
    selector, aggregator = _noted("selector", selector), _noted("aggregator", aggregator)
    filter, participation = _noted("filter", filter), _noted("participation rule", participation)
    needs = set(selector.needs) | set(participation.needs)
    if filter is not None:
      needs |= set(filter.needs)
    unknown = needs - set(STAT_NAMES)
    if unknown:
      raise ValueError(f"unknown stats {sorted(unknown)}; accepted: {STAT_NAMES}")
    _check_split_stats(data, needs)
    if filter is not None and filter.uses_public and not np.shape(data.public_y)[0]:
      raise ValueError("the filter evaluates models on the server's public set, but the dataset "
                       "has none (set public_fraction > 0)")
    self.model, self.data, self.optimizer = model, data, optimizer
    self.availability, self.selector, self.aggregator = availability, selector, aggregator
    self.filter, self.participation = filter, participation
    if server_optimizer is not None and not isinstance(server_optimizer, ServerOptimizer):
      raise TypeError("server_optimizer must be a ServerOptimizer (server_sgd, fedavgm, fedadam, "
                      "fedyogi, fedadagrad, or ServerOptimizer(optax transform, spec)), got "
                      f"{type(server_optimizer).__name__}")
    self.server_optimizer = server_optimizer
    clock = None
    if system_profile is not None:
      check_profile(system_profile, n)
      if deadline_s is not None and not (math.isfinite(deadline_s) and deadline_s > 0):
        raise ValueError(f"deadline_s must be a finite number of seconds > 0, got {deadline_s}")
      clock = Clock(system_profile, float(size), None if deadline_s is None else float(deadline_s))
    elif deadline_s is not None:
      raise ValueError("deadline_s needs a system_profile (the clients' speeds) to time them")
    if asynchrony is not None:
      _check_asynchrony(asynchrony, clients_per_round, availability.num_available, clock, filter,
                        participation, on_host)
      if selector.sampling_weights is not None:
        warnings.warn(f"the selector {part_name(selector)!r} reweights the clients it samples; "
                      "the asynchronous mode aggregates the updates that arrive as a set and "
                      "ignores those weights", stacklevel=2)
    self.k, self.seed, self.num_clients = clients_per_round, int(seed), n
    self.init_params = init_params
    self.eval_mask = np.ones(n, bool) if eval_mask is None else np.asarray(eval_mask, bool)
    self.mesh = self.client_sharding = self.replicated = None
    if jax.device_count() > 1:
      self.mesh = jax.make_mesh((jax.device_count(),), ("clients",),
                                axis_types=(jax.sharding.AxisType.Auto,))
      spec = jax.sharding.PartitionSpec
      self.client_sharding = jax.sharding.NamedSharding(self.mesh, spec("clients"))
      self.replicated = jax.sharding.NamedSharding(self.mesh, spec())
    if local.chunk_size is None:
      slots = max(clients_per_round, availability.num_available)
      budget = local.memory_budget_bytes or default_memory_budget()
      cost = client_step_cost(model, optimizer, local, data.feature_shape)
      local = local._replace(chunk_size=auto_chunk_size(cost, budget, slots))
    self.local = local
    schedule = lr_schedule if lr_schedule is not None else constant_lr(0.1)
    base, factor = ((schedule.base, schedule.factor) if isinstance(schedule, LrSchedule)
                    else (1.0, schedule))
    exclude = nonfinite == "exclude"
    # Stream a linear aggregate out of local training when nothing needs the K local models.
    self.stream = (aggregator.linear_weights is not None and not selector.reads_local_models
                   and not exclude and not participation.reads_local_models
                   and (clock is None or clock.deadline_s is None)
                   and (filter is None or not filter.trains_available)
                   and asynchrony is None)
    if selector.sampling_weights is not None and not aggregator.applies_sampling_weights:
      warnings.warn(f"the selector {part_name(selector)!r} reweights the clients it samples, and "
                    f"the aggregator {part_name(aggregator)!r} ignores those weights: it "
                    "aggregates the chosen clients as a set, so the aggregate is no longer an "
                    "unbiased estimate of full participation's", stacklevel=2)
    self.on_host = on_host
    self.capacity = capacity or Capacity.of([data])
    self.config = RoundConfig(
        model=model, optimizer=optimizer,
        local=local._replace(prox_mu=0.0, memory_budget_bytes=None),
        availability=availability, selector=selector, aggregator=aggregator, filter=filter,
        participation=participation, k=clients_per_round, needs=tuple(sorted(needs)),
        stream=self.stream, exclude_nonfinite=exclude,
        max_count=data.train.max_count if self.on_host else self.capacity.max_count,
        eval_batch_size=eval_batch_size, lr_factor=factor, clean_metrics=eval_mask is not None,
        client_sharding=self.client_sharding, server_optimizer=server_optimizer, clock=clock,
        proximal=bool(local.prox_mu), asynchrony=asynchrony)
    self.keyed = Keyed(program_key(self.config), self.config)
    self.run_values = RunValues(jnp.int32(seed), jnp.float32(base), jnp.float32(local.prox_mu))
    self.placement = HostPlacement(self, host_rows) if self.on_host else DevicePlacement(
        self, self.capacity)
    self.host_rows = self.placement.host_rows if self.on_host else None

  @property
  def arrays(self) -> DataArrays:
    """The run's data as the compiled programs read them (on the device, uploaded on first use;
    the host placement's are the shapes of a round's rows)."""
    return self.placement.arrays

  @property
  def needs(self) -> tuple[str, ...]:
    return self.config.needs

  def program(self, fn, static_argnums: tuple[int, ...] = ()):
    """The shared compiled `fn` (`programs.py`), outputs replicated over the clients mesh when
    there is one (every process of a multi-host run then holds the whole state and metrics)."""
    return programs.program(fn, self.replicated, static_argnums)

  def _global(self, tree):
    """`tree` placed on every device of the mesh (the same values in every process)."""
    return tree if self.mesh is None else jax.device_put(tree, self.replicated)

  # ---------------------------------------------------------------------------------------------
  def init(self) -> EngineState:
    """The state before round 0."""
    params = self.init_params
    if params is None:
      model = Keyed(signature(self.model.init), self.model)
      params = self.program(programs.init_params)(model, self.run_values.seed)
    n = self.num_clients
    filt = self.filter
    state = EngineState(
        round=jnp.zeros((), jnp.int32), params=params, clients=ClientState.create(n),
        filter_state=filt.init(n, params) if filt is not None else (),
        selector_state=self.selector.init(n, params),
        participation_state=self.participation.init(n, params),
        aggregator_state=self.aggregator.init(n, params), filtered=jnp.zeros((n,), bool),
        prev_available=jnp.zeros((n,), bool), costs=Costs.zeros(),
        server_state=(() if self.server_optimizer is None else
                      self.server_optimizer.transform.init(trainable(self.model, params))),
        inflight=(() if self.config.asynchrony is None else
                  InFlight.create(self.config.asynchrony.concurrency, params)))
    return self._global(state)

  def step(self, state: EngineState) -> tuple[EngineState, dict]:
    """Runs one round (one compiled call; in host mode, after this round's rows reach the
    device)."""
    state, metrics = self.placement.step(self._global(state))
    check_contracts(self.config, metrics)
    return state, metrics

  def steps(self, state: EngineState, num_rounds: int) -> tuple[EngineState, dict]:
    """Runs `num_rounds` rounds in one compiled call (a `lax.scan` over rounds); the metrics come
    back stacked with a leading `[num_rounds]` axis. Use it when nothing needs the host between
    rounds: for small models it removes the per-round dispatch."""
    state, metrics = self.placement.steps(self._global(state), num_rounds)
    check_contracts(self.config, metrics)
    return state, metrics

  def evaluate(self, params) -> dict:
    """Global model metrics: pooled test and train loss/accuracy, and on the public set."""
    return self.placement.evaluate(params)


def check_contracts(config: RoundConfig, metrics: dict, runs_axis: bool = False) -> None:
  """Raises `ContractError` naming the part, what it broke, the round (and the run, with
  `runs_axis`) when a round's contract counts (`round.CONTRACTS`) are not all zero. `metrics` may
  hold one round, a `steps` stack of rounds or a batch of runs."""
  rounds = np.asarray(metrics["round"])
  for key, counts in metrics["contract"].items():
    counts = np.asarray(counts)
    if not counts.any():
      continue
    at = tuple(np.argwhere(counts)[0])
    role, what = CONTRACTS[key]
    run = f", run {at[0]}" if runs_axis else ""
    raise ContractError(f"round {int(rounds[at])}{run}: the {role} "
                        f"{part_name(getattr(config, role))!r} {what} ({int(counts[at])} "
                        "clients); the run stops here, before anything of this round is kept")


def to_host(tree) -> Any:
  """Device pytree -> numpy / Python scalars (for JSON)."""
  return jax.tree.map(lambda a: np.asarray(a).item() if np.ndim(a) == 0 else np.asarray(a), tree)
