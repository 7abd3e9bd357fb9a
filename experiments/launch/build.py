"""A job config turned into library objects: data, model, availability, clock, parts, simulator.

Every builder takes the typed job config (`experiments.launch.config`), never the command line;
an error is an `app.UsageError` naming the config field at fault by its flag (a field and its flag
share one name), raised before any compute:

  >>> from experiments.launch import build, config
  >>> cfg = config.updated(config.JobConfig(), num_clients=12, num_available=6,
  ...                      clients_per_round=3)
  >>> data = build.load_data(cfg, seed=0)
  >>> sim = build.simulator(cfg, data, seed=0)
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import NamedTuple

import numpy as np
import optax
from absl import app

import fedjax_sel as fs
from experiments.launch import config as cfglib
from fedjax_sel import registry
from fedjax_sel.data import federated_sqlite, sources
from fedjax_sel.data.builders import source
from fedjax_sel.data.store import STORE_FILE
from fedjax_sel.engine import checks
from fedjax_sel.data.corruption import KINDS as CORRUPTION_KINDS
from fedjax_sel.data.corruption import corrupt_clients, corruption_kinds
from fedjax_sel.models import resolve_conv_impl
from fedjax_sel.models.bundle import accepts as model_accepts

PART_FLAG = cfglib.PART_FLAG
DEFAULT_PUBLIC_FRACTION = 0.05  # A filter's public set, unless --public_fraction says otherwise.
DEFAULT_VAL_FRACTION = 0.1  # The validation split a part decides on, unless given.


# --- Parts --------------------------------------------------------------------------------------

def part_error(kind: str, name: str, error: ValueError) -> app.UsageError:
  """A part's refusal as a usage error naming the flag of the setting at fault (or the part)."""
  flag = PART_FLAG[kind]
  if isinstance(error, registry.SettingError):
    entry = registry.lookup(kind, name)
    field = next((f for f in entry.settings.__dataclass_fields__.values()
                  if f.name == error.field), None)
    if field is not None:
      space = "" if error.message.startswith("=") else " "
      return app.UsageError(f"--{cfglib.setting_flag(name, field)}{space}{error.message} "
                            f"(--{flag}={name})")
  return app.UsageError(f"--{flag}={name}: {error}")


def context(cfg: cfglib.JobConfig, data=None, model=None, profile=None,
            seed: int = 0) -> registry.BuildContext:
  """What the parts' factories read besides their settings, from the config and the run."""
  e = cfg.engine
  num_clients = cfg.data.num_clients if data is None else data.num_clients
  return registry.BuildContext(k=e.clients_per_round, rounds=e.rounds, seed=seed,
                               num_clients=num_clients, num_available=num_available(cfg),
                               data=data, model=model, profile=profile,
                               local_epochs=cfg.local.local_epochs,
                               deadline_s=cfg.clock.deadline_s or None)


def part(kind: str, chosen: cfglib.Part | None, ctx: registry.BuildContext):
  """The part `chosen` of `kind` (None for none); a refusal names the flag."""
  if chosen is None:
    return None
  try:
    return registry.build(kind, chosen.name, chosen.settings, ctx)
  except ValueError as e:
    raise part_error(kind, chosen.name, e) from e


def check_part(kind: str, chosen: cfglib.Part | None, ctx: registry.BuildContext) -> None:
  """The settings of part `chosen` of `kind`, before any data."""
  if chosen is None:
    return
  try:
    registry.check(kind, chosen.name, chosen.settings, ctx)
  except ValueError as e:
    raise part_error(kind, chosen.name, e) from e


def check_parts(run: cfglib.JobConfig) -> None:
  """Every part of a run's config, and the combinations that cannot run, before any data."""
  ctx = context(run)._replace(num_available=availability(run).num_available)
  for kind in registry.KINDS:
    check_part(kind, getattr(run.parts, kind), ctx)
  wanted = needs(run)
  if "public" in wanted and run.data.public_fraction <= 0 and not _public_text(run):
    raise app.UsageError(f"{asker(wanted['public'])} evaluates models on a public set: set "
                         "--public_fraction > 0")
  if "validation" in wanted and run.data.val_fraction <= 0:
    raise app.UsageError(f"{asker(wanted['validation'])} needs --val_fraction > 0 (each client's "
                         "held-out data)")


class Asker(NamedTuple):
  """The part of a run that asks for a requirement: its kind, the part, and the settings field
  whose value asks (None: the part always does)."""

  kind: str
  part: cfglib.Part
  field: str | None


