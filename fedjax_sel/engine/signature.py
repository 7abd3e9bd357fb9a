"""Structural signatures of the pure functions a round is built from.

A compiled round may be reused by another run only when every function it traced would trace the
same way. `signature(obj)` describes a function by its code (not where it was written) and,
recursively, by the values its closure captured, the globals it reads, its defaults and bound
arguments; modules by name; containers (tuples, dicts, NamedTuples such as a
`Selector`) by their members; arrays by shape, dtype and a digest of their bytes; hashable values
(numbers, strings, flax modules) by themselves; anything else by identity (never reused). Two parts
built by the same factory with the same static settings therefore share a signature, and a captured
array or number that differs gives another one: reuse is never silently wrong.

Values that vary between runs (seed, learning rate, a selector's eps, FedSRC's target) live in run
values or part state, not in closures, so that runs that differ only in them share one program.

Examples:
  >>> from fedjax_sel.parts.selectors.baselines import power_of_choice
  >>> signature(power_of_choice(5).select) == signature(power_of_choice(5).select)
  True
  >>> signature(power_of_choice(5).select) == signature(power_of_choice(6).select)
  False
"""

from __future__ import annotations

import functools
import hashlib
import types
from typing import Any

import numpy as np


def _array(a) -> tuple:
  a = np.asarray(a)
  return ("array", a.shape, str(a.dtype), hashlib.sha256(np.ascontiguousarray(a).tobytes())
          .hexdigest())


def signature(obj: Any, _seen: frozenset = frozenset()) -> Any:
  """A hashable description of `obj` that is equal for objects that compute the same thing."""
  if id(obj) in _seen:
    return ("cycle",)
  seen = _seen | {id(obj)}
  if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes, type)):
    return (type(obj).__name__, obj)
  if isinstance(obj, types.FunctionType):
    cells = tuple(signature(c.cell_contents, seen) if _filled(c) else ("empty",)
                  for c in obj.__closure__ or ())
    names = sorted(n for n in _global_names(obj.__code__) if n in obj.__globals__)
    used = tuple((n, signature(obj.__globals__[n], seen)) for n in names)
    return ("function", _code(obj.__code__), cells, used, signature(obj.__defaults__, seen),
            signature(obj.__kwdefaults__, seen))
  if isinstance(obj, types.CodeType):
    return _code(obj)
  if isinstance(obj, types.MethodType):
    return ("method", signature(obj.__func__, seen), signature(obj.__self__, seen))
  if isinstance(obj, functools.partial):
    return ("partial", signature(obj.func, seen), signature(obj.args, seen),
            signature(obj.keywords, seen))
  if isinstance(obj, (types.BuiltinFunctionType, types.ModuleType)):
    return ("named", getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
            or obj.__name__)
  if hasattr(obj, "__array__") and hasattr(obj, "shape") and hasattr(obj, "dtype"):
    return _array(obj)
  if isinstance(obj, tuple):
    return (type(obj).__qualname__,) + tuple(signature(v, seen) for v in obj)
  if isinstance(obj, list):
    return ("list",) + tuple(signature(v, seen) for v in obj)
  if isinstance(obj, dict):
    return ("dict",) + tuple((signature(k, seen), signature(v, seen)) for k, v in obj.items())
  if isinstance(obj, (set, frozenset)):
    return ("set", frozenset(signature(v, seen) for v in obj))
  try:
    hash(obj)
    return ("value", type(obj).__qualname__, obj)  # e.g. flax modules: frozen dataclasses.
  except TypeError:
    return ("object", id(obj))


def _code(code: types.CodeType) -> tuple:
  """What a code object computes, without where it was written (file, lines): the same lambda
  written in two places has one signature."""
  consts = tuple(_code(c) if isinstance(c, types.CodeType) else (type(c).__name__, c)
                 for c in code.co_consts)
  return ("code", code.co_code, consts, code.co_names, code.co_varnames, code.co_freevars,
          code.co_cellvars, code.co_argcount, code.co_kwonlyargcount, code.co_flags)


def _global_names(code: types.CodeType) -> set:
  """Names a code object (and the functions defined inside it) may read from its globals."""
  names = set(code.co_names)
  for c in code.co_consts:
    if isinstance(c, types.CodeType):
      names |= _global_names(c)
  return names


def _filled(cell) -> bool:
  try:
    cell.cell_contents  # noqa: B018  (reading an empty cell raises)
    return True
  except ValueError:
    return False


class Keyed:
  """Wraps `value` with a precomputed hash and equality on `key`: a cheap static jit argument.

  Examples:
    >>> a, b = Keyed(("k", 1), object()), Keyed(("k", 1), object())
    >>> a == b, hash(a) == hash(b)
    (True, True)
  """

  __slots__ = ("key", "value", "_hash")

  def __init__(self, key: Any, value: Any):
    self.key, self.value, self._hash = key, value, hash(key)

  def __hash__(self) -> int:
    return self._hash

  def __eq__(self, other) -> bool:
    return isinstance(other, Keyed) and (self is other or (self._hash == other._hash
                                                           and self.key == other.key))
