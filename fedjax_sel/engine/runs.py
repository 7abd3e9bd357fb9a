"""Runs as a batch axis: R runs of one program advance together in one compiled call.

`RunBatch(specs)` takes `RunSpec`s (`run_spec.build_run`) that share a program (equal
`description.program_key`: same model, parts, K, n and capacities; they may differ in seed, learning
rate, FedProx mu, data values and the values parts keep in their state, such as the entropy
selector's eps, FedALIGN's eps_0 or FedSRC's target and beta) and stacks their states, data and run
values on a leading `[R]` axis. Its `step` runs one round of every run: the round is `vmap`ped over
chunks of `runs_chunk` runs (axis name "runs"), and the chunks are looped inside the compiled call
(`lax.map`); chunks of one run loop without any vmap. On CPU, wide vmaps of models with real work
per client are slower than a loop (see docs/engine.md, "Compile once, run many"), so
`auto_runs_chunk` vmaps the runs only for tiny models there; on accelerators it vmaps them all.

With several devices in one process and every run vmapped, the runs shard over the devices (a
`runs` mesh axis; each run's clients stay on its device); otherwise (one device, runs looped, or
a multi-host run) the batch is replicated and each run's clients shard as a single run's do.

Schedule decisions are taken for the batch as a whole: the round index is one unbatched value
(the runs advance together), and FilFL's filtering round is or-ed over the runs (`selection.py`), so
`lax.cond` runs one branch instead of both. Runs with the host store advance one by one (their
rows are sent per run): run them as separate runs.

Examples:
  >>> import optax
  >>> from fedjax_sel import (DatasetSpec, build_dataset, build_model, build_run, fedavg,
  ...                         random_selector, uniform_availability, LocalHParams, Capacity)
  >>> datasets = [build_dataset(DatasetSpec("digits", num_clients=10), seed=s) for s in (0, 1)]
  >>> cap = Capacity.of(datasets)
  >>> specs = [build_run(build_model("logreg", d.feature_shape, 10), d, lambda lr: optax.sgd(lr),
  ...                    LocalHParams(batch_size=16), uniform_availability(10, 5),
  ...                    random_selector(), fedavg(), 3, seed=s, capacity=cap)
  ...          for s, d in enumerate(datasets)]
  >>> batch = RunBatch(specs)
  >>> states, metrics = batch.step(batch.init())
  >>> metrics["num_trained"].tolist()
  [3, 3]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from fedjax_sel.engine import sweeps
from fedjax_sel.engine.contracts import check_contracts
from fedjax_sel.engine.description import (RoundConfig, client_step_cost, program_key,
                                           replicated)
from fedjax_sel.engine.evaluation import evaluate, evaluation_key
from fedjax_sel.engine.placement import padded_arrays
from fedjax_sel.engine.programs import program
from fedjax_sel.engine.round import round_finish, round_plan, step_function
from fedjax_sel.engine.run_spec import RunSpec
from fedjax_sel.engine.signature import Keyed
from fedjax_sel.engine.state import EngineState
from fedjax_sel.engine.training import train, training_config, training_key

AXIS = "runs"


class BatchConfig(NamedTuple):
  """The static config of a batched program: the round's config, the runs per vmapped chunk and
  the `(part, setting)` pairs the runs carry as run values (`sweeps.py`)."""

  round: RoundConfig
  runs_chunk: int
  swept: tuple[tuple[str, str], ...] = ()


def stack_runs(trees: Sequence[Any], sharding=None) -> Any:
  """The trees stacked on a leading runs axis on the host, then placed on `sharding` (or the
  default device) with `jax.device_put`, which compiles nothing; `jnp.asarray` would compile a
  small copy program per shape and dtype. On CPU the placed arrays may alias the stacked numpy
  memory, which nothing else holds."""
  stacked = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *trees)
  return jax.device_put(stacked, sharding)


def unstack(tree: Any, i: int) -> Any:
  """Run `i`'s slice of a stacked `[R, ...]` tree."""
  return jax.tree.map(lambda a: a[i], tree)


