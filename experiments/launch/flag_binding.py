"""The command line bound to the job config: each config field is the flag of the same name.

A launcher calls `define(defaults, ...)` once, at import, with its default `JobConfig`: absl flags
are declared from the config fields it uses (help text, type, accepted values and bounds as the
fields state them, defaults from `defaults`), from the settings of the parts it uses
(`fedjax_sel.registry`) and from its own options dataclass, and it keeps the `Binding` returned.
`binding.job_config(resolve)` reads them back into one `JobConfig`: the flags given on the command
line over `--config=<out_dir>/config.json` (a finished job's resolved config: it replays the job
exactly) or over the launcher's defaults.
This module and the launchers' entry points are the only readers of `FLAGS`. Since a field and its
flag share one name, an error about a field names its flag without parsing any text.

A setting flag of a part the job does not use is refused, and so is a field set where the job's
other settings leave it without effect (`config.without_effect`: `--staleness_b` without
`--staleness=hinge`, `--shards_per_client` without `--partition=shards`, ...).
`binding.flag_lines(cfg)` is the job's
flagfile (`flags.txt`): `--flagfile=<out_dir>/flags.txt` replays it too.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
import sys
import typing
from collections.abc import Callable
from typing import Any

from absl import app, flags

from experiments.launch import config as cfglib
from fedjax_sel import registry

FLAGS = flags.FLAGS
flags.disclaim_key_flags()  # The flags `define` declares are the calling launcher's (its --help).
PART_FLAG = cfglib.PART_FLAG
NONE = "none"  # The value of a part's flag meaning "no such part".
PART_HELP = {
    "dataset": "Dataset (digits ships with scikit-learn; its own settings are flags: --data_dir, "
               "--tfds_name, --leaf_files, --synth_alpha, ...)",
    "model": "Model the clients train (its size follows --hidden, --resnet_width, --norm)",
    "selector": "Client selector (applied to the available, filtered-in clients)",
    "filter": "Client filter before selection (none: every available client may be selected)",
    "rule": "Participation rule of the selected clients (none: everyone trains)",
    "aggregator": "How the server combines the trained models",
    "server_optimizer": "Server optimizer stepping the global model with the pseudo-gradient "
                        "(global minus aggregate); none: the aggregate is the new model",
    "availability": "Which clients are available each round: uniform (exactly --num_available, "
                    "redrawn every --avail_period rounds), probability (each client with its own "
                    "probability, drawn once in --avail_prob_range), diurnal (a day cycle of "
                    "--diurnal_period rounds, each client with its own phase), trace (read from "
                    "--avail_trace); the last three vary the number by round, at most "
                    "--avail_capacity",
}
NOT_REPLAYED = ("resume", "overwrite", "config")  # A replay decides these itself.
# The section fields `--sweep` takes besides the part settings (the data, loaded once per seed
# for all of a method's runs, and the outputs are not swept).
SWEEP_FIELDS = ("lr", "prox_mu", "local_epochs", "local_steps", "batch_size", "clients_per_round",
                "deadline_s", "concurrency", "buffer_size", "staleness_a", "staleness_b",
                "async_alpha", "max_staleness")
SWEEP_MARKS = {"value": "one program", "structural": "a program per value"}


@dataclasses.dataclass(frozen=True)
class Binding:
  """What `define` declared for a launcher: its defaults and the flags of each config field, and
  the reading of those flags back into its job (the launcher keeps it; no module state does)."""

  defaults: cfglib.JobConfig
  fields: dict[str, tuple[str, Any]]  # flag -> (section or "options", type hint)
  choices: tuple[str, ...]  # Kinds with a flag choosing the part.
  settings: dict[str, list[tuple[str, str, str]]]  # flag -> [(kind, part, field)]

  def job_config(self, resolve: Resolve | None = None) -> cfglib.JobConfig:
    """The job the command line describes (`_job_config`)."""
    return _job_config(self, resolve)

  def flag_lines(self, cfg: cfglib.JobConfig) -> list[str]:
    """The job's flagfile (`_flag_lines`)."""
    return _flag_lines(self, cfg)

  def short_help(self, doc: str) -> str:
    """The launcher's --help (`_short_help`)."""
    return _short_help(self, doc)

  def setting_owners(self, kind: str) -> dict[str, set[str]]:
    """The parts each setting flag of `kind` sets (`_setting_owners`)."""
    return _setting_owners(self, kind)


