r"""The selection benchmark: every selector x named scenarios, one leaderboard.

  python -m experiments.bench --out_dir=runs/bench                  # every registered selector
  python -m experiments.bench --selectors=random,oort,md --scenarios=label_skew,clock_deadline
  python -m experiments.bench --quick --out_dir=/tmp/bench         # tiny jobs, two rounds

The scenarios are `experiments/bench_scenarios.json` (each the `experiments.run` flags of one job,
beside the common ones: label skew, quantity skew, corrupted clients, heterogeneous speeds with a
deadline, diurnal availability). Each (scenario, selector) is one `experiments.run` job in
`<out_dir>/<scenario>/<selector>`, its seeds batched into one compiled program; a job that
finished is read again, one that stopped is resumed (`--resume`), so a killed benchmark goes on
where it was. `<out_dir>/leaderboard.md` and `leaderboard.csv` hold one row per selector and
scenario (mean +- sample std over the seeds): final test accuracy, the mean of the last
`--last_k` evaluated rounds, rounds and simulated seconds to the target (seeds that reached it),
the worst-10% client's accuracy, Jain's index of participation, the samples clients spent on
selection alone, and stragglers; `leaderboard_ranks.png` ranks the selectors per scenario by
final accuracy, and `participation.png` shows each selector's histogram of how often the clients
took part.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
from absl import app, flags

from experiments import job as joblib
from experiments import report
from fedjax_sel import registry
from fedjax_sel.host.plotting import mean_std

FLAGS = flags.FLAGS
SCENARIOS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_scenarios.json")
flags.DEFINE_string("out_dir", "runs/bench", "Folder of the benchmark's jobs and leaderboard.")
flags.DEFINE_list("selectors", [], "Selectors to rank (default: every registered one).")
flags.DEFINE_list("scenarios", [], "Scenarios of the scenarios file (default: all).")
flags.DEFINE_string("scenarios_file", SCENARIOS_FILE, "The benchmark's scenarios: a JSON file of "
                    "common flags, quick flags, a target accuracy and named scenarios.")
flags.DEFINE_bool("quick", False, "Tiny jobs of two rounds (the suite's and CI's smoke run).")
flags.DEFINE_integer("last_k", 10, "Evaluated rounds of the last-k mean, >= 1.")

COLUMNS = ("scenario", "selector", "seeds", "final_acc", "last_k_acc", "rounds_to_target",
           "sim_s_to_target", "worst10_client_acc", "jain", "selection_samples", "stragglers")


def load_scenarios(path: str) -> dict:
  """The scenarios file, checked: ValueError naming the file and what is wrong."""
  try:
    with open(path, encoding="utf-8") as f:
      spec = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise ValueError(f"{path}: not a readable JSON file ({e})") from e
  for key in ("common", "quick", "target", "scenarios"):
    if key not in spec:
      raise ValueError(f"{path}: has no {key!r} (it needs common, quick, target, scenarios)")
  if not spec["scenarios"] or not all(isinstance(v, list) for v in spec["scenarios"].values()):
    raise ValueError(f"{path}: scenarios must map names to lists of flags")
  return spec


def run_job(folder: str, flags_: list[str]) -> None:
  """One `experiments.run` job into `folder`: read again when finished, resumed when it was
  stopped, started otherwise; its output is the job's `bench.log`."""
  os.makedirs(folder, exist_ok=True)
  started = os.path.exists(os.path.join(folder, "job.json"))
  args = [sys.executable, "-m", "experiments.run", *flags_, f"--out_dir={folder}"]
  args += ["--resume"] if started else []
  with open(os.path.join(folder, "bench.log"), "a", encoding="utf-8") as log:
    proc = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT, check=False)
  if proc.returncode:
    raise app.UsageError(f"{' '.join(args[2:])} failed (exit {proc.returncode}); its output is "
                         f"in {os.path.join(folder, 'bench.log')}")


def row(scenario: str, selector: str, runs: list[list[dict]], target: float,
        last_k: int) -> dict:
  """One leaderboard row from a job's runs (cells as text, mean +- sample std over the seeds)."""
  acc = [[r["test_accuracy"] for r in recs if "test_accuracy" in r] for recs in runs]
  rounds, seconds = report.reach_values(runs, "test_accuracy", target)
  worst10, jain, _ = report.telemetry_values(runs)
  final = [recs[-1] for recs in runs]
  selection = [f["cumulative_cost"]["client_eval_samples"]
               + f["cumulative_cost"]["client_grad_samples"] for f in final]
  stragglers = [sum(r.get("stragglers", 0) for r in recs) for recs in runs]
  return {"scenario": scenario, "selector": selector, "seeds": len(runs),
          "final_acc": mean_std([a[-1] for a in acc]),
          "last_k_acc": mean_std([np.mean(a[-last_k:]) for a in acc]),
          "rounds_to_target": rounds, "sim_s_to_target": seconds,
          "worst10_client_acc": worst10, "jain": jain,
          "selection_samples": f"{np.mean(selection):.0f}",
          "stragglers": f"{np.mean(stragglers):.1f}"}