def needs(*runs: cfglib.JobConfig) -> dict[str, Asker]:
  """What the parts of `runs` need of the run (`registry.requirements`: a public set, a
  validation split, the clock, ...), each with the first part asking for it."""
  out: dict[str, Asker] = {}
  for run in runs:
    for kind in registry.KINDS:
      p = getattr(run.parts, kind, None)
      if p is not None:
        for what, field in registry.requirements(kind, p.name, p.settings).items():
          out.setdefault(what, Asker(kind, p, field))
  return out


def asker(who: Asker) -> str:
  """The flag by which a part asks for a requirement: its setting's (`--decision_stat=val_loss`)
  or its own (`--filter=dgf`)."""
  if who.field is None:
    return f"--{PART_FLAG[who.kind]}={who.part.name}"
  field = next(f for f in dataclasses.fields(who.part.settings) if f.name == who.field)
  return f"--{cfglib.setting_flag(who.part.name, field)}={getattr(who.part.settings, who.field)}"


def check_runs(cfg: cfglib.JobConfig) -> None:
  """`check_parts` for every run of the job (each method and swept value); a swept value that a
  part refuses names --sweep."""
  methods = cfg.methods or (cfglib.Method("", ""),)
  for sweep in cfg.sweeps:
    if all(sweep.applied(m.apply(cfg), sweep.points[0]) is None for m in methods):
      owners = sorted({part for t in "|".join(sweep.targets).split("|")
                       for kind, part, _ in [cfglib.split_target(t)] if kind is not None})
      raise app.UsageError(f"--sweep={'+'.join(sweep.names)}:...: no run of the job has the "
                           f"setting (it belongs to {', '.join(owners)}): choose that part, or "
                           "sweep a setting of the job's parts")
  for _, points, run in cfg.runs():
    try:
      check_parts(run)
    except app.UsageError as e:
      if not points:
        raise
      raise app.UsageError(f"--sweep: the runs of {cfglib.points_tag(points)} are refused: "
                           f"{e}") from e


def _public_text(cfg: cfglib.JobConfig) -> bool:
  return getattr(cfg.options, "public_text", None) is not None


def part_defaults(cfg: cfglib.JobConfig, given: frozenset) -> cfglib.JobConfig:
  """What the job's parts need from the data (`needs`), unless the command line set it: a public
  set (a filter's), a validation split (FedSRC's val_loss decision, FedALIGN's val split)."""
  runs = [run for _, _, run in cfg.runs()]
  wanted = needs(*runs)
  if "public" in wanted and not _public_text(cfg):
    cfg = cfglib.updated(cfg, given, public_fraction=DEFAULT_PUBLIC_FRACTION)
  if "validation" in wanted:
    cfg = cfglib.updated(cfg, given, val_fraction=DEFAULT_VAL_FRACTION)
  if cfg.parts.dataset.name in PUBLISHED_SPLITS and set_off_default(cfg, given,
                                                                    ("test_fraction",)):
    raise app.UsageError(f"--test_fraction: --dataset={cfg.parts.dataset.name} has its published "
                         "per-client test split, which the runs use; leave --test_fraction out")
  cfg = _required(asynchronous(cfg, given), given, runs)
  if cfg.engine.mode == "async" and "clients_per_round" not in given:
    check_population(cfg, "--buffer_size")  # K is the buffer size: name the flag that set it.
  return cfg


def set_off_default(cfg: cfglib.JobConfig, given: frozenset, names) -> list[str]:
  """The flags among `names` given at a value other than their default (`--name`): a replayed
  flags.txt names every flag, most at their defaults."""
  fresh = cfglib.JobConfig()
  value = lambda c, name: getattr(getattr(c, cfglib.field_section(name)), name)
  return [f"--{name}" for name in names
          if name in given and value(cfg, name) != value(fresh, name)]


FEDSCALE = "fedscale:"  # --system_profile=fedscale:FILE reads FedScale's device capacity pickle.
PUBLISHED_SPLITS = tuple(federated_sqlite.DATASETS)  # Datasets with their own test split.


