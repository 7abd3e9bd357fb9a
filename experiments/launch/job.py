"""The host side of a job: its folder, provenance and manifest, and running its runs.

A launcher's entry path (`cli`) builds its `JobConfig` (`flag_binding`) and hands the launcher a
`Job`: `job.start()` checks and locks the output folder and writes `flags.txt`, `config.json` and
`run_info.json`; `job.run_groups(...)` builds a `Run` per (method, swept value, seed) and advances
each method's runs as one batch (`Job.run_all`); the job's manifest and its stopped runs live on
the `Job`, not in this module. Nothing here reads the command line.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from absl import app

import fedjax_sel as fs
from experiments.launch import config as cfglib
from fedjax_sel.data.integrity import DataError
from fedjax_sel.engine.cohort import training_layout
from fedjax_sel.engine.description import program_key
from fedjax_sel.engine.training import training_key
from fedjax_sel.host import folder_lock, side_by_side
from fedjax_sel.host.checkpoint import ABSENT, DEFAULTS, CheckpointError, WriteError, write_atomic
from fedjax_sel.host.checkpoint import previous as checkpoint_previous
from fedjax_sel.host.runner import CHECKPOINT_FILE, NonFiniteError, OneRun
from fedjax_sel.models import CONV_MODELS, resolve_conv_impl

FLAGFILE = "flags.txt"
CONFIG_FILE = "config.json"
RUN_INFO_FILE = "run_info.json"
JOB_FILE = "job.json"
# Fingerprint entries that are not fields (a field's is its flag), by what sets them.
FINGERPRINT_NAMES = {"seed": "--seeds",
                     "data": "the data (--dataset and its flags)",
                     "param_shapes": "the model's shapes (--model and its flags)",
                     "library": "the fedjax_sel version", "parts": "the method's parts",
                     "lr_schedule": "the learning-rate schedule (--lr, --lr_decay)",
                     "availability_draws": "availability (--availability and its flags)",
                     "part_selector": "--selector", "part_filter": "--filter",
                     "part_rule": "--rule", "part_aggregator": "--aggregator",
                     "part_server_optimizer": "--server_opt",
                     "part_availability": "--availability", "part_dataset": "--dataset",
                     "part_model": "--model"}
# Entries that follow from the flags (a changed flag changes them too).
DERIVED = ("data", "param_shapes", "parts", "lr_schedule", "availability_draws")


class Run(NamedTuple):
  """One run of a job: its built run (`fs.RunSpec`), folder under the job's out_dir, method (its
  group and method label, e.g. "scenario1 Random"), seed, swept value's tag ("NAME=V" or ""),
  optional per-round `extra(state, record) -> dict`, its fingerprint settings
  (`settings(cfg)`) and its swept values by flag."""

  spec: fs.RunSpec
  path: tuple[str, ...]
  method: str
  seed: int
  tag: str = ""
  extra: Callable | None = None
  settings: dict | None = None
  swept: dict | None = None

  @property
  def label(self) -> str:
    """Its progress label, "<method> s<seed> <tag> " (a grid's tags space-separated)."""
    parts = (self.method, f"s{self.seed}", self.tag.replace("/", " "))
    return " ".join(p for p in parts if p) + " "


def settings(run: cfglib.JobConfig) -> dict:
  """A run's fingerprint settings: its config's (`config.fingerprint`), with `conv_impl=auto`
  replaced by what it stood for on this machine (lowerings round differently)."""
  out = cfglib.fingerprint(run)
  if out.get("part_model") in CONV_MODELS and out.get("conv_impl") == "auto":
    out["conv_impl"] = resolve_conv_impl("auto")
  out[DEFAULTS] = cfglib.fingerprint_defaults(run)
  return out


def writer() -> bool:
  """Whether this process writes files (process 0 of a multi-host run, or the only one)."""
  import jax  # pylint: disable=import-outside-toplevel
  return jax.process_index() == 0


def write_text(path: str, text: str) -> None:
  """Writes `text` to `path` atomically."""
  write_atomic(path, text.encode("utf-8"))


def check_out_dir(out: cfglib.OutputConfig) -> None:
  """--out_dir must be a writable folder; one holding a run needs --resume or --overwrite."""
  folder = out.out_dir
  if os.path.exists(folder) and not os.path.isdir(folder):
    raise app.UsageError(f"--out_dir={folder} is a file, not a folder")
  parent = folder if os.path.isdir(folder) else os.path.dirname(os.path.abspath(folder))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise app.UsageError(f"--out_dir={folder}: {parent} is a file, not a folder")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise app.UsageError(f"--out_dir={folder}: {parent} is not writable")
  if os.path.isdir(folder) and not (out.resume or out.overwrite):
    for root, _, files in os.walk(folder):
      if "metrics.jsonl" in files:
        raise app.UsageError(f"--out_dir={folder} holds a previous run ({root}/metrics.jsonl): "
                             "pass --resume to continue it or --overwrite to replace it")


def start(cfg: cfglib.JobConfig, flag_lines: list[str]) -> None:
  """Checks and locks the job's folder and writes its provenance (process 0): `flags.txt` (a
  flagfile replaying the job), `config.json` (the resolved config: `--config` replays it) and
  `run_info.json` (the command line, the time, the library, JAX and device versions, the host,
  what `--conv_impl` resolved to for a convolutional model (also printed); with --resume, the
  earlier starts under `earlier`)."""
  check_out_dir(cfg.output)
  if not writer():
    return
  out = cfg.output.out_dir
  try:
    folder_lock.hold(out)
  except folder_lock.FolderInUse as e:
    raise app.UsageError(f"--out_dir: {e}") from e
  nearby = folder_lock.in_use_nearby(out)
  if nearby is not None:  # Nested job folders would mix their runs.
    folder_lock.release(out)
    raise app.UsageError(f"--out_dir={out}: {nearby}, "
                         f"{'inside' if nearby.startswith(os.path.realpath(out)) else 'around'} "
                         "it, is in use by another job; wait for it or write to another folder")
  import flax  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel
  os.makedirs(out, exist_ok=True)
  write_text(os.path.join(out, FLAGFILE), "\n".join(flag_lines) + "\n")
  write_text(os.path.join(out, CONFIG_FILE), cfglib.to_json(cfg))
  info = {"launcher": cfg.launcher, "command": [sys.executable, *sys.argv],
          "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
          "host": socket.gethostname(),
          "versions": {"fedjax_sel": fs.__version__, "jax": jax.__version__,
                       "jaxlib": getattr(jax.lib, "__version__", None) or jax.__version__,
                       "flax": flax.__version__, "optax": optax.__version__,
                       "numpy": np.__version__, "python": sys.version.split()[0]},
          "devices": [f"{d.platform}:{d.device_kind}" for d in jax.devices()],
          "processes": jax.process_count()}
  impl = getattr(cfg.parts.model.settings, "conv_impl", None)
  if cfg.parts.model.name in CONV_MODELS and impl is not None:
    # What "auto" stood for on this machine (an explicit impl is checked with the model).
    info["conv_impl"] = resolve_conv_impl(impl) if impl == "auto" else impl
    print(f"convolutions: --conv_impl={impl} -> {info['conv_impl']}", flush=True)
  path = os.path.join(out, RUN_INFO_FILE)
  earlier = _earlier_starts(path) if cfg.output.resume else []
  if earlier:  # A resumed job keeps how it was started, and every resume before.
    info["earlier"] = earlier
  write_text(path, json.dumps(info, indent=1) + "\n")


def _earlier_starts(path: str) -> list[dict]:
  """The starts a job folder's run_info.json records: the last one and those before it."""
  try:
    with open(path, encoding="utf-8") as f:
      last = json.load(f)
  except (OSError, ValueError):
    return []
  return [*last.pop("earlier", []), last] if isinstance(last, dict) else []


@contextlib.contextmanager
def trackers(cfg: cfglib.JobConfig, runs: list[Run], folders: list[str]):
  """With --tensorboard and / or --wandb, the writers of each run folder (process 0 only): yields
  one callback per run that hands a record to each of its writers (or None), closes them after."""
  out = cfg.output
  if not (out.tensorboard or out.wandb) or not writer():
    yield None
    return
  from fedjax_sel.host import tracking  # pylint: disable=import-outside-toplevel
  writers = [[] for _ in folders]
  try:
    for run, folder, own in zip(runs, folders, writers):
      if out.tensorboard:
        own.append(_tracker("--tensorboard", lambda f=folder: tracking.TensorBoardWriter(f)))
      if out.wandb:
        own.append(_tracker("--wandb", lambda r=run, f=folder: tracking.WandbWriter(
            f, r.label.strip(), {**(r.settings or {}), "seed": r.seed}, out.wandb_project,
            out.wandb_mode)))
    yield [_fan_out(own) for own in writers]
  finally:
    for w in (w for own in writers for w in own):
      w.close()


def _fan_out(writers: list) -> Callable[[dict], None]:
  def write(record: dict) -> None:
    for w in writers:
      w.write(record)
  return write


def _tracker(flag: str, make: Callable):
  try:
    return make()
  except ImportError as e:
    raise app.UsageError(f"{flag}: {e}") from e


def _entry_name(key: str) -> str:
  """A fingerprint entry as the command line knows it: its flag, or what sets it, with the path
  of a nested value ("the method's parts (selector.d)")."""
  top, _, rest = key.partition(".")
  name = FINGERPRINT_NAMES.get(top, f"--{top}")
  return f"{name} ({rest})" if rest else name


def _entry_value(value) -> str:
  return "absent" if isinstance(value, str) and value == ABSENT else repr(value)


def failure(error: Exception) -> str:
  """An error's message for the command line: a refused resume names the flags that changed,
  each with its old and new value (the entries that follow from flags, `DERIVED`, only where
  no flag changed: data on disk, a part's spec)."""
  changed = getattr(error, "changed", ())
  if not changed:
    return str(error)
  named = [c for c in changed if c[0].partition(".")[0] not in DERIVED]
  return ("--resume refused: the run was started with other settings (checkpoint -> now): "
          + "; ".join(f"{_entry_name(k)}: {_entry_value(a)} -> {_entry_value(b)}"
                      for k, a, b in named or changed)
          + ". Rerun with the flags it was started with, or start afresh with --overwrite")


def shared_training(methods: list[list[Run]]) -> list[bool]:
  """Per method (its runs), whether its rounds train as another method's do while their rounds
  differ: those run their rounds as three programs (`fs.RunBatch`'s stages) and compile the
  training once; a method that trains alone keeps its round in one program."""
  keys = [{((training_key(r.spec.config), training_layout(r.spec.config)),
            program_key(r.spec.config)) for r in runs} for runs in methods]
  rounds = collections.defaultdict(set)
  for method in keys:
    for train, whole in method:
      rounds[train].add(whole)
  return [any(len(rounds[train]) > 1 for train, _ in method) for method in keys]


class Batch(NamedTuple):
  """Runs advanced together: their positions among a method's runs and what advances them (a
  `RunBatch`, or a `OneRun` for a run alone)."""

  indices: list[int]
  runner: fs.RunBatch | OneRun


class Plan(NamedTuple):
  """A method's batches (`Job.plan`) and what to say when they start (None: nothing)."""

  batches: list[Batch]
  note: str | None


def preload(batches: list[Batch]) -> threading.Thread | None:
  """Reads the batches' stored programs on another thread (`RunBatch.preload`), so that XLA's
  loading overlaps the rounds running before them (a warm main job: 0.2 s of FilFL's round).
  Their initial states are made here (a program not compiled yet compiles on this thread, once).
  None when there are no batches."""
  if not batches:
    return None
  states = [b.runner.init() for b in batches]
  thread = threading.Thread(target=lambda: [b.runner.preload(s) for b, s in zip(batches, states)],
                            daemon=True, name="preload")
  thread.start()
  return thread


def concurrent_batches(cfg: cfglib.JobConfig) -> int:
  """How many batches of runs `Job.run_groups` advances at once: --concurrent_batches, or for 0
  (auto) `side_by_side.default_workers()` (2 in a single-device CPU process with two or more
  cores, else 1); 1 with --wandb (a W&B run is a process-wide one; the flag is refused beside
  it): the main job warm 3.8-4.1 -> 3.0-3.1 s on 2 cores, records unchanged (cold, where XLA
  compiles on both cores, 11.6-14.7 -> 11.0-12.9 s)."""
  if cfg.output.wandb:
    return 1
  return cfg.engine.concurrent_batches or side_by_side.default_workers()


def _parts(group: list[int], count: int) -> list[list[int]]:
  """`group` cut into `count` equal consecutive parts when it holds a multiple of `count` runs,
  two or more each (parts of one shape: one compiled program); else whole."""
  if count < 2 or len(group) % count or len(group) < 2 * count:
    return [group]
  size = len(group) // count
  return [group[k:k + size] for k in range(0, len(group), size)]


def _run_batch(cfg: cfglib.JobConfig, batch: fs.RunBatch | OneRun, runs: list[Run],
               folders: list[str], stop: threading.Event | None = None
               ) -> tuple[list[list[dict]], list[str | None]]:
  """`runs` advanced together by `batch`: (each run's records, why each stopped or None);
  `stop`: `fs.run_batch`'s."""
  out = cfg.output
  common = dict(eval_every=cfg.engine.eval_every, checkpoint_every=out.checkpoint_every,
                resume=out.resume, overwrite=out.overwrite, log_every=out.log_every)
  label = os.path.commonprefix([r.label for r in runs]).rsplit(" ", 1)[0].strip()
  label = runs[0].label if len(runs) == 1 else (f"{label} ({len(runs)} runs) " if label else
                                                f"({len(runs)} runs) ")
  try:
    with _exit_on_failure(label), trackers(cfg, runs, folders) as on_records:
      return (fs.run_batch(batch, cfg.engine.rounds, folders, label=label,
                           settings=[r.settings for r in runs], extras=[r.extra for r in runs],
                           on_records=on_records, stop=stop, **common), [None] * len(runs))
  except NonFiniteError as e:
    return e.records, [e.stopped.get(i) for i in range(len(runs))]


def _holds_checkpoint(folder: str) -> bool:
  path = os.path.join(folder, CHECKPOINT_FILE)
  return os.path.exists(path) or os.path.exists(checkpoint_previous(path))


def _structural(cfg: cfglib.JobConfig) -> str:
  """The swept flags of `cfg` that compile a program per value, as "--a, --b"."""
  return ", ".join(f"--{name}" for sweep in cfg.sweeps
                   for name, target in zip(sweep.names, sweep.targets)
                   if cfglib.target_kind(target) == "structural")


class RunSpec(NamedTuple):
  """One run to build: its group of runs, method, run config (the method's parts and the swept
  values in place), seed, swept points' tag ("NAME=V", "A=1/B=2" or ""), its data (what the
  launcher's `load` returned for this seed and group, the dataset first) and the `Capacity` its
  group pads to."""

  group: str
  method: cfglib.Method
  run: cfglib.JobConfig
  seed: int
  tag: str
  data: tuple
  capacity: fs.Capacity

  @property
  def name(self) -> str:
    """The method's label, then " NAME=V": the key of its results."""
    return f"{self.method.label} {self.tag.replace('/', ' ')}".strip()

  @property
  def path(self) -> tuple[str, ...]:
    """The run's folder under the job's: `<group>/<method key>/<NAME=V>/.../seed<s>` (a level per
    `--sweep`), empty levels left out."""
    return tuple(p for p in (self.group, self.method.key, self.tag, f"seed{self.seed}") if p)


BuildRun = Callable[[RunSpec], tuple[fs.RunSpec, Callable | None]]
Load = Callable[[int, str], tuple]


class Job:
  """One job: its config, its flagfile lines, the runs its manifest (`<out_dir>/job.json`) records
  and why any of them stopped. The launchers' entry path (`cli.launcher_main`) makes it, the
  launcher's `execute(job)` starts and runs it, and `finish` ends it."""

  def __init__(self, cfg: cfglib.JobConfig, flag_lines: list[str]):
    self.cfg = cfg
    self.flag_lines = flag_lines
    fs.use_fast_compile(cfg.output.fast_compile)  # Before the job's first program.
    self.manifest: list[dict] = []  # Per run: launcher, label, method, seed, sweep, folder.
    self.stopped: list[str] = []  # "<label>: why" of each run that stopped.
    self._lock = threading.Lock()  # The manifest and `stopped`, written by methods' threads.

  @property
  def writes(self) -> bool:
    """Whether this process writes the job's files (`writer`)."""
    return writer()

  def start(self) -> None:
    """Checks and locks the job's folder and writes its provenance (`start`)."""
    start(self.cfg, self.flag_lines)

  def record_runs(self, runs: list[Run]) -> None:
    """Adds `runs` to the job's manifest, `<out_dir>/job.json`: per run its launcher, label,
    method (without seed and swept value), seed, swept value and folder (relative to the
    out_dir)."""
    for r in runs:
      self.manifest.append({"launcher": self.cfg.launcher, "label": r.label.strip(),
                            "method": r.method, "seed": r.seed,
                            "sweep": r.tag.replace("/", " ") or None, "swept": r.swept or None,
                            "folder": os.path.join(*r.path)})
    self._write_manifest()

  def _write_manifest(self) -> None:
    """`job.json` as this process has recorded the job's runs (process 0 writes it)."""
    if writer():
      out = self.cfg.output.out_dir
      os.makedirs(out, exist_ok=True)
      write_text(os.path.join(out, JOB_FILE), json.dumps({"runs": self.manifest}, indent=1) + "\n")

  def _mark_stopped(self, position: int, label: str, message: str) -> None:
    """Marks the job's run at `position` stopped in job.json and remembers it for `finish`."""
    with self._lock:
      self.manifest[position]["stopped"] = message
      self.stopped.append(f"{label}: {message}")
      print(f"run {label} stopped: {message}", flush=True)
      self._write_manifest()

  def finish(self) -> None:
    """Exits with status 1 naming the runs that stopped (after the launcher wrote its summary and
    figures of what finished)."""
    if self.stopped:
      sys.exit("error: " + "; ".join(self.stopped) + ". The other runs finished; the summary "
               "holds every run's rounds up to where it stopped (job.json marks the stopped runs)")

  def run_all(self, runs: list[Run], stages: bool = False, plan: Plan | None = None,
              workers: int = 1) -> list[list[dict]]:
    """Runs a method's runs for --rounds, each keeping its own folder, metrics, checkpoint and
    resume: with --batch_runs and the device store as one `RunBatch` (one compiled call per
    round for all of them), else one after another; with --resume, runs added to the job (a
    seed, a swept value) start as a batch of their own while the others resume. A run that
    diverges stops alone: the others finish, its records so far are returned and it is marked
    stopped in job.json (`finish` then exits 1 after the launcher's summary). A refused resume or
    a foreign checkpoint exits with the message (status 1). `stages`: their rounds as three
    programs (`plan`); `plan`: their batches when planned before (`run_groups` plans the next
    method's while these run); `workers` > 1: the runs cut into that many equal batches where
    they divide (`_parts`), advanced at once on threads (`concurrent_batches`)."""
    done = self.announce(runs)
    if plan is None:  # A plan made ahead was preloaded whole (`run_groups`).
      plan = self.plan(runs, stages, parts=workers)
      if workers == 1:
        preload(plan.batches[1:])
    return self._advance(runs, done, plan, workers=workers)

  def announce(self, runs: list[Run]) -> int:
    """Records `runs` in the manifest and says which of the job's runs they are; returns how
    many runs the job held before them."""
    self.record_runs(runs)
    done = len(self.manifest) - len(runs)
    each = ", ".join(r.label[len(r.method):].strip() for r in runs)  # "s0 lr=0.05, s1 ..."
    print(f"-- runs {done + 1}-{done + len(runs)} of the job: {runs[0].method}: {each}",
          flush=True)
    return done

  def _advance(self, runs: list[Run], done: int, plan: Plan,
               stop: threading.Event | None = None, workers: int = 1) -> list[list[dict]]:
    """`run_all`'s rounds: the runs (the job's from `done` on) advanced by `plan`'s batches, one
    after another or `workers` at once on threads (`side_by_side.on_threads`); `stop`:
    `fs.run_batch`'s."""
    if plan.note:
      print(plan.note, flush=True)
    results = {}

    def advance(batch: Batch) -> None:
      records = _run_batch(self.cfg, batch.runner, [runs[i] for i in batch.indices],
                           [self.folder(runs[i]) for i in batch.indices], stop)
      for i, recs, stopped in zip(batch.indices, *records):
        results[i] = recs
        if stopped:
          self._mark_stopped(done + i, runs[i].label.strip(), stopped)

    if workers > 1 and len(plan.batches) > 1:
      print(f"-- {min(workers, len(plan.batches))} batches at a time (--concurrent_batches)",
            flush=True)
      stop = stop or threading.Event()
      side_by_side.on_threads(plan.batches, advance, workers, stop)
    else:
      for batch in plan.batches:
        advance(batch)
    return [results[i] for i in range(len(runs))]

  def _at_once(self, methods: list[list[Run]], stages: list[bool], workers: int
               ) -> list[list[list[dict]]]:
    """Each method's runs as `run_all` runs them, `workers` methods at a time on threads of
    their own (`side_by_side.on_threads`: a failure or Ctrl-C stops the others before their
    next round), started in order as threads free up and planned there (at most `workers`
    methods' data placed at once); every method is recorded in the manifest first, in order."""
    dones = [self.announce(runs) for runs in methods]
    print(f"-- {min(workers, len(methods))} methods at a time (--concurrent_batches)",
          flush=True)
    results: list = [None] * len(methods)
    stop = threading.Event()

    def advance(i: int) -> None:
      results[i] = self._advance(methods[i], dones[i], self.plan(methods[i], stages[i]), stop)

    side_by_side.on_threads(range(len(methods)), advance, workers, stop)
    return results

  def folder(self, run: Run) -> str:
    """The run's folder under --out_dir."""
    return os.path.join(self.cfg.output.out_dir, *run.path)

  def plan(self, runs: list[Run], stages: bool = False, parts: int = 1) -> Plan:
    """The batches `run_all` advances `runs` in (see there), each made and its data placed, and a
    note when the runs need several programs. `stages`: their rounds as three programs
    (`fs.RunBatch`), to share a training compiled for another method; `parts`: each batch cut
    into that many equal ones where its runs divide (`_parts`)."""
    out = self.cfg.output
    batched = out.batch_runs and len(runs) > 1 and not any(r.spec.on_host for r in runs)
    if not batched:
      groups = [[i] for i in range(len(runs))]
    elif out.resume:  # Runs added to the job start as a batch of their own.
      held = [_holds_checkpoint(self.folder(r)) for r in runs]
      groups = [b for b in ([i for i, h in enumerate(held) if h == group]
                            for group in (True, False)) if b]
    else:
      groups = [list(range(len(runs)))]
    note = None
    if batched:  # Runs of a structural setting's values run as a batch per program.
      programs = fs.program_groups([r.spec.config for r in runs])
      groups = [[i for i in group if i in same] for same in programs for group in groups]
      groups = [g for g in groups if g]
      if len(programs) > 1:
        note = (f"-- {len(programs)} compiled programs for these runs, one per value of "
                f"{_structural(self.cfg) or 'their shapes'} (settings that set shapes or "
                "branches)")
    if batched:
      groups = [part for g in groups for part in _parts(g, parts)]
    return Plan([Batch(g, fs.RunBatch([runs[i].spec for i in g], stages=stages) if len(g) > 1
                       else OneRun(runs[g[0]].spec, stages=stages)) for g in groups], note)

  def run_groups(self, groups: list[str], load: Load, build_run: BuildRun
                 ) -> tuple[dict[str, dict[str, list[list[dict]]]], dict[tuple[int, str], tuple]]:
    """Runs the job: every group's data loaded first (every data error before any training),
    then per group each method's runs (swept values x seeds) as one batch (`run_all`).

    Args:
      groups: the launcher's groups of runs (data splits, scenarios, noise levels), each with its
        own data; [""] for one group without a folder level of its own.
      load: `(seed, group) -> (dataset, ...)`, the data of a seed's runs in a group.
      build_run: `RunSpec -> (simulator, per-round extra or None)`.

    Returns:
      ({group: {`RunSpec.name`: the records of each seed's run}}, {(seed, group): loaded data}).
    """
    cfg = self.cfg
    loaded = {(s, g): load(s, g) for g in groups for s in cfg.seeds}
    results = {}
    for group in groups:
      capacity = fs.Capacity.of([loaded[(s, group)][0] for s in cfg.seeds])
      out, methods = {}, []
      for method in cfg.methods:
        runs, names = [], []
        for m, points, run in cfg.runs():
          if m is not method:
            continue
          tag, swept = cfglib.points_tag(points), cfglib.points_values(points)
          for seed in cfg.seeds:
            spec = RunSpec(group, method, run, seed, tag, loaded[(seed, group)], capacity)
            try:
              sim, extra = build_run(spec)
            except (ValueError, TypeError) as e:  # The library's refusal, before any compute.
              raise app.UsageError(f"{spec.name} seed {seed}: {e}") from e
            label = " ".join(p for p in (group, method.label) if p)
            runs.append(Run(sim, spec.path, label, seed, tag, extra, settings(run), swept))
          names.append(spec.name)
        methods.append((runs, names))
      stages = cfg.engine.stages
      shared = (shared_training([runs for runs, _ in methods]) if stages == "auto" else
                [stages == "three"] * len(methods))
      workers = concurrent_batches(cfg)
      if workers > 1 and any(r.spec.on_host for runs, _ in methods for r in runs):
        workers = 1  # A host store's runs advance one by one (--store=auto chose it here).
        if cfg.engine.concurrent_batches > 1:
          print(f"-- --concurrent_batches={cfg.engine.concurrent_batches} has no effect: the "
                "clients' data went to the host store, whose runs advance one at a time",
                flush=True)
      if workers > 1 and len(methods) > 1:  # Methods side by side.
        every = self._at_once([runs for runs, _ in methods], shared, workers)
      elif workers > 1:  # A lone method's runs in equal batches side by side.
        every = [self.run_all(methods[0][0], stages=shared[0], workers=workers)]
      else:
        every, plans = [], [None] * len(methods)
        for i, ((runs, _), share) in enumerate(zip(methods, shared)):
          if i + 1 < len(methods):  # The next method's stored programs are read while these run.
            plans[i + 1] = self.plan(methods[i + 1][0], shared[i + 1])
            preload(plans[i + 1].batches)
          every.append(self.run_all(runs, stages=share, plan=plans[i]))
          plans[i] = None
      n = len(cfg.seeds)
      for records, (_, names) in zip(every, methods):
        out.update({name: records[i * n:(i + 1) * n] for i, name in enumerate(names)})
      results[group] = out
    return results, loaded


@contextlib.contextmanager
def _exit_on_failure(label: str):
  try:
    yield
  except (CheckpointError, FileExistsError, WriteError) as e:
    sys.exit(f"error: {label.strip()}: {failure(e)}")
  except DataError as e:  # A host store's rows are checked as a round first reads them.
    sys.exit(f"error: {label.strip()}: {e}; the rounds before it are kept. Fix the data (or "
             "write the store again with experiments.make_store) and rerun with --resume")
