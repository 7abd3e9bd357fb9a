"""Host loop around a run (a `Simulator` or a `RunSpec`): progress, per-round JSONL (flushed),
checkpoints, resume.

A finished round is never lost: its metrics line is flushed before the next round starts, and the
engine state is checkpointed (`checkpoint.py`: msgpack, checksummed, atomic) every
`checkpoint_every` rounds with a fingerprint of the run (library version, seed, data, model and
the caller's settings). `run(..., resume=True)` checks the fingerprint, reads the run's history
back from its metrics file (a torn last line, from a kill mid-write, is dropped), continues from
the checkpoint and returns the whole history; resuming a finished run computes nothing.

In a multi-host run (`jax.distributed`) every process computes every round and only process 0
writes files and progress; on resume every process reads the checkpoint (a shared folder).

A round whose global model or losses are not finite stops the run (`NonFiniteError`, naming the
round and the cause) after its record is written; `Simulator(..., nonfinite="exclude")` instead
keeps non-finite local updates out of the aggregate and counts them.

Examples:
  >>> records = run(sim, rounds=5, out_dir="/tmp/run")   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TextIO

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.engine import checks
from fedjax_sel.engine.placement import place
from fedjax_sel.engine.programs import program
from fedjax_sel.engine.run_spec import RunSpec
from fedjax_sel.engine.signature import Keyed, signature
from fedjax_sel.engine.simulator import Simulator
from fedjax_sel.engine.state import EngineState, to_host
from fedjax_sel.host import checkpoint, folder_lock, telemetry
from fedjax_sel.parts.types import describe
from fedjax_sel.version import __version__

METRICS_FILE = "metrics.jsonl"
CHECKPOINT_FILE = "checkpoint.msgpack"


class NonFiniteError(FloatingPointError):
  """A round produced a non-finite global model or loss."""


def _jsonable(tree) -> Any:
  if isinstance(tree, dict):
    return {k: _jsonable(v) for k, v in tree.items()}
  if isinstance(tree, np.ndarray):
    return np.where(tree)[0].tolist() if tree.dtype == bool else tree.tolist()
  if isinstance(tree, (np.floating, float)):
    return float(tree)
  if isinstance(tree, (np.integer, np.bool_)):
    return tree.item()
  return tree


def dataset_digest(data) -> str:
  """SHA-256 (hex, 16 chars) of a federated dataset's labels, client sizes, public set and a
  strided sample of its training features: the data's identity in a run's fingerprint."""
  h = hashlib.sha256()
  for pool in (data.train, data.val, data.test):
    stride = max(1, pool.x.shape[0] // 4096)
    for a in (pool.counts, pool.y, pool.x[::stride]):
      h.update(np.ascontiguousarray(a).tobytes())
  h.update(np.ascontiguousarray(data.public_y).tobytes())
  return h.hexdigest()[:16]


# Rounds whose learning rates and availability a fingerprint covers (a run may be resumed to run
# longer, so the fingerprint cannot depend on the number of rounds).
LR_HORIZON = 10_000
AVAILABILITY_HORIZON = 64


def _digest(a) -> str:
  return hashlib.sha256(np.ascontiguousarray(np.asarray(a)).tobytes()).hexdigest()[:16]


def _draws(cfg, lr, seed):
  """The learning rates of rounds 0..`LR_HORIZON`-1 and the availability of rounds
  0..`AVAILABILITY_HORIZON`-1 of the schedule and availability model `cfg.value`: one program (run
  eagerly, each of their operations compiled on its own: about 1 s of a cold process)."""
  lr_factor, availability = cfg.value
  rounds = jnp.arange(LR_HORIZON, dtype=jnp.int32)
  lrs = lr * jax.vmap(lr_factor)(rounds) * jnp.ones_like(rounds, jnp.float32)
  return lrs, jax.vmap(lambda t: availability.sample(seed, t))(rounds[:AVAILABILITY_HORIZON])


class RunView:
  """Run `i`'s part of a batch's `EngineState`, each field sliced when it is read: an extra that
  reads one field (or none) costs a slice of that field, not of every leaf of the state.

  Example:
    >>> import numpy as np
    >>> class Batch:
    ...   run_slice = staticmethod(lambda tree, i: tree[i])
    >>> states = EngineState(*[None] * 11)._replace(round=np.array([3, 3]))
    >>> int(RunView(Batch, states, 1).round)
    3
  """

  def __init__(self, batch, states: EngineState, i: int):
    self._batch, self._states, self._i = batch, states, i

  def __getattr__(self, name: str):
    return self._batch.run_slice(getattr(self._states, name), self._i)


def run_fingerprint(spec: RunSpec, settings: dict | None = None) -> dict:
  """What determines a run, in one vocabulary: the job config's field names (and flags) where one
  exists (`lr`, `prox_mu`, `clients_per_round`, `num_clients`, `batch_size`, `local_epochs`,
  `local_steps`), else a name for what the entry covers: the library version, seed, model and
  its parameter shapes, the data's digest, every part's spec by kind (`describe`: name and
  settings), the learning rates of rounds 0..`LR_HORIZON`-1 and the availability of rounds
  0..`AVAILABILITY_HORIZON`-1 (digests). The caller's `settings` join it under the same names
  (a launcher's: its job config's fields, `experiments.launch.config.fingerprint`), theirs kept
  where both name an entry."""
  config = spec.config
  shapes = [list(a.shape) for a in jax.tree.leaves(checks.model_shapes(config.model))]
  drawn = (config.lr_factor, config.availability)
  lrs, avail = program(_draws, light=True)(Keyed(signature(drawn), drawn), spec.run_values.lr,
                                           spec.run_values.seed)
  local = config.local
  parts = {kind: describe(getattr(config, role))
           for kind, role in (("selector", "selector"), ("filter", "filter"),
                              ("rule", "participation"), ("aggregator", "aggregator"),
                              ("server_optimizer", "server_optimizer"))}
  clock = config.clock
  if clock is not None:
    parts["clock"] = {"profile": _digest(np.stack([clock.profile.speed, clock.profile.bandwidth])),
                      "model_bytes": clock.model_bytes, "deadline_s": clock.deadline_s}
  return {"library": __version__, "seed": spec.seed, "lr": float(spec.run_values.lr),
          "prox_mu": float(spec.run_values.prox_mu), "clients_per_round": config.k,
          "num_clients": spec.num_clients, "model": config.model.name,
          "param_shapes": hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:16],
          "data": dataset_digest(spec.data), "parts": parts, "batch_size": local.batch_size,
          "local_epochs": local.num_epochs, "local_steps": local.num_steps,
          "lr_schedule": _digest(lrs), "availability_draws": _digest(avail), **(settings or {})}


def read_history(path: str, rounds: int) -> list[dict]:
  """The records of rounds `< rounds` in a metrics file; a torn last line is dropped, a malformed
  line before it raises `CheckpointError` naming the file and line."""
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")
  records = []
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError as e:
      if i >= len(lines) - 2 and not "".join(lines[i + 1:]).strip():  # The last line, torn.
        break
      raise checkpoint.CheckpointError(f"{path}:{i + 1} is not a JSON record ({e})") from e
  return [r for r in records if r["round"] < rounds]


def _write_records(path: str, records: list[dict]) -> None:
  checkpoint.write_atomic(path, "".join(json.dumps(r) + "\n" for r in records).encode("utf-8"))


def _append(sink, path: str, record: dict) -> None:
  """Writes one round's record and flushes it (a torn line, from a full disk or a kill, is dropped
  when the run resumes)."""
  try:
    sink.write(json.dumps(record) + "\n")
    sink.flush()
  except OSError as e:
    raise checkpoint.write_error(path, e, f"the rounds before round {record['round']} are kept: "
                                          "free space and resume") from e


def _close(sink) -> None:
  """Closes a metrics file; a write that failed already raised its own error."""
  with contextlib.suppress(OSError):
    sink.close()


def _check_space(out_dir: str, state) -> None:
  """Refuses a folder whose disk cannot hold a checkpoint while replacing the last one (a new
  file beside the current and the previous generation) and some metrics, before any round."""
  # From the shapes: copying a large state to the host to count its bytes could exhaust memory.
  need = 3 * sum(np.size(leaf) * np.dtype(leaf.dtype).itemsize
                 for leaf in jax.tree.leaves(state)) + (1 << 18)
  free = shutil.disk_usage(out_dir).free
  if free < need:
    raise checkpoint.WriteError(errno.ENOSPC, f"cannot run in {out_dir}: its disk has "
                                f"{free / 2**20:.1f} MiB free, a run's checkpoints need about "
                                f"{need / 2**20:.1f} MiB; free space or choose another folder")


def _resume(ckpt_path: str, template, fingerprint: dict, metrics_path: str,
            writer: bool) -> tuple[Any, list[dict]]:
  """A checkpoint's state and its run's history read back from the metrics file (rewritten
  without what came after the checkpoint), refused naming what differs or what is lost."""
  state, _ = checkpoint.load(ckpt_path, template, fingerprint)
  done = int(np.asarray(state.round))
  history = read_history(metrics_path, done)
  if [r["round"] for r in history] != list(range(done)):
    raise checkpoint.CheckpointError(
        f"cannot resume: {metrics_path} holds rounds {[r['round'] for r in history][:5]}... "
        f"but {ckpt_path} is at round {done}; the run's history is lost, start it afresh")
  if writer:
    _write_records(metrics_path, history)
  return state, history


def _check_loop(rounds, eval_every, checkpoint_every, log_every) -> None:
  """The loop's counts are integers >= 1, else ValueError naming the argument."""
  if not isinstance(rounds, int) or rounds < 1:
    raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
  for name, value in (("eval_every", eval_every), ("checkpoint_every", checkpoint_every),
                      ("log_every", log_every)):
    if not isinstance(value, int) or value < 1:
      raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _host_loop(rounds, eval_every, checkpoint_every, progress, label, log_every=1):
  """Checks the loop arguments; (writer process, its progress stream, `say`)."""
  _check_loop(rounds, eval_every, checkpoint_every, log_every)
  writer = jax.process_index() == 0
  progress = progress if writer else None
  say = (lambda text: (progress.write(label + text), progress.flush())) if progress else (
      lambda text: None)
  return writer, progress, say


