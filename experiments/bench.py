r"""The selection benchmark: every selector x named scenarios, one leaderboard.

  python -m experiments.bench --out_dir=runs/bench                  # every registered selector
  python -m experiments.bench --selectors=random,oort,md --scenarios=label_skew,clock_deadline
  python -m experiments.bench --quick --out_dir=/tmp/bench         # tiny jobs, two rounds

The scenarios are `experiments/bench_scenarios.json` (each the `experiments.run` flags of one job,
beside the common ones; the help of `--scenarios` below names those of the file the benchmark
comes with). Each (scenario, selector) is one `experiments.run` job in
`<out_dir>/<scenario>/<selector>`, its seeds batched into one compiled program; a job that
finished is read again, one that stopped is resumed (`--resume`), so a killed benchmark goes on
where it was; Ctrl-C or a SIGTERM stops the job it is running too (no process outlives it).
`<out_dir>/leaderboard.md` and `leaderboard.csv` hold one row per selector and scenario: the final
test accuracy with its 95% interval over the seeds, its paired comparison with random on the same
seeds (the mean difference and its interval, "better" or "worse" only where the interval excludes
0, the seeds won / tied / lost: `reports/statistics.py`), then, as mean +- sample std, the mean of
the last `--last_k` evaluated rounds, rounds and simulated seconds to the target (seeds that
reached it), the worst-10% client's accuracy, Jain's index of participation, the samples clients
spent on selection alone, and stragglers; `leaderboard_ranks.png` ranks the selectors per scenario
by final accuracy, and `participation.png` shows each selector's histogram of how often the
clients took part. The CSV carries the numbers too (mean, std, interval, n; the paired difference,
its interval and counts); every output of a `--quick` run says it is a smoke run. With `--tune`, a
selector the scenarios file tunes (`"tune": {"oort": ["--sweep=oort_exploration:0.1,0.5,0.9"]}`)
is compared at its best setting: its job sweeps them (one batched program where the settings are
values), a tenth of each client's data is held out, and the setting with the best final
validation accuracy gives its row (`tuning.md` lists every setting's validation and test accuracy;
the test split never chooses).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
from absl import app, flags

from experiments.launch import cli, report, schema
from experiments.reports import statistics
from experiments.launch.config import number_text
from fedjax_sel import registry
from fedjax_sel.host.plotting import mean_std

FLAGS = flags.FLAGS
SCENARIOS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_scenarios.json")


def scenario_names(path: str = SCENARIOS_FILE) -> list[str]:
  """The names of the scenarios of the scenarios file `path`, in its order (for `--help`)."""
  with open(path, encoding="utf-8") as f:
    return list(json.load(f)["scenarios"])


flags.DEFINE_string("out_dir", "runs/bench", "Folder of the benchmark's jobs and leaderboard.")
flags.DEFINE_list("selectors", [], "Selectors to rank (default: every registered one).")
flags.DEFINE_list("scenarios", [], "Scenarios of the scenarios file to run (default: all; the "
                  f"default file's: {', '.join(scenario_names())}).")
flags.DEFINE_string("scenarios_file", SCENARIOS_FILE, "The benchmark's scenarios: a JSON file of "
                    "common flags, quick flags, a target accuracy and named scenarios.")
flags.DEFINE_bool("quick", False, "Tiny jobs of two rounds (the suite's and CI's smoke run).")
flags.DEFINE_bool("tune", False, "Compare each selector the scenarios file tunes (its `tune` "
                  "entry) at its best setting: its job sweeps them, a tenth of each client's data "
                  "is held out, and the setting with the best final validation accuracy (mean "
                  "over the seeds, never the test accuracy) gives its row.")
flags.DEFINE_integer("last_k", 10, "Evaluated rounds of the last-k mean, >= 1.")
cli.define_finite_float("job_timeout_s", 1800.0, "Wall seconds after which a job's process is "
                        "taken as hung: killed and resumed from its checkpoint once.", above=0)

COLUMNS = ("scenario", "selector", "seeds", "final_acc", "last_k_acc", "rounds_to_target",
           "sim_s_to_target", "worst10_client_acc", "jain", "selection_samples", "stragglers")


@dataclasses.dataclass(frozen=True)
class Scenarios:
  """The scenarios file (`--scenarios_file`): the `experiments.run` flags every job shares
  (`common`; `quick` in their place with --quick), the target test accuracy of the leaderboard's
  time-to-target columns, each scenario's own flags by name, and per selector the `--sweep`
  flags of its tuning (`tune`, used with --tune)."""

  common: tuple[str, ...]
  quick: tuple[str, ...]
  target: float
  scenarios: dict[str, tuple[str, ...]]
  about: str = ""
  tune: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


OWN_FLAGS = ("--out_dir", "--selector", "--resume", "--overwrite")  # The benchmark sets these.


def load_scenarios(path: str) -> Scenarios:
  """The scenarios file, checked against `Scenarios`: ValueError naming the file and the field
  at fault (`scenarios.label_skew[2]`)."""
  spec = schema.read(path, Scenarios)
  if not spec.scenarios:
    raise ValueError(f"{path}: scenarios must name at least one scenario")
  if not 0 < spec.target <= 1:
    raise ValueError(f"{path}: target must be a test accuracy in (0, 1], got {spec.target}")
  lists = {"common": spec.common, "quick": spec.quick,
           **{f"scenarios.{name}": flags_ for name, flags_ in spec.scenarios.items()},
           **{f"tune.{name}": flags_ for name, flags_ in spec.tune.items()}}
  for name, flags_ in spec.tune.items():
    for i, flag in enumerate(flags_):
      if not flag.startswith("--sweep="):
        raise ValueError(f"{path}: tune.{name}[{i}] must be a '--sweep=NAME:V1,V2' flag, got "
                         f"{flag!r}")
  for field, flags_ in lists.items():
    for i, flag in enumerate(flags_):
      if not flag.startswith("--"):
        raise ValueError(f"{path}: {field}[{i}] must be a flag '--name=value', got {flag!r}")
      if flag.split("=", 1)[0] in OWN_FLAGS:
        raise ValueError(f"{path}: {field}[{i}] is {flag!r}, which the benchmark sets for "
                         f"each job ({', '.join(OWN_FLAGS)})")
  return spec


TIMING_FILE = "timing.json"
STOP_GRACE_S = 60.0  # Seconds a stopped job's process has to end its round before it is killed.


def run_job(folder: str, flags_: list[str], timeout_s: float = 1800.0) -> list[dict]:
  """One `experiments.run` job into `folder`, under `benchmarks.timed_launch`: read again when it
  finished, resumed when it was stopped, started otherwise; its output is the job's `bench.log`.
  A process that runs past `timeout_s` (a hang) is killed and the job resumed once. An interrupt
  (SIGINT, or SIGTERM: `cli.interrupt_on_sigterm`) stops the job's process (`stop`), keeps its
  timing and is raised again: no process outlives the benchmark.

  Returns:
    The timings of the processes that trained its rounds (`<folder>/timing.json`, one entry per
    such process: wall seconds by phase, rounds trained, programs compiled; a process that found
    every round done adds none).
  """
  os.makedirs(folder, exist_ok=True)
  fresh = os.path.join(folder, "timing.new.json")
  keep_timing(folder, fresh)  # A process whose benchmark was killed (SIGKILL) ended on its own.
  for attempt in range(2):
    started = os.path.exists(os.path.join(folder, "job.json"))
    args = [sys.executable, "-m", "benchmarks.timed_launch", fresh, "experiments.run", *flags_,
            f"--out_dir={folder}"]
    args += ["--resume"] if started else []
    with open(os.path.join(folder, "bench.log"), "a", encoding="utf-8") as log:
      proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
      try:
        proc.wait(timeout_s)
        break
      except subprocess.TimeoutExpired:  # Killed; its checkpoint stays, the retry resumes it.
        proc.kill()
        proc.wait()
        print(f"   {folder}: no end after {timeout_s:.0f} s, killed"
              + ("; resuming it" if attempt == 0 else ""), flush=True)
      except KeyboardInterrupt:
        stop(proc, folder)
        keep_timing(folder, fresh)
        raise
  else:
    raise app.UsageError(f"{folder}: the job did not end in {timeout_s:.0f} s twice "
                         f"(--job_timeout_s); its output is in "
                         f"{os.path.join(folder, 'bench.log')}")
  if proc.returncode:
    raise app.UsageError(f"{' '.join(args[4:])} failed (exit {proc.returncode}); its output is "
                         f"in {os.path.join(folder, 'bench.log')}")
  return keep_timing(folder, fresh)


def stop(proc: subprocess.Popen, folder: str, grace_s: float = STOP_GRACE_S) -> None:
  """Stops a job's process as an interrupt stops a launcher (SIGTERM: it ends its round, keeps
  its finished rounds and writes its timing) and waits for it; kills it after `grace_s` or at a
  second interrupt."""
  print(f"   stopping the job in {folder} (a second interrupt kills it)", file=sys.stderr,
        flush=True)
  proc.terminate()
  try:
    proc.wait(grace_s)
  except (subprocess.TimeoutExpired, KeyboardInterrupt):
    proc.kill()
    proc.wait()


def keep_timing(folder: str, fresh: str) -> list[dict]:
  """Adds the timing a job's process wrote (`fresh`, removed) to `<folder>/timing.json` when the
  process trained rounds (it compiled a round program or loaded one from the executable store);
  returns the job's timings."""
  path = os.path.join(folder, TIMING_FILE)
  timings = []
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      timings = json.load(f)
  if not os.path.exists(fresh):
    return timings
  with open(fresh, encoding="utf-8") as f:
    latest = json.load(f)
  os.remove(fresh)
  if latest["round_compiles"] + latest.get("round_loads", 0):
    timings.append(latest)
    with open(path, "w", encoding="utf-8") as f:
      json.dump(timings, f, indent=1)
  return timings