def _base_type(hint) -> Any:
  """The type inside Optional."""
  args = typing.get_args(hint)
  if type(None) in args:
    return [a for a in args if a is not type(None)][0]
  return hint


def _define(name: str, hint, default: Any, field: dataclasses.Field, owner: str = "") -> None:
  """One absl flag for `field` (of type `hint`); `owner` names the parts it sets, if any."""
  base = _base_type(hint)
  meta = field.metadata
  help_text = (f"{owner}: " if owner else "") + registry.setting_help(field)
  within = meta.get("within")  # Its closed ends bound the flag; `check_values` checks the rest.
  bounds = {} if within is None else {
      k: v for k, v, shut in (("lower_bound", within.low, not within.open_low),
                              ("upper_bound", within.high, not within.open_high))
      if shut and math.isfinite(v)}
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


def _import_named_modules() -> None:
  """Imports the modules the command line names in a part's flag (`--selector=my_pkg.parts:top`),
  so that the parts they register, and their settings' flags, exist when the flags are declared."""
  choosing = set(PART_FLAG.values())
  for arg in sys.argv[1:]:
    match = re.fullmatch(r"--(\w+)=([\w.]+):\w+", arg)
    if match and match.group(1) in choosing:
      try:
        importlib.import_module(match.group(2))
      except ImportError:
        pass  # The registry's lookup names the module and the error.


def define(defaults: cfglib.JobConfig, *, exclude: tuple[str, ...] = (),
           choose: tuple[str, ...] = (), parts: dict[str, tuple[str, ...] | None] | None = None,
           replay: bool = True) -> Binding:
  """Declares a launcher's flags, with `defaults` (its default job) as their defaults.

  Args:
    defaults: the launcher's default `JobConfig` (its `options` type gives its own flags).
    exclude: fields of the shared sections this launcher does not use (no flag).
    choose: kinds of part the command line chooses (`--selector`, `--filter`, ...).
    parts: kind -> the names of the parts whose settings are flags (None: every registered
      one); kinds in `choose` default to every registered part.
    replay: define `--config` (a job's config.json to run again).

  Returns:
    The `Binding` of these flags to the config, which reads them back.
  """
  _import_named_modules()
  fields = {}
  sections = [(s, cls, getattr(defaults, s)) for s, cls in cfglib.SECTIONS.items()]
  if defaults.options is not None:
    sections.append(("options", type(defaults.options), defaults.options))
  for section, cls, values in sections:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
      if f.name not in exclude:
        _define(f.name, hints[f.name], getattr(values, f.name), f)
        fields[f.name] = (section, hints[f.name])
  for kind in choose:
    chosen = getattr(defaults.parts, kind)
    accepted = ", ".join(((NONE,) if kind in cfglib.OPTIONAL_KINDS else ()) + registry.names(kind))
    flags.DEFINE_string(PART_FLAG[kind], NONE if chosen is None else chosen.name,
                        f"{PART_HELP[kind]}: {accepted}, or module:name of one registered "
                        "outside the package (fedjax_sel.registry).")
  wanted = {kind: None for kind in choose}
  wanted.update(parts or {})
  settings: dict[str, list[tuple[str, str, str]]] = {}
  declared = {}  # flag -> (type hint, default, field): declared once all its parts are known.
  for kind, names in wanted.items():
    chosen = getattr(defaults.parts, kind)
    for name in names or registry.names(kind):
      entry = registry.lookup(kind, name)
      hints = typing.get_type_hints(entry.settings)
      base = chosen.settings if chosen is not None and chosen.name == name else entry.settings()
      for f in dataclasses.fields(entry.settings):
        flag = cfglib.setting_flag(name, f)
        declared.setdefault(flag, (hints[f.name], getattr(base, f.name), f))
        settings.setdefault(flag, []).append((kind, name, f.name))
  for flag, (hint, default, f) in declared.items():
    users = settings[flag]
    kinds = sorted({kind for kind, _, _ in users})
    _define(flag, hint, default, f, f"{', '.join(name for _, name, _ in users)} {'/'.join(kinds)}")
  flags.DEFINE_list("seeds", [str(s) for s in defaults.seeds], "Comma-separated seeds, one run "
                    "each (distinct integers >= 0), run as one batch.")
  flags.DEFINE_multi_string(
      "sweep", None, "Sweep a setting: NAME:V1,V2 adds a run per value to each method that "
      "has the setting (labelled and filed NAME=V), batched with its seeds. Repeat it for a grid "
      "(the product); join NAME:values by + to pair values instead (--sweep=lr:0.05,0.1+"
      "prox_mu:0,0.01). NAME: any setting of a chosen part (each says [sweep: one program] or "
      f"[sweep: a program per value]), or {', '.join(SWEEP_FIELDS)}.")
  if replay:
    flags.DEFINE_string("config", None, "A job's config.json (in its --out_dir): run that job "
                        "again exactly; flags given beside it override its values.")
  return Binding(defaults, fields, tuple(choose), settings)