def _fresh(out_dir: str, overwrite: bool, writer: bool) -> None:
  """A clean run folder (made only by the `writer` process): a previous run in it is refused
  unless `overwrite`."""
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise FileExistsError(f"out_dir {out_dir} is a file, not a folder")
  if writer:
    os.makedirs(out_dir, exist_ok=True)
  ckpt_path = os.path.join(out_dir, CHECKPOINT_FILE)
  previous = [p for p in (os.path.join(out_dir, METRICS_FILE), ckpt_path,
                          checkpoint.previous(ckpt_path)) if os.path.exists(p)]
  if previous and not overwrite and writer:  # Others may see the writer's first lines.
    raise FileExistsError(f"{out_dir} holds a previous run ({', '.join(previous)}); resume it "
                          "(resume=True, --resume) or replace it (overwrite=True, --overwrite)")
  for p in previous if writer else ():
    os.remove(p)


def _check_finite(record: dict, t: int, server_step: bool) -> None:
  """Raises `NonFiniteError` naming round `t`'s non-finite numbers and their likely cause: the
  clients' local training when their losses diverged, else the server's step where a server
  optimizer takes one (`server_step`), else the clients' last local steps (the aggregate of
  their models is the new model)."""
  causes = [f"{k} = {record[k]}" for k in ("local_train_loss", "test_loss", "train_loss")
            if isinstance(record.get(k), float) and not math.isfinite(record[k])]
  if not record.get("model_finite", True):
    causes.insert(0, "the aggregated global model has non-finite weights")
  if not causes:
    return
  local = record.get("local_train_loss")
  clients_finite = isinstance(local, float) and math.isfinite(local)
  if clients_finite and server_step:
    advice = ("the clients trained to finite losses, so the server's step diverged: lower the "
              "server learning rate (server_lr, --server_lr) or use another server optimizer or "
              "aggregator")
  elif clients_finite:
    advice = ("the clients' losses stayed finite while they trained and no server optimizer "
              "steps the model (the aggregate of theirs is the new one), so their last local "
              "steps diverged: lower the client learning rate (--lr) or use another aggregator")
  else:
    advice = ("so local training diverged: lower the client learning rate (--lr), or exclude "
              "non-finite client updates with nonfinite='exclude', --nonfinite=exclude")
  raise NonFiniteError(f"round {t}: " + "; ".join(causes) + " (the clients' data passed their "
                       "checks when the run started: finite features, integer labels within "
                       f"the model's classes; {advice})")


