"""One registry of names: every part of a round by kind and name, its factory and its settings.

A part (selector, filter, participation rule, aggregator, server optimizer, availability model),
and each dataset and model a job may name, is registered once,
beside its code, with a typed settings class (a frozen dataclass whose fields say their help text,
their command-line flag and their accepted values). The launchers' choices, `--help`, the job
config, fingerprints and the docs' tables read the registry, so a new method is one module:

  @dataclasses.dataclass(frozen=True)
  class TopLossSettings:
    temperature: float = registry.setting(1.0, "Softmax temperature.", within="> 0")
    # Checks the choices and ranges cannot state go in a method `check(self, context)`,
    # raising registry.SettingError(field, message).

  @registry.register("selector", "top_loss", TopLossSettings)
  def top_loss(settings, context):
    del context  # A selector reads K from its inputs (`inputs.k`).
    return my_selector(settings.temperature)

Parts can be registered from outside the package: `lookup("selector", "my_pkg.parts:top_loss")`
imports `my_pkg.parts` (whose import registers its parts) and finds `top_loss` among them; a
package may also name its modules in the `fedjax_sel.parts` entry-point group, imported the first
time a name is not found.

Example:
  >>> from fedjax_sel import registry
  >>> registry.lookup("selector", "poc").settings().variant
  'pow'
  >>> "oort" in registry.names("selector")
  True
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import math
import numbers
import pkgutil
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import jax

KINDS = ("selector", "filter", "rule", "aggregator", "server_optimizer", "availability",
         "dataset", "model")
ENTRY_POINT_GROUP = "fedjax_sel.parts"
# The package's folders whose modules register parts, datasets and models: every module in them is
# imported the first time the registry is read, so a part registered where it is written is found.
PACKAGES = ("fedjax_sel.parts", "fedjax_sel.data", "fedjax_sel.models", "fedjax_sel.privacy")
SWEEPS = ("value", "structural")  # How a setting's values share a compiled round (`sweeps`).


class SettingError(ValueError):
  """A setting's value is refused: `field` names it (the launchers map it to its flag)."""

  def __init__(self, field: str, message: str):
    super().__init__(f"{field} {message}")
    self.field = field
    self.message = message


class BuildContext(NamedTuple):
  """What a part's factory may read besides its settings.

  Attributes:
    k: clients per round (K), held by the simulator; selectors choose at most K.
    rounds: rounds of the run (T), for schedules over the run.
    seed: the run's seed (draws that describe the run, e.g. FedALIGN's priority clients).
    num_clients: N.
    num_available: the most clients available at once (the availability model's).
    data: the run's `FederatedDataset` (None when settings are checked before the data exist).
    model: the run's `Model` (None likewise).
    profile: the clients' `system.SystemProfile` on the simulated clock, or None.
    local_epochs: E, local passes per round (a duration estimate for clock-aware parts).
    deadline_s: the clock's round deadline in seconds, or None.
  """

  k: int
  rounds: int
  seed: int = 0
  num_clients: int = 0
  num_available: int = 0
  data: Any = None
  model: Any = None
  profile: Any = None
  local_epochs: int = 1
  deadline_s: float | None = None


@dataclasses.dataclass(frozen=True)
class NoSettings:
  """The settings of a part that has none."""

  def check(self, context: BuildContext) -> None:
    del context


class Entry(NamedTuple):
  """A registered part: `factory(settings, context) -> part`."""

  kind: str
  name: str
  factory: Callable[[Any, BuildContext], Any]
  settings: type
  doc: str
  requires: tuple[str, ...] = ()
  label: str = ""  # Its name in a method's label ("Krum"); "" for its registered name.
  reads: str = ""  # What a selector's choice reads (`READS`); "" undeclared (private, under DP).


# What a part may require of the run (`register(..., requires=...)`, or its settings' values:
# `requirements`): "clock", the simulated clock (a system profile); "availability", an
# availability model where clients differ (a launcher turns these two on, and says so, when the
# command line chose none); "public", a public set the server evaluates on; "validation", each
# client's held-out split (a launcher sets aside a share of the data for these two unless the
# command line set it); "priority", a group of priority clients its settings draw
# (`settings.priority(context)`), whose clean data the clean metrics then score.
REQUIREMENTS = ("clock", "availability", "public", "validation", "priority")

# What a selector's choice reads of the clients, which decides how differential privacy accounts
# for it (docs/papers/privacy.md): "nothing" (uniform or Poisson draws), "metadata" (public facts:
# data sizes, speeds, availability), "stats" (private statistics read only as the round's scalar
# per-client stats it `needs`, or the last reported loss: `--dp_selection=privatized` can clip and
# noise them), "private" (other private data: updates, gradients, observed training losses).
READS = ("nothing", "metadata", "stats", "private")

