"""JAX's persistent compilation cache, and a count of what compiled.

`use_persistent_cache()` points JAX's persistent compilation cache at the user's cache folder, so a
second process running the same program loads it instead of compiling it: `$FEDJAX_SEL_CACHE_DIR`
when set (`off` disables the cache), else `$XDG_CACHE_HOME/fedjax_sel/jax` or
`~/.cache/fedjax_sel/jax`. Importing `fedjax_sel` leaves JAX's settings alone: the launchers'
entry path (`experiments.launch.cli`), the benchmarks and the tests call it first thing, and a
library user calls `fedjax_sel.use_persistent_cache()` before the first compilation. Every program
is kept (`MIN_COMPILE_SECS` = 0: JAX's default of 1 s would leave out a small model's evaluation and
initializer, which a second process then compiles again), and JAX never caches programs with
host callbacks, so the round has none. A cache folder another user owns or may write is refused
with a one-line warning (a program there is native code that would run in this process). The
engine's own programs go further: its executable store, the cache folder's `executables/`
(`engine/executables.py`), keeps them compiled, and a later process loads them without tracing
either.

`CompileLog` counts the XLA compilations (and persistent cache hits) per function name from JAX's
monitoring events, for benchmarks and for tests that a second run reuses a compiled round.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> with CompileLog() as log:
  ...   _ = jax.jit(lambda a: a * 3.0)(jnp.ones(2))
  >>> log.compiles >= 1
  True
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time

import jax
from jax import monitoring

from fedjax_sel.engine import store_trust
from fedjax_sel.engine.executables import CACHE_HIT_EVENT, LOADED_EVENT

ENV_DIR = "FEDJAX_SEL_CACHE_DIR"
MIN_COMPILE_SECS = 0.0
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def cache_dir() -> str | None:
  """The persistent cache folder of this process (None: disabled by `FEDJAX_SEL_CACHE_DIR=off`)."""
  explicit = os.environ.get(ENV_DIR)
  if explicit is not None:
    return None if explicit.strip().lower() in ("", "off", "0", "none") else explicit
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "fedjax_sel", "jax")


def use_persistent_cache(path: str | None = None) -> str | None:
  """Enables JAX's persistent compilation cache in `path` (default `cache_dir()`); returns the
  folder, or None when disabled. Call it before the first compilation."""
  path = path or cache_dir()
  if path is None:
    return None
  try:
    os.makedirs(path, exist_ok=True)
  except OSError:  # A read-only home: run without the cache rather than fail.
    return None
  reason = store_trust.untrusted(path)
  if reason is not None:  # Another user could plant a program (native code) there.
    print(f"warning: the persistent compilation cache is off: {reason}", file=sys.stderr)
    return None
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECS)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path


class _Counter:
  """Process-wide tallies fed by JAX's monitoring events (listeners cannot be removed, so one
  listener serves every `CompileLog`)."""

  def __init__(self):
    self.lock = threading.Lock()
    self.compiles = collections.Counter()
    self.seconds = collections.Counter()
    self.hits = 0
    self.loaded = collections.Counter()
    self.spans: list[tuple[float, float]] = []  # (start, end) `time.perf_counter()` of each.
    monitoring.register_event_duration_secs_listener(self._on_duration)
    monitoring.register_event_listener(self._on_event)

  def _on_duration(self, event, duration, **kwargs):
    if event == _COMPILE_EVENT:
      end = time.perf_counter()
      with self.lock:
        name = kwargs.get("fun_name", "?")
        self.compiles[name] += 1
        self.seconds[name] += duration
        self.spans.append((end - duration, end))

  def _on_event(self, event, **kwargs):
    if event == CACHE_HIT_EVENT:
      with self.lock:
        self.hits += 1
    elif event == LOADED_EVENT:
      with self.lock:
        self.loaded[kwargs.get("fun_name", "?")] += 1


_COUNTER: _Counter | None = None


class CompileLog:
  """Counts compilations between `__enter__` and `__exit__` (or `snapshot()` calls).

  Attributes (after exit): `by_name` (Counter of compilations per jitted function name),
  `seconds` (compile seconds per name), `compiles` (total), `cache_hits` (persistent cache
  loads; a hit still counts as a compilation of its name), `loaded` (programs loaded from the
  executable store, `engine/executables.py`: neither traced nor compiled), `loaded_by_name`
  (those per jitted function name, named as compilations are), `spans` (each compilation's
  `(start, end)` in `time.perf_counter()` seconds: threads may compile at once).
  """

  def __enter__(self) -> CompileLog:
    global _COUNTER  # pylint: disable=global-statement
    if _COUNTER is None:
      _COUNTER = _Counter()
    self._start = self._now()
    self.by_name, self.seconds = collections.Counter(), collections.Counter()
    self.cache_hits = self.loaded = 0
    self.loaded_by_name = collections.Counter()
    self.spans = []
    return self

  def __exit__(self, *exc):
    self.snapshot()

  @staticmethod
  def _now():
    with _COUNTER.lock:
      return (collections.Counter(_COUNTER.compiles), collections.Counter(_COUNTER.seconds),
              _COUNTER.hits, collections.Counter(_COUNTER.loaded), len(_COUNTER.spans))

  def snapshot(self) -> CompileLog:
    """Updates the tallies to now (inside the `with` block too)."""
    compiles, seconds, hits, loaded, spans = self._now()
    self.by_name = compiles - self._start[0]
    self.seconds = seconds - self._start[1]
    self.cache_hits = hits - self._start[2]
    self.loaded_by_name = loaded - self._start[3]
    self.loaded = sum(self.loaded_by_name.values())
    with _COUNTER.lock:
      self.spans = _COUNTER.spans[self._start[4]:spans]
    return self

  @property
  def compiles(self) -> int:
    return sum(self.by_name.values())

  def count(self, name: str) -> int:
    """Compilations of jitted functions whose name contains `name`."""
    return sum(v for k, v in self.by_name.items() if name in k)
