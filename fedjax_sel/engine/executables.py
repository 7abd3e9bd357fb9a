"""Compiled programs kept on disk and loaded without tracing: a warm start for the next process.

JAX's persistent compilation cache (`host/compilation.py`) saves the compiling, but to find its
entry a process still traces and lowers each program, 0.4-0.9 s for a batched round. This store
keys a compiled program by what determines it, without tracing: the program's function and its
static config (the structural `signature`, `signature.py`: the bytecode of every function it
captures), the arguments' tree, shapes and dtypes, and the environment: Python, jax, jaxlib, flax,
optax and numpy versions, the device and its CPU features, every `XLA_*` environment variable, a
digest of this package's sources, and a digest of the source files of the modules the signature
reads by name or whose classes it holds (a user's module, a flax model's class in a script). A
process that meets the same key loads the executable (`jax.experimental.serialize_executable`) and
calls it; any other change gives another key, so an edit to the code is never run with an old
program.

A config is stored only when its signature is the same in every process and its code is known:
one that describes a value by identity (an object without structural equality), or holds a class
defined where there is no source file (a notebook), is compiled as before. The store is on
with the persistent cache, in its `executables/` folder, on a single-device, single-process run;
`FEDJAX_SEL_CACHE_DIR=off` turns both off. A file that cannot be read back is compiled again, and
a program that JAX's own cache supplied is not stored (`compile_and_save` says why): it enters the
store when XLA next compiles it.

Examples:
  >>> key = store_key("f", ("a", 1), (), (), "")
  >>> key == store_key("f", ("a", 1), (), (), "") and key != store_key("f", ("a", 2), (), (), "")
  True
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import pickle
import platform
import sys
import sysconfig
import zlib
from collections.abc import Callable
from typing import Any

import jax
from jax import monitoring
from jax.experimental import serialize_executable

from fedjax_sel.models import onednn

FORMAT = 1  # Of the stored files; another format is a different key.
LOADED_EVENT = "/fedjax_sel/executables/loaded"  # A `jax.monitoring` event per executable loaded.
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"  # JAX's event per persistent cache load.
MAX_BYTES = 1 << 30  # The store's size: past it, the files least recently used are removed.
_VERSIONS = ("jax", "jaxlib", "flax", "optax", "numpy")
_CONFIG = ("jax_enable_x64", "jax_default_matmul_precision", "jax_default_prng_impl",
           "jax_threefry_partitionable")
_CACHE_HITS = [0]  # JAX's persistent cache hits in this process (its monitoring events).


def _count_hit(event: str, **kwargs) -> None:
  del kwargs
  if event == CACHE_HIT_EVENT:
    _CACHE_HITS[0] += 1


monitoring.register_event_listener(_count_hit)


def folder() -> str | None:
  """The store's folder: `executables/` in JAX's persistent cache folder (None when the cache is
  off, or the process has several devices or processes)."""
  base = jax.config.jax_compilation_cache_dir
  return os.path.join(base, "executables") if base and _single_device() else None


@functools.cache
def _single_device() -> bool:
  return jax.process_count() == 1 and jax.device_count() == 1


def canonical(key: Any) -> str | None:
  """A text of the structural signature `key` that is the same in every process, or None when
  `key` describes something by identity (then it is not stored)."""
  if isinstance(key, tuple) and key[:1] == ("object",):
    return None
  if isinstance(key, tuple) and len(key) == 3 and key[0] == "value":
    value = key[2]
    text = repr(value)
    if type(value).__hash__ is object.__hash__ or " at 0x" in text:
      return None
    return f"value:{key[1]}:{text}"
  if isinstance(key, (tuple, list)):
    parts = [canonical(v) for v in key]
    return None if None in parts else "(" + ",".join(parts) + ")"
  if isinstance(key, frozenset):  # Hash order differs between processes: sort.
    parts = [canonical(v) for v in key]
    return None if None in parts else "{" + ",".join(sorted(parts)) + "}"
  if isinstance(key, bytes):
    return key.hex()
  return repr(key)


def _installed_roots() -> tuple[str, ...]:
  paths = sysconfig.get_paths()
  roots = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
  return tuple(sorted(roots))


@functools.cache
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
  del mtime_ns, size  # Part of the cache key: an edited file is read again.
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def _source(path: str) -> str:
  stat = os.stat(path)
  return _file_digest(path, stat.st_mtime_ns, stat.st_size)


def package_digest() -> str:
  """A digest of this package's source files (the engine code every program runs)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  digest = hashlib.sha256()
  for folder, dirs, files in os.walk(root):
    dirs.sort()
    for name in sorted(files):
      if name.endswith((".py", ".cc")):
        path = os.path.join(folder, name)
        digest.update(f"{os.path.relpath(path, root)}:{_source(path)};".encode())
  return digest.hexdigest()


def referenced_modules(key: Any, found: set | None = None) -> set:
  """The modules a structural signature names (a module or function read as a global) or whose
  classes it holds by value (a flax module's class): the code it depends on beyond its own
  bytecode."""
  found = set() if found is None else found
  if isinstance(key, tuple) and len(key) == 3 and key[0] == "named":
    found.add(key[1] or key[2])  # A builtin function's module, or a module's own name.
  elif isinstance(key, tuple) and len(key) == 3 and key[0] == "value":
    found.add(type(key[2]).__module__)
  elif isinstance(key, (tuple, list, frozenset)):
    for value in key:
      referenced_modules(value, found)
  return found