class OneRun:
  """One run as a batch of one, for the host loop (`run` is `run_batch` of it): its state and
  metrics unstacked, its data wherever its placement keeps them (device or host).

  Args:
    run: a `RunSpec` (placed here) or a `Simulator` (its spec and placement).
    stages: place a `RunSpec` with its round as three programs (`placement.DevicePlacement`).
  """

  num_runs = 1

  def __init__(self, run: RunSpec | Simulator, stages: bool = False):
    if isinstance(run, Simulator):
      self.specs, self.placement = [run.spec], run.placement
    elif isinstance(run, RunSpec):
      self.specs, self.placement = [run], place(run, stages)
    else:
      raise TypeError(f"a run is a RunSpec (build_run) or a Simulator, got {type(run).__name__}")

  def init(self) -> EngineState:
    return self.specs[0].initial_state()

  def preload(self, state: EngineState) -> None:
    """Reads the run's stored programs ahead of their first call (`RunBatch.preload`)."""
    self.placement.preload(state)

  def step(self, state: EngineState) -> tuple[EngineState, dict]:
    return self.placement.step(state)

  def evaluate(self, params) -> dict:
    return self.placement.evaluate(params)

  def run_slice(self, tree: Any, i: int) -> Any:
    del i
    return tree

  def stack(self, trees: list) -> Any:
    return trees[0]


