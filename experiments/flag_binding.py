"""The command line bound to the job config: each config field is the flag of the same name.

`define(...)` declares absl flags from the fields of `experiments.config` (help text, type,
accepted values and bounds as the fields state them) and from the settings of every registered
part (`fedjax_sel.registry`); `job_config()` reads them back into one `JobConfig`. Nothing below
this module and the launchers' entry points reads `FLAGS`. Since a field and its flag share one
name, an error about a field names its flag without parsing any text.

A setting flag of a part the job does not use is refused. A job replays from its folder's
`flags.txt` (`--flagfile=<out_dir>/flags.txt`); `config.json` beside it is the resolved config.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

from absl import app, flags

from experiments import config as cfglib
from fedjax_sel import registry

FLAGS = flags.FLAGS
# The flag choosing each kind of part, and the value meaning "no such part".
PART_FLAGS = {"selector": "selector", "filter": "filter", "rule": "rule",
              "aggregator": "aggregator", "server_optimizer": "server_opt"}
NONE = "none"
PART_HELP = {
    "selector": "Client selector (applied to the available, filtered-in clients)",
    "filter": "Client filter before selection (none: every available client may be selected)",
    "rule": "Participation rule of the selected clients (none: everyone trains)",
    "aggregator": "How the server combines the trained models",
    "server_optimizer": "Server optimizer stepping the global model with the pseudo-gradient "
                        "(global minus aggregate); none: the aggregate is the new model",
}
_SETTING_FLAGS: dict[str, list[tuple[str, str, str]]] = {}  # flag -> [(kind, part, field)]


def _base_type(hint) -> tuple[Any, bool]:
  """(the type inside Optional, whether None is allowed)."""
  args = typing.get_args(hint)
  if type(None) in args:
    inner = [a for a in args if a is not type(None)]
    return inner[0], True
  return hint, False


def _define(name: str, hint, default: Any, meta: dict) -> None:
  """One absl flag for a field of type `hint`."""
  base, _ = _base_type(hint)
  help_text = meta.get("help") or name
  bounds = {k: v for k, v in (("lower_bound", meta.get("lower")),
                              ("upper_bound", meta.get("upper"))) if v is not None}
  if typing.get_origin(base) is tuple:
    flags.DEFINE_list(name, None if default is None else [str(v) for v in default], help_text)
  elif meta.get("choices") is not None:
    flags.DEFINE_enum(name, default, [str(c) for c in meta["choices"]], help_text)
  elif base is bool:
    flags.DEFINE_bool(name, default, help_text)
  elif base is int:
    flags.DEFINE_integer(name, default, help_text, **bounds)
  elif base is float:
    flags.DEFINE_float(name, default, help_text, **bounds)
  else:
    flags.DEFINE_string(name, default, help_text)


def define_section(section: str, exclude: tuple[str, ...] = ()) -> None:
  """Flags for the fields of a config section (`data`, `model`, ...)."""
  cls = cfglib.SECTIONS[section]
  hints = typing.get_type_hints(cls)
  for f in dataclasses.fields(cls):
    if f.name not in exclude:
      _define(f.name, hints[f.name], f.default, dict(f.metadata))


def define_choices(kinds: tuple[str, ...]) -> None:
  """`--selector`, `--filter`, ...: the flag choosing the part of each of `kinds`."""
  defaults = {"selector": "random", "aggregator": "fedavg"}
  for kind in kinds:
    optional = kind in cfglib.OPTIONAL_KINDS
    accepted = ", ".join(((NONE,) if optional else ()) + registry.names(kind))
    flags.DEFINE_string(PART_FLAGS[kind], defaults.get(kind, NONE),
                        f"{PART_HELP[kind]}: {accepted}, or module:name of one registered "
                        "outside the package (fedjax_sel.registry).")


def define_parts(kinds: tuple[str, ...] = registry.KINDS, choose: bool = True) -> None:
  """A flag for every setting of every registered part of `kinds` (one flag for parts sharing a
  setting, as `--krum_f`), and with `choose` the flags choosing the parts (`define_choices`)."""
  if choose:
    define_choices(kinds)
  for kind in kinds:
    for name in registry.names(kind):
      entry = registry.lookup(kind, name)
      hints = typing.get_type_hints(entry.settings)
      for f in dataclasses.fields(entry.settings):
        flag = setting_flag(kind, name, f)
        if flag not in _SETTING_FLAGS:
          _SETTING_FLAGS[flag] = []
          _define(flag, hints[f.name], f.default, dict(f.metadata))
        _SETTING_FLAGS[flag].append((kind, name, f.name))


def setting_flag(kind: str, name: str, field: dataclasses.Field) -> str:
  """The flag of a part's setting: as the field names it, else `<part>_<field>`."""
  del kind
  return field.metadata.get("flag") or f"{name}_{field.name}"


