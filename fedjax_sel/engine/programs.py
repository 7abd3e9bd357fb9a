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

import concurrent.futures
import functools
import os
import threading
from collections.abc import Callable
from typing import Any

import jax

from fedjax_sel import keys as keylib
from fedjax_sel.client.evaluation import client_metrics
from fedjax_sel.engine import executables, store_keys
from fedjax_sel.engine.evaluation import evaluate as evaluate_round
from fedjax_sel.engine.evaluation import public_metrics
from fedjax_sel.engine.round import round_finish, round_plan, step_function
from fedjax_sel.engine.selection import plan_rows
from fedjax_sel.engine.stats import client_stats
from fedjax_sel.engine.training import train


_UNSEEN = object()
# XLA:CPU's legacy loop emitters instead of its MLIR fusion emitters (`use_fast_compile`).
FAST_CPU_OPTIONS = {"xla_cpu_use_fusion_emitters": False}
_FAST = [False]
# XLA:CPU's backend (LLVM) optimization level 1 instead of its default 3, for the programs built
# `light`: the models' initializers and the fingerprint's draws, elementwise work whose every bit
# is the same at both levels (tested for every registered model) and which compiles about 3x
# faster (the MLP's initializer 0.95 -> 0.32 s, resnet18's 4.0 -> 1.7 s). Rounds and evaluations
# are not light: their reductions round differently at other levels. A level set in XLA_FLAGS
# wins (the tests' level 0, for one).
LIGHT_CPU_OPTIONS = {"xla_backend_optimization_level": 1}
# The jitted names of a round's programs, as `host.compilation.CompileLog` counts them: the round
# in one program (a step, a scan of steps, a batch's step) or in three (plan, training, finish).
ROUND_PROGRAMS = ("jit(step)", "jit(steps)", "jit(_batched_step)", "jit(plan_stage)",
                  "jit(train_stage)", "jit(finish_stage)", "jit(_batched_plan)",
                  "jit(_batched_train)", "jit(_batched_finish)")