def run(sim: Simulator | RunSpec, rounds: int, out_dir: str | None = None, *, eval_every: int = 1,
        checkpoint_every: int = 10, resume: bool = False, overwrite: bool = False,
        progress: TextIO | None = sys.stdout, label: str = "", log_every: int = 1,
        extra: Callable[[EngineState, dict], dict] | None = None,
        settings: dict | None = None,
        on_record: Callable[[dict], None] | None = None) -> list[dict]:
  """Runs `rounds` rounds (in total, counting resumed ones) and returns every round's record:
  `run_batch` of a batch of one run (`OneRun`).

  Args:
    sim: the run: a `Simulator`, or a `RunSpec` (`build_run`).
    rounds: rounds to train in all (T), counting resumed ones.
    out_dir: where `metrics.jsonl` and `checkpoint.msgpack` go (None: keep in memory only).
    eval_every: evaluate the global model every this many rounds (and at the last round).
    checkpoint_every: checkpoint period in rounds.
    resume: continue from `out_dir/checkpoint.msgpack` if present (refused, naming the settings,
      if the run's fingerprint differs); without one, start fresh and say so.
    overwrite: replace a previous run in `out_dir` (without it or `resume`, FileExistsError).
    progress: stream for the one-line-per-round progress display (None: silent).
    label: prefix of the progress lines.
    log_every: print a progress line every this many rounds (and on the first and last round).
    extra: optional `(state, record) -> dict` merged into each record (e.g. OPT ratios).
    settings: JSON-able settings that determine the run besides what the simulator knows (the
      launcher's job config), stored in the checkpoint's fingerprint.
    on_record: optional callback of each new round's record once it is written (e.g.
      `tracking.TensorBoardWriter(...).write`).

  Raises:
    NonFiniteError: a round's global model or loss is not finite (its record is written first).
  """
  _check_loop(rounds, eval_every, checkpoint_every, log_every)  # Before the run is placed.
  return run_batch(OneRun(sim), rounds, None if out_dir is None else [out_dir],
                   eval_every=eval_every, checkpoint_every=checkpoint_every, resume=resume,
                   overwrite=overwrite, progress=progress, label=label, log_every=log_every,
                   settings=[settings], extras=[extra], on_records=[on_record])[0]