HELP_GROUPS = {"data": "Data", "local": "Local training", "engine": "Rounds",
               "clock": "Simulated clock", "lognormal": "Log-normal clock profile "
               "(--system_profile=lognormal)", "asynchrony": "Asynchronous mode (--mode=async)",
               "parts": "Parts (each setting applies when its part is chosen)",
               "options": "This launcher's options", "output": "Outputs",
               "distributed": "Several hosts"}


def first_sentence(text: str) -> str:
  """`text` up to its first full stop outside parentheses (not an "e.g." or "i.e.", nor an
  ellipsis), without it.

    >>> first_sentence("A count (e.g. 3). More.")
    'A count (e.g. 3)'
  """
  depth = 0
  for i, ch in enumerate(text):
    depth += {"(": 1, ")": -1}.get(ch, 0)
    if (ch == "." and depth <= 0 and text[i + 1:i + 2] in ("", " ")
        and not text[max(0, i - 3):i].endswith(("e.g", "i.e")) and text[i - 1:i] != "."):
      return text[:i]
  return text.rstrip(".")


def _short_help(bound: Binding, doc: str) -> str:
  """The launcher's help: its docstring, then each flag `bound` declares in one line (name, the
  first sentence of its help, its default), grouped by what it configures; `--helpfull` gives
  absl's full listing."""
  groups: dict[str, list[str]] = {group: [] for group in HELP_GROUPS}
  groups["job"] = []
  owners = {flag: "parts" for flag in bound.settings}
  owners.update({PART_FLAG[kind]: "parts" for kind in bound.choices})
  owners.update({flag: section for flag, (section, _) in bound.fields.items()})
  for name in [*bound.fields, *(PART_FLAG[k] for k in bound.choices), *bound.settings, "seeds",
               "sweep", "config"]:
    if name not in FLAGS:
      continue
    flag = FLAGS[name]
    first = first_sentence(flag.help)
    default = "" if flag.default in (None, "", []) else f" (default {flag.default_as_str})"
    how = sweep_kind(bound, name) if name != "sweep" else None
    mark = "" if how is None else f" [sweep: {SWEEP_MARKS[how]}]"
    groups[owners.get(name, "job")].append(f"  --{name}: {first}{default}{mark}")
  lines = [doc.strip(), ""]
  for group, entries in groups.items():
    if entries:
      lines += [f"{HELP_GROUPS.get(group, 'The job')}:", *entries, ""]
  lines.append("--helpfull lists every flag with its whole help (absl's listing).")
  return "\n".join(lines)


# --- Reading the flags back ---------------------------------------------------------------------

def _convert(flag: str, hint, value: Any) -> Any:
  """A flag's value as the field's type (list flags of numbers parsed, naming the flag)."""
  base = _base_type(hint)
  if value is None or typing.get_origin(base) is not tuple:
    return value
  item = typing.get_args(base)[0]
  try:
    return tuple(item(v) for v in value)
  except ValueError as e:
    raise app.UsageError(f"--{flag} must be a comma-separated list of {item.__name__}s, got "
                         f"{','.join(value)}") from e


def given(flag: str) -> bool:
  """Whether `flag` was given on the command line (or in a flagfile)."""
  return flag in FLAGS and FLAGS[flag].present


def _setting_owners(bound: Binding, kind: str) -> dict[str, set[str]]:
  """{setting flag: the names of the parts of `kind` it sets} of the launcher's flags."""
  return {flag: {n for _, n, _ in owners} for flag, owners in bound.settings.items()
          if owners[0][0] == kind}