def source_digest(modules: set) -> str | None:
  """A digest of the source files of `modules` that are neither installed packages (their
  versions are in `_machine`) nor Python's; None when one has no source file to read (a class
  defined in a notebook), so its code is unknown."""
  roots = _installed_roots()
  digest = hashlib.sha256()
  for name in sorted(modules):
    module = sys.modules.get(name)
    if module is None or name in sys.builtin_module_names or name.startswith("fedjax_sel."):
      continue
    path = getattr(module, "__file__", None)
    if path is None:
      return None
    real = os.path.realpath(path)
    if real.startswith(roots):
      continue
    if not os.path.exists(real):
      return None
    digest.update(f"{name}:{_source(real)};".encode())
  return digest.hexdigest()


@functools.cache
def _machine() -> str:
  """The platform, versions, device, CPU features and XLA environment settings (every `XLA_*`
  variable) the executables are compiled for."""
  versions = []
  for package in _VERSIONS:
    try:
      versions.append(f"{package}={importlib.metadata.version(package)}")
    except importlib.metadata.PackageNotFoundError:
      versions.append(f"{package}=none")
  device = jax.devices()[0]
  flags = ""
  if os.path.exists("/proc/cpuinfo"):
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
      flags = next((line for line in f if line.startswith("flags")), "")
  return "|".join([f"format={FORMAT}", sys.version, platform.machine(), *versions,
                   device.platform, device.device_kind, device.client.platform_version,
                   hashlib.sha256(flags.encode()).hexdigest(),
                   *sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("XLA_"))])


def environment() -> str:
  """`_machine()` with the JAX settings that change lowering and this package's sources."""
  settings = [f"{name}={getattr(jax.config, name, None)}" for name in _CONFIG]
  return "|".join([_machine(), *settings, package_digest()])


def avals(leaves) -> tuple:
  """Type, shape, dtype and weak type of each argument leaf: what a compiled program was compiled
  for (hashable, and cheap: a lookup per call)."""
  return tuple((type(leaf), getattr(leaf, "shape", None), getattr(leaf, "dtype", None),
                getattr(leaf, "weak_type", None)) for leaf in leaves)


def _avals_text(types: tuple) -> str:
  return repr([(t.__qualname__, shape, str(dtype), weak) for t, shape, dtype, weak in types])


def store_key(name: str, config_key: Any, static: tuple, leaf_types: tuple, tree: str
              ) -> str | None:
  """The file name of a program: its function `name`, its config's signature, its other static
  arguments, its arguments' types and tree (None when the config is not storable)."""
  text = canonical((config_key, static))
  sources = source_digest(referenced_modules(config_key))
  if text is None or sources is None:
    return None
  digest = hashlib.sha256()
  for part in (name, text, _avals_text(leaf_types), tree, environment(), sources):
    digest.update(part.encode())
    digest.update(b"\0")
  return digest.hexdigest()


def load(path: str):
  """The executable stored at `path`, or None when it is missing or cannot be read back (or calls
  the oneDNN convolutions where this process cannot register them)."""
  try:
    with open(path, "rb") as f:
      payload, in_tree, out_tree, uses_onednn = pickle.loads(zlib.decompress(f.read()))
    os.utime(path)  # Recently used: the last to be removed.
    if uses_onednn and onednn.unavailable_reason() is not None:  # Registers the handlers.
      return None
    return serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
  except (OSError, EOFError, zlib.error, pickle.UnpicklingError, ValueError, TypeError,
          AttributeError, jax.errors.JaxRuntimeError):
    return None


def compile_and_save(lowered, path: str):
  """Compiles `lowered` and stores it at `path` when XLA compiled it now. One that JAX's persistent
  cache supplied is not stored (on CPU an executable it loads serializes without its kernels:
  `NOT_FOUND: Function ... not found` when the copy runs), so a miss here costs no more than
  before the store: tracing and the cache's load. A program XLA cannot serialize is marked
  (`jit_marker`) so the next process jits it; one that cannot be written runs from memory."""
  hits = _CACHE_HITS[0]
  compiled = lowered.compile()
  if _CACHE_HITS[0] != hits:
    return compiled
  # The oneDNN handlers registered in this process may be called: the loader registers them too.
  uses_onednn = (onednn.unavailable_reason.cache_info().currsize > 0
                 and onednn.unavailable_reason() is None)
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
      data = zlib.compress(pickle.dumps((*serialize_executable.serialize(compiled), uses_onednn)),
                           1)
    except (ValueError, TypeError, NotImplementedError, pickle.PicklingError,
            jax.errors.JaxRuntimeError):  # E.g. an operation XLA cannot serialize.
      path, data = jit_marker(path), b""
    _write(path, data)
    evict(os.path.dirname(path), MAX_BYTES)
  except OSError:
    pass  # A read-only cache: run it from memory.
  return compiled


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
    with open(path, encoding="utf-8") as f:
      return tuple(json.load(f))
  except (OSError, ValueError):  # No file yet, or a damaged one.
    pass
  values = compute()
  try:
    os.makedirs(base, exist_ok=True)
    _write(path, json.dumps(list(values)).encode())
  except OSError:
    pass  # A read-only cache: computed again next time.
  return values


def first_call(executable, args: tuple, path: str):
  """Runs a loaded `executable` once and waits for it: its outputs, or None when it fails to run
  (a stored file that lacks its kernels), after removing the file so the program is compiled
  again."""
  try:
    outputs = jax.block_until_ready(executable(*args))
    monitoring.record_event(LOADED_EVENT)
    return outputs
  except jax.errors.JaxRuntimeError:
    _remove(path)
    return None
