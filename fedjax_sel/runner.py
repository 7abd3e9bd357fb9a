"""Host loop around a `Simulator`: progress, per-round JSONL (flushed), checkpoints, resume.

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

Example:
  >>> records = run(sim, rounds=5, out_dir="/tmp/run")   # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from typing import Any, Callable, TextIO

import jax
import numpy as np

from fedjax_sel import __version__, checkpoint
from fedjax_sel.engine import EngineState, Simulator, to_host

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


def run_fingerprint(sim: Simulator, settings: dict | None = None) -> dict:
  """What determines a run: the library version, seed, K, N, model and its parameter shapes, the
  data's digest, and the caller's `settings` (e.g. the launcher's flags)."""
  shapes = [list(np.shape(a)) for a in jax.tree.leaves(jax.eval_shape(sim.init).params)]
  return {"library": __version__, "seed": sim.seed, "clients_per_round": sim.k,
          "num_clients": sim.num_clients, "model": sim.model.name,
          "param_shapes": hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:16],
          "data": dataset_digest(sim.data), **(settings or {})}


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
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def _start(state, out_dir, resume, overwrite, fingerprint, say,
           writer: bool) -> tuple[EngineState, list]:
  """The state to start from and the history before it (resume), or a clean run folder (made
  only by the `writer` process)."""
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise FileExistsError(f"out_dir {out_dir} is a file, not a folder")
  if writer:
    os.makedirs(out_dir, exist_ok=True)
  metrics_path = os.path.join(out_dir, METRICS_FILE)
  ckpt_path = os.path.join(out_dir, CHECKPOINT_FILE)
  if resume and os.path.exists(ckpt_path):
    state, stored = checkpoint.load(ckpt_path, state)
    diff = checkpoint.differences(stored, fingerprint)
    if diff:
      raise checkpoint.CheckpointError(f"cannot resume {ckpt_path}: the run was started with other "
                                       "settings (checkpoint -> now): " + "; ".join(diff))
    done = int(state.round)
    history = read_history(metrics_path, done)
    if [r["round"] for r in history] != list(range(done)):
      raise checkpoint.CheckpointError(
          f"cannot resume: {metrics_path} holds rounds {[r['round'] for r in history][:5]}... "
          f"but {ckpt_path} is at round {done}; the run's history is lost, start it afresh")
    if writer:
      _write_records(metrics_path, history)
    say(f"resuming {ckpt_path} after round {done}\n")
    return jax.tree.map(jax.numpy.asarray, state), history
  previous = [p for p in (metrics_path, ckpt_path) if os.path.exists(p)]
  if resume:
    say(f"no checkpoint in {out_dir}: starting fresh\n")
  elif previous and not overwrite and writer:  # Others may see the writer's first lines.
    raise FileExistsError(f"{out_dir} holds a previous run ({', '.join(previous)}); resume it "
                          "(resume=True, --resume) or replace it (overwrite=True, --overwrite)")
  for p in previous if writer else ():
    os.remove(p)
  return state, []


def _check_finite(record: dict, t: int) -> None:
  causes = [f"{k} = {record[k]}" for k in ("local_train_loss", "test_loss", "train_loss")
            if isinstance(record.get(k), float) and not math.isfinite(record[k])]
  if not record.get("model_finite", True):
    causes.insert(0, "the aggregated global model has non-finite weights")
  if causes:
    raise NonFiniteError(f"round {t}: " + "; ".join(causes) + " (diverged: lower the learning "
                         "rate, or exclude non-finite client updates with nonfinite='exclude', "
                         "--nonfinite=exclude)")


