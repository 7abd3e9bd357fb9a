"""Build, then run: `build_run` checks a run's arguments and builds its `RunSpec` once, with
nothing uploaded or compiled; placements (`placement.place`), run batches (`runs.RunBatch`), the
host loop (`host/runner.py`) and the `Simulator` facade take that value.

A `RunSpec` is the round's description (`description.RoundConfig`: model, optimizer, local
training, the parts, K, clock, asynchrony, evaluation) with what the run itself brings: its data,
its run values (seed, learning rate, FedProx mu), its initial model and where its data live.

Example:
  >>> import optax
  >>> from fedjax_sel import (DatasetSpec, LocalHParams, build_dataset, build_model, fedavg,
  ...                         random_selector, uniform_availability)
  >>> data = build_dataset(DatasetSpec("digits", num_clients=20), seed=0)
  >>> spec = build_run(build_model("logreg", data.feature_shape, data.num_classes), data,
  ...                  lambda lr: optax.sgd(lr), LocalHParams(batch_size=10),
  ...                  uniform_availability(20, 10), random_selector(), fedavg(), 5, seed=3)
  >>> spec.config.k, spec.seed, spec.on_host
  (5, 3, False)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from fedjax_sel.client.local_training import (LocalHParams, OptimizerFactory, auto_chunk_size,
                                              default_memory_budget)
from fedjax_sel.client.system import Clock, SystemProfile, check_profile
from fedjax_sel.data import integrity
from fedjax_sel.data.federated import FederatedDataset
from fedjax_sel.engine import checks, footprints, programs
from fedjax_sel.engine.asynchronous import InFlight
from fedjax_sel.engine.capacity import Capacity, fits_on_device
from fedjax_sel.engine.contracts import noted
from fedjax_sel.engine.description import (LrSchedule, RoundConfig, client_step_cost, constant_lr,
                                           replicated)
from fedjax_sel.engine.signature import Keyed, signature
from fedjax_sel.engine.state import Costs, EngineState, RunValues
from fedjax_sel.models.bundle import Model, trainable
from fedjax_sel.parts.asynchronous import AsyncSpec
from fedjax_sel.parts.availability import Availability
from fedjax_sel.parts.server_optimizers import ServerOptimizer
from fedjax_sel.parts.types import (STAT_NAMES, Aggregator, ClientState, Filter, Participation,
                                    Selector, everyone, part_name)


class RunSpec(NamedTuple):
  """One run, built and checked.

  Attributes:
    config: the round's description (static; runs with equal `program_key`s share a program).
    data: the federated dataset.
    run_values: the run's seed, base learning rate and FedProx mu.
    init_params: the initial global model, or None (`model.init` at the run's INIT key).
    eval_mask: `[N]` bool, the clients of the `clean_*` metrics.
    capacity: the `Capacity` the device arrays are padded to.
    on_host: the data stay in host memory (`placement.HostPlacement`).
    host_rows: with the host store, "available", "chosen" or "auto".
  """

  config: RoundConfig
  data: FederatedDataset
  run_values: RunValues
  init_params: Any
  eval_mask: np.ndarray
  capacity: Capacity
  on_host: bool
  host_rows: str

  @property
  def seed(self) -> int:
    return int(self.run_values.seed)

  @property
  def num_clients(self) -> int:
    return self.data.num_clients

  def initial_state(self) -> EngineState:
    """The state before round 0 (on every device of the clients mesh when there is one)."""
    config, n = self.config, self.num_clients
    params = self.init_params
    if params is None:
      model = Keyed(signature(config.model.init), config.model)
      params = programs.program(programs.init_params, replicated(config), light=True)(
          model, self.run_values.seed)
    filt, server_opt = config.filter, config.server_optimizer
    state = EngineState(
        round=jax.device_put(np.int32(0)), params=params, clients=ClientState.create(n),
        filter_state=filt.init(n, params) if filt is not None else (),
        selector_state=config.selector.init(n, params),
        participation_state=config.participation.init(n, params),
        aggregator_state=config.aggregator.init(n, params),
        filtered=jax.device_put(np.zeros(n, bool)),
        prev_available=jax.device_put(np.zeros(n, bool)), costs=Costs.zeros(),
        server_state=(() if server_opt is None else
                      server_opt.transform.init(trainable(config.model, params))),
        inflight=(() if config.asynchrony is None else
                  InFlight.create(config.asynchrony.concurrency, params)))
    return on_mesh(config, state)


def on_mesh(config: RoundConfig, tree):
  """`tree` placed on every device of the config's clients mesh (the same values in every
  process), or as it is on one device."""
  sharding = replicated(config)
  return tree if sharding is None else jax.device_put(tree, sharding)


def _clock(system_profile, deadline_s, n: int, model_size: int) -> Clock | None:
  """The run's clock from its profile and deadline, else None; ValueError naming the argument."""
  if system_profile is None:
    if deadline_s is not None:
      raise ValueError("deadline_s needs a system_profile (the clients' speeds) to time them")
    return None
  check_profile(system_profile, n)
  if deadline_s is not None and not (math.isfinite(deadline_s) and deadline_s > 0):
    raise ValueError(f"deadline_s must be a finite number of seconds > 0, got {deadline_s}")
  return Clock(system_profile, float(model_size), None if deadline_s is None else float(deadline_s))