def row(scenario: str, selector: str, runs: list[list[dict]], target: float,
        last_k: int) -> dict:
  """One leaderboard row from a job's runs: cells as text (the final accuracy with its 95% interval
  over the seeds, the others mean +- sample std), and the final accuracy's numbers
  (`final_acc_mean`, `_std`, `_low`, `_high`, `_n`)."""
  acc = [[r["test_accuracy"] for r in recs if "test_accuracy" in r] for recs in runs]
  rounds, seconds = report.reach_values(runs, "test_accuracy", target)
  worst10, jain, _ = report.telemetry_values(runs)
  final = [recs[-1] for recs in runs]
  clients = [f["cumulative_cost"]["client_eval_samples"]
             + f["cumulative_cost"]["client_grad_samples"] for f in final]
  server = [f["cumulative_cost"]["server_public_samples"] for f in final]
  stragglers = [sum(r.get("stragglers", 0) for r in recs) for recs in runs]
  final_acc = statistics.interval([a[-1] for a in acc])
  return {"scenario": scenario, "selector": selector, "seeds": len(runs),
          "final_acc": final_acc.text(), **{f"final_acc_{k}": v
                                            for k, v in final_acc._asdict().items()},
          "last_k_acc": mean_std([np.mean(a[-last_k:]) for a in acc]),
          "rounds_to_target": rounds, "sim_s_to_target": seconds,
          "worst10_client_acc": worst10, "jain": jain,
          "selection_samples": f"{np.mean(clients):.0f} / {np.mean(server):.0f}",
          "stragglers": f"{np.mean(stragglers):.1f}"}