def define_job() -> None:
  """`--seeds` and `--sweep`."""
  flags.DEFINE_list("seeds", ["0"], "Comma-separated seeds, one run each (distinct integers >= 0), "
                    "run as one batch.")
  flags.DEFINE_string("sweep", None, "Sweep one continuous setting: NAME:V1,V2,... adds a run per "
                      "value to each method (labelled NAME=V), batched with its seeds. NAME: lr "
                      "or prox_mu.")


# --- Reading the flags back ---------------------------------------------------------------------

def _convert(flag: str, hint, value: Any) -> Any:
  """A flag's value as the field's type (list flags of numbers parsed, naming the flag)."""
  base, _ = _base_type(hint)
  if value is None or typing.get_origin(base) is not tuple:
    return value
  item = typing.get_args(base)[0]
  try:
    return tuple(item(v) for v in value)
  except ValueError as e:
    raise app.UsageError(f"--{flag} must be a comma-separated list of {item.__name__}s, got "
                         f"{','.join(value)}") from e


def _value(flag: str, hint, base_value: Any) -> Any:
  """The flag's value as the field's type, or `base_value` where this launcher has no such flag."""
  if flag not in FLAGS:
    return base_value
  return _convert(flag, hint, FLAGS[flag].value)


def _section(section: str, base: Any) -> Any:
  cls = cfglib.SECTIONS[section]
  hints = typing.get_type_hints(cls)
  return cls(**{f.name: _value(f.name, hints[f.name], getattr(base, f.name))
                for f in dataclasses.fields(cls)})


def unused_setting_flags() -> set[str]:
  """The setting flags at their defaults of parts that the chosen `--selector`, `--filter`, ...
  are not: a job's flagfile leaves them out (given, they would be refused; left out, they keep
  their defaults)."""
  unused = set()
  for flag, owners in _SETTING_FLAGS.items():
    kind = owners[0][0]
    chosen = PART_FLAGS[kind] in FLAGS and FLAGS[PART_FLAGS[kind]].value
    if chosen not in {n for _, n, _ in owners} and FLAGS[flag].value == FLAGS[flag].default:
      unused.add(flag)
  return unused


def part_settings(kind: str, name: str) -> Any:
  """The settings of part `name` of `kind` as the flags give them."""
  entry = registry.lookup(kind, name)
  hints = typing.get_type_hints(entry.settings)
  return entry.settings(**{f.name: _value(setting_flag(kind, name, f), hints[f.name], f.default)
                                 for f in dataclasses.fields(entry.settings)})


def _part(kind: str, base: cfglib.Part | None) -> cfglib.Part | None:
  flag = PART_FLAGS[kind]
  if flag not in FLAGS:
    return base
  name = FLAGS[flag].value
  chosen = {(k, n) for k, n in [(kind, name)]}
  for setting, owners in _SETTING_FLAGS.items():
    if FLAGS[setting].present and owners[0][0] == kind and not chosen & {o[:2] for o in owners}:
      parts = sorted({n for _, n, _ in owners})
      raise app.UsageError(f"--{setting} is a setting of --{flag}={'/'.join(parts)}, not of "
                           f"--{flag}={name}: drop it or choose that {kind}")
  if name == NONE and kind in cfglib.OPTIONAL_KINDS:
    return None
  try:
    entry = registry.lookup(kind, name)
  except ValueError as e:
    raise app.UsageError(f"--{flag}: {e}") from e
  hints = typing.get_type_hints(entry.settings)
  same = base is not None and base.name == name
  values = {}
  for f in dataclasses.fields(entry.settings):
    old = getattr(base.settings, f.name) if same else f.default
    values[f.name] = _value(setting_flag(kind, name, f), hints[f.name], old)
  return cfglib.Part(name, entry.settings(**values))