def asynchronous(cfg: cfglib.JobConfig, given: frozenset) -> cfglib.JobConfig:
  """The asynchronous mode's flags resolved: K is --buffer_size when given (one K: the selector's
  and the buffer's), C defaults to 2 K, the clock is turned on (and said) unless chosen (an
  asynchronous flag in the synchronous mode is refused with the job, `config.without_effect`)."""
  a = cfg.asynchrony
  if cfg.engine.mode == "sync":
    return cfg
  if a.buffer_size:
    k = cfg.engine.clients_per_round
    if "clients_per_round" in given and k != a.buffer_size:
      raise app.UsageError(f"--buffer_size={a.buffer_size} and --clients_per_round={k} disagree: "
                           "in --mode=async the buffer size is K; give one of them")
    cfg = cfglib.updated(cfg, clients_per_round=a.buffer_size)
  cfg = cfglib.updated(cfg, buffer_size=cfg.engine.clients_per_round)
  if not a.concurrency:
    cfg = cfglib.updated(cfg, concurrency=2 * cfg.engine.clients_per_round)
  if cfg.clock.system_profile == "none":
    if "system_profile" in given:
      raise app.UsageError("--mode=async needs --system_profile (lognormal or a file): the "
                           "clients' speeds order their updates")
    print("note: --mode=async times the clients: --system_profile=lognormal (log-normal speeds "
          "and bandwidths) is on; set --system_profile to choose others")
    cfg = cfglib.updated(cfg, system_profile="lognormal")
  return cfg


def async_spec(cfg: cfglib.JobConfig):
  """The run's `AsyncSpec` (None in the synchronous mode). Its values are checked already: each
  field's choices and range (`flag_binding.check_values`), the concurrency against K and the
  available clients (`check_population`)."""
  if cfg.engine.mode == "sync":
    return None
  a = cfg.asynchrony
  return fs.async_spec(a.concurrency, a.async_rule, a.staleness, a.staleness_a, a.staleness_b,
                       a.async_alpha, a.avail_window_s,
                       None if a.max_staleness < 0 else a.max_staleness)


def _required(cfg: cfglib.JobConfig, given: frozenset, runs) -> cfglib.JobConfig:
  """The clock or a varied availability model, turned on (and said) for a part that requires
  it (`needs`) where the command line chose none."""
  wanted = {what: who.part.name for what, who in needs(*runs).items()}
  if ("clock" in wanted and cfg.clock.system_profile == "none"
      and "system_profile" not in given):
    print(f"note: {wanted['clock']} times the clients: --system_profile=lognormal (log-normal "
          "speeds and bandwidths) is on; set --system_profile to choose others")
    cfg = cfglib.updated(cfg, given, system_profile="lognormal")
  avail = cfg.parts.availability
  chosen = "availability" in given or any(
      registry.setting_flag(avail.name, f) in given for f in dataclasses.fields(avail.settings))
  default = cfglib.JobConfig().parts.availability.name
  if "availability" in wanted and avail.name == default and not chosen:
    print(f"note: {wanted['availability']} reads when each client is available: "
          f"--availability={cfglib.VARIED_AVAILABILITY} (each client available around its own "
          "local noon) is on; set --availability to choose another model")
    cfg = cfglib.updated(cfg, given, availability=cfglib.VARIED_AVAILABILITY)
  return cfg


def priority_mask(cfg: cfglib.JobConfig, n: int, label_hist, seed: int) -> np.ndarray:
  """The priority clients among `n` of the part that requires them (FedALIGN's rule: its
  settings' `priority(context)`; errors name the flag)."""
  who = needs(cfg)["priority"]
  data = None if label_hist is None else _Hist(label_hist)
  ctx = context(cfg, seed=seed)._replace(num_clients=n, data=data)
  try:
    return who.part.settings.priority(ctx)
  except ValueError as e:
    raise part_error(who.kind, who.part.name, e) from e


class _Hist(NamedTuple):
  """The label histogram a priority draw reads, where a launcher has no dataset object."""

  label_hist: np.ndarray


# --- Population: counts, availability, clock ----------------------------------------------------

def num_available(cfg: cfglib.JobConfig) -> int:
  """The most clients available at once: the n of a model whose settings fix it (the uniform
  model's; N for 0), else N (the others' capacity is checked with the model,
  `check_population`)."""
  n = getattr(cfg.parts.availability.settings, "num_available", 0)
  return n or cfg.data.num_clients