_ENTRIES: dict[tuple[str, str], Entry] = {}
_LOADED_ENTRY_POINTS = False
_PACKAGE_MODULES: list[str] = []  # The modules of `PACKAGES`, in the order names are listed.


class Range(NamedTuple):
  """The accepted values of a number: `low` to `high`, each end included unless `open_*`."""

  low: float = -math.inf
  high: float = math.inf
  open_low: bool = False
  open_high: bool = False

  @staticmethod
  def parse(text: str) -> Range:
    """`"[0, 1)"`, `"(0, 1]"` (brackets include the end, parentheses leave it out), `">= 1"` or
    `"> 0"`."""
    interval = re.fullmatch(r"([\[(])\s*([^,]+),\s*([^\])]+)([\])])", text.strip())
    bound = re.fullmatch(r"(>=?)\s*(\S+)", text.strip())
    try:
      if interval:
        return Range(float(interval[2]), float(interval[3]), interval[1] == "(",
                     interval[4] == ")")
      if bound:
        return Range(float(bound[2]), open_low=bound[1] == ">")
    except ValueError:
      pass
    raise ValueError(f"a range must read like '[0, 1)', '(0, 1]', '>= 1' or '> 0', got {text!r}")

  def __str__(self) -> str:
    if self.high == math.inf:
      return f"{'>' if self.open_low else '>='} {self.low:g}"
    return (f"in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}"
            f"{')' if self.open_high else ']'}")

  def __contains__(self, value: Any) -> bool:
    """Whether `value` is a finite real number (not a bool, nor a string) within the range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
      return False
    return bool(math.isfinite(value) and (self.low < value if self.open_low else self.low <= value)
                and (value < self.high if self.open_high else value <= self.high))


def setting(default: Any, help: str, *, flag: str | None = None,  # pylint: disable=redefined-builtin
            choices: tuple | None = None, within: str | None = None,
            sweep: str | None = None) -> Any:
  """A settings field: its default, help text, command-line flag (default `<part>_<field>`) and
  accepted values: for a string among fixed values, `choices`; for a number, the range `within`
  (as `Range.parse` reads it; the help text then ends with it).

  `sweep` says how runs that differ in the setting share a compiled round (`sweeps`): "value",
  a number the round's arithmetic reads, which then travels as a run value of the batch axis
  (one program for every value; the part's factory is called with a traced scalar, so it must
  not turn the setting into a Python number); "structural", one that sets an array's shape, a
  count, a choice or a branch taken in Python (one program per value). Default: "value" for a
  float, "structural" for everything else.

  Example:
    >>> import dataclasses
    >>> @dataclasses.dataclass(frozen=True)
    ... class Settings:
    ...   share: float = setting(0.5, "Share of the K drawn uniformly.", within="[0, 1]")
    >>> setting_help(dataclasses.fields(Settings)[0])
    'Share of the K drawn uniformly, in [0, 1].'
    >>> check_values(Settings(share=1.5))
    Traceback (most recent call last):
    ...
    fedjax_sel.registry.SettingError: share must be in [0, 1], got 1.5
  """
  if sweep not in (None,) + SWEEPS:
    raise ValueError(f"sweep must be one of {SWEEPS}, got {sweep!r}")
  metadata = {"help": help, "flag": flag, "choices": choices,
              "within": None if within is None else Range.parse(within), "sweep": sweep}
  if isinstance(default, (list, dict)):
    raise TypeError("settings defaults must be immutable (use a tuple)")
  return dataclasses.field(default=default, metadata=metadata)


def sweeps(field: dataclasses.Field) -> str:
  """How runs that differ in `field` share a program: "value" or "structural" (`setting`)."""
  declared = field.metadata.get("sweep")
  if declared is not None:
    return declared
  float_default = isinstance(field.default, float) and not isinstance(field.default, bool)
  return "value" if float_default else "structural"


def setting_help(field: dataclasses.Field) -> str:
  """The help text of a settings field, its range (if any) at the end."""
  text, within = field.metadata.get("help") or field.name, field.metadata.get("within")
  return text if within is None else f"{text.rstrip('.')}, {within}."


def value_problem(value: Any, metadata) -> str | None:
  """Why `value` is outside the `choices` or the range (`within`) of a field with `metadata`
  ("must be ..., got ..."), or None when it is inside (a None value has no range)."""
  if isinstance(value, jax.core.Tracer):  # A swept run value: checked as each run was built.
    return None
  choices, within = metadata.get("choices"), metadata.get("within")
  if choices is not None and value not in choices:
    return f"must be one of {', '.join(map(str, choices))}, got {value!r}"
  if within is not None and value is not None and value not in within:
    return f"must be {within}, got {value}"
  return None


def concrete(*values: Any) -> bool:
  """Whether `values` are known numbers, not the traced scalars of a batch that sweeps them
  (`sweeps`): a factory checks a setting's range only then (each run's own value was checked when
  it was built)."""
  return not any(isinstance(v, jax.core.Tracer) for v in values)


def plain(value: Any) -> Any:
  """A setting as a part's `spec` records it: a Python float, or the traced scalar it is while a
  batch sweeps it (`sweeps`)."""
  return value if isinstance(value, jax.core.Tracer) else float(value)


def check_values(settings: Any) -> None:
  """Raises `SettingError` naming the first field of `settings` outside its `choices` or its
  range."""
  for f in dataclasses.fields(settings):
    problem = value_problem(getattr(settings, f.name), f.metadata)
    if problem is not None:
      raise SettingError(f.name, problem)


def setting_flag(name: str, field: dataclasses.Field) -> str:
  """The command-line flag of a setting of part `name`: as the field names it, else
  `<name>_<field>` (the registered name: `module:` left out)."""
  return field.metadata.get("flag") or f"{name.rsplit(':', 1)[-1]}_{field.name}"


def register(kind: str, name: str, settings: type = NoSettings, doc: str | None = None,
             requires: tuple[str, ...] = (), label: str = "", reads: str = ""):
  """Decorator registering `factory(settings, context) -> part` as part `name` of `kind`;
  `requires` names what the part needs of the run (`REQUIREMENTS`), whatever its settings (a
  settings class may add what some of its values need: `requirements`); `label` is its name in a
  method's label (its registered name when empty); `reads`, for a selector, what its choice
  reads (`READS`; every selector of the package declares it; an undeclared one counts as reading
  private data).

  Registering a name twice with another factory is refused (a module imported twice registers
  the same factory again, which is allowed)."""
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
  if not set(requires) <= set(REQUIREMENTS):
    raise ValueError(f"requires must name some of {REQUIREMENTS}, got {requires}")
  if not dataclasses.is_dataclass(settings):
    raise TypeError(f"settings of {kind} {name!r} must be a frozen dataclass, got {settings}")
  if reads and (kind != "selector" or reads not in READS):
    raise ValueError(f"{kind} {name!r}: reads= is a selector's declaration, one of {READS}; got "
                     f"{reads!r}")

  def wrap(factory):
    key = (kind, name)
    old = _ENTRIES.get(key)
    if old is not None and old.factory.__qualname__ != factory.__qualname__:
      raise ValueError(f"{kind} {name!r} is registered already ({old.factory.__module__}."
                       f"{old.factory.__qualname__})")
    text = doc if doc is not None else (factory.__doc__ or "").strip().split("\n")[0]
    _ENTRIES[key] = Entry(kind, name, factory, settings, text, tuple(requires), label, reads)
    return factory

  return wrap


class Makes:
  """A settings mixin for a part its settings build alone (`make()`, no context): its check
  builds it, a refusal naming the field `REFUSED`; register it with `register_made`."""

  REFUSED = ""

  def make(self) -> Any:
    raise NotImplementedError

  def check(self, context: BuildContext) -> None:
    del context
    try:
      self.make()
    except ValueError as e:
      raise SettingError(self.REFUSED, f"is refused: {e}") from e


def register_made(kind: str, name: str, settings: type, doc: str, label: str = "") -> None:
  """Registers part `name` of `kind` whose `Makes` settings build it (`settings.make()`)."""
  def factory(s, context: BuildContext) -> Any:
    del context
    return s.make()
  factory.__qualname__ = f"{kind}_{name}"
  factory.__module__ = settings.__module__  # Listed, and found by module:name, with its module.
  register(kind, name, settings, doc, label=label)(factory)


def package_modules() -> tuple[str, ...]:
  """Every module of `PACKAGES`, imported (their parts registered), in a fixed order: the packages
  in turn, each folder's modules by name, a subpackage's after its parent's."""
  if not _PACKAGE_MODULES:
    found = []
    for package in PACKAGES:
      path = importlib.import_module(package).__path__
      found += [m.name for m in pkgutil.walk_packages(path, f"{package}.")]
    for module in found:
      importlib.import_module(module)
    _PACKAGE_MODULES.extend(found)
  return tuple(_PACKAGE_MODULES)


