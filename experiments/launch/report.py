"""What a launcher writes after its runs: the summary file, figure paths and titles.

  >>> from experiments import config, report
  >>> report.setup_title(config.JobConfig(), "FedAvg")
  'digits, N = 50, K = 10, mlp, 30 rounds, FedAvg'
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
from typing import Any

import numpy as np
from absl import app

from experiments.launch import config as cfglib
from experiments.launch import schema
from fedjax_sel.host.checkpoint import CheckpointError
from fedjax_sel.host.plotting import mean_std
from fedjax_sel.host.runner import read_history


def figure_path(cfg: cfglib.JobConfig, name: str) -> str:
  """`<out_dir>/<name>.<--figure_format>`."""
  return os.path.join(cfg.output.out_dir, f"{name}.{cfg.output.figure_format}")


def setup_title(cfg: cfglib.JobConfig, detail: str = "", with_k: bool = True) -> str:
  """A figure's title: the data, model, N, K (`with_k`) and rounds, and a launcher's `detail`."""
  k = f", K = {cfg.engine.clients_per_round}" if with_k else ""
  parts = [f"{cfg.parts.dataset.name}, N = {cfg.data.num_clients}{k}", cfg.parts.model.name,
           f"{cfg.engine.rounds} rounds"]
  return ", ".join(parts + ([detail] if detail else []))


TELEMETRY_HEADER = ("worst-10% client test acc | participation fairness (Jain) | clients never "
                    "taking part")


def telemetry_values(runs: list[list[dict]]) -> tuple[str, str, str]:
  """The runs' last evaluated selection telemetry (`host/telemetry.py`), mean +- sample std over
  the runs: the 10th percentile of the clients' test accuracy, Jain's index of participation, the
  share never taking part ("-" for records written before it existed)."""
  last = [next((r for r in reversed(recs) if "participation" in r), None) for recs in runs]
  if any(r is None for r in last):
    return "-", "-", "-"
  return (mean_std([r["client_test_accuracy"]["p10"] for r in last]),
          mean_std([r["participation"]["jain"] for r in last]),
          mean_std([r["participation"]["never"] for r in last]))


def telemetry_cells(runs: list[list[dict]]) -> str:
  """`telemetry_values` as the cells of a markdown row."""
  return " | ".join(telemetry_values(runs))


def reach_values(runs: list[list[dict]], metric: str, target: float) -> tuple[str, str]:
  """Rounds trained and simulated seconds until `metric` first reaches `target`: the means over
  the runs that reached it (the rounds with how many did, "never" when none; seconds "-" without
  a clock)."""
  hits = [h for h in (first_reach(recs, metric, target) for recs in runs) if h is not None]
  rounds = f"{np.mean([h[0] for h in hits]):.1f} ({len(hits)}/{len(runs)})" if hits else "never"
  seconds = f"{np.mean([h[1] for h in hits]):.0f}" if hits and any(h[1] for h in hits) else "-"
  return rounds, seconds


def method_table(cfg: cfglib.JobConfig, groups: dict[str, list[list[dict]]]) -> str:
  """Per method (and swept value), over its seeds (mean +- sample std, n stated): the final and
  best test accuracy, the mean over the last --last_k evaluated rounds, the rounds and simulated
  seconds to --target, the final test loss, and the selection telemetry (`telemetry_cells`);
  server steps in place of rounds in the asynchronous mode."""
  k, target = cfg.output.last_k, cfg.output.target
  reach = cfglib.number_text(target)
  steps = "server steps" if cfg.engine.mode == "async" else "rounds"
  lines = [f"| method | seeds | final test acc | best test acc | mean test acc, last {k} evaluated "
           f"{steps} | {steps} to {reach} | simulated s to {reach} | final test loss | "
           f"{TELEMETRY_HEADER} |", "|" + "---|" * 11]
  for name, runs in groups.items():
    ended = [recs[-1]["round"] + 1 for recs in runs if recs[-1]["round"] + 1 < cfg.engine.rounds]
    if ended:  # Runs that diverged: their rounds up to where they stopped.
      name += f" ({len(ended)} stopped, after {steps[:-1]} {min(ended)})"
    acc = [[r["test_accuracy"] for r in recs if "test_accuracy" in r] for recs in runs]
    loss = [[r["test_loss"] for r in recs if "test_loss" in r][-1] for recs in runs]
    rounds, seconds = reach_values(runs, "test_accuracy", target)
    lines.append(f"| {name} | {len(runs)} | {mean_std([a[-1] for a in acc])} | "
                 f"{mean_std([max(a) for a in acc])} | "
                 f"{mean_std([sum(a[-k:]) / len(a[-k:]) for a in acc])} | {rounds} | {seconds} | "
                 f"{mean_std(loss)} | {telemetry_cells(runs)} |")
  return "\n".join(lines + ["", f"Mean +- sample std over the seeds (one seed: its value); {steps} "
                            f"and simulated seconds to {reach} (--target): the mean over the "
                            "seeds that reached it (how many, in brackets; seconds '-' without "
                            "the clock)."])


def write_summary(cfg: cfglib.JobConfig, text: str) -> None:
  """Prints `text` and writes it to `<out_dir>/summary.md`."""
  print(text)
  with open(os.path.join(cfg.output.out_dir, "summary.md"), "w", encoding="utf-8") as f:
    f.write(text + "\n")


# --- Reading finished jobs (experiments.compare, experiments.bench) ---------------------------

@dataclasses.dataclass(frozen=True)
class ManifestRun:
  """One run of a job's manifest, `job.json` (`Job.record_runs` writes it; a manifest written
  before runs recorded their method lacks `method`)."""

  label: str
  seed: int
  folder: str
  launcher: str = ""
  method: str | None = None
  sweep: str | None = None
  swept: dict[str, Any] | None = None
  stopped: str | None = None


@dataclasses.dataclass(frozen=True)
class Manifest:
  """A job's manifest, `job.json`: its runs."""

  runs: tuple[ManifestRun, ...]