def _checkpoint_rounds(path: str, template, fingerprint: dict) -> dict[int, str]:
  """{round: file} of the checkpoints kept at `path` (the latest and the one before it), each
  refused when its run's fingerprint differs; a corrupt older copy is passed over while the
  latest one is intact."""
  found = {}
  for p in (path, checkpoint.previous(path)):
    if not os.path.exists(p):
      continue
    try:
      state, _ = checkpoint.load(p, template, fingerprint)
    except checkpoint.CheckpointError as e:
      if p == path or not found or getattr(e, "changed", ()):
        raise
      continue
    found[int(np.asarray(state.round))] = p
  return found


def run_batch(batch, rounds: int, out_dirs: list[str] | None = None, *, eval_every: int = 1,
              checkpoint_every: int = 10, resume: bool = False, overwrite: bool = False,
              progress: TextIO | None = sys.stdout, label: str = "", log_every: int = 1,
              settings: list[dict] | None = None,
              extras: list[Callable[[EngineState, dict], dict] | None] | None = None,
              on_records: list[Callable[[dict], None] | None] | None = None,
              stop: threading.Event | None = None) -> list[list[dict]]:
  """Runs the R runs of a `RunBatch` (or a `OneRun`) for `rounds` rounds together; returns each
  run's records. The one host loop: `run` is this loop over a batch of one.

  Each run keeps its own folder (`out_dirs[i]`: `metrics.jsonl`, `checkpoint.msgpack` and the one
  before it), fingerprint and history, as with `run`. The runs checkpoint together, keeping the
  previous checkpoint too, so a job killed at any moment (even between two runs' writes) resumes
  every run from one round. A run whose model or loss stops being finite stops alone: its record
  is written, then nothing more of it, while the others go on; `NonFiniteError` is raised at the
  end naming it (its `records` attribute holds every run's records, its `stopped` attribute the
  index and message of each run that stopped; a batch of one raises it with the run's own
  message).

  Args:
    batch: the `RunBatch`, or `OneRun(run)`.
    rounds: as in `run`.
    eval_every: as in `run`.
    checkpoint_every: as in `run`.
    resume: as in `run`.
    overwrite: as in `run`.
    progress: as in `run`.
    label: as in `run`.
    log_every: as in `run`.
    out_dirs: one folder per run (None: keep in memory only).
    settings: per-run JSON-able settings for the fingerprints (e.g. the launcher's flags with the
      run's swept value).
    extras: per-run optional `(state, record) -> dict` merged into each of its records (`state`
      is that run's view of the batch's state, `RunView`: each field it reads sliced then).
    on_records: per-run optional callback of each new record, as `run`'s `on_record`.
    stop: optional event, read before each round: once set, the batch ends there as Ctrl-C ends
      it (a KeyboardInterrupt), its finished rounds kept (a batch on another thread, stopped by
      the thread that waits for it).
  """
  writer, progress, say = _host_loop(rounds, eval_every, checkpoint_every, progress, label,
                                     log_every)
  for spec in batch.specs:
    checks.check_clock(spec, rounds)
  with folder_lock.locked(out_dirs if out_dirs is not None and writer else ()):
    r = batch.num_runs
    if out_dirs is not None and len(out_dirs) != r:
      raise ValueError(f"out_dirs must name one folder per run ({r}), got {len(out_dirs)}")
    if out_dirs is not None:
      real = [os.path.realpath(d) for d in out_dirs]
      twice = sorted({d for d, p in zip(out_dirs, real) if real.count(p) > 1})
      if twice:
        raise ValueError(f"out_dirs must be distinct folders (two runs would write one "
                         f"metrics.jsonl and checkpoint): {twice} given more than once")
    if settings is not None and len(settings) != r:
      raise ValueError(f"settings must hold one dict per run ({r}), got {len(settings)}")
    states = batch.init()
    histories = [[] for _ in range(r)]
    paths, fingerprints = [None] * r, [None] * r
    if out_dirs is not None:
      fingerprints = [run_fingerprint(spec, (settings or [None] * r)[i])
                      for i, spec in enumerate(batch.specs)]
      states, histories = _start_batch(batch, states, out_dirs, resume, overwrite, fingerprints,
                                       say, writer)
      if writer:
        _check_space(out_dirs[0], states)
        paths = [(os.path.join(d, METRICS_FILE), os.path.join(d, CHECKPOINT_FILE))
                 for d in out_dirs]
    first = int(np.ravel(np.asarray(states.round))[0])
    if first >= rounds:
      say(f"finished earlier ({first} rounds): nothing to compute\n")
      return [h[:rounds] for h in histories]
    _continue_histories(histories, paths, writer)
    start = time.perf_counter() - max((h[-1]["wall_s"] for h in histories if h), default=0.0)
    sinks = [open(p[0], "a", encoding="utf-8") if p else None for p in paths]
    stopped: dict[int, str] = {}
    pace = Pace()
    try:
      for t in range(first, rounds):
        if stop is not None and stop.is_set():
          raise KeyboardInterrupt
        states, metrics = batch.step(states)
        metrics = to_host(metrics)
        evaluated = (t + 1) % eval_every == 0 or t == rounds - 1
        evals = to_host(batch.evaluate(states.params)) if evaluated else None
        # Read once for the batch, then sliced on the host (a slice of a device array per run
        # would be an operation on the device each).
        participations = np.asarray(states.clients.participations) if evaluated else None
        wall = round(time.perf_counter() - start, 3)
        for i in range(r):
          if i in stopped:
            continue
          record = _jsonable(batch.run_slice(metrics, i))
          if evals is not None:
            record.update(_jsonable(batch.run_slice(evals, i)))
            counts = batch.run_slice(participations, i)
            record["participation"] = telemetry.participation_summary(counts)
            if t == rounds - 1:
              record["participations"] = counts.tolist()
          if extras is not None and extras[i] is not None:
            record.update(extras[i](RunView(batch, states, i), record))
          record["wall_s"] = wall
          histories[i].append(record)
          if sinks[i]:
            _append(sinks[i], paths[i][0], record)
          if on_records is not None and on_records[i] is not None:
            on_records[i](record)
          try:
            _check_finite(record, t, batch.specs[i].config.server_optimizer is not None)
          except NonFiniteError as e:
            stopped[i] = str(e)
            if r > 1:
              say(f"run {i} stopped: {e}\n")
        pace = pace.after(wall, evaluated)
        shown = (t + 1) % log_every == 0 or t in (first, rounds - 1)
        if progress is not None and shown:
          line = (progress_line(label, t, rounds, histories[0][-1], pace) if r == 1 else
                  batch_progress_line(label, t, rounds, histories, stopped, pace))
          progress.write(line + "\n")
          progress.flush()
        if (t + 1) % checkpoint_every == 0 or t == rounds - 1:
          held = jax.tree.map(np.asarray, states) if any(paths) else None
          for i, p in enumerate(paths):
            if p and i not in stopped:
              checkpoint.save(p[1], batch.run_slice(held, i), fingerprints[i],
                              keep_previous=True)
        if len(stopped) == r:
          break
    finally:
      for sink in sinks:
        if sink:
          _close(sink)
    if stopped:
      error = NonFiniteError(stopped[0] if r == 1 else
                             "; ".join(f"run {i}: {m}" for i, m in sorted(stopped.items())))
      error.records = histories
      error.stopped = dict(stopped)  # Run index -> why it stopped.
      raise error
    return histories