def write_leaderboard(out_dir: str, rows: list[dict], target: float, last_k: int) -> None:
  """`leaderboard.md`, `leaderboard.csv` and the rank figure."""
  with open(os.path.join(out_dir, "leaderboard.csv"), "w", encoding="utf-8", newline="") as f:
    writer = csv.DictWriter(f, COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
  heads = ("scenario", "selector", "seeds", "final acc", f"mean acc, last {last_k} evaluated",
           f"rounds to {target:g}", f"simulated s to {target:g}", "worst-10% client acc",
           "participation fairness (Jain)", "selection samples", "stragglers")
  lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
  lines += ["| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in rows]
  lines += ["", "Mean +- sample std over the seeds; rounds and simulated seconds to the target: "
            "the mean over the seeds that reached it (how many, in brackets)."]
  with open(os.path.join(out_dir, "leaderboard.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  rank_figure(rows, os.path.join(out_dir, "leaderboard_ranks.png"))


def rank_figure(rows: list[dict], path: str) -> None:
  """A heatmap of each selector's rank by final accuracy in each scenario (1 = best)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
  selectors = list(dict.fromkeys(r["selector"] for r in rows))
  value = {(r["scenario"], r["selector"]): float(r["final_acc"].split()[0]) for r in rows}
  ranks = np.full((len(selectors), len(scenarios)), np.nan)
  for j, s in enumerate(scenarios):
    order = sorted(selectors, key=lambda m, s=s: -value.get((s, m), -np.inf))
    for i, m in enumerate(selectors):
      if (s, m) in value:
        ranks[i, j] = order.index(m) + 1
  fig, ax = plt.subplots(figsize=(1.6 * len(scenarios) + 3, 0.35 * len(selectors) + 1.5))
  image = ax.imshow(ranks, cmap="viridis_r", aspect="auto")
  ax.set_xticks(range(len(scenarios)), scenarios, rotation=30, ha="right")
  ax.set_yticks(range(len(selectors)), selectors)
  for i in range(len(selectors)):
    for j in range(len(scenarios)):
      if not np.isnan(ranks[i, j]):
        light = ranks[i, j] <= (np.nanmax(ranks) + 1) / 2  # viridis_r: best ranks are yellow.
        ax.text(j, i, int(ranks[i, j]), ha="center", va="center", fontsize=8,
                color="black" if light else "white")
  ax.set_title("rank by final test accuracy (1 = best)")
  fig.colorbar(image, ax=ax, label="rank")
  fig.tight_layout()
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)


def participation_figure(jobs: dict[tuple[str, str], list[list[dict]]], path: str) -> None:
  """Per scenario (rows) and selector (columns): the histogram of how many rounds each client
  took part in, pooled over the seeds (a uniform selector is a narrow bump; one that favours a
  few clients a long tail and a spike at 0)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  from matplotlib.ticker import MaxNLocator  # pylint: disable=import-outside-toplevel
  scenarios = list(dict.fromkeys(s for s, _ in jobs))
  selectors = list(dict.fromkeys(m for _, m in jobs))
  fig, axes = plt.subplots(len(scenarios), len(selectors), squeeze=False, sharey="row",
                           figsize=(1.9 * len(selectors) + 1, 1.6 * len(scenarios) + 1))
  for i, scenario in enumerate(scenarios):
    for j, selector in enumerate(selectors):
      ax = axes[i][j]
      counts = [c for recs in jobs.get((scenario, selector), [])
                for c in recs[-1].get("participations", [])]
      if counts:
        ax.hist(counts, bins=np.arange(max(counts) + 2) - 0.5, color="tab:blue")
      if i == 0:
        ax.set_title(selector, fontsize=8)
      if j == 0:
        ax.set_ylabel(f"{scenario}\nclients", fontsize=8)
      if i == len(scenarios) - 1:
        ax.set_xlabel("rounds taken part", fontsize=8)
      ax.tick_params(labelsize=7)
      ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    spec = load_scenarios(FLAGS.scenarios_file)
  except ValueError as e:
    raise app.UsageError(f"--scenarios_file: {e}") from e
  known = registry.names("selector")
  selectors = FLAGS.selectors or list(known)
  bad = [s for s in selectors if s not in known and ":" not in s]
  if bad:
    raise app.UsageError(f"--selectors: unknown {bad}; accepted: {', '.join(known)}")
  scenarios = FLAGS.scenarios or list(spec["scenarios"])
  bad = [s for s in scenarios if s not in spec["scenarios"]]
  if bad:
    raise app.UsageError(f"--scenarios: unknown {bad}; accepted: "
                         f"{', '.join(spec['scenarios'])}")
  if FLAGS.last_k < 1:
    raise app.UsageError(f"--last_k must be >= 1, got {FLAGS.last_k}")
  common = spec["quick"] if FLAGS.quick else spec["common"]
  rows, jobs = [], {}
  for scenario in scenarios:
    for selector in selectors:
      folder = os.path.join(FLAGS.out_dir, scenario, selector.replace(":", "_"))
      print(f"== {scenario} / {selector}", flush=True)
      run_job(folder, [*common, *spec["scenarios"][scenario], f"--selector={selector}"])
      runs = [r for method in report.read_job(folder).values() for r in method]
      jobs[scenario, selector] = runs
      rows.append(row(scenario, selector, runs, spec["target"], FLAGS.last_k))
  write_leaderboard(FLAGS.out_dir, rows, spec["target"], FLAGS.last_k)
  participation_figure(jobs, os.path.join(FLAGS.out_dir, "participation.png"))
  print(f"leaderboard: {os.path.join(FLAGS.out_dir, 'leaderboard.md')}")


if __name__ == "__main__":
  app.run(joblib.cli(main))
