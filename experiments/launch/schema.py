"""The JSON files the launchers read, checked against their schemas: every error names the file
and the field's path (`data.num_clients`, `scenarios.label_skew[2]`, `runs[0].seed`).

A schema is a type hint: `bool`, `int`, `float` (an integer reads as one), `str`, `X | None`,
`tuple[X, ...]` (a JSON list, read as a tuple), `dict[str, X]` (an object of any names), `Any`
(anything), or a dataclass (an object of its fields: a name it lacks is refused, naming the
accepted ones; a field without a default is required).

  >>> conform({"num_clients": "50"}, dict[str, int], "config.json")
  Traceback (most recent call last):
  ...
  ValueError: config.json: num_clients must be an integer, got the string '50'
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import types
import typing
from typing import Any

NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
         type(None): "null"}


def describe(value: Any) -> str:
  """A JSON value as an error names it: "the string '50'", "a list", "null", ..."""
  if value is None:
    return "null"
  if isinstance(value, bool):
    return str(value).lower()
  if isinstance(value, str):
    return f"the string {value!r}"
  if isinstance(value, numbers.Number):
    return f"the number {value!r}"
  return "a list" if isinstance(value, (list, tuple)) else "an object"


def _expected(hint) -> str:
  """What a value of `hint` is, in words."""
  if hint in NAMES:
    return NAMES[hint]
  origin = typing.get_origin(hint)
  if origin in (typing.Union, types.UnionType):
    return " or ".join(_expected(h) for h in typing.get_args(hint))
  if origin is tuple:
    return f"a list of {_expected(typing.get_args(hint)[0]).split(' ', 1)[-1]}s"
  return "an object"


def _fail(where: str, path: str, hint, value: Any) -> ValueError:
  return ValueError(f"{where}: {path or 'the file'} must be {_expected(hint)}, got "
                    f"{describe(value)}")


def _join(path: str, name: str) -> str:
  return f"{path}.{name}" if path else name


def conform(value: Any, hint, where: str, path: str = "") -> Any:
  """`value` (parsed JSON) read as `hint`: tuples for lists, dataclasses for objects, floats for
  integers in a float field; ValueError "<where>: <path> must be ..., got ..." otherwise."""
  origin = typing.get_origin(hint)
  if hint is Any:
    return value
  if origin in (typing.Union, types.UnionType):
    options = typing.get_args(hint)
    if value is None and type(None) in options:
      return None
    others = [h for h in options if h is not type(None)]
    if len(others) == 1 and others[0] not in NAMES:  # A list's or object's own error.
      return conform(value, others[0], where, path)
    for option in others:
      try:
        return conform(value, option, where, path)
      except ValueError:
        continue
    raise _fail(where, path, hint, value)
  if origin is tuple:
    if not isinstance(value, (list, tuple)):
      raise _fail(where, path, hint, value)
    item = typing.get_args(hint)[0]
    return tuple(conform(v, item, where, f"{path}[{i}]") for i, v in enumerate(value))
  if origin is dict:
    if not isinstance(value, dict):
      raise _fail(where, path, hint, value)
    item = typing.get_args(hint)[1]
    return {k: conform(v, item, where, _join(path, k)) for k, v in value.items()}
  if dataclasses.is_dataclass(hint):
    return _conform_object(value, hint, where, path)
  if hint is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
    return float(value)
  if hint in NAMES and type(value) is hint:  # Not a bool for an integer.
    return value
  raise _fail(where, path, hint, value)


def _conform_object(value: Any, cls: type, where: str, path: str) -> Any:
  """Dataclass `cls` from its JSON object, each field conformed to its hint."""
  if not isinstance(value, dict):
    raise _fail(where, path, cls, value)
  fields = {f.name: f for f in dataclasses.fields(cls)}
  unknown = sorted(set(value) - set(fields))
  if unknown:
    raise ValueError(f"{where}: {path or 'the file'} has unknown fields {unknown}; accepted: "
                     f"{sorted(fields)}")
  missing = [name for name, f in fields.items() if name not in value
             and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
  if missing:
    raise ValueError(f"{where}: {path or 'the file'} lacks {', '.join(map(repr, missing))}")
  hints = typing.get_type_hints(cls)
  return cls(**{name: conform(v, hints[name], where, _join(path, name))
                for name, v in value.items()})


def read(path: str, hint) -> Any:
  """The JSON file at `path` read as `hint` (`conform`); ValueError naming the file when it
  cannot be read, is not JSON or does not fit."""
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except OSError as e:
    raise ValueError(f"{path}: cannot be read ({e.strerror or e})") from e
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path}: not JSON ({e})") from e
  return conform(data, hint, path)
