"""The round's description: `RoundConfig`, the static value a compiled round is built from.

Everything that fixes the program lives here (model, client optimizer, local training, the parts,
K, the clock, the asynchronous mode, capacities), and nothing that varies between runs of it (seed,
learning rate, FedProx mu: `state.RunValues`; the data: `state.DataArrays`). `program_key(config)`
is its structural signature (`signature.py`): every run whose config has an equal key reuses one
compiled round (`programs.py`). `run_spec.build_run` builds and checks a config; placements and
run batches take it from there.

Examples:
  >>> s = step_decay_lr(0.1, 0.5, every=10)
  >>> [round(float(s(t)), 4) for t in (0, 9, 10, 25)]
  [0.1, 0.1, 0.05, 0.025]
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.client.local_training import (CPU_TINY_STEP_FLOPS, LocalHParams, OptimizerFactory,
                                              StepCost, step_cost)
from fedjax_sel.engine import executables
from fedjax_sel.engine.signature import Keyed, signature
from fedjax_sel.models.bundle import Model, param_shapes
from fedjax_sel.parts.availability import Availability
from fedjax_sel.parts.types import Aggregator, Filter, Participation, Selector


class RoundConfig(NamedTuple):
  """What fixes the compiled round (static; see `program_key`).

  Attributes:
    model, optimizer, local: the model bundle, client optimizer factory and local settings
      (`local.chunk_size` resolved; `local.prox_mu` is 0: mu is a run value, `RunValues.prox_mu`).
    availability, selector, aggregator, filter, participation: the parts (filter may be None).
    k: K training slots: the one place K lives (the parts read it from `RoundInputs.k`).
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
      `asynchronous.py`'s server step and `k` the buffer size), or None (rounds).
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
  # Its recipe says how it was built: its functions say what the program computes.
  stripped = {name: p if p is None else p._replace(init=None, spec=None, recipe=None)
              for name, p in parts.items()}
  server = config.server_optimizer
  if server is not None:
    stripped["server_optimizer"] = server._replace(spec=None, recipe=None)
  return signature(config._replace(model=config.model._replace(init=None), **stripped))


def keyed(config: RoundConfig) -> Keyed:
  """The config as the compiled programs take it: hashed by `program_key`."""
  return Keyed(program_key(config), config)


def replicated(config: RoundConfig):
  """The sharding that replicates a value over the config's clients mesh, or None (one device)."""
  if config.client_sharding is None:
    return None
  return jax.sharding.NamedSharding(config.client_sharding.mesh, jax.sharding.PartitionSpec())


def _one(t):
  del t
  return jnp.ones((), jnp.float32)


def _step_decay(t, decay, every):
  return jnp.power(jnp.float32(decay), (t // every).astype(jnp.float32))


class LrSchedule(NamedTuple):
  """Client learning rate of round t: `base * factor(t)`. The base is a run value (runs of one
  program may differ in it); the factor is part of the compiled program.

  Examples:
    >>> float(constant_lr(0.3)(7))
    0.30000001192092896
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
    params = param_shapes(model)
    return step_cost(model, optimizer, local, params, feature_shape, bytes_from_flops=tiny)

  return StepCost(*executables.remembered("client_step_cost", (key.key, tiny), compute))