def store_clients(cfg: cfglib.JobConfig, given: frozenset) -> cfglib.JobConfig:
  """With --store_dir, N is the store's (refused where --num_clients says otherwise); a store
  that does not add up is refused here, naming the file."""
  if cfg.data.store_dir is None:
    return cfg
  n = _store_size(cfg.data.store_dir)  # Its description only: the data are opened to load them.
  if n is None or ("num_clients" in given and cfg.data.num_clients != n):
    n = open_data_store(cfg).num_clients  # A store that does not add up is refused first.
  if "num_clients" in given and cfg.data.num_clients != n:
    raise app.UsageError(f"--num_clients={cfg.data.num_clients} but "
                         f"--store_dir={cfg.data.store_dir} holds {n} clients")
  return cfglib.updated(cfg, num_clients=n)


def _store_size(folder: str) -> int | None:
  """The clients a store's description says it holds (None where it cannot be read)."""
  try:
    with open(os.path.join(folder, STORE_FILE), encoding="utf-8") as f:
      return int(json.load(f)["num_clients"])
  except (OSError, ValueError, KeyError, TypeError):
    return None


def open_data_store(cfg: cfglib.JobConfig) -> fs.FederatedDataset:
  """The memory-mapped client store of --store_dir (its errors naming the flag and file)."""
  from fedjax_sel.data.store import open_store  # pylint: disable=import-outside-toplevel
  try:
    return open_store(cfg.data.store_dir)
  except (FileNotFoundError, ValueError) as e:
    raise app.UsageError(f"--store_dir={cfg.data.store_dir}: {e}") from e


K_FLAG = "--clients_per_round"


def check_counts(cfg: cfglib.JobConfig, k_flag: str = K_FLAG) -> None:
  """K <= n <= N (n: the uniform model's --num_available; the other models vary it); `k_flag`:
  the flag that set K."""
  k, n, total = cfg.engine.clients_per_round, num_available(cfg), cfg.data.num_clients
  if not k <= n <= total:
    raise app.UsageError(f"need {k_flag} <= --num_available <= --num_clients, got "
                         f"{k}, {n}, {total}")


def availability(cfg: cfglib.JobConfig) -> fs.Availability:
  """The availability model (`fedjax_sel.parts.availability`, by its registered name), errors
  naming the flag or file."""
  return part("availability", cfg.parts.availability, context(cfg))


def system_profile(cfg: cfglib.JobConfig):
  """The clients' speeds and bandwidths (`system.SystemProfile`, None for none), errors naming
  the flag or file."""
  from fedjax_sel.client import system  # pylint: disable=import-outside-toplevel
  e = cfg.clock
  try:
    if e.system_profile == "none":
      if e.deadline_s:
        raise ValueError("--deadline_s needs --system_profile (the clients' speeds)")
      return None
    if e.system_profile == "lognormal":
      return system.lognormal_profiles(cfg.data.num_clients, 0,
                                       **dataclasses.asdict(cfg.lognormal))
    fedscale = e.system_profile.startswith(FEDSCALE)
    path = e.system_profile.removeprefix(FEDSCALE)
    if not os.path.isfile(path):
      raise ValueError(f"{path}: no such file (accepted: none, lognormal, a CSV file "
                       "client,speed,bandwidth, or fedscale:FILE, FedScale's "
                       "client_device_capacity)")
    if fedscale:
      return system.fedscale_profile(path, cfg.data.num_clients)
    return system.read_profiles(path, cfg.data.num_clients)
  except ValueError as err:
    raise app.UsageError(f"--system_profile={e.system_profile}: {err}") from err


def check_population(cfg: cfglib.JobConfig, k_flag: str = K_FLAG) -> None:
  """Counts, availability, clock and server optimizer, before any data; `k_flag`: the flag that
  set K (the asynchronous mode's --buffer_size, `asynchronous`)."""
  check_counts(cfg, k_flag)
  system_profile(cfg)
  server_optimizer(cfg)
  available = availability(cfg).num_available
  k, concurrency = cfg.engine.clients_per_round, cfg.asynchrony.concurrency
  if available < k:
    raise app.UsageError(f"--availability={cfg.parts.availability.name} makes at most {available} "
                         f"clients available at once, fewer than {k_flag}={k}; raise "
                         "--avail_capacity or lower K")
  if cfg.engine.mode == "async" and not k <= concurrency <= available:
    raise app.UsageError(f"--concurrency={concurrency} (C; twice K where not given) must be in "
                         f"{k}..{available} (the buffer size K up to the clients available at "
                         "once)")


def server_optimizer(cfg: cfglib.JobConfig):
  """The server optimizer (None for none); bad values name the flag."""
  return part("server_optimizer", cfg.parts.server_optimizer, context(cfg))


# --- Data ---------------------------------------------------------------------------------------