def _load_entry_points() -> None:
  global _LOADED_ENTRY_POINTS  # pylint: disable=global-statement
  if _LOADED_ENTRY_POINTS:
    return
  _LOADED_ENTRY_POINTS = True
  for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
    point.load()


def names(kind: str) -> tuple[str, ...]:
  """The names registered for `kind`: the package's (by module, `package_modules`), then the
  others in registration order."""
  rank = {m: i for i, m in enumerate(package_modules())}
  _load_entry_points()
  entries = [e for e in _ENTRIES.values() if e.kind == kind]
  entries.sort(key=lambda e: rank.get(e.factory.__module__, len(rank)))  # Stable: then in order.
  return tuple(e.name for e in entries)


def lookup(kind: str, name: str) -> Entry:
  """The entry of part `name` of `kind`; `module:name` imports `module` first. An unknown name
  raises ValueError listing the accepted ones."""
  package_modules()
  if ":" in name:
    module, _, short = name.partition(":")
    try:
      importlib.import_module(module)
    except ImportError as e:
      raise ValueError(f"{kind} {name!r}: cannot import {module} ({e})") from e
    entry = next((e for e in _ENTRIES.values() if e.kind == kind
                  and (e.name == short or e.name == name)
                  and e.factory.__module__ == module), None)
    if entry is None:
      raise ValueError(f"{kind} {name!r}: {module} registers no {kind} named {short!r} "
                       f"(register it with fedjax_sel.registry.register({kind!r}, {short!r}, ...))")
    return entry
  if (kind, name) not in _ENTRIES:
    _load_entry_points()
  if (kind, name) not in _ENTRIES:
    raise ValueError(f"unknown {kind} {name!r}; accepted: {', '.join(names(kind))}, or "
                     "module:name of one registered outside the package")
  return _ENTRIES[(kind, name)]