def part_settings(kind: str, name: str, cfg: cfglib.JobConfig | None = None) -> Any:
  """The settings of part `name` of `kind`: as `cfg` holds them (its parts or its methods'),
  else the registered defaults, with the setting flags given on the command line over them."""
  entry = registry.lookup(kind, name)
  base = None
  if cfg is not None:
    held = [getattr(cfg.parts, kind)] + [p for m in cfg.methods for k, p in m.parts if k == kind]
    base = next((p.settings for p in held if p is not None and p.name == name), None)
  base = base if base is not None else entry.settings()
  hints = typing.get_type_hints(entry.settings)
  values = {}
  for f in dataclasses.fields(entry.settings):
    flag = cfglib.setting_flag(name, f)
    values[f.name] = (_convert(flag, hints[f.name], FLAGS[flag].value) if given(flag)
                      else getattr(base, f.name))
  return entry.settings(**values)


def _part(bound: Binding, kind: str, base: cfglib.Part | None,
          cfg: cfglib.JobConfig) -> cfglib.Part | None:
  """The part of `kind`: the chosen one (its flag, else `base`'s) with its settings."""
  flag = PART_FLAG[kind]
  name = base.name if base is not None else NONE
  if kind in bound.choices and given(flag):
    name = FLAGS[flag].value
  if name == NONE and kind in cfglib.OPTIONAL_KINDS:
    return None
  try:
    registry.lookup(kind, name)
  except ValueError as e:
    raise app.UsageError(f"--{flag}: {e}") from e
  return cfglib.Part(name, part_settings(kind, name, cfg))


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


def sweep_targets(bound: Binding, name: str) -> tuple[str, ...] | None:
  """Where `--sweep=NAME:...` sets its values (`config.Sweep`'s targets; a setting flag shared
  by several parts targets each), or None for a name the launcher cannot sweep."""
  if name in SWEEP_FIELDS and name in bound.fields:
    return (f"{bound.fields[name][0]}.{name}",)
  owners = [o for o in bound.settings.get(name, ()) if o[0] != "dataset"]  # Data: once a seed.
  targets = tuple(f"{kind}/{part}.{field}" for kind, part, field in owners)
  if not targets or typing.get_origin(_base_type(_target_hint(bound, targets[0]))) is tuple:
    return None  # A list's values cannot be told apart by commas.
  return targets


def sweep_kind(bound: Binding, name: str) -> str | None:
  """How runs that differ in `name` share a program (`config.target_kind`), or None when
  `--sweep` cannot take it."""
  targets = sweep_targets(bound, name)
  return None if targets is None else cfglib.target_kind("|".join(targets))


def _target_hint(bound: Binding, target: str):
  """The type of the field a sweep target sets."""
  kind, owner, field = cfglib.split_target(target)
  if kind is None:
    return bound.fields[field][1] if field in bound.fields else float
  return typing.get_type_hints(registry.lookup(kind, owner).settings)[field]


def _parse(name: str, text: str, hint) -> Any:
  """One swept value as its field's type, naming the flag."""
  base = _base_type(hint)
  try:
    if base is bool:
      if text.lower() not in ("true", "false"):
        raise ValueError(text)
      return text.lower() == "true"
    if base in (int, float, str):
      return base(text)
  except ValueError as e:
    raise app.UsageError(f"--sweep={name}:...: {text!r} is not a valid --{name} (a "
                         f"{base.__name__})") from e
  raise app.UsageError(f"--sweep={name}:... cannot sweep --{name}, a {base}")


