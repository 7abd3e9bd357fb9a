r"""Time to a target accuracy, in rounds and in simulated seconds, for runs already finished.

  python -m experiments.time_to_accuracy --target=0.85 runs/random runs/poc runs/oort

Each folder is a job's `--out_dir` (or one method's folder inside it) holding `seed<s>/metrics.jsonl`
files. Per folder, over its seeds: the final test accuracy (mean +- sample std), and the rounds and
the simulated time (`sim_time_s`, with `--system_profile`) until the test accuracy first reaches
the target, as the mean over the seeds that reached it and how many did. Round t counts the rounds
trained (round 0's record is the model after one round).
"""

import glob
import json
import math
import os

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_float("target", 0.85, "Target test accuracy, in (0, 1].")
flags.DEFINE_string("metric", "test_accuracy", "The accuracy metric of the records.")


def read_runs(folder: str) -> list[list[dict]]:
  """The records of every `seed*/metrics.jsonl` under `folder` (a torn last line dropped)."""
  paths = sorted(glob.glob(os.path.join(folder, "**", "metrics.jsonl"), recursive=True))
  if not paths:
    raise app.UsageError(f"{folder}: no metrics.jsonl under it")
  runs = []
  for path in paths:
    with open(path, encoding="utf-8") as f:
      lines = f.read().split("\n")
    records = []
    for line in lines:
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        continue
    runs.append(records)
  return runs


def reach(records: list[dict], metric: str, target: float):
  """(rounds trained, simulated seconds) when `metric` first reaches `target`, or None."""
  for r in records:
    if r.get(metric, -math.inf) >= target:
      return r["round"] + 1, r.get("cumulative_cost", {}).get("sim_time_s", 0.0)
  return None


def spread(values) -> str:
  values = np.asarray(values, float)
  if len(values) == 1:
    return f"{values[0]:.4f}"
  return f"{values.mean():.4f} +- {values.std(ddof=1):.4f}"


def table(folders: list[str], metric: str, target: float) -> str:
  head = (f"| run | seeds | final {metric} | rounds to {target:g} | simulated seconds to "
          f"{target:g} | simulated seconds, all rounds |")
  lines = [head, "|" + "---|" * 6]
  for folder in folders:
    runs = read_runs(folder)
    finals = [next(r[metric] for r in reversed(recs) if metric in r) for recs in runs]
    hits = [h for h in (reach(recs, metric, target) for recs in runs) if h is not None]
    total = np.mean([recs[-1].get("cumulative_cost", {}).get("sim_time_s", 0.0) for recs in runs])
    rounds = f"{np.mean([h[0] for h in hits]):.1f} ({len(hits)}/{len(runs)})" if hits else "never"
    seconds = f"{np.mean([h[1] for h in hits]):.0f}" if hits else "-"
    lines.append(f"| {os.path.basename(os.path.normpath(folder))} | {len(runs)} | "
                 f"{spread(finals)} | {rounds} | {seconds} | {total:.0f} |")
  return "\n".join(lines)


def main(argv):
  folders = argv[1:]
  if not folders:
    raise app.UsageError("name the run folders to compare")
  if not 0.0 < FLAGS.target <= 1.0:
    raise app.UsageError(f"--target must be in (0, 1], got {FLAGS.target}")
  print(table(folders, FLAGS.metric, FLAGS.target))


if __name__ == "__main__":
  app.run(main)
