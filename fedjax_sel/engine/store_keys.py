"""The key of a stored program, computed without tracing (`executables.py` keeps the programs).

A compiled program is determined by the program's function and its static config (the structural
`signature`, `signature.py`: the bytecode of every function it captures), the arguments' tree,
shapes and dtypes, and the environment: Python, jax, jaxlib, flax, optax and numpy versions, the
device and its CPU features, every `XLA_*` environment variable, a digest of this package's
sources, and a digest of the source files of the modules the signature reads by name or whose
classes it holds (a user's module, a flax model's class in a script). `store_key` digests them all;
a config whose signature describes a value by identity, or whose code has no source file, has no
key (it is not stored).

Examples:
  >>> key = store_key("f", ("a", 1), (), (), "")
  >>> key == store_key("f", ("a", 1), (), (), "") and key != store_key("f", ("a", 2), (), (), "")
  True
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
import sys
import sysconfig
from typing import Any

import jax

FORMAT = 1  # Of the stored files; another format is a different key.
_VERSIONS = ("jax", "jaxlib", "flax", "optax", "numpy")
_CONFIG = ("jax_enable_x64", "jax_default_matmul_precision", "jax_default_prng_impl",
           "jax_threefry_partitionable")


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