def seeds() -> tuple[int, ...]:
  """--seeds as distinct integers >= 0 (a usage error naming the flag otherwise)."""
  try:
    values = [int(s) for s in FLAGS.seeds]
  except ValueError as e:
    raise app.UsageError(f"--seeds must be a comma-separated list of integers, got "
                         f"{FLAGS.seeds}") from e
  if not values or min(values) < 0 or len(set(values)) != len(values):
    raise app.UsageError(f"--seeds must be distinct integers >= 0, got {FLAGS.seeds}")
  return tuple(values)


def _sweep(sweepable: dict[str, str]) -> cfglib.Sweep | None:
  """--sweep=NAME:V1,V2 as a `Sweep`, each value checked like the flag NAME itself."""
  text = FLAGS.sweep
  name, _, values = text.partition(":")
  if name not in sweepable or not values:
    raise app.UsageError(f"--sweep must be NAME:V1,V2,... with NAME among {sorted(sweepable)}, "
                         f"got {text!r}")
  try:
    parsed = tuple(float(v) for v in values.split(","))
  except ValueError as e:
    raise app.UsageError(f"--sweep values must be numbers, got {values!r}") from e
  if len(set(parsed)) != len(parsed):
    raise app.UsageError(f"--sweep values must be distinct, got {values!r}")
  section, field = sweepable[name].split(".")
  meta = next(f.metadata for f in dataclasses.fields(cfglib.SECTIONS[section]) if f.name == field)
  for v in parsed:
    low, high = meta.get("lower"), meta.get("upper")
    if not math.isfinite(v) or (low is not None and v < low) or (high is not None and v > high):
      raise app.UsageError(f"--sweep={text}: {v} is not a valid --{name} (a finite number"
                           + (f" >= {low}" if low is not None else "")
                           + (f" <= {high}" if high is not None else "") + ")")
  return cfglib.Sweep(sweepable[name], parsed)


def check_finite(cfg: cfglib.JobConfig) -> None:
  """Every float of the config (sections and part settings) finite, naming its flag; a part's
  setting may be +inf where its own check accepts it."""
  for section in cfglib.SECTIONS:
    for f in dataclasses.fields(cfglib.SECTIONS[section]):
      value = getattr(getattr(cfg, section), f.name)
      if isinstance(value, float) and not math.isfinite(value):
        raise app.UsageError(f"--{f.name} must be a finite number, got {value}")


def job_config(defaults: cfglib.JobConfig | None = None,
               sweepable: dict[str, str] | None = None) -> cfglib.JobConfig:
  """The job the command line describes (`defaults` for what this launcher does not define)."""
  base = defaults or cfglib.JobConfig()
  sections = {name: _section(name, getattr(base, name)) for name in cfglib.SECTIONS}
  parts = {kind: _part(kind, getattr(base.parts, kind)) for kind in registry.KINDS}
  run_seeds = seeds() if "seeds" in FLAGS else base.seeds
  sweep = base.sweep
  if "sweep" in FLAGS:
    sweep = None if FLAGS.sweep is None else _sweep(sweepable or {})
  cfg = cfglib.JobConfig(**sections, parts=cfglib.PartsConfig(**parts), seeds=run_seeds,
                         sweep=sweep)
  check_finite(cfg)
  return cfg


def part_error(kind: str, name: str, error: ValueError) -> app.UsageError:
  """A part's refusal as a usage error naming the flag of the setting at fault (or the part)."""
  flag = PART_FLAGS[kind]
  if isinstance(error, registry.SettingError):
    field = next((f for f in dataclasses.fields(registry.lookup(kind, name).settings)
                  if f.name == error.field), None)
    if field is not None:
      space = "" if error.message.startswith("=") else " "
      return app.UsageError(f"--{setting_flag(kind, name, field)}{space}{error.message} "
                            f"(--{flag}={name})")
  return app.UsageError(f"--{flag}={name}: {error}")