def check_corruption(cfg: cfglib.JobConfig) -> tuple[str, ...]:
  """The --corrupt_kinds, checked."""
  kinds = tuple(cfg.data.corrupt_kinds)
  bad = [k for k in kinds if k not in CORRUPTION_KINDS]
  if bad or not kinds:
    raise app.UsageError(f"--corrupt_kinds must list values among {CORRUPTION_KINDS}, got "
                         f"{','.join(kinds)}")
  return kinds


def dataset_spec(cfg: cfglib.JobConfig, **overrides) -> fs.DatasetSpec:
  """The `DatasetSpec` of the data config and the chosen dataset's settings (the spec's fields of
  the settings' flag names), with launcher-specific fields in `overrides`."""
  d, chosen = cfg.data, cfg.parts.dataset
  own = {cfglib.setting_flag(chosen.name, f): getattr(chosen.settings, f.name)
         for f in dataclasses.fields(chosen.settings)}
  own = {k: v for k, v in own.items() if k in fs.DatasetSpec._fields}
  spec = fs.DatasetSpec(
      name=chosen.name, num_clients=d.num_clients, partition=d.partition,
      alpha=d.dirichlet_alpha, classes_per_client=d.classes_per_client,
      dominant_fraction=d.dominant_fraction, shards_per_client=d.shards_per_client,
      size_skew=d.size_skew, val_fraction=d.val_fraction,
      test_fraction=d.test_fraction, public_fraction=d.public_fraction,
      max_examples=d.max_examples, **own)
  return spec._replace(**overrides)


def load_data(cfg: cfglib.JobConfig, seed: int, hint: str = "",
              **overrides) -> fs.FederatedDataset:
  """The dataset, data errors as usage errors naming the flags (before any training); `hint` is
  added to the message of missing data (e.g. how a preset's data are prepared)."""
  if cfg.data.store_dir is not None:
    return open_data_store(cfg)
  spec = dataset_spec(cfg, **overrides)
  if spec.name == "fashion_mnist" and not os.path.isdir(spec.data_dir):
    raise app.UsageError(f"--data_dir={spec.data_dir} does not exist; install the Debian "
                         "package dataset-fashion-mnist or point --data_dir at IDX files")
  where = f"--dataset={spec.name} --num_clients={spec.num_clients}"
  if not source(spec, seed).federated:
    where += f" --partition={spec.partition}"
  if spec.public_fraction:
    where += f" --public_fraction={spec.public_fraction} (the server's share)"
  try:
    data = fs.build_dataset(spec, seed)
  except FileNotFoundError as e:
    hint = "" if hint[-40:] in str(e) else hint  # The loader's message may say it already.
    raise app.UsageError(f"{where}: {e}. {hint}".strip()) from e
  except ValueError as e:
    if str(e).startswith("public_text="):  # The flag's own problem, not the dataset's.
      raise app.UsageError(f"--{e}") from e
    raise app.UsageError(f"{where}: {e}") from e
  empty = int((data.train.counts == 0).sum())
  if empty:
    raise app.UsageError(f"{where}: {empty} clients get no training example; lower "
                         "--num_clients or --test_fraction / --val_fraction / --public_fraction")
  if spec.test_fraction > 0 and data.test.counts.sum() == 0:
    raise app.UsageError(f"{where}: clients are too small for a test split at "
                         f"--test_fraction={spec.test_fraction}; lower --num_clients")
  return data


def corrupt(cfg: cfglib.JobConfig, data, seed: int):
  """(data with --corrupt_fraction of the clients corrupted, `[N]` bool bad mask, `[N]` kinds)."""
  kinds = check_corruption(cfg)
  share = cfg.data.corrupt_fraction
  bad_data, bad = corrupt_clients(data, share, kinds, seed=seed + 100)
  if bad.all():
    raise app.UsageError(f"--corrupt_fraction={share} corrupts all {data.num_clients} clients: the "
                         "clean_* metrics score the uncorrupted clients and none would be left; "
                         "give a share that leaves at least one client clean")
  return bad_data, bad, corruption_kinds(data.num_clients, share, kinds, seed=seed + 100)


# --- Model and local training -------------------------------------------------------------------

