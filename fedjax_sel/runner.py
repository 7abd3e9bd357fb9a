"""Host loop around a `Simulator`: progress, per-round JSONL (flushed), checkpoints, resume.

A finished round is never lost: its metrics line is flushed before the next round starts, and the
engine state is checkpointed every `checkpoint_every` rounds; `run(..., resume=True)` continues
from the last checkpoint and truncates the metrics file to the rounds the checkpoint covers.

Example:
  >>> records = run(sim, rounds=5, out_dir="/tmp/run")   # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from typing import Any, Callable, TextIO

import jax
import numpy as np

from fedjax_sel.engine import EngineState, Simulator, to_host

METRICS_FILE = "metrics.jsonl"
CHECKPOINT_FILE = "checkpoint.pkl"


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


def save_checkpoint(path: str, state: EngineState) -> None:
  """Writes the state atomically (numpy arrays, readable without a device)."""
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    pickle.dump(jax.device_get(state), f)
  os.replace(tmp, path)


def load_checkpoint(path: str) -> EngineState:
  with open(path, "rb") as f:
    return jax.tree.map(jax.numpy.asarray, pickle.load(f))


def _truncate_metrics(path: str, rounds: int) -> None:
  if not os.path.exists(path):
    return
  with open(path, encoding="utf-8") as f:
    lines = [ln for ln in f if ln.strip() and json.loads(ln)["round"] < rounds]
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(lines)


def run(sim: Simulator, rounds: int, out_dir: str | None = None, *, eval_every: int = 1,
        checkpoint_every: int = 10, resume: bool = False, progress: TextIO | None = sys.stdout,
        label: str = "", extra: Callable[[EngineState, dict], dict] | None = None) -> list[dict]:
  """Runs `rounds` rounds (in total, counting resumed ones) and returns the per-round records.

  Args:
    sim: the simulator.
    rounds: T.
    out_dir: where `metrics.jsonl` and `checkpoint.pkl` go (None: keep in memory only).
    eval_every: evaluate the global model every this many rounds (and at the last round).
    checkpoint_every: checkpoint period in rounds.
    resume: continue from `out_dir/checkpoint.pkl` if present.
    progress: stream for the one-line-per-round progress display (None: silent).
    label: prefix of the progress lines.
    extra: optional `(state, record) -> dict` merged into each record (e.g. OPT ratios).
  """
  if rounds < 1:
    raise ValueError(f"rounds must be >= 1, got {rounds}")
  if eval_every < 1:
    raise ValueError(f"eval_every must be >= 1, got {eval_every}")
  state = sim.init()
  metrics_path = ckpt_path = None
  if out_dir is not None:
    os.makedirs(out_dir, exist_ok=True)
    metrics_path = os.path.join(out_dir, METRICS_FILE)
    ckpt_path = os.path.join(out_dir, CHECKPOINT_FILE)
    if resume and os.path.exists(ckpt_path):
      state = load_checkpoint(ckpt_path)
      _truncate_metrics(metrics_path, int(state.round))
    elif os.path.exists(metrics_path):
      os.remove(metrics_path)
  records = []
  start = time.perf_counter()
  first = int(state.round)
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
      if ckpt_path and ((t + 1) % checkpoint_every == 0 or t == rounds - 1):
        save_checkpoint(ckpt_path, state)
      if progress is not None:
        progress.write(progress_line(label, t, rounds, record) + "\n")
        progress.flush()
  finally:
    if sink:
      sink.close()
  return records


def progress_line(label: str, t: int, rounds: int, record: dict) -> str:
  parts = [f"{label}[{t + 1:>4}/{rounds}]", f"train {record['local_train_loss']:.4f}",
           f"sel {record['num_selected']}", f"trained {record['num_trained']}"]
  if "num_filtered" in record and record.get("filtered_in") is not None:
    parts.append(f"filtered {record['num_filtered']}")
  if "test_accuracy" in record:
    parts.append(f"test acc {record['test_accuracy']:.4f} loss {record['test_loss']:.4f}")
  parts.append(f"{record['wall_s']:.1f}s")
  return "  ".join(parts)


def summary_table(rows: list[tuple[str, list[dict]]]) -> str:
  """Markdown table of final and best test accuracy, final losses and costs per labelled run."""
  head = ("| run | final test acc | best test acc (round) | final test loss | final train loss | "
          "train samples | uploads | wall s |")
  lines = [head, "|" + "---|" * 8]
  for label, recs in rows:
    evald = [r for r in recs if "test_accuracy" in r]
    last = evald[-1]
    best = max(evald, key=lambda r: r["test_accuracy"])
    cost = recs[-1]["cumulative_cost"]
    lines.append(f"| {label} | {last['test_accuracy']:.4f} | {best['test_accuracy']:.4f} "
                 f"({best['round']}) | {last['test_loss']:.4f} | {last['train_loss']:.4f} | "
                 f"{cost['train_samples']:.0f} | {cost['uploads']:.0f} | {recs[-1]['wall_s']:.1f} |")
  return "\n".join(lines)