def read_job(folder: str, by: str | None = None) -> dict[str, list[list[dict]]]:
  """{method label: [records of each seed]} of one job folder (its job.json checked against
  `Manifest`, a usage error naming the field at fault). With `by` (a swept flag), the runs are
  grouped by its value instead ("NAME=V": every run with that value, whatever its method and
  other swept values)."""
  manifest = os.path.join(folder, "job.json")
  methods: dict[str, list[list[dict]]] = {}
  if os.path.exists(manifest):
    try:
      runs = schema.read(manifest, Manifest).runs
    except ValueError as e:
      raise app.UsageError(str(e)) from e
    # A run that stopped (diverged) is its own row: "(stopped)" after its method's label.
    entries = [((_method_of(r) if by is None else _value_of(r, by, manifest))
                + (" (stopped)" if r.stopped else ""), os.path.join(folder, r.folder))
               for r in runs]
  elif by is not None:
    raise app.UsageError(f"{folder}: --by={by} reads the swept values from job.json, which the "
                         "folder lacks")
  else:
    paths = sorted(glob.glob(os.path.join(folder, "**", "metrics.jsonl"), recursive=True))
    relative = [os.path.relpath(os.path.dirname(os.path.dirname(p)), folder) for p in paths]
    entries = [(rel if rel != "." else os.path.basename(os.path.normpath(folder)),
                os.path.dirname(p)) for rel, p in zip(relative, paths)]
  for method, run_folder in entries:
    path = os.path.join(run_folder, "metrics.jsonl")
    if not os.path.exists(path):
      raise app.UsageError(f"{folder}: the run folder {run_folder} holds no metrics.jsonl")
    try:
      methods.setdefault(method, []).append(read_history(path, math.inf))
    except CheckpointError as e:
      raise app.UsageError(f"{folder}: {e}") from e
  if not methods:
    raise app.UsageError(f"{folder}: no job.json and no metrics.jsonl under it")
  return methods


def _value_of(run: ManifestRun, by: str, manifest: str) -> str:
  """"NAME=V" of a run's swept value of `by`; a usage error when the run did not sweep it."""
  swept = run.swept or {}
  if by not in swept:
    raise app.UsageError(f"{manifest}: run {run.folder} did not sweep --{by} (it swept "
                         f"{', '.join(sorted(swept)) or 'nothing'})")
  value = swept[by]
  return f"{by}={cfglib.number_text(value) if isinstance(value, float) else value}"


def _method_of(run: ManifestRun) -> str:
  """A manifest entry's method and swept value, e.g. "FedAvg lr=0.1": its `method` and `sweep`
  (a manifest written before runs recorded their method: its label without the seed's word)."""
  if run.method is None:
    return " ".join(w for w in run.label.split() if w != f"s{run.seed}")
  return " ".join(p for p in (run.method, run.sweep) if p)


def first_reach(records: list[dict], metric: str, target: float):
  """(rounds trained, simulated seconds) when `metric` first reaches `target`, or None."""
  for r in records:
    if r.get(metric, -math.inf) >= target:
      return r["round"] + 1, r.get("cumulative_cost", {}).get("sim_time_s", 0.0)
  return None