def run(sim: Simulator, rounds: int, out_dir: str | None = None, *, eval_every: int = 1,
        checkpoint_every: int = 10, resume: bool = False, overwrite: bool = False,
        progress: TextIO | None = sys.stdout, label: str = "",
        extra: Callable[[EngineState, dict], dict] | None = None,
        settings: dict | None = None) -> list[dict]:
  """Runs `rounds` rounds (in total, counting resumed ones) and returns every round's record.

  Args:
    sim: the simulator.
    rounds: T.
    out_dir: where `metrics.jsonl` and `checkpoint.msgpack` go (None: keep in memory only).
    eval_every: evaluate the global model every this many rounds (and at the last round).
    checkpoint_every: checkpoint period in rounds.
    resume: continue from `out_dir/checkpoint.msgpack` if present (refused, naming the settings,
      if the run's fingerprint differs); without one, start fresh and say so.
    overwrite: replace a previous run in `out_dir` (without it or `resume`, FileExistsError).
    progress: stream for the one-line-per-round progress display (None: silent).
    label: prefix of the progress lines.
    extra: optional `(state, record) -> dict` merged into each record (e.g. OPT ratios).
    settings: JSON-able settings that determine the run besides what the simulator knows (the
      launcher's flags), stored in the checkpoint's fingerprint.

  Raises:
    NonFiniteError: a round's global model or loss is not finite (its record is written first).
  """
  if not isinstance(rounds, int) or rounds < 1:
    raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
  for name, value in (("eval_every", eval_every), ("checkpoint_every", checkpoint_every)):
    if not isinstance(value, int) or value < 1:
      raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
  writer = jax.process_index() == 0
  progress = progress if writer else None
  say = (lambda text: (progress.write(label + text), progress.flush())) if progress else (
      lambda text: None)
  state = sim.init()
  records, metrics_path, ckpt_path, fingerprint = [], None, None, None
  if out_dir is not None:
    fingerprint = run_fingerprint(sim, settings)
    state, records = _start(state, out_dir, resume, overwrite, fingerprint, say, writer)
    if writer:
      metrics_path = os.path.join(out_dir, METRICS_FILE)
      ckpt_path = os.path.join(out_dir, CHECKPOINT_FILE)
  first = int(state.round)
  if first >= rounds:
    say(f"finished earlier ({first} rounds): nothing to compute\n")
    return records[:rounds]
  start = time.perf_counter() - (records[-1]["wall_s"] if records else 0.0)
  sink = open(metrics_path, "a", encoding="utf-8") if metrics_path else None
  try:
    for t in range(first, rounds):
      state, metrics = sim.step(state)
      record = _jsonable(to_host(metrics))
      if (t + 1) % eval_every == 0 or t == rounds - 1:
        record.update(_jsonable(to_host(sim.evaluate(state.params))))
      if extra is not None:
        record.update(extra(state, record))
      record["wall_s"] = round(time.perf_counter() - start, 3)
      records.append(record)
      if sink:
        sink.write(json.dumps(record) + "\n")
        sink.flush()
      if progress is not None:
        progress.write(progress_line(label, t, rounds, record) + "\n")
        progress.flush()
      _check_finite(record, t)
      if ckpt_path and ((t + 1) % checkpoint_every == 0 or t == rounds - 1):
        checkpoint.save(ckpt_path, state, fingerprint)
  finally:
    if sink:
      sink.close()
  return records


def progress_line(label: str, t: int, rounds: int, record: dict) -> str:
  excluded = record.get("nonfinite_clients", 0)
  trained = (f"train {record['local_train_loss']:.4f}" if record["num_trained"] > excluded
             else "no client trained" if not excluded else "every update non-finite")
  parts = [f"{label}[{t + 1:>4}/{rounds}]", trained, f"sel {record['num_selected']}",
           f"trained {record['num_trained']}"]
  if excluded:
    parts.append(f"excluded {excluded} non-finite")
  if "num_filtered" in record and record.get("filtered_in") is not None:
    parts.append(f"filtered {record['num_filtered']}")
  if "test_accuracy" in record:
    parts.append(f"test acc {record['test_accuracy']:.4f} loss {record['test_loss']:.4f}")
  parts.append(f"{record['wall_s']:.1f}s")
  return "  ".join(parts)


def summary_table(rows: list[tuple[str, list[dict]]]) -> str:
  """Markdown table of final and best test accuracy, final losses and costs per labelled run."""
  head = ("| run | final test acc | best test acc (round) | final test loss | final train loss | "
          "train samples | uploads | rounds nobody trained | wall s |")
  lines = [head, "|" + "---|" * 9]
  for label, recs in rows:
    evald = [r for r in recs if "test_accuracy" in r]
    last = evald[-1]
    best = max(evald, key=lambda r: r["test_accuracy"])
    cost = recs[-1]["cumulative_cost"]
    lines.append(f"| {label} | {last['test_accuracy']:.4f} | {best['test_accuracy']:.4f} "
                 f"({best['round']}) | {last['test_loss']:.4f} | {last['train_loss']:.4f} | "
                 f"{cost['train_samples']:.0f} | {cost['uploads']:.0f} | "
                 f"{sum(r['num_trained'] == 0 for r in recs)} | {recs[-1]['wall_s']:.1f} |")
  return "\n".join(lines)