class Program:
  """`jax.jit(fn)` with argument 0 static (a `Keyed` config) and the given static arguments; with
  the executable store (`executables.py`), a config met by an earlier process is loaded instead of
  traced, and what this process compiles is stored for the next."""

  def __init__(self, fn: Callable, out_shardings: Any, static_argnums: tuple[int, ...],
               light: bool = False):
    kwargs = {} if out_shardings is None else {"out_shardings": out_shardings}
    cpu = jax.default_backend() == "cpu"
    fast = _FAST[0] and cpu
    light = light and cpu and "--xla_backend_optimization_level" not in os.environ.get(
        "XLA_FLAGS", "")
    options = {**(FAST_CPU_OPTIONS if fast else {}), **(LIGHT_CPU_OPTIONS if light else {})}
    # Called inside another function's trace, the program is part of that one's compilation,
    # and JAX refuses compiler options there: `nested` is the same jit without them.
    self.nested = jax.jit(fn, static_argnums=(0, *static_argnums), **kwargs)
    self.jitted = (jax.jit(fn, static_argnums=(0, *static_argnums), compiler_options=options,
                           **kwargs) if options else self.nested)
    # The executable store keeps the compilations of a program apart.
    self.name = (f"{fn.__module__}.{fn.__qualname__}{'+fast' if fast else ''}"
                 f"{'+light' if light else ''}")
    self.jit_name = f"jit({fn.__name__})"  # As JAX names the function's compilations.
    self.static = tuple(i - 1 for i in static_argnums)  # Among the arguments after the config.
    self.compiled: dict = {}  # (config, static, tree, types) -> executable, or None: jit it.
    self.recent: dict = {}  # (config, static, tree, weak types) -> the last executable used.
    self.preloaded: dict = {}  # (config, static, tree, types) -> Future of the stored executable.
    self.preparing: dict = {}  # (config, static, tree, types) -> the lock of its preparation.
    self._lock = threading.Lock()

  def _split(self, args: tuple):
    """(static arguments, dynamic arguments, their leaves, their tree)."""
    static = tuple(args[i] for i in self.static)
    dynamic = tuple(a for i, a in enumerate(args) if i not in self.static)
    leaves, tree = jax.tree.flatten(dynamic)
    return static, dynamic, leaves, tree

  def preload(self, cfg, *args) -> None:
    """Reads the stored executable of these arguments, if the store holds one, ahead of its first
    call: XLA's loading takes a while (0.2 s for FilFL's batched round), and on another thread it
    overlaps the programs running before it. The first call then checks and runs it as it would
    one read then. Safe on several threads; nothing is compiled or traced here."""
    folder = executables.folder()
    if folder is None:
      return
    static, _, leaves, tree = self._split(args)
    memo = (cfg, static, tree, store_keys.avals(leaves))
    future = concurrent.futures.Future()
    with self._lock:
      if memo in self.compiled or memo in self.preloaded:
        return
      self.preloaded[memo] = future
    try:
      path = self._stored(folder, memo)
      future.set_result(executables.load(path) if path and os.path.exists(path) else None)
    except Exception:  # pylint: disable=broad-except
      future.set_result(None)  # The first call reads it itself.

  def _stored(self, folder: str, memo: tuple) -> str | None:
    """The store file of `memo`, or None for a config that is not stored or a program the store
    leaves to JAX's cache."""
    cfg, static, tree, types = memo
    key = store_keys.store_key(self.name, cfg.key, static, types, str(tree))
    if key is None:
      return None
    path = os.path.join(folder, key + ".exe")
    return None if os.path.exists(executables.jit_marker(path)) else path

  def _jit(self, cfg, *args):
    """The program through `jax.jit`: with its compiler options at the top level, without them
    inside another trace (`jax.eval_shape` of code that calls it, with concrete arguments)."""
    if self.jitted is self.nested:
      return self.jitted(cfg, *args)
    try:
      return self.jitted(cfg, *args)
    except ValueError as e:  # Raised while staging into the outer trace, before any compute.
      if "compiler_options" not in str(e):
        raise
      return self.nested(cfg, *args)

  def __call__(self, cfg, *args):
    folder = executables.folder()
    if folder is None:
      return self._jit(cfg, *args)
    static, dynamic, leaves, tree = self._split(args)
    if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):  # Called inside a trace.
      return self.nested(cfg, *args)
    # The executable checks shapes and dtypes itself (a TypeError before it runs); weak types,
    # which it lets pass, are part of the lookup, since jit would trace them apart.
    recent = (cfg, static, tree, tuple(getattr(leaf, "weak_type", None) for leaf in leaves))
    executable = self.recent.get(recent, _UNSEEN)
    if executable is not _UNSEEN:
      if executable is None:
        return self._jit(cfg, *args)
      try:
        return executable(*dynamic)
      except TypeError:  # Other shapes or dtypes than last time: look them up below.
        pass
    memo = (cfg, static, tree, store_keys.avals(leaves))
    outputs = None
    if memo not in self.compiled:
      with self._lock:
        preparing = self.preparing.setdefault(memo, threading.Lock())
      with preparing:  # A second thread with these arguments waits, then finds it prepared.
        if memo not in self.compiled:
          self.compiled[memo], outputs = self._prepare(folder, memo, args, dynamic)
    self.recent[recent] = executable = self.compiled[memo]
    if outputs is not None:
      return outputs
    return self._jit(cfg, *args) if executable is None else executable(*dynamic)

  def _prepare(self, folder: str, memo: tuple, args: tuple, dynamic: tuple):
    """`(executable, outputs)`: the stored executable and its outputs on these arguments (it is
    run once to check it), else one compiled now and stored, and None; `(None, None)` for a
    config that is not stored (jit then traces it)."""
    path = self._stored(folder, memo)
    if path is None:  # Not stored, or not serializable: JAX's cache instead.
      return None, None
    with self._lock:
      future = self.preloaded.pop(memo, None)
    if future is not None:
      loaded = future.result()  # Waits for a preload still reading it.
    else:
      loaded = executables.load(path) if os.path.exists(path) else None
    if loaded is not None:
      outputs = executables.first_call(loaded, dynamic, path, self.jit_name)
      if outputs is not None:
        return loaded, outputs
    cfg = memo[0]
    return executables.compile_and_save(self.jitted.lower(cfg, *args), path), None