def _continue_histories(histories, paths, writer) -> None:
  """A run that goes on past its last round: that record's per-client participation counts (a
  run's last record's) move to the new last round, so a resumed run's records equal an
  uninterrupted one's."""
  for history, path in zip(histories, paths):
    if history and "participations" in history[-1]:
      del history[-1]["participations"]
      if writer and path:
        _write_records(path[0], history)


def _start_batch(batch, states, out_dirs, resume, overwrite, fingerprints, say, writer):
  """The stacked states to start from and each run's history: with `resume`, every run from the
  latest round all of them hold a checkpoint of (the latest or the one before it)."""
  r = batch.num_runs
  # Sliced on the host, and only to resume (a slice of each device array lowers a program).
  template = batch.run_slice(jax.tree.map(np.asarray, states), 0) if resume else None
  found = []
  for i, d in enumerate(out_dirs):
    ckpt = os.path.join(d, CHECKPOINT_FILE)
    found.append(_checkpoint_rounds(ckpt, template, fingerprints[i]) if resume else {})
  common = set.intersection(*(set(f) for f in found)) if all(found) else set()
  if resume and common:
    done = max(common)
    loaded, histories = [], []
    for i, d in enumerate(out_dirs):
      state, history = _resume(found[i][done], template, fingerprints[i],
                               os.path.join(d, METRICS_FILE), writer)
      loaded.append(state)
      histories.append(history)
    say(f"resuming {found[0][done]} after round {done}\n" if r == 1 else
        f"resuming {r} runs after round {done} ({out_dirs[0]} ...)\n")
    return batch.stack([jax.tree.map(jnp.asarray, s) for s in loaded]), histories
  if resume:
    say(f"no checkpoint in {out_dirs[0]}: starting fresh\n" if r == 1 else
        "no common checkpoint of the runs: starting them fresh\n")
  for d in out_dirs:
    _fresh(d, overwrite or resume, writer)
  return states, [[] for _ in out_dirs]