def _sweep(bound: Binding, text: str) -> cfglib.Sweep:
  """One --sweep (`NAME:V1,V2` or zipped `NAME:V1,V2+NAME2:W1,W2`) as a `Sweep` (each value is
  then checked with the config, `check_values`)."""
  names, targets, columns = [], [], []
  for piece in text.split("+"):
    name, _, values = piece.partition(":")
    found = sweep_targets(bound, name)
    if found is None or not values:
      raise app.UsageError(f"--sweep must be NAME:V1,V2,... (or NAME:...+NAME:... paired), NAME "
                           f"a setting flag of a chosen part or one of "
                           f"{', '.join(SWEEP_FIELDS)}; got {text!r} (--help marks "
                           "each part setting [sweep: ...])")
    if name in names:
      raise app.UsageError(f"--sweep={text}: {name} is given twice")
    hint = _target_hint(bound, found[0])
    names.append(name)
    targets.append("|".join(found))
    columns.append([_parse(name, v, hint) for v in values.split(",")])
  if len({len(c) for c in columns}) != 1:
    raise app.UsageError(f"--sweep={text}: paired settings need as many values each, got "
                         + ", ".join(f"{n}: {len(c)}" for n, c in zip(names, columns)))
  points = tuple(zip(*columns))
  if len(set(points)) != len(points):
    raise app.UsageError(f"--sweep={text}: values must be distinct")
  return cfglib.Sweep(tuple(names), tuple(targets), points)


def _sweeps(bound: Binding) -> tuple[cfglib.Sweep, ...]:
  """Every --sweep given, its names distinct across them."""
  sweeps = tuple(_sweep(bound, text) for text in FLAGS.sweep or ())
  names = [n for sweep in sweeps for n in sweep.names]
  twice = sorted({n for n in names if names.count(n) > 1})
  if twice:
    raise app.UsageError(f"--sweep: {', '.join(twice)} swept by more than one --sweep; pair "
                         "values with + or list them in one")
  return sweeps


def check_values(cfg: cfglib.JobConfig) -> None:
  """Every field of the sections and options within its bounds and choices and every float
  finite, naming its flag (a config file passes no flag parser); each swept value likewise."""
  groups = [getattr(cfg, s) for s in cfglib.SECTIONS]
  groups += [cfg.options] if cfg.options is not None else []
  for group in groups:
    for f in dataclasses.fields(group):
      _check_value(f.name, getattr(group, f.name), dict(f.metadata))
  for sweep in cfg.sweeps:
    for i, name in enumerate(sweep.names):
      meta = _target_meta(sweep.targets[i])
      for point in sweep.points:
        try:
          _check_value(name, point[i], meta)
        except app.UsageError as e:
          raise app.UsageError(f"--sweep={name}:...: {point[i]} is not a valid --{name} "
                               f"({e})") from e


def _target_meta(target: str) -> dict:
  """The metadata of the field a sweep target sets (its first alternative's)."""
  field = cfglib.target_field(target.split("|")[0])
  return {} if field is None else dict(field.metadata)


def _check_value(flag: str, value: Any, meta: dict) -> None:
  if isinstance(value, float) and not math.isfinite(value):
    raise app.UsageError(f"--{flag} must be a finite number, got {value}")
  problem = None if value is None else registry.value_problem(value, meta)
  if problem is not None:
    raise app.UsageError(f"--{flag} {problem}")


Resolve = Callable[[cfglib.JobConfig, frozenset], cfglib.JobConfig]


def _job_config(bound: Binding, resolve: Resolve | None = None) -> cfglib.JobConfig:
  """The job the command line describes: the given flags over `--config`'s job or the launcher's
  defaults, then `resolve(cfg, given)` (the launcher's presets, the defaults its parts need and
  its methods; `given`: the flags set on the command line, every field with `--config`), checked:
  each value (`check_values`), and each given field that has no effect in the job (set off the
  launcher's default where its option's `applies` is unmet: `config.without_effect`) refused.
  """
  base = bound.defaults
  from_file = "config" in FLAGS and FLAGS.config is not None
  if from_file:
    try:
      with open(FLAGS.config, encoding="utf-8") as f:
        text = f.read()
    except (OSError, UnicodeDecodeError) as e:
      raise app.UsageError(f"--config={FLAGS.config}: cannot be read "
                           f"({getattr(e, 'strerror', None) or e})") from e
    try:
      base = cfglib.from_json(text, FLAGS.config, type(bound.defaults.options)
                              if bound.defaults.options is not None else None)
    except ValueError as e:
      raise app.UsageError(f"--config: {e}") from e
    if base.launcher != bound.defaults.launcher:
      raise app.UsageError(f"--config={FLAGS.config} is a job of {base.launcher}, not of "
                           f"{bound.defaults.launcher}: run it with that launcher")
  cfg = base
  for flag, (section, hint) in bound.fields.items():
    if given(flag):
      cfg = cfglib.replace(cfg, f"{section}.{flag}", _convert(flag, hint, FLAGS[flag].value))
  parts = {kind: _part(bound, kind, getattr(cfg.parts, kind), cfg) for kind in registry.KINDS}
  cfg = dataclasses.replace(cfg, parts=cfglib.PartsConfig(**parts))
  if given("seeds"):
    cfg = dataclasses.replace(cfg, seeds=seeds())
  if given("sweep"):
    cfg = dataclasses.replace(cfg, sweeps=_sweeps(bound))
  explicit = {name for name in FLAGS if given(name)}
  if from_file:
    explicit |= set(bound.fields) | set(bound.settings)
  if resolve is not None:
    check_values(cfg)  # Before the launcher's own resolution computes with them.
    cfg = resolve(cfg, frozenset(explicit))
  cfg = _given_settings(bound, cfg)
  check_values(cfg)
  stray = cfglib.without_effect(cfg, bound.defaults, explicit)
  if stray:
    one = len(stray) == 1
    raise app.UsageError("; ".join(stray) + (": drop it or choose the setting it applies with"
                                             if one else ": drop them or choose the settings "
                                             "they apply with"))
  return cfg