def tables(out_dir: str, name: str, columns: tuple[str, ...], heads: tuple[str, ...],
           rows: list[dict], csv_columns: tuple[str, ...] = ()) -> list[str]:
  """Writes `<out_dir>/<name>.csv` (a header of `columns` and `csv_columns`, a line per row) and
  returns the lines of the rows' `columns` as a markdown table under `heads`."""
  with open(os.path.join(out_dir, f"{name}.csv"), "w", encoding="utf-8", newline="") as f:
    writer = csv.DictWriter(f, (*columns, *csv_columns), extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
  return (["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
          + ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows])


# The leaderboard CSV's numbers beside its text cells: the final accuracy's mean, sample std, 95%
# interval and seeds, and the paired comparison with random on the same seeds.
NUMERIC_COLUMNS = ("final_acc_mean", "final_acc_std", "final_acc_low", "final_acc_high",
                   "final_acc_n", "vs_random_mean", "vs_random_low", "vs_random_high",
                   "vs_random_wins", "vs_random_ties", "vs_random_losses", "vs_random_verdict",
                   "smoke_run")
SMOKE = ("SMOKE RUN (--quick): two-round jobs that check the benchmark runs; their numbers rank "
         "nothing")


def write_leaderboard(out_dir: str, rows: list[dict], target: float, last_k: int,
                      smoke: bool = False) -> None:
  """`leaderboard.md`, `leaderboard.csv` (text cells, then `NUMERIC_COLUMNS`) and the rank
  figure; a `smoke` run (--quick) says so in each."""
  for r in rows:
    r["smoke_run"] = smoke
  reach = number_text(target)
  heads = ("scenario", "selector", "seeds", "final acc [95% interval]",
           f"mean acc, last {last_k} evaluated",
           f"rounds to {reach}", f"simulated s to {reach}", "worst-10% client acc",
           "participation fairness (Jain)", "selection samples (clients / server)", "stragglers")
  columns = COLUMNS
  if any(r.get("setting") for r in rows):  # --tune: the setting each tuned row was run at.
    columns, heads = (*COLUMNS[:2], "setting", *COLUMNS[2:]), (*heads[:2], "tuned setting",
                                                              *heads[2:])
  if any(r.get("vs_random") for r in rows):
    columns, heads = (*columns, "vs_random"), (*heads, "vs random, same seeds")
  lines = tables(out_dir, "leaderboard", columns, heads, rows, NUMERIC_COLUMNS)
  lines = ([f"**{SMOKE}.**", ""] if smoke else []) + lines
  lines += ["", "Final accuracy: the mean over the seeds with its 95% Student's t interval; the "
            "others: mean +- sample std; rounds and simulated seconds to the target: the mean "
            "over the seeds that reached it (how many, in brackets). vs random: the mean "
            "difference from the random selector's final accuracy on the same seeds with its 95% "
            "interval, 'better' or 'worse' only where the interval excludes 0, then the seeds "
            "won / tied / lost."]
  with open(os.path.join(out_dir, "leaderboard.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  rank_figure(rows, os.path.join(out_dir, "leaderboard_ranks.png"), smoke)


TIMING_COLUMNS = ("scenario", "selector", "processes", "wall_s", "compile_s", "round_programs",
                  "ms_per_round", "x_random")


def timing_rows(timings: dict[tuple[str, str], list[dict]], rounds: int) -> list[dict]:
  """Per job: the wall and compile seconds of the processes that trained it (one that was stopped
  and the one that resumed it alike), the round programs they compiled, the milliseconds per
  round they trained (every seed in one step, compilation excluded; a round a stopped process
  trained after its last checkpoint counts each time it ran; `rounds` per job where a timing
  predates the count) and that against the random selector's in the same scenario (what
  selection and the statistics it needs add to a round). A job no process of which was timed
  (every round trained by a process that wrote no timing) has "-" cells, not zeros."""
  rows = []
  for (scenario, selector), procs in timings.items():
    if not procs:
      rows.append({"scenario": scenario, "selector": selector, "processes": 0,
                   **dict.fromkeys(TIMING_COLUMNS[3:], "-")})
      continue
    trained = (sum(p["rounds_trained"] for p in procs)
               if all("rounds_trained" in p for p in procs) else rounds)
    rows.append({"scenario": scenario, "selector": selector, "processes": len(procs),
                 "wall_s": round(sum(p["total_s"] for p in procs), 1),
                 "compile_s": round(sum(p["compile_s"] for p in procs), 1),
                 "round_programs": sum(p["round_compiles"] + p.get("round_loads", 0)
                                       for p in procs),
                 "ms_per_round": round(1e3 * sum(p["rounds_s"] for p in procs)
                                       / max(trained, 1), 1)})
  timed = [r for r in rows if r["processes"]]
  base = {r["scenario"]: r["ms_per_round"] for r in timed if r["selector"] == "random"}
  for r in timed:
    r["x_random"] = (round(r["ms_per_round"] / base[r["scenario"]], 2)
                     if base.get(r["scenario"]) else "-")
  return rows


def write_timing(out_dir: str, rows: list[dict]) -> None:
  """`timing.md` (per job, then per scenario) and `timing.csv`: how long the benchmark took on
  this machine, kept apart from the leaderboard, which is the same on every rerun."""
  heads = ("scenario", "selector", "processes", "wall s", "compile s",
           "round programs compiled or loaded", "ms per round (all seeds)", "x random's round")
  lines = tables(out_dir, "timing", TIMING_COLUMNS, heads, rows)
  lines += ["", "| scenario | jobs | wall s | compile s | round programs compiled or loaded |",
            "|---|---|---|---|---|"]
  timed = [r for r in rows if r["processes"]]  # "-" rows: no process of theirs was timed.
  for scenario in dict.fromkeys(r["scenario"] for r in rows):
    mine = [r for r in timed if r["scenario"] == scenario]
    lines.append(f"| {scenario} | {len(mine)} | {sum(r['wall_s'] for r in mine):.0f} | "
                 f"{sum(r['compile_s'] for r in mine):.0f} | "
                 f"{sum(r['round_programs'] for r in mine)} |")
  total = sum(r["wall_s"] for r in timed)
  lines += ["", f"All jobs: {total / 60:.1f} min of wall time (a job's seeds share one compiled "
            "round program; a job that was stopped counts the process that resumed it too)."]
  with open(os.path.join(out_dir, "timing.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")


def target_figure(jobs: dict[tuple[str, str], list[list[dict]]], target: float,
                  path: str, smoke: bool = False) -> None:
  """Per scenario, each selector's rounds to the target accuracy (simulated seconds where every
  selector of the scenario ran on the clock), the mean over the seeds that reached it with how
  many did; "never" where none did."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  scenarios = list(dict.fromkeys(s for s, _ in jobs))
  selectors = list(dict.fromkeys(m for _, m in jobs))
  fig, axes = plt.subplots(1, len(scenarios), squeeze=False, sharey=True,
                           figsize=(2.6 * len(scenarios) + 1.5, 0.28 * len(selectors) + 1.6))
  for ax, scenario in zip(axes[0], scenarios):
    hits = {m: [h for h in (report.first_reach(recs, "test_accuracy", target)
                            for recs in jobs[scenario, m]) if h is not None] for m in selectors}
    # Simulated seconds where every selector ran on the clock (some turn it on for themselves).
    clock = all(h[1] for hs in hits.values() for h in hs)
    ax.set_title(scenario, fontsize=9)
    ax.set_xlabel("simulated s" if clock else "rounds", fontsize=8)
    for i, m in enumerate(selectors):
      n = len(jobs[scenario, m])
      if hits[m]:
        value = np.mean([h[1] if clock else h[0] for h in hits[m]])
        ax.barh(i, value, color="tab:blue" if len(hits[m]) == n else "tab:orange")
        ax.text(value, i, f" {len(hits[m])}/{n}", va="center", fontsize=6)
      else:
        ax.text(0, i, " never", va="center", fontsize=6, color="tab:red")
    ax.tick_params(labelsize=7)
    ax.margins(x=0.25)
  axes[0][0].set_yticks(range(len(selectors)), selectors)
  axes[0][0].invert_yaxis()
  fig.suptitle(("SMOKE RUN (--quick): meaningless\n" if smoke else "")
               + f"time to test accuracy {number_text(target)} (mean over the seeds that reached "
               "it; orange: not every seed did)", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)


def rank_figure(rows: list[dict], path: str, smoke: bool = False) -> None:
  """A heatmap of each selector's rank by final accuracy in each scenario (1 = best)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
  selectors = list(dict.fromkeys(r["selector"] for r in rows))
  value = {(r["scenario"], r["selector"]): r["final_acc_mean"] for r in rows}
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
  ax.set_title(("SMOKE RUN (--quick): meaningless\n" if smoke else "")
               + "rank by final test accuracy (1 = best)")
  fig.colorbar(image, ax=ax, label="rank")
  fig.tight_layout()
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)


def participation_figure(jobs: dict[tuple[str, str], list[list[dict]]], path: str,
                         smoke: bool = False) -> None:
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
  if smoke:
    fig.suptitle("SMOKE RUN (--quick): meaningless", fontsize=9, color="tab:red")
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)


def best_point(points: dict[str, list[list[dict]]]) -> str:
  """The swept point (a `read_job` key) whose runs end with the best mean validation accuracy
  (ties: the first); chosen on the clients' held-out split, never on the test split."""
  def score(name):
    finals = [[r["val_accuracy"] for r in recs if "val_accuracy" in r] for recs in points[name]]
    if not all(finals):
      raise app.UsageError(f"{name}: its runs report no val_accuracy (no validation split)")
    return np.mean([f[-1] for f in finals])
  return max(points, key=score)


def setting_of(point: str) -> str:
  """The swept values of a `read_job` key ("FedAvg + oort oort_exploration=0.9" ->
  "oort_exploration=0.9")."""
  return " ".join(word for word in point.split() if "=" in word)


def write_tuning(out_dir: str, tuned: list[tuple]) -> None:
  """`tuning.md`: per tuned selector and scenario, every setting's final validation and test
  accuracy (mean +- sample std over the seeds), the chosen one marked."""
  lines = ["| scenario | selector | setting | final val acc | final test acc | chosen |",
           "|---|---|---|---|---|---|"]
  for scenario, selector, chosen, points in tuned:
    for name, runs in points.items():
      val = [[r["val_accuracy"] for r in recs if "val_accuracy" in r][-1] for recs in runs]
      test = [[r["test_accuracy"] for r in recs if "test_accuracy" in r][-1] for recs in runs]
      lines.append(f"| {scenario} | {selector} | {setting_of(name)} | {mean_std(val)} | "
                   f"{mean_std(test)} | {'yes' if name == chosen else ''} |")
  text = "\n".join(lines + ["", "Each tuned selector's leaderboard row is its setting with the "
                            "best final validation accuracy (the clients' held-out tenth), never "
                            "chosen on the test accuracy shown here."]) + "\n"
  with open(os.path.join(out_dir, "tuning.md"), "w", encoding="utf-8") as f:
    f.write(text)


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
  scenarios = FLAGS.scenarios or list(spec.scenarios)
  bad = [s for s in scenarios if s not in spec.scenarios]
  if bad:
    raise app.UsageError(f"--scenarios: unknown {bad}; accepted: {', '.join(spec.scenarios)}")
  if FLAGS.last_k < 1:
    raise app.UsageError(f"--last_k must be >= 1, got {FLAGS.last_k}")
  common = spec.quick if FLAGS.quick else spec.common
  rows, jobs, timings, tuned = [], {}, {}, []
  for scenario in scenarios:
    for selector in selectors:
      folder = os.path.join(FLAGS.out_dir, scenario, selector.replace(":", "_"))
      print(f"== {scenario} / {selector}", flush=True)
      tuning = list(spec.tune.get(selector, ())) if FLAGS.tune else []
      held_out = [] if not tuning or any(f.startswith("--val_fraction=")
                                         for f in spec.scenarios[scenario]) else [
                                             "--val_fraction=0.1"]
      try:
        timings[scenario, selector] = run_job(
            folder, [*common, *spec.scenarios[scenario], f"--selector={selector}", *tuning,
                     *held_out], FLAGS.job_timeout_s)
      except KeyboardInterrupt:
        sys.stderr.write(f"interrupted: the job {scenario} / {selector} was stopped and no "
                         f"process of the benchmark is left; every finished round is kept (its "
                         f"output: {os.path.join(folder, 'bench.log')}): run the same command "
                         "again to go on where it stopped\n")
        sys.exit(130)
      points = report.read_job(folder)
      chosen = best_point(points) if tuning else next(iter(points))
      if tuning:
        tuned.append((scenario, selector, chosen, points))
      jobs[scenario, selector] = runs = points[chosen]
      rows.append(row(scenario, selector, runs, spec.target, FLAGS.last_k)
                  | ({"setting": setting_of(chosen)} if tuning else {}))
  finals = {key: [[r["test_accuracy"] for r in recs if "test_accuracy" in r][-1] for recs in runs]
            for key, runs in jobs.items()}
  statistics.compare_with_random(rows, finals)
  write_leaderboard(FLAGS.out_dir, rows, spec.target, FLAGS.last_k, FLAGS.quick)
  if tuned:
    write_tuning(FLAGS.out_dir, tuned)
  participation_figure(jobs, os.path.join(FLAGS.out_dir, "participation.png"), FLAGS.quick)
  target_figure(jobs, spec.target, os.path.join(FLAGS.out_dir, "time_to_target.png"),
                FLAGS.quick)
  rounds = max(recs[-1]["round"] + 1 for runs in jobs.values() for recs in runs)
  write_timing(FLAGS.out_dir, timing_rows(timings, rounds))
  print(f"leaderboard: {os.path.join(FLAGS.out_dir, 'leaderboard.md')}")


if __name__ == "__main__":
  cli.launch(main)