def _client_sharding():
  """A clients axis over every local device, or None on one device."""
  if jax.device_count() == 1:
    return None
  mesh = jax.make_mesh((jax.device_count(),), ("clients",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("clients"))


def streams(aggregator: Aggregator, selector: Selector, participation: Participation,
            filt: Filter | None, clock: Clock | None, exclude: bool, asynchrony) -> bool:
  """Whether local training folds a linear aggregate out (no K local models held): when the
  aggregator is linear and nothing needs the local models (a part reading them, the non-finite
  guard, a deadline's stragglers, FilFL's candidates, the asynchronous buffer)."""
  return (aggregator.linear_weights is not None and not selector.reads_local_models
          and not exclude and not participation.reads_local_models
          and (clock is None or clock.deadline_s is None)
          and (filt is None or not filt.trains_available) and asynchrony is None)


def build_run(model: Model, data: FederatedDataset, optimizer: OptimizerFactory,
              local: LocalHParams, availability: Availability, selector: Selector,
              aggregator: Aggregator, clients_per_round: int, seed: int,
              filter: Filter | None = None,  # pylint: disable=redefined-builtin
              participation: Participation | None = None,
              lr_schedule: Callable[[jax.Array], jax.Array] | None = None,
              eval_batch_size: int = 512, init_params: Any = None, eval_mask=None,
              nonfinite: str = "stop", store: str = "device", host_rows: str = "auto",
              capacity: Capacity | None = None, server_optimizer: ServerOptimizer | None = None,
              system_profile: SystemProfile | None = None, deadline_s: float | None = None,
              asynchrony: AsyncSpec | None = None) -> RunSpec:
  """Checks a run's arguments and builds its `RunSpec`, uploading and compiling nothing.

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

  Returns:
    The run's `RunSpec`.

  Raises:
    ValueError, TypeError: naming the argument that is wrong and what it accepts.
  """
  n = data.num_clients
  checks.check_choice("store", store, checks.STORES)
  checks.check_choice("host_rows", host_rows, checks.HOST_ROWS)
  checks.check_choice("nonfinite", nonfinite, checks.NONFINITE)
  checks.check_arguments(data, optimizer, local, availability, seed, eval_mask, lr_schedule,
                         model)
  size = checks.check_model_fits(model)
  checks.check_model(model, data, init_params)
  on_host = store == "host" or (store == "auto" and not fits_on_device(data))
  # Device data are checked whole; the host placement checks rows as it reads them.
  integrity.check_dataset(data, "data", rows=not on_host)
  if not 1 <= clients_per_round <= availability.num_available:
    raise ValueError(f"clients_per_round (K) must be in 1..{availability.num_available} "
                     f"(clients available per round), got {clients_per_round}")
  if capacity is not None and not capacity.holds(data):
    raise ValueError(f"capacity {capacity} is smaller than the dataset (train / val / test rows "
                     f"{[getattr(data, s).x.shape[0] for s in ('train', 'val', 'test')]}, "
                     f"largest client {data.train.max_count})")
  participation = noted("participation rule", participation or everyone())
  selector, aggregator = noted("selector", selector), noted("aggregator", aggregator)
  filter = noted("filter", filter)
  needs = set(selector.needs) | set(participation.needs)
  if filter is not None:
    needs |= set(filter.needs)
  unknown = needs - set(STAT_NAMES)
  if unknown:
    raise ValueError(f"unknown stats {sorted(unknown)}; accepted: {STAT_NAMES}")
  checks.check_split_stats(data, needs)
  scale = footprints.scale_of(model, n, availability.num_available, clients_per_round)
  footprints.check_footprints({"filter": filter, "selector": selector,
                               "participation rule": participation}, scale)
  if filter is not None and filter.uses_public and not np.shape(data.public_y)[0]:
    raise ValueError("the filter evaluates models on the server's public set, but the dataset "
                     "has none (set public_fraction > 0)")
  if server_optimizer is not None and not isinstance(server_optimizer, ServerOptimizer):
    raise TypeError("server_optimizer must be a ServerOptimizer (server_sgd, fedavgm, fedadam, "
                    "fedyogi, fedadagrad, or ServerOptimizer(optax transform, spec)), got "
                    f"{type(server_optimizer).__name__}")
  clock = _clock(system_profile, deadline_s, n, size)
  if asynchrony is not None:
    checks.check_asynchrony(asynchrony, clients_per_round, availability.num_available, clock,
                            filter, participation, on_host)
    if selector.sampling_weights is not None:
      warnings.warn(f"the selector {part_name(selector)!r} reweights the clients it samples; "
                    "the asynchronous mode aggregates the updates that arrive as a set and "
                    "ignores those weights", stacklevel=3)
  if local.chunk_size is None:
    slots = max(clients_per_round, availability.num_available)
    budget = local.memory_budget_bytes or default_memory_budget()
    cost = client_step_cost(model, optimizer, local, data.feature_shape)
    local = local._replace(chunk_size=auto_chunk_size(cost, budget, slots))
  schedule = lr_schedule if lr_schedule is not None else constant_lr(0.1)
  base, factor = ((schedule.base, schedule.factor) if isinstance(schedule, LrSchedule)
                  else (1.0, schedule))
  exclude = nonfinite == "exclude"
  if selector.sampling_weights is not None and not aggregator.applies_sampling_weights:
    warnings.warn(f"the selector {part_name(selector)!r} reweights the clients it samples, and "
                  f"the aggregator {part_name(aggregator)!r} ignores those weights: it "
                  "aggregates the chosen clients as a set, so the aggregate is no longer an "
                  "unbiased estimate of full participation's", stacklevel=3)
  capacity = capacity or Capacity.of([data])
  config = RoundConfig(
      model=model, optimizer=optimizer,
      local=local._replace(prox_mu=0.0, memory_budget_bytes=None),
      availability=availability, selector=selector, aggregator=aggregator, filter=filter,
      participation=participation, k=clients_per_round, needs=tuple(sorted(needs)),
      stream=streams(aggregator, selector, participation, filter, clock, exclude, asynchrony),
      exclude_nonfinite=exclude,
      max_count=data.train.max_count if on_host else capacity.max_count,
      eval_batch_size=eval_batch_size, lr_factor=factor, clean_metrics=eval_mask is not None,
      client_sharding=_client_sharding(), server_optimizer=server_optimizer, clock=clock,
      proximal=bool(local.prox_mu), asynchrony=asynchrony)
  return RunSpec(config, data,
                 jax.device_put(RunValues(np.int32(seed), np.float32(base),
                                          np.float32(local.prox_mu))),
                 init_params,
                 np.ones(n, bool) if eval_mask is None else np.asarray(eval_mask, bool),
                 capacity, on_host, host_rows)
