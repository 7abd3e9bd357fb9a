r"""The selection benchmark: every selector x named scenarios, one leaderboard.

  python -m experiments.bench --out_dir=runs/bench                  # every registered selector
  python -m experiments.bench --selectors=random,oort,md --scenarios=label_skew,clock_deadline
  python -m experiments.bench --quick --out_dir=/tmp/bench         # smoke run, two rounds a job
  python -m experiments.bench --scenarios=fmnist_dirichlet_0.1 --job_flag=--rounds=300  # a GPU's

The scenarios are `experiments/bench_scenarios.json` (each the `experiments.run` flags of one job,
after the common ones; the help of `--scenarios` below names those of the file the benchmark
comes with): digits' small leaderboard, Fashion-MNIST over 1000 clients, and fedjax's EMNIST,
CIFAR-100 and Shakespeare files, a scenario whose files (`needs`) are missing skipped with one
line naming the file. Each (scenario, selector) is one `experiments.run` job in
`<out_dir>/<scenario>/<selector>`, its seeds batched into one compiled program; the jobs run one
after another in one worker process (`experiments/bench_worker.py`), so they share its compiled
programs. A job that finished is read again, one that stopped is resumed (`--resume`), so a
killed benchmark goes on where it was; Ctrl-C or a SIGTERM stops the job it is running too (no
process outlives it). `<out_dir>/leaderboard.md` and `leaderboard.csv` hold one row per selector
and scenario, under the command, machine and wall time: its rank where the 95% intervals
separate ("2-9": a tie), the final test accuracy with its 95% interval over the seeds, its paired
comparison with random on the same seeds (the mean difference and its interval, "better" or
"worse" only where the interval excludes 0, the seeds won / tied / lost:
`reports/statistics.py`), then, as mean +- sample std, the mean of the last `--last_k`
evaluated rounds, rounds and simulated seconds to the target (seeds that reached it), the
worst-10% client's accuracy, Jain's index of participation, the samples clients spent on
selection alone, and stragglers; `leaderboard_ranks.png` shows per scenario each selector's
paired difference from random (starred where its interval excludes 0) and its rank range, and
`participation.png` each selector's histogram of how often the clients took part. The CSV
carries the numbers too (mean, std, interval, n; the paired difference, its interval and
counts; the rank range). `--quick` is a smoke run: two rounds a job, random in every scenario
and every other selector in one (by default the scenarios that need no data file), compiled
with `--fast_compile` (its numbers check that the benchmark runs, so their last float bits do
not matter), each output marked as such. With `--tune`, a selector the
scenarios file tunes (`"tune": {"oort": ["--sweep=oort_exploration:0.1,0.5,0.9"]}`) is compared
at its best setting: its job sweeps them (one batched program where the settings are values), a
tenth of each client's data is held out (in every job, so all selectors train on the same rows),
and the setting with the best final validation accuracy
gives its row (`tuning.md` lists every setting's validation and test accuracy; the test split
never chooses).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np
from absl import app, flags

from experiments.launch import cli, report, schema
from experiments.reports import statistics
from experiments.launch.config import number_text
from fedjax_sel import registry
from fedjax_sel.data import federated_sqlite
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
flags.DEFINE_bool("quick", False, "A smoke run (the suite's and CI's): jobs of two rounds, random "
                  "in every scenario and every other selector in one of them; by default on the "
                  "scenarios that need no data file.")
flags.DEFINE_bool("tune", False, "Compare each selector the scenarios file tunes (its `tune` "
                  "entry) at its best setting: its job sweeps them, a tenth of each client's data "
                  "is held out, and the setting with the best final validation accuracy (mean "
                  "over the seeds, never the test accuracy) gives its row.")
flags.DEFINE_integer("last_k", 10, "Evaluated rounds of the last-k mean, >= 1.")
flags.DEFINE_multi_string("job_flag", [], "An experiments.run flag given to every job after its "
                          "scenario's (repeat it: --job_flag=--rounds=300 "
                          "--job_flag=--seeds=0,1,2), e.g. the scale of a GPU run.")
flags.DEFINE_string("data_dir", federated_sqlite.DEFAULT_DIR, "Folder of the field datasets' "
                    "files (fedjax's SQLite files); a scenario that needs a file not there is "
                    "skipped, with one line naming it.")
cli.define_finite_float("job_timeout_s", 1800.0, "Wall seconds after which a job's process is "
                        "taken as hung: killed and resumed from its checkpoint once.", above=0)

COLUMNS = ("scenario", "selector", "rank", "seeds", "final_acc", "last_k_acc", "rounds_to_target",
           "sim_s_to_target", "worst10_client_acc", "jain", "selection_samples", "stragglers")


@dataclasses.dataclass(frozen=True)
class Scenarios:
  """The scenarios file (`--scenarios_file`): the `experiments.run` flags every job starts with
  (`common`) and those a smoke run ends with (`quick`, overriding the scenario's), the target
  test accuracy of the leaderboard's time-to-target columns, each scenario's own flags by name,
  per selector the `--sweep` flags of its tuning (`tune`, used with --tune), and per scenario the
  files it needs (`needs`: paths under --data_dir, or absolute; missing, it is skipped)."""

  common: tuple[str, ...]
  quick: tuple[str, ...]
  target: float
  scenarios: dict[str, tuple[str, ...]]
  about: str = ""
  tune: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
  needs: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


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
  unknown = sorted(set(spec.needs) - set(spec.scenarios))
  if unknown:
    raise ValueError(f"{path}: needs names scenarios the file lacks: {unknown}")
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
FRESH_TIMING = "timing.new.json"  # A job's timing as its worker wrote it, before `keep_timing`.
STOP_GRACE_S = 60.0  # Seconds a stopped job's worker has to end its round before it is killed.


class Stopped(KeyboardInterrupt):
  """An interrupt that stopped the benchmark's job `label` (its output: `log`)."""

  def __init__(self, label: str, log: str):
    super().__init__(label)
    self.label, self.log = label, log


def run_jobs(jobs: list[tuple[str, str, list[str]]], plan_path: str,
             timeout_s: float = 1800.0) -> dict[str, list[dict]]:
  """Jobs `(label, folder, experiments.run flags)` one after another in one worker process
  (`experiments.bench_worker`; its plan is written to `plan_path`), so that they share its
  compiled programs: each job read again when it finished, resumed when it was stopped, started
  otherwise, its output in `<folder>/bench.log`. A job that runs past `timeout_s` (a hang) has
  its worker killed and is resumed once in a new one, with the jobs after it. An interrupt
  (SIGINT, or SIGTERM: `cli.interrupt_on_sigterm`) stops the worker (`stop`), keeps its timings
  and raises `Stopped` naming the job it stopped: no process outlives the benchmark.

  Returns:
    Per folder, the timings of the worker runs that trained its rounds (`<folder>/timing.json`,
    one entry per such run: wall seconds by phase, rounds trained, programs compiled; a run that
    found every round done adds none).
  """
  for _, folder, _ in jobs:
    os.makedirs(folder, exist_ok=True)
    keep_timing(folder)  # A worker whose benchmark was killed (SIGKILL) ended on its own.
  pending, hung = list(jobs), set()
  while pending:
    plan = [{"label": label, "folder": folder, "timing": os.path.join(folder, FRESH_TIMING),
             "flags": [*flags_, f"--out_dir={folder}"]
                      + (["--resume"] if os.path.exists(os.path.join(folder, "job.json")) else [])}
            for label, folder, flags_ in pending]
    with open(plan_path, "w", encoding="utf-8") as f:
      json.dump(plan, f, indent=1)
    proc = subprocess.Popen([sys.executable, "-m", "experiments.bench_worker", plan_path])
    try:
      finished = watch(proc, [job["timing"] for job in plan], timeout_s)
    except KeyboardInterrupt:
      stop(proc)
      at = current(plan)
      for job in plan:
        keep_timing(job["folder"])
      raise Stopped(at["label"], os.path.join(at["folder"], "bench.log")) from None
    at = current(plan)
    for job in plan:
      keep_timing(job["folder"])
    if at is None:
      break
    log = os.path.join(at["folder"], "bench.log")
    if finished:
      raise app.UsageError(f"{at['label']}: experiments.run {' '.join(at['flags'])} failed (exit "
                           f"{proc.returncode}); its output is in {log}")
    if at["folder"] in hung:
      raise app.UsageError(f"{at['label']}: the job did not end in {timeout_s:.0f} s twice "
                           f"(--job_timeout_s); its output is in {log}")
    hung.add(at["folder"])
    print(f"   {at['label']}: no end after {timeout_s:.0f} s, killed; resuming it", flush=True)
    pending = pending[[job["folder"] for job in plan].index(at["folder"]):]
  return {folder: read_timings(folder) for _, folder, _ in jobs}


def current(plan: list[dict]) -> dict | None:
  """The plan's job the worker did not end well (none written, or a failure's status), or
  None when every job ended well."""
  for job in plan:
    if not os.path.exists(job["timing"]):
      return job
    with open(job["timing"], encoding="utf-8") as f:
      if json.load(f)["status"]:
        return job
  return None


def watch(proc: subprocess.Popen, timings: list[str], timeout_s: float) -> bool:
  """Waits for the worker `proc`; kills it when no job of its plan (their `timings` files) has
  ended for `timeout_s`. Returns whether it ended by itself."""
  last = time.monotonic()
  done = 0
  while True:
    try:
      proc.wait(min(5.0, timeout_s))
      return True
    except subprocess.TimeoutExpired:
      now = sum(os.path.exists(t) for t in timings)
      if now > done:
        done, last = now, time.monotonic()
      elif time.monotonic() - last > timeout_s:
        proc.kill()
        proc.wait()
        return False


def stop(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
  """Stops a worker as an interrupt stops a launcher (SIGTERM: its job ends its round, keeps its
  finished rounds and writes its timing) and waits for it; kills it after `grace_s` or at a
  second interrupt."""
  print("   stopping the benchmark's job (a second interrupt kills it)", file=sys.stderr,
        flush=True)
  proc.terminate()
  try:
    proc.wait(grace_s)
  except (subprocess.TimeoutExpired, KeyboardInterrupt):
    proc.kill()
    proc.wait()


def read_timings(folder: str) -> list[dict]:
  """A job's timings, `<folder>/timing.json` (none before any worker trained its rounds)."""
  path = os.path.join(folder, TIMING_FILE)
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def keep_timing(folder: str) -> None:
  """Adds the timing a worker wrote for the job in `folder` (`FRESH_TIMING`, removed) to
  `<folder>/timing.json` when it trained rounds or compiled (or loaded) a round program."""
  fresh = os.path.join(folder, FRESH_TIMING)
  if not os.path.exists(fresh):
    return
  with open(fresh, encoding="utf-8") as f:
    latest = json.load(f)
  os.remove(fresh)
  if latest.get("rounds_trained") or latest["round_compiles"] + latest.get("round_loads", 0):
    timings = [*read_timings(folder), latest]
    with open(os.path.join(folder, TIMING_FILE), "w", encoding="utf-8") as f:
      json.dump(timings, f, indent=1)


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
                   "rank_best", "rank_worst", "smoke_run")
SMOKE = ("SMOKE RUN (--quick): two-round jobs that check the benchmark runs; their numbers rank "
         "nothing")


def write_leaderboard(out_dir: str, rows: list[dict], target: float, last_k: int,
                      smoke: bool = False, about: tuple[str, ...] = ()) -> None:
  """`leaderboard.md` (under the lines `about`: its command, machine and wall time),
  `leaderboard.csv` (text cells, then `NUMERIC_COLUMNS`) and the rank figure; a `smoke` run
  (--quick) says so in each."""
  for r in rows:
    r["smoke_run"] = smoke
  reach = number_text(target)
  heads = ("scenario", "selector", "rank", "seeds", "final acc [95% interval]",
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
  lines = ([f"**{SMOKE}.**", ""] if smoke else []) + [f"{line}  " for line in about] + [""] + lines
  lines += ["", "Rank: by final accuracy, where the 95% intervals separate: a selector's rank is "
            "one more than the selectors whose interval lies wholly above its own, its range "
            "runs to where those wholly below it begin; a range (\"2-9\") is a tie with the "
            "selectors it overlaps. Final accuracy: the mean over the seeds with its 95% "
            "Student's t interval; the "
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
  """Per job: the wall and compile seconds of the worker processes that trained it (one that was
  stopped and the one that resumed it alike; "processes" counts them), the round programs they
  compiled or loaded (none where an earlier job of the worker compiled it alike), the
  milliseconds per
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


def write_timing(out_dir: str, rows: list[dict], about: tuple[str, ...] = ()) -> None:
  """`timing.md` (under the lines `about`; per job, then per scenario) and `timing.csv`: how long
  the benchmark took on this machine, kept apart from the leaderboard's numbers, which are the
  same on every rerun."""
  heads = ("scenario", "selector", "worker processes", "wall s", "compile s",
           "round programs compiled or loaded", "ms per round (all seeds)", "x random's round")
  lines = [f"{line}  " for line in about] + [""] + tables(out_dir, "timing", TIMING_COLUMNS,
                                                          heads, rows)
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
            "round program; a scenario's jobs run in one worker process, so a program two "
            "selectors compile alike is compiled once; a job that was stopped counts the worker "
            "that resumed it too; the command's own wall time, above, adds each worker's start)."]
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
    ran = [m for m in selectors if (scenario, m) in jobs]  # A smoke run's share of them.
    hits = {m: [h for h in (report.first_reach(recs, "test_accuracy", target)
                            for recs in jobs[scenario, m]) if h is not None] for m in ran}
    # Simulated seconds where every selector ran on the clock (some turn it on for themselves).
    clock = all(h[1] for hs in hits.values() for h in hs)
    ax.set_title(scenario, fontsize=9)
    ax.set_xlabel("simulated s" if clock else "rounds", fontsize=8)
    for i, m in enumerate(selectors):
      if m not in ran:
        continue
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
  """A heatmap of each selector in each scenario: coloured by its paired difference in final
  accuracy from random on the same seeds (blue better, red worse, white even), labelled with its
  rank where the 95% intervals separate ("2-9": a tie with the selectors its interval overlaps;
  `statistics.add_ranks`) and the difference, starred where its own 95% interval excludes 0."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
  selectors = list(dict.fromkeys(r["selector"] for r in rows))
  diffs = np.full((len(selectors), len(scenarios)), np.nan)
  labels = {}
  for r in rows:
    i, j = selectors.index(r["selector"]), scenarios.index(r["scenario"])
    diff = r.get("vs_random_mean")
    text = f"rank {r['rank']}"
    if diff is not None and diff == diff:  # Random's own row has no difference.
      diffs[i, j] = diff
      star = "*" if r.get("vs_random_verdict") in ("better", "worse") else ""
      text += f"\n{diff:+.3f}{star}"
    labels[i, j] = text
  # At least 5 points of accuracy either way: a tie of a few thousandths stays pale.
  limit = max(float(np.nanmax(np.abs(diffs))) if np.isfinite(diffs).any() else 0.0, 0.05)
  fig, ax = plt.subplots(figsize=(1.8 * len(scenarios) + 3, 0.45 * len(selectors) + 1.6))
  image = ax.imshow(diffs, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
  ax.set_xticks(range(len(scenarios)), scenarios, rotation=30, ha="right")
  ax.set_yticks(range(len(selectors)), selectors)
  for (i, j), text in labels.items():
    strong = np.isfinite(diffs[i, j]) and abs(diffs[i, j]) > 0.6 * limit
    ax.text(j, i, text, ha="center", va="center", fontsize=6.5,
            color="white" if strong else "black")
  ax.set_title(("SMOKE RUN (--quick): meaningless\n" if smoke else "")
               + "final test accuracy against random on the same seeds\n"
               "(* the 95% interval of the difference excludes 0; rank where intervals separate)")
  fig.colorbar(image, ax=ax, label="mean paired difference from random")
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
      elif (scenario, selector) not in jobs:  # Not run (a smoke run's): no frame to lay out.
        ax.set_axis_off()
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
  fig.savefig(path, dpi=110)
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


def machine() -> str:
  """This machine as the leaderboard states it: its CPU, cores and JAX's devices."""
  import jax  # pylint: disable=import-outside-toplevel
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  devices = sorted({f"{d.platform}:{d.device_kind}" for d in jax.devices()})
  return (f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores ({cpu}), "
          f"JAX {jax.__version__} on {', '.join(devices)}")


def missing_file(spec: Scenarios, scenario: str, data_dir: str) -> str | None:
  """Why scenario `scenario` cannot run: "no PATH" naming the first file it needs (`needs`: paths
  under `data_dir`, or absolute) that is not there, or None."""
  for need in spec.needs.get(scenario, ()):
    path = os.path.join(data_dir, need)
    if not os.path.exists(path):
      return f"no {path}" + ("" if os.path.isabs(need) else " (--data_dir)")
  return None


def job_flags(spec: Scenarios, scenario: str, selector: str, tune: bool, quick: bool,
              data_dir: str, extra: tuple[str, ...] = ()) -> list[str]:
  """The `experiments.run` flags of a (scenario, selector) job: the common ones, the scenario's,
  `--data_dir` where its files lie under it, `extra` (`--job_flag`), the selector, with `tune`
  its tuning sweep and the held-out validation tenth (every job's, tuned or not, so that all
  train on the same rows and the paired comparison with random stays like for like), and last,
  overriding them, the quick ones with `quick`."""
  own = spec.scenarios[scenario]
  tuning = list(spec.tune.get(selector, ())) if tune else []
  held_out = ["--val_fraction=0.1"] if tune and not any(
      f.startswith("--val_fraction=") for f in own) else []
  under_dir = any(not os.path.isabs(f) for f in spec.needs.get(scenario, ()))
  return [*spec.common, *own, *([f"--data_dir={data_dir}"] if under_dir else []), *extra,
          f"--selector={selector}", *tuning, *held_out, *(spec.quick if quick else [])]


def smoke_pairs(scenarios: list[str], selectors: list[str]) -> list[tuple[str, str]]:
  """The (scenario, selector) jobs of a smoke run (--quick): random in every scenario (the paired
  comparisons' baseline) and every other selector once, the i-th in the (i mod S)-th scenario,
  so that every scenario and every selector runs without the S x M jobs of the leaderboard.

    >>> smoke_pairs(["a", "b"], ["random", "md", "oort", "poc"])
    [('a', 'random'), ('a', 'md'), ('a', 'poc'), ('b', 'random'), ('b', 'oort')]
  """
  others = [m for m in selectors if m != "random"]
  return [(s, m) for i, s in enumerate(scenarios)
          for m in (["random"] if "random" in selectors else [])
          + others[i::len(scenarios)]]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  started = time.perf_counter()
  try:
    spec = load_scenarios(FLAGS.scenarios_file)
  except ValueError as e:
    raise app.UsageError(f"--scenarios_file: {e}") from e
  known = registry.names("selector")
  selectors = FLAGS.selectors or list(known)
  bad = [s for s in selectors if s not in known and ":" not in s]
  if bad:
    raise app.UsageError(f"--selectors: unknown {bad}; accepted: {', '.join(known)}")
  # A smoke run checks the benchmark, not the data: by default the scenarios that need no file.
  scenarios = FLAGS.scenarios or [s for s in spec.scenarios
                                  if not (FLAGS.quick and spec.needs.get(s))]
  bad = [s for s in scenarios if s not in spec.scenarios]
  if bad:
    raise app.UsageError(f"--scenarios: unknown {bad}; accepted: {', '.join(spec.scenarios)}")
  if FLAGS.last_k < 1:
    raise app.UsageError(f"--last_k must be >= 1, got {FLAGS.last_k}")
  ready = []
  for scenario in scenarios:
    missing = missing_file(spec, scenario, FLAGS.data_dir)
    if missing:
      print(f"== {scenario}: skipped, {missing}", flush=True)
    else:
      ready.append(scenario)
  pairs = smoke_pairs(ready, selectors) if FLAGS.quick else [(s, m) for s in ready
                                                             for m in selectors]
  folders = {(s, m): os.path.join(FLAGS.out_dir, s, m.replace(":", "_")) for s, m in pairs}
  try:
    times = run_jobs([(f"{s} / {m}", folders[s, m],
                       job_flags(spec, s, m, FLAGS.tune, FLAGS.quick, FLAGS.data_dir,
                                 tuple(FLAGS.job_flag)))
                      for s, m in pairs], os.path.join(FLAGS.out_dir, "plan.json"),
                     FLAGS.job_timeout_s)
  except Stopped as e:
    sys.stderr.write(f"interrupted: the job {e.label} was stopped and no process of the "
                     f"benchmark is left; every finished round is kept (its output: {e.log}): "
                     "run the same command again to go on where it stopped\n")
    sys.exit(130)
  rows, jobs, timings, tuned = [], {}, {}, []
  for scenario, selector in pairs:
    timings[scenario, selector] = times[folders[scenario, selector]]
    points = report.read_job(folders[scenario, selector])
    tuning = FLAGS.tune and selector in spec.tune
    chosen = best_point(points) if tuning else next(iter(points))
    if tuning:
      tuned.append((scenario, selector, chosen, points))
    jobs[scenario, selector] = runs = points[chosen]
    rows.append(row(scenario, selector, runs, spec.target, FLAGS.last_k)
                | ({"setting": setting_of(chosen)} if tuning else {}))
  if not rows:
    raise app.UsageError("no scenario could run: every one lacks a file (lines above)")
  finals = {key: [[r["test_accuracy"] for r in recs if "test_accuracy" in r][-1] for recs in runs]
            for key, runs in jobs.items()}
  statistics.compare_with_random(rows, finals)
  statistics.add_ranks(rows)
  wall = time.perf_counter() - started
  trained = sum(t["total_s"] for procs in timings.values() for t in procs)
  about = [f"Command: `python -m experiments.bench {' '.join(sys.argv[1:])}`",
           f"Machine: {machine()}",
           f"Wall time: {wall / 60:.1f} min (this command; jobs it read back from an earlier run "
           f"cost it nothing); the jobs' own, every run that trained them: {trained / 60:.1f} min "
           "(timing.md)"]
  write_leaderboard(FLAGS.out_dir, rows, spec.target, FLAGS.last_k, FLAGS.quick, about)
  if tuned:
    write_tuning(FLAGS.out_dir, tuned)
  participation_figure(jobs, os.path.join(FLAGS.out_dir, "participation.png"), FLAGS.quick)
  target_figure(jobs, spec.target, os.path.join(FLAGS.out_dir, "time_to_target.png"),
                FLAGS.quick)
  rounds = max(recs[-1]["round"] + 1 for runs in jobs.values() for recs in runs)
  write_timing(FLAGS.out_dir, timing_rows(timings, rounds), about)
  print(f"leaderboard: {os.path.join(FLAGS.out_dir, 'leaderboard.md')} ({wall:.0f} s)")


if __name__ == "__main__":
  cli.launch(main)