def _over_runs(fn, chunk: int, *trees):
  """`fn` over the leading runs axis of `trees`: vmapped (axis "runs") in chunks of `chunk` runs,
  the chunks looped by `lax.map`; with `chunk` 1, a plain loop over the runs (no vmap at all)."""
  r = jax.tree.leaves(trees)[0].shape[0]
  if chunk == 1:
    if r == 1:
      return jax.tree.map(lambda a: a[None], fn(*jax.tree.map(lambda a: a[0], trees)))
    return jax.lax.map(lambda xs: fn(*xs), trees)
  vmapped = jax.vmap(fn, axis_name=AXIS)
  if chunk >= r:
    return vmapped(*trees)
  split = lambda a: a.reshape(r // chunk, chunk, *a.shape[1:])
  out = jax.lax.map(lambda xs: vmapped(*xs), jax.tree.map(split, trees))
  return jax.tree.map(lambda a: a.reshape(r, *a.shape[2:]), out)


def _each_run(cfg, fn, states, arrays, runs, *rest):
  """`fn(config, state, arrays, run, *rest)` over the batch's runs, each with its swept value
  settings in its config and the batch's round index (the runs advance together: one unbatched
  index)."""
  config, chunk, pairs = cfg.value
  t = states.round[0]
  return _over_runs(
      lambda s, a, r, *x: fn(sweeps.with_run_settings(config, pairs, r.settings),
                             s._replace(round=t), a, r, *x), chunk, states, arrays, runs, *rest)


def _batched_step(cfg, states, arrays, runs):
  return _each_run(cfg, step_function(cfg.value[0]), states, arrays, runs)


def _batched_plan(cfg, states, arrays, runs):
  return _each_run(cfg, round_plan, states, arrays, runs)


def _batched_finish(cfg, states, arrays, runs, plans, trained):
  return _each_run(cfg, round_finish, states, arrays, runs, plans, trained)


def _batched_train(cfg, params, pools, seeds, prox_mus, rounds, requests):
  training, chunk = cfg.value
  t = rounds[0]
  return _over_runs(lambda p, pool, seed, mu, req: train(training, p, pool, seed, mu, t, req),
                    chunk, params, pools, seeds, prox_mus, requests)


def _batched_evaluate(cfg, params, arrays):
  config, chunk, _ = cfg.value
  return _over_runs(lambda p, a: evaluate(config, p, a), chunk, params, arrays)


# On CPU, runs are vmapped together only when a client step is below this many FLOPs (logistic
# regression: dispatch-bound); the digits MLP (5 MFLOP) measured 1.14x at R = 4 but 0.92x at
# R = 16 vmapped, and the LEAF CNN is compute-bound (docs/performance.md, "Runs axis").
CPU_RUNS_VMAP_FLOPS = 1e6


def auto_runs_chunk(spec: RunSpec, num_runs: int, platform: str | None = None) -> int:
  """Runs per vmapped chunk: all of them on accelerators and, on CPU, for models whose client step
  is below `CPU_RUNS_VMAP_FLOPS`; else 1 (a loop over the runs inside the compiled call)."""
  if (platform or jax.devices()[0].platform) != "cpu":
    return num_runs
  config = spec.config
  cost = client_step_cost(config.model, config.optimizer, config.local, spec.data.feature_shape)
  return num_runs if cost.flops < CPU_RUNS_VMAP_FLOPS else 1


def _differences(a: RoundConfig, b: RoundConfig) -> list[str]:
  return [name for name in RoundConfig._fields
          if program_key(a._replace(**{f: getattr(b, f) for f in RoundConfig._fields
                                       if f != name}))
          != program_key(b)]


class RunBatch:
  """R runs of one program, advanced together.

  Args:
    specs: the runs, `RunSpec`s with the device store whose configs share a program (build them
      with one `capacity=Capacity.of(datasets)`); runs may differ in whether FedProx is on (mu = 0
      runs then compute the proximal term with mu = 0, which changes nothing).
    runs_chunk: runs per vmapped chunk (a divisor of R); default `auto_runs_chunk`.
    stages: a synchronous round as three programs called one by one (`round.py`): its training
      is then one program for every batch that trains alike (`training.training_key`), whatever
      its selector, filter, rule or aggregator; else one program per round.

  Raises:
    ValueError: naming what differs between two runs' programs, or a host-store run.
    TypeError: a run that is not a `RunSpec` (a `Simulator`'s is its `spec`).
  """

  def __init__(self, specs: Sequence[RunSpec], runs_chunk: int | None = None,
               stages: bool = False):
    specs = list(specs)
    if not specs:
      raise ValueError("a RunBatch needs at least one run")
    for i, spec in enumerate(specs):
      if not isinstance(spec, RunSpec):
        raise TypeError(f"run {i} is a {type(spec).__name__}, not a RunSpec: build runs with "
                        "build_run (a Simulator's RunSpec is its .spec)")
      if spec.on_host:
        raise ValueError(f"run {i} keeps its data on the host (store='host'): host-store runs "
                         "advance one by one; use store='device' to batch them")
    prox = any(spec.config.proximal for spec in specs)
    configs = [s.config._replace(proximal=prox) for s in specs]
    pairs = sweeps.swept(configs)
    first = program_key(configs[0])
    for i, config in enumerate(configs[1:], 1):
      config = sweeps.aligned(config, configs[0], pairs)
      if program_key(config) != first:
        raise ValueError(f"run {i} does not share run 0's program: they differ in "
                         f"{', '.join(_differences(configs[0], config)) or 'their data shapes'} "
                         "(runs may differ only in seed, learning rate, FedProx mu, data values, "
                         "part-state values and the parts' value settings, registry.sweeps; "
                         "pad their data to one Capacity)")
    values = [sweeps.run_settings(c, pairs) for c in configs]
    sweeps.check_traceable(configs[0], pairs, values[0])  # A named error before any upload.
    hosts = [padded_arrays(s) for s in specs]  # The runs' data, not yet on the device.
    shapes = {jax.tree.map(np.shape, h) == jax.tree.map(np.shape, hosts[0]) for h in hosts}
    if shapes != {True}:
      raise ValueError("the runs' data have different shapes: build them with one "
                       "capacity=Capacity.of(datasets) (and public sets of one size)")
    self.specs = specs
    self.num_runs = len(specs)
    chunk = runs_chunk or auto_runs_chunk(specs[0], len(specs))
    chunk = max(c for c in range(1, min(chunk, len(specs)) + 1) if len(specs) % c == 0)
    self.runs_chunk = chunk
    config = configs[0]._replace(runs_axis=AXIS if chunk > 1 else None)
    self.placement = replicated(configs[0])
    devices = jax.device_count()
    if (devices > 1 and jax.process_count() == 1 and chunk == len(specs)
        and len(specs) % devices == 0):
      # The runs shard over the devices (a "runs" mesh axis); each run's clients stay on one.
      mesh = jax.make_mesh((devices,), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,))
      self.placement = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(AXIS))
      config = config._replace(client_sharding=None)
    self.config = BatchConfig(config, chunk, pairs)
    self.keyed = Keyed((program_key(config), chunk, pairs), self.config)
    self.evaluation = Keyed((evaluation_key(config), chunk), self.config)
    self.stages = stages and config.asynchrony is None
    self.training = (Keyed((training_key(config), chunk), (training_config(config), chunk))
                     if self.stages else None)
    self.arrays = stack_runs(hosts, self.placement)  # Each run's data uploaded once, here.
    self.run_values = stack_runs(
        [s.run_values._replace(settings=v) for s, v in zip(specs, values)], self.placement)

  def run_slice(self, tree: Any, i: int) -> Any:
    """Run `i`'s part of a stacked tree (its state, metrics or evaluation)."""
    return unstack(tree, i)

  def stack(self, trees: Sequence[Any]) -> Any:
    """The runs' trees stacked `[R, ...]` where the batch places them."""
    return stack_runs(trees, self.placement)

  def init(self) -> EngineState:
    """The runs' states before round 0, stacked `[R, ...]`."""
    return stack_runs([s.initial_state() for s in self.specs], self.placement)

  def preload(self, states: EngineState) -> None:
    """Reads the batch's stored round (or its first stage: the others read what it returns) and
    evaluation for `states` (`init`'s) ahead of their first call (`programs.Program.preload`): a
    job calls it on another thread while the batch before runs, so XLA's loading overlaps those
    rounds."""
    where = self.placement
    if self.stages:
      program(_batched_plan, where).preload(self.keyed, states, self.arrays, self.run_values)
    else:
      program(_batched_step, where).preload(self.keyed, states, self.arrays, self.run_values)
    program(_batched_evaluate, where).preload(self.evaluation, states.params, self.arrays)

  def step(self, states: EngineState) -> tuple[EngineState, dict]:
    """One round of every run (one compiled call); metrics stacked `[R, ...]`. `states` come from
    `init`, `step` or a resume of every run at one round: the runs advance together (run 0's
    round index is the batch's)."""
    if self.stages:
      states, metrics = self._stages(states)
    else:
      states, metrics = program(_batched_step, self.placement)(self.keyed, states, self.arrays,
                                                                self.run_values)
    check_contracts(self.specs[0].config, metrics, runs_axis=True)
    return states, metrics

  def _stages(self, states: EngineState):
    """One round of every run as its three programs, called one by one."""
    values, arrays, where = self.run_values, self.arrays, self.placement
    plans = program(_batched_plan, where)(self.keyed, states, arrays, values)
    trained = program(_batched_train, where)(self.training, states.params, arrays.train,
                                             values.seed, values.prox_mu, states.round,
                                             plans.cohort.request)
    return program(_batched_finish, where)(self.keyed, states, arrays, values, plans, trained)

  def evaluate(self, params) -> dict:
    """Every run's global-model metrics (`Simulator.evaluate`), stacked `[R]`."""
    return program(_batched_evaluate, self.placement)(self.evaluation, params, self.arrays)