def batch_progress_line(label: str, t: int, rounds: int, histories: list[list[dict]],
                        stopped: dict, pace: Pace | None = None) -> str:
  """One line per round of a batch: runs going, the mean and range of their losses, of the
  staleness of an asynchronous step's updates (mean and max) and of their test accuracy."""
  live = [h[-1] for i, h in enumerate(histories) if i not in stopped and h]
  parts = [f"{label}[{t + 1:>4}/{rounds}]", f"runs {len(live)}/{len(histories)}"]
  def spread(key, fmt):
    values = [rec[key] for rec in live if isinstance(rec.get(key), (int, float))]
    if not values:
      return None
    return (f"{key.replace('_', ' ')} {np.mean(values):{fmt}}" if len(values) == 1 else
            f"{key.replace('_', ' ')} {np.mean(values):{fmt}} [{min(values):{fmt}}-"
            f"{max(values):{fmt}}]")
  for key, fmt in (("local_train_loss", ".4f"), ("staleness_mean", ".2f"),  # Staleness: async.
                   ("staleness_max", ".1f"), ("test_accuracy", ".4f")):
    text = spread(key, fmt)
    if text:
      parts.append(text)
  if live:
    parts.append(_elapsed(live[0]["wall_s"], t, rounds, pace))
  return "  ".join(parts)


class Pace(NamedTuple):
  """The rounds a process ran that compiled nothing, whose mean estimates the time left: how many
  and their wall seconds. Its first round (the step compiles) and its first evaluated round (the
  evaluation compiles; with --eval_every=2, the second round) are not among them."""

  rounds: int = 0
  seconds: float = 0.0
  wall: float | None = None  # The wall seconds at the end of the last round.
  evaluated: bool = False  # Whether a round evaluated the model yet.

  def after(self, wall: float, evaluated: bool) -> Pace:
    """The pace with one more round, which ended at `wall` seconds and evaluated or not."""
    timed = self.wall is not None and (self.evaluated or not evaluated)
    return Pace(self.rounds + timed, self.seconds + (wall - self.wall if timed else 0.0), wall,
                self.evaluated or evaluated)


