"""The compiled programs of the engine, one per distinct static signature in the process.

Every entry point is a module-level `jax.jit` whose first argument is a `Keyed` config (static:
hashed by its structural signature, `signature.py`). A second `Simulator` whose config has the
same signature (another seed, learning rate or dataset of the same shapes) therefore reuses the
compiled round instead of tracing and compiling it again, and JAX's persistent cache
(`compilation.py`) carries the compiled programs over to the next process.

Examples:
  >>> import jax.numpy as jnp
  >>> from fedjax_sel.engine.signature import Keyed
  >>> double = program(lambda cfg, x: x * cfg.value)
  >>> float(double(Keyed(("two",), 2.0), jnp.float32(3.0)))
  6.0
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from fedjax_sel import keys as keylib
from fedjax_sel.client.evaluation import client_metrics
from fedjax_sel.engine import round as round_lib
from fedjax_sel.engine.asynchronous import step_function


@functools.cache
def program(fn: Callable, out_shardings: Any = None, static_argnums: tuple[int, ...] = ()):
  """`jax.jit(fn)` with argument 0 static (a `Keyed` config), cached per function, output
  sharding and static arguments, so that all callers share one jit cache."""
  kwargs = {} if out_shardings is None else {"out_shardings": out_shardings}
  return jax.jit(fn, static_argnums=(0, *static_argnums), **kwargs)


def step(cfg, state, arrays, run, stats=None):
  """One round (`round.round_step`; a server step in the asynchronous mode) of the config
  `cfg.value`."""
  return step_function(cfg.value)(cfg.value, state, arrays, run, stats)


def steps(cfg, state, arrays, run, num_rounds):
  """`num_rounds` rounds in one call (a `lax.scan`); metrics stacked `[num_rounds, ...]`."""
  fn = step_function(cfg.value)
  return jax.lax.scan(lambda s, _: fn(cfg.value, s, arrays, run), state, None,
                      length=num_rounds)


def evaluate(cfg, params, arrays):
  return round_lib.evaluate(cfg.value, params, arrays)


def public(cfg, params, x, y):
  return round_lib.public_metrics(cfg.value.model, params, x, y)


def chunk_stats(cfg, params, arrays, t, seed, ids):
  return round_lib.client_stats(cfg.value, params, arrays, t, seed, ids)


def plan(cfg, state, arrays, run, stats):
  return round_lib.plan_rows(cfg.value, state, arrays, run, stats)


def pool_metrics(cfg, params, pool):
  return client_metrics(cfg.value.model, params, pool, cfg.value.eval_batch_size)


def availability(cfg, seed, t):
  return cfg.value.availability.sample(seed, t)


def init_params(model, seed):
  """The initial global model of a run: `model.value.init` at the run's INIT key."""
  return model.value.init(keylib.round_key(seed, 0, keylib.INIT))