def requirements(kind: str, name: str, settings: Any) -> dict[str, str | None]:
  """What part `name` of `kind` with `settings` needs of the run (`REQUIREMENTS`): {requirement:
  the settings field whose value asks for it, None where the part always does}. A settings class
  states what its values need in a method `requires(self) -> {requirement: field name}`."""
  out: dict[str, str | None] = dict.fromkeys(lookup(kind, name).requires)
  own = getattr(settings, "requires", None)
  if own is not None:
    asked = own()
    if not set(asked) <= set(REQUIREMENTS):
      raise ValueError(f"{kind} {name!r} requires must name some of {REQUIREMENTS}, got {asked}")
    out.update(asked)
  return out


def label(kind: str, name: str) -> str:
  """Part `name` of `kind` as a method's label names it (`register(..., label=...)`)."""
  return lookup(kind, name).label or name


def settings_fields(settings: type) -> tuple[dataclasses.Field, ...]:
  """The fields of a settings class, in order."""
  return dataclasses.fields(settings)


def check(kind: str, name: str, settings: Any, context: BuildContext) -> None:
  """Checks `settings` of part `name`: `check_values`, then the settings' own `check` (if any)."""
  entry = lookup(kind, name)
  if not isinstance(settings, entry.settings):
    raise TypeError(f"{kind} {name!r} takes {entry.settings.__name__}, got "
                    f"{type(settings).__name__}")
  check_values(settings)
  own = getattr(settings, "check", None)
  if own is not None:
    own(context)


class Recipe(NamedTuple):
  """How the registry built a part: rebuilt with other values of its settings (`with_values`),
  the part's program can take those values as run values (`engine/sweeps.py`)."""

  kind: str
  name: str
  settings: Any
  context: BuildContext

  def value_fields(self) -> tuple[str, ...]:
    """The settings that travel as run values when runs differ in them (`sweeps`)."""
    return tuple(f.name for f in dataclasses.fields(self.settings) if sweeps(f) == "value")

  def with_values(self, **values) -> Any:
    """The part built with `values` in place of those settings (unchecked: they may be traced
    scalars; each run's own values were checked when it was built)."""
    settings = dataclasses.replace(self.settings, **values)
    part = lookup(self.kind, self.name).factory(settings, self.context)
    return _with_recipe(part, self._replace(settings=settings))


def _with_recipe(part: Any, recipe: Recipe) -> Any:
  fields = getattr(part, "_fields", ())
  return part._replace(recipe=recipe) if "recipe" in fields else part


def build(kind: str, name: str, settings: Any, context: BuildContext) -> Any:
  """The part `name` of `kind` with `settings`, checked first (a part type with a `recipe` field
  records how it was built there)."""
  check(kind, name, settings, context)
  part = lookup(kind, name).factory(settings, context)
  return _with_recipe(part, Recipe(kind, name, settings, context))
