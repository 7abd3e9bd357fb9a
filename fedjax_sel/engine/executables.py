"""Compiled programs kept on disk and loaded without tracing: a warm start for the next process.

JAX's persistent compilation cache (`host/compilation.py`) saves the compiling, but to find its
entry a process still traces and lowers each program, 0.4-0.9 s for a batched round. This store
keys a compiled program by what determines it, without tracing (`store_keys.py`). A process that
meets the same key loads the executable (`jax.experimental.serialize_executable`) and calls it;
any other change gives another key, so an edit to the code is never run with an old program.

A config is stored only when its signature is the same in every process and its code is known:
one that describes a value by identity (an object without structural equality), or holds a class
defined where there is no source file (a notebook), is compiled as before. The store is on
with the persistent cache, in its `executables/` folder, on a single-device, single-process run;
`FEDJAX_SEL_CACHE_DIR=off` turns both off. A file that cannot be read back is compiled again, and
a program that JAX's own cache supplied is not stored (`compile_and_save` says why): it enters the
store when XLA next compiles it. Every file is sealed with the user's secret and read back only
when its seal verifies under the key it is filed under, and only from a folder no other user may
write (`store_trust.py`): a planted or swapped file is compiled again, never run.

Examples:
  >>> jit_marker("/cache/executables/abc.exe")
  '/cache/executables/abc.jit'
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import os
import pickle
import threading
import zlib
from collections.abc import Callable
from typing import Any

import jax
from jax import monitoring
from jax.experimental import serialize_executable

from fedjax_sel.engine import store_trust
from fedjax_sel.engine.store_keys import store_key
from fedjax_sel.models import onednn

LOADED_EVENT = "/fedjax_sel/executables/loaded"  # A `jax.monitoring` event per executable loaded.
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"  # JAX's event per persistent cache load.
MAX_BYTES = 1 << 30  # The store's size: past it, the files least recently used are removed.
_HITS = threading.local()  # JAX's persistent cache hits of each thread (its monitoring events).
# The serialized executables XLA compiled lately in this process, with their argument types, by
# their module's digest: what a twin program (another config, the same module) that JAX's cache
# then supplied is stored from. Serialized when compiled: XLA:CPU refuses to serialize a program
# with a sort (`LessThan` is not serializable) once it has run.
_COMPILED: collections.OrderedDict = collections.OrderedDict()
_COMPILED_KEPT = 32
_COMPILED_LOCK = threading.Lock()


def _count_hit(event: str, **kwargs) -> None:
  del kwargs
  if event == CACHE_HIT_EVENT:  # Recorded on the thread that compiles.
    _HITS.count = _hits() + 1


def _hits() -> int:
  return getattr(_HITS, "count", 0)


monitoring.register_event_listener(_count_hit)


def folder() -> str | None:
  """The store's folder: `executables/` in JAX's persistent cache folder (None when the cache is
  off, the process has several devices or processes, or the folder or the user's secret cannot
  be trusted: `store_trust.py`, warned once)."""
  base = jax.config.jax_compilation_cache_dir
  if not base or not _single_device():
    return None
  path = os.path.join(base, "executables")
  return path if _trusted(base, path) else None


@functools.cache
def _trusted(*paths: str) -> bool:
  for path in paths:
    reason = store_trust.untrusted(path)
    if reason is not None:
      store_trust.warn_once(reason)
      return False
  return store_trust.secret() is not None


def _read(path: str) -> bytes | None:
  """The body of the sealed file at `path`, or None when it is missing, unsafe (warned) or its
  seal does not verify under the key it is filed under (its name)."""
  reason = store_trust.untrusted(path)
  if reason is not None:
    store_trust.warn_once(reason)
    return None
  key = store_trust.secret()
  if key is None:
    return None
  with open(path, "rb") as f:
    data = f.read()
  return store_trust.unseal(key, _filed_under(path), data)


def _sealed(path: str, body: bytes) -> bytes:
  """`body` sealed as the file at `path`."""
  return store_trust.seal(store_trust.secret(), _filed_under(path), body)


def _filed_under(path: str) -> str:
  """The key a store file is filed under: its name without the extension."""
  return os.path.splitext(os.path.basename(path))[0]


@functools.cache
def _single_device() -> bool:
  return jax.process_count() == 1 and jax.device_count() == 1


def load(path: str):
  """The executable stored at `path`, or None when it is missing or cannot be read back (or calls
  the oneDNN convolutions where this process cannot register them)."""
  try:
    body = _read(path)
    if body is None:  # Not this user's program for this key: never unpickled.
      return None
    payload, in_tree, out_tree, uses_onednn = pickle.loads(zlib.decompress(body))
    os.utime(path)  # Recently used: the last to be removed.
    if uses_onednn and onednn.unavailable_reason() is not None:  # Registers the handlers.
      return None
    return serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
  except (OSError, EOFError, zlib.error, pickle.UnpicklingError, ValueError, TypeError,
          AttributeError, jax.errors.JaxRuntimeError):
    return None


def compile_and_save(lowered, path: str):
  """Compiles `lowered` and stores it at `path` when XLA compiled it now, or compiled its twin
  (the same module for another config, e.g. the evaluation of two methods) in this process, from
  the bytes that was serialized to when it compiled. One
  that JAX's persistent cache supplied otherwise is not stored (on CPU an executable it loads
  serializes without its kernels: `NOT_FOUND: Function ... not found` when the copy runs), so a
  miss here costs no more than before the store: tracing and the cache's load. A program XLA
  cannot serialize is marked (`jit_marker`) so the next process jits it; one that cannot be
  written runs from memory. Safe on several threads at once."""
  hits = _hits()
  compiled = lowered.compile()
  digest = hashlib.sha256(lowered.as_text().encode()).hexdigest()
  if _hits() != hits:  # JAX's cache supplied it: store it from its twin XLA compiled, if any.
    with _COMPILED_LOCK:
      twin = _COMPILED.get(digest)
    if twin is None or twin[1] != _arguments(compiled):
      return compiled
    payload = twin[0]
  else:
    payload = _serialized(compiled)
    with _COMPILED_LOCK:
      _COMPILED[digest] = (payload, _arguments(compiled))
      while len(_COMPILED) > _COMPILED_KEPT:
        _COMPILED.popitem(last=False)
  # The oneDNN handlers registered in this process may be called: the loader registers them too.
  uses_onednn = (onednn.unavailable_reason.cache_info().currsize > 0
                 and onednn.unavailable_reason() is None)
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if payload is None:  # E.g. an operation XLA cannot serialize.
      path, data = jit_marker(path), b""
    else:
      data = zlib.compress(pickle.dumps((payload, jax.tree.structure(compiled.args_info),
                                         compiled.out_tree, uses_onednn)), 1)
    _write(path, _sealed(path, data))
    evict(os.path.dirname(path), MAX_BYTES)
  except OSError:
    pass  # A read-only cache: run it from memory.
  return compiled


def _serialized(compiled) -> bytes | None:
  """`compiled` serialized, or None when XLA cannot serialize it."""
  try:
    return serialize_executable.serialize(compiled)[0]
  except (ValueError, TypeError, NotImplementedError, pickle.PicklingError,
          jax.errors.JaxRuntimeError):
    return None


def _arguments(compiled) -> str:
  """The argument types a compiled program takes, flat (twins agree on them)."""
  return repr(jax.tree.leaves(compiled.args_info))


def _write(path: str, data: bytes) -> None:
  """`data` at `path` through a file of this process renamed over it: a reader (another worker)
  sees the whole file or none."""
  partial = f"{path}.{os.getpid()}.tmp"
  with open(partial, "wb") as f:
    f.write(data)
  os.replace(partial, path)


def _remove(path: str) -> None:
  try:
    os.remove(path)
  except OSError:  # Removed by another process meanwhile.
    pass


def jit_marker(path: str) -> str:
  """The file that says the program stored at `path` cannot be serialized (jit it instead)."""
  return path.removesuffix(".exe") + ".jit"


def evict(folder: str, max_bytes: int) -> None:
  """Removes the least recently used files of `folder` until it holds at most `max_bytes` (each
  edit of the sources gives new keys, so an unbounded store would grow with every edit)."""
  entries = []
  for name in os.listdir(folder):
    try:
      stat = os.stat(os.path.join(folder, name))
    except OSError:  # Removed by another process meanwhile.
      continue
    entries.append((stat.st_mtime, stat.st_size, name))
  total = sum(size for _, size, _ in entries)
  for _, size, name in sorted(entries):
    if total <= max_bytes:
      break
    _remove(os.path.join(folder, name))
    total -= size


def remembered(name: str, config_key: Any, compute: Callable[[], tuple]) -> tuple:
  """`compute()` (a tuple of numbers, e.g. a step's cost from XLA's analysis of its lowering),
  kept in the store under the key of `name` and `config_key` so a later process skips the
  tracing it needs."""
  base = folder()
  key = None if base is None else store_key(name, config_key, (), (), "")
  if key is None:
    return compute()
  path = os.path.join(base, key + ".json")
  try:
    body = _read(path)
    if body is not None:
      return tuple(json.loads(body))
  except (OSError, ValueError):  # No file yet, or a damaged one.
    pass
  values = compute()
  try:
    os.makedirs(base, exist_ok=True)
    _write(path, _sealed(path, json.dumps(list(values)).encode()))
  except OSError:
    pass  # A read-only cache: computed again next time.
  return values


def first_call(executable, args: tuple, path: str, name: str):
  """Runs a loaded `executable` once and waits for it: its outputs (the load is recorded under the
  jitted function's `name`, as `host.compilation.CompileLog` counts it), or None when it fails to
  run (a stored file that lacks its kernels), after removing the file so the program is compiled
  again."""
  try:
    outputs = jax.block_until_ready(executable(*args))
    monitoring.record_event(LOADED_EVENT, fun_name=name)
    return outputs
  except jax.errors.JaxRuntimeError:
    _remove(path)
    return None