def _given_settings(bound: Binding, cfg: cfglib.JobConfig) -> cfglib.JobConfig:
  """The setting flags given on the command line over the final parts (a preset may have chosen
  another part; the flags win over its settings). A given setting of a part that is not chosen
  is refused."""
  for kind in bound.choices:
    chosen = getattr(cfg.parts, kind)
    name = NONE if chosen is None else chosen.name
    flag = PART_FLAG[kind]
    short = name.rsplit(":", 1)[-1]  # A part registered outside, chosen as module:name.
    for setting, owners in bound.settings.items():
      if given(setting) and owners[0][0] == kind and short not in {n for _, n, _ in owners}:
        parts = sorted({n for _, n, _ in owners})
        raise app.UsageError(f"--{setting} is a setting of --{flag}={'/'.join(parts)}, not of "
                             f"--{flag}={name}: drop it or choose that {kind}")
    if chosen is not None:
      settings = part_settings(kind, chosen.name, cfg)
      cfg = dataclasses.replace(cfg, parts=dataclasses.replace(
          cfg.parts, **{kind: cfglib.Part(chosen.name, settings)}))
  return cfg


def _flag_values(bound: Binding, cfg: cfglib.JobConfig) -> dict[str, Any]:
  """The value of each of the launcher's flags that `cfg` holds."""
  values = {flag: cfglib.get(cfg, f"{section}.{flag}")
            for flag, (section, _) in bound.fields.items()}
  held = [getattr(cfg.parts, kind) for kind in registry.KINDS]
  held += [p for m in cfg.methods for _, p in m.parts]  # After the job's own: theirs first.
  for p in held:
    for f in [] if p is None else dataclasses.fields(p.settings):
      flag = cfglib.setting_flag(p.name, f)
      if flag in bound.settings:
        values.setdefault(flag, getattr(p.settings, f.name))
  for kind in bound.choices:
    chosen = getattr(cfg.parts, kind)
    values[PART_FLAG[kind]] = NONE if chosen is None else chosen.name
  values["seeds"] = cfg.seeds
  if cfg.sweeps:
    values["sweep"] = tuple("+".join(f"{n}:{','.join(str(p[i]) for p in sweep.points)}"
                                     for i, n in enumerate(sweep.names)) for sweep in cfg.sweeps)
  return values


def _flag_lines(bound: Binding, cfg: cfglib.JobConfig) -> list[str]:
  """The resolved job `cfg` as `--name=value` lines (absl's flagfile format): the job's flagfile,
  `--flagfile=<out_dir>/flags.txt` replays it (a later `--out_dir` overriding). Settings of parts
  the job does not use, and fields at None, are left out (they keep their defaults)."""
  lines = []
  for name, value in sorted(_flag_values(bound, cfg).items()):
    if name in NOT_REPLAYED or value is None:
      continue
    if name == "sweep":  # A repeated flag: one line each.
      lines += [f"--sweep={text}" for text in value]
    elif isinstance(value, bool):
      lines.append(f"--{'' if value else 'no'}{name}")
    elif isinstance(value, tuple):
      lines.append(f"--{name}={','.join(str(v) for v in value)}")
    else:
      lines.append(f"--{name}={value}")
  return lines