def use_fast_compile(on: bool = True) -> None:
  """Compiles the engine's programs built from now on with XLA:CPU's legacy loop emitters
  (`on`), or with XLA's defaults. They compile about a quarter faster (the main job: 11.1 -> 8.4 s
  of XLA compilation; FedSRC's job 57 -> 52 s cold) and run as fast, but a composition may round
  differently in the last float bits (a clock's seconds did; every golden job's records did
  not), so a run is reproduced bit for bit only under the setting it ran with: the launchers'
  `--fast_compile`, off by default (docs/engine.md, "Faster compiling"). Without effect on
  accelerators.

  Example:
    >>> use_fast_compile()
    >>> program(lambda cfg, x: x + 1.0).name.endswith("+fast")
    True
    >>> use_fast_compile(False)
  """
  if _FAST[0] != on:
    _FAST[0] = on
    program.cache_clear()  # Programs already built keep their options: build them again.


@functools.cache
def program(fn: Callable, out_shardings: Any = None, static_argnums: tuple[int, ...] = (),
            light: bool = False) -> Program:
  """The `Program` of `fn`, cached per function, output sharding, static arguments and `light`
  (compiled at `LIGHT_CPU_OPTIONS` on CPU), so that all callers share one jit cache and one set
  of loaded executables."""
  return Program(fn, out_shardings, static_argnums, light)


def step(cfg, state, arrays, run, stats=None):
  """One round (`round.step_function`: a server step in the asynchronous mode) of the config
  `cfg.value`."""
  return step_function(cfg.value)(cfg.value, state, arrays, run, stats)


def plan_stage(cfg, state, arrays, run):
  """A round's first stage (`round.round_plan`) of the config `cfg.value`."""
  return round_plan(cfg.value, state, arrays, run)


def train_stage(cfg, params, pool, seed, prox_mu, t, req):
  """A round's training (`training.train`) of the `TrainingConfig` `cfg.value`: one program for
  every round that trains alike."""
  return train(cfg.value, params, pool, seed, prox_mu, t, req)


def finish_stage(cfg, state, arrays, run, plan, trained):
  """A round's last stage (`round.round_finish`) of the config `cfg.value`."""
  return round_finish(cfg.value, state, arrays, run, plan, trained)


def steps(cfg, state, arrays, run, num_rounds):
  """`num_rounds` rounds in one call (a `lax.scan`); metrics stacked `[num_rounds, ...]`."""
  fn = step_function(cfg.value)
  return jax.lax.scan(lambda s, _: fn(cfg.value, s, arrays, run), state, None,
                      length=num_rounds)


def evaluate(cfg, params, arrays):
  return evaluate_round(cfg.value, params, arrays)


def public(cfg, params, x, y):
  return public_metrics(cfg.value.model, params, x, y)


def chunk_stats(cfg, params, arrays, t, seed, ids):
  return client_stats(cfg.value, params, arrays, t, seed, ids)


def plan(cfg, state, arrays, run, stats):
  return plan_rows(cfg.value, state, arrays, run, stats)


def pool_metrics(cfg, params, pool):
  return client_metrics(cfg.value.model, params, pool, cfg.value.eval_batch_size)


def availability(cfg, seed, t):
  return cfg.value.availability.sample(seed, t)


def init_params(model, seed):
  """The initial global model of a run: `model.value.init` at the run's INIT key."""
  return model.value.init(keylib.round_key(seed, 0, keylib.INIT))