def _elapsed(wall_s: float, t: int, rounds: int, pace: Pace | None = None) -> str:
  """Seconds so far and an estimate of those left: the mean round of `pace` times the rounds
  left; no estimate before a round that compiled nothing has run."""
  left = rounds - t - 1
  text = f"{wall_s:.1f}s"
  if not left or pace is None or not pace.rounds:
    return text
  return text + f" (~{pace.seconds / pace.rounds * left:.0f}s left)"


def progress_line(label: str, t: int, rounds: int, record: dict,
                  pace: Pace | None = None) -> str:
  """One run's line per round: its local train loss, clients selected and trained (and what
  kept their updates out), the staleness of an asynchronous step's updates (mean and max), its
  test accuracy when evaluated, simulated and wall seconds and the estimate of those left."""
  excluded = record.get("nonfinite_clients", 0)
  trained = (f"train {record['local_train_loss']:.4f}" if record["num_trained"] > excluded
             else "no client trained" if not excluded else "every update non-finite")
  parts = [f"{label}[{t + 1:>4}/{rounds}]", trained, f"sel {record['num_selected']}",
           f"trained {record['num_trained']}"]
  if excluded:
    parts.append(f"excluded {excluded} non-finite")
  if record["num_trained"] and not record.get("num_aggregated", 1):
    parts.append(f"nothing aggregated ({record.get('stragglers', 0)} past the deadline)")
  if "num_filtered" in record and record.get("filtered_in") is not None:
    parts.append(f"filtered {record['num_filtered']}")
  if "staleness_max" in record:  # An asynchronous server step: how stale its updates were.
    parts.append(f"staleness mean {record['staleness_mean']:.2f} max {record['staleness_max']}")
  if "test_accuracy" in record:
    parts.append(f"test acc {record['test_accuracy']:.4f} loss {record['test_loss']:.4f}")
  if record.get("round_time_s"):
    parts.append(f"sim {record['cumulative_cost']['sim_time_s']:.0f}s")
  parts.append(_elapsed(record["wall_s"], t, rounds, pace))
  return "  ".join(parts)


def step_name(records: list[dict]) -> str:
  """What a run's steps are: "server steps" for an asynchronous run (its records carry the
  staleness of the updates each step aggregated), else "rounds"."""
  return "server steps" if "staleness_max" in records[0] else "rounds"


def summary_table(rows: list[tuple[str, list[dict]]], clean: str | None = None) -> str:
  """Markdown table of final and best test accuracy, final losses and costs per labelled run;
  its counts are of rounds, or of server steps for asynchronous runs (`step_name`). With `clean`,
  the clients the records' clean_* metrics score (a simulator's `eval_mask`, e.g. "uncorrupted
  clients"), their final train loss stands beside that of all clients."""
  steps = " / ".join(dict.fromkeys(step_name(recs) for _, recs in rows))
  at = "rounds trained" if steps == "rounds" else steps
  own = f" final train loss ({clean}) |" if clean else ""
  head = (f"| run | final test acc | best test acc ({at}) | final test loss | final train loss "
          f"(all clients) |{own} train samples | uploads | {steps} nobody trained | {steps} "
          "nothing aggregated | wall s |")
  lines = [head, "|" + "---|" * (10 + bool(clean))]
  for label, recs in rows:
    evald = [r for r in recs if "test_accuracy" in r]
    last = evald[-1]
    best = max(evald, key=lambda r: r["test_accuracy"])
    cost = recs[-1]["cumulative_cost"]
    own = f" {last['clean_train_loss']:.4f} |" if clean else ""
    lines.append(f"| {label} | {last['test_accuracy']:.4f} | {best['test_accuracy']:.4f} "
                 f"({best['round'] + 1}) | {last['test_loss']:.4f} | {last['train_loss']:.4f} |"
                 f"{own} {cost['train_samples']:.0f} | {cost['uploads']:.0f} | "
                 f"{sum(r['num_trained'] == 0 for r in recs)} | "
                 f"{sum(r.get('num_aggregated', 1) == 0 for r in recs)} | "
                 f"{recs[-1]['wall_s']:.1f} |")
  return "\n".join(lines)