def model_for(cfg: cfglib.JobConfig, data: fs.FederatedDataset) -> fs.Model:
  """The chosen model for `data`'s inputs (a model that does not fit them is refused)."""
  chosen = cfg.parts.model
  # Token windows: 1-D rows of vocabulary indices labelled over the vocabulary (LEAF's and
  # fedjax's characters, Stack Overflow's words).
  text = len(data.feature_shape) == 1 and (
      data.num_classes in (sources.VOCAB_SIZE, federated_sqlite.SHAKESPEARE_VOCAB)
      or data.name == "stackoverflow_nwp")
  if chosen.name in fs.MODELS and not model_accepts(chosen.name, data.feature_shape, text):
    kind = "token windows" if text else f"features of shape {data.feature_shape}"
    source = (f"--store_dir={cfg.data.store_dir} (dataset {data.name})" if cfg.data.store_dir
              else f"--dataset={cfg.parts.dataset.name}")
    raise app.UsageError(f"--model={chosen.name} does not fit {source} ({kind}); accepted: "
                         + ", ".join(
                             n for n in fs.MODELS if model_accepts(n, data.feature_shape, text)))
  impl = getattr(chosen.settings, "conv_impl", None)
  if impl is not None:
    try:
      resolve_conv_impl(impl)
    except ValueError as e:
      raise app.UsageError(f"--conv_impl={impl}: {e}") from e
  return part("model", chosen, context(cfg, data))


def optimizer(cfg: cfglib.JobConfig):
  """lr -> optax SGD with optional momentum and decoupled weight decay."""
  momentum = cfg.local.momentum or None
  wd = cfg.local.weight_decay

  def make(lr):
    sgd = optax.sgd(lr, momentum=momentum)
    return optax.chain(optax.add_decayed_weights(wd), sgd) if wd else sgd

  return make


def local_hparams(cfg: cfglib.JobConfig) -> fs.LocalHParams:
  loc = cfg.local
  return fs.LocalHParams(batch_size=loc.batch_size, num_epochs=loc.local_epochs,
                         num_steps=loc.local_steps, prox_mu=loc.prox_mu,
                         chunk_size=loc.chunk_size, micro_batch=loc.micro_batch)


def lr_schedule(cfg: cfglib.JobConfig):
  return fs.step_decay_lr(cfg.local.lr, cfg.local.lr_decay, cfg.local.lr_decay_every)


# --- The simulator ------------------------------------------------------------------------------

def engine_options(cfg: cfglib.JobConfig) -> dict:
  """The engine config as `Simulator` arguments."""
  e = cfg.engine
  return {"nonfinite": e.nonfinite, "store": e.store, "server_optimizer": server_optimizer(cfg),
          "system_profile": system_profile(cfg), "deadline_s": cfg.clock.deadline_s or None,
          "asynchrony": async_spec(cfg)}


class OwnParts(NamedTuple):
  """Parts a launcher builds from its own options rather than from the config's registered parts
  (FedALIGN: its participation mode's availability, selector and K, its method's rule); None
  leaves the config's."""

  availability: fs.Availability | None = None
  selector: fs.Selector | None = None
  rule: fs.Participation | None = None
  clients_per_round: int | None = None


def simulator(run: cfglib.JobConfig, data: fs.FederatedDataset, seed: int, *, model=None,
              capacity=None, eval_mask=None, own: OwnParts = OwnParts()) -> fs.RunSpec:
  """The built run (`fs.build_run`: checked, nothing uploaded) of one run: its config's model,
  local training, availability and parts on `data` (those of `own` in their place), padded to
  `capacity` (the job's runs then share one compiled round), the clean metrics scoring the
  clients of `eval_mask` (`[N]` bool; None: every client)."""
  model = model if model is not None else model_for(run, data)
  options = {**engine_options(run), "capacity": capacity}
  profile = options["system_profile"]
  p = run.parts
  ctx = context(run, data, model, profile, seed)
  pick = lambda given, make: given if given is not None else make()
  spec = fs.build_run(
      model=model, data=data, optimizer=optimizer(run), local=local_hparams(run),
      clients_per_round=pick(own.clients_per_round, lambda: run.engine.clients_per_round),
      seed=seed, lr_schedule=lr_schedule(run), eval_mask=eval_mask,
      selector=pick(own.selector, lambda: part("selector", p.selector, ctx)),
      aggregator=part("aggregator", p.aggregator, ctx),
      filter=part("filter", p.filter, ctx),
      participation=pick(own.rule, lambda: part("rule", p.rule, ctx)),
      availability=pick(own.availability, lambda: availability(run)), **options)
  try:  # The asynchronous clock over --rounds, before anything compiles.
    checks.check_clock(spec, run.engine.rounds)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  return spec
