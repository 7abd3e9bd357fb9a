r"""Jobs side by side: one markdown table and one overlay figure per metric, for jobs of any
launcher.

  python -m experiments.compare runs/fedavg runs/oort --out=runs/compare --target=0.9

Each argument is a job's `--out_dir`. Its runs are read through its manifest (`job.json`: every
run's label, seed and folder); a folder without one is read as the runs of its
`seed<s>/metrics.jsonl` files. Runs are grouped into methods by their label without the seed (a
run that stopped, marked so in job.json, is a row of its own, "(stopped)" after its label). Per
method, over its seeds (mean +- sample std, n stated; no spread for one seed): the final value of
`--metric`, its mean over the last `--last_k` rounds, its best value, and the rounds trained and
the simulated seconds (`sim_time_s`, with `--system_profile`) until it first reaches `--target`
(the mean over the seeds that did, and how many did). With `--out=PREFIX`: `PREFIX.md` holds the
table and `PREFIX_<metric>.png` one figure per `--plot_metrics` entry (mean over seeds per
method, its sample std shaded as in the launchers' figures, the jobs' setup under the title, x in
rounds trained, or in simulated seconds with `--x=sim_time` (`--x_scale=log` or `linear`), which
puts asynchronous server steps and synchronous rounds on one axis). `--by=NAME` groups a sweep's
runs by one swept setting instead (a row and a line per value, its other swept values pooled), and
the table ends with each job's best row.
"""

from __future__ import annotations

import json
import os

import numpy as np
from absl import app, flags

from experiments.launch import cli
from experiments.launch import report
from experiments.launch.config import number_text
from experiments.launch.report import read_job
from fedjax_sel.host.plotting import bounds_of, mean_std, metric_matrix, seed_spread, time_matrix

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "Prefix of the files to write (PREFIX.md, PREFIX_<metric>.png); "
                    "without it the table is only printed.")
flags.DEFINE_string("metric", "test_accuracy", "The metric of the table (a key of the records).")
flags.DEFINE_enum("x", "rounds", ["rounds", "sim_time"], "The figures' x axis: rounds trained "
                  "(server steps in the asynchronous mode) or simulated seconds (runs with a "
                  "clock; compares synchronous and asynchronous training).")
cli.define_finite_float("target", 0.85, "The value whose first crossing the table reports "
                        "(rounds and simulated seconds to reach it), for a metric where higher "
                        "is better.")
flags.DEFINE_integer("last_k", 10, "Rounds of the table's last-k mean, >= 1.", lower_bound=1)
flags.DEFINE_enum("figure_format", "png", ("png", "pdf", "svg"), "File format of the figures.")
flags.DEFINE_list("plot_metrics", ["test_accuracy", "test_loss"], "Metrics drawn, one figure each "
                  "(keys of the records).")
flags.DEFINE_enum("x_scale", "log", ["log", "linear"], "The simulated-seconds axis' scale "
                  "(--x=sim_time).")
flags.DEFINE_string("by", None, "Group each job's runs by the value of this swept setting (a "
                    "--sweep NAME): a row and a line per value, pooling the runs of its other "
                    "swept values and methods; default: a row per method and swept point.")


def job_names(folders: list[str]) -> list[str]:
  """Each job folder's name in the table: its basename, or its path where basenames coincide
  (two jobs must not merge into one)."""
  names = [os.path.basename(os.path.normpath(f)) for f in folders]
  return [n if names.count(n) == 1 else os.path.normpath(f) for n, f in zip(names, folders)]


def row(job: str, method: str, runs: list[list[dict]], metric: str, target: float,
        last_k: int) -> str:
  series = [[r[metric] for r in recs if metric in r] for recs in runs]
  if not all(series):
    raise app.UsageError(f"{job} / {method}: some runs have no {metric!r} in their records")
  rounds, seconds = report.reach_values(runs, metric, target)
  return (f"| {job} | {method} | {len(runs)} | {mean_std([s[-1] for s in series])} | "
          f"{mean_std([np.mean(s[-last_k:]) for s in series])} | "
          f"{mean_std([max(s) for s in series])} | "
          f"{rounds} | {seconds} | {report.telemetry_cells(runs)} |")


def table(jobs: dict[str, dict], metric: str, target: float, last_k: int) -> str:
  reach = number_text(target)
  lines = [f"| job | method | seeds | final {metric} | mean of the last {last_k} rounds | best | "
           f"rounds to {reach} | simulated seconds to {reach} | {report.TELEMETRY_HEADER} |",
           "|" + "---|" * 11]
  for job, methods in jobs.items():
    for method, runs in methods.items():
      lines.append(row(job, method, runs, metric, target, last_k))
  return "\n".join(lines + ["", "Mean +- sample std over the seeds (n = seeds; one seed: its "
                            "value). Rounds count the rounds trained.", "", *best(jobs, metric)])


def best(jobs: dict[str, dict], metric: str) -> list[str]:
  """Per job with several rows, the row with the best final `metric` (the highest; the lowest
  for a loss) and its spread over seeds."""
  lower = "loss" in metric
  lines = []
  for job, methods in jobs.items():
    finals = {m: [[r[metric] for r in recs if metric in r][-1] for recs in runs]
              for m, runs in methods.items()}
    if len(finals) > 1:
      pick = (min if lower else max)(finals, key=lambda m: np.mean(finals[m]))
      lines.append(f"Best final {metric} of {job}: {pick}, {mean_std(finals[pick])} "
                   f"({len(finals[pick])} runs).")
  return lines


LEGIBLE = 8  # Methods one panel of curves shows legibly.


def curves(runs: list[list[dict]], metric: str, x: str) -> tuple[np.ndarray, np.ndarray]:
  """(x values, `[seeds, x]` values of `metric`): by rounds trained, at the rounds every seed
  evaluated; by simulated seconds, each seed's curve interpolated (as a step: the last value
  reached) onto 100 times up to the shortest seed's end."""
  if x == "sim_time":
    return time_matrix(runs, metric)
  rounds, values = metric_matrix(runs, metric)
  return rounds + 1, values


def figure(jobs: dict[str, dict], metric: str, path: str, x: str = "rounds",
           x_scale: str = "log", setup: str = "") -> None:
  """One panel of `metric` per round (`x="rounds"`) or simulated second (`x="sim_time"`, for
  asynchronous runs beside synchronous ones; `x_scale` "log" or "linear"): every method's mean
  over seeds, its sample std shaded as the launchers' figures shade it; `setup` under the title.
  With more than `LEGIBLE` methods the curves go unshaded and a second panel ranks the methods by
  their final value (mean and sample std over seeds), coloured as their curves, in place of a
  legend."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  import matplotlib.ticker  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  styles = ["-", "--", "-.", ":"]
  one_job = len(jobs) == 1
  named = [(m if one_job else job if m == job else f"{job}: {m}", runs)
           for job, methods in jobs.items() for m, runs in methods.items()]
  # A private run whose selection went unaccounted says so (docs/papers/privacy.md).
  named = [(label + (" (DP guarantee: aggregate only)"
                     if any(recs and recs[-1].get("dp_guarantee") for recs in runs) else ""), runs)
           for label, runs in named]
  many = len(named) > LEGIBLE
  if many:
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, max(4.5, 0.28 * len(named) + 1.5)),
                                 gridspec_kw={"width_ratios": [3, 2]})
  else:
    fig, ax = plt.subplots(figsize=(9, 4.5))
  finals = []
  for i, (label, runs) in enumerate(named):
    xs, values = curves(runs, metric, x)
    if not len(xs):
      continue
    line, = ax.plot(xs, values.mean(0), styles[i % len(styles)], label=label, marker="o",
                    markevery=max(len(xs) // 8, 1), markersize=4)
    if len(runs) > 1 and not many:  # The launchers' band: mean +- sample std over seeds.
      mean, std = seed_spread(values)
      low, high = bounds_of(metric)
      ax.fill_between(xs, np.clip(mean - std, low, high), np.clip(mean + std, low, high),
                      color=line.get_color(), alpha=0.15)
    last = values[:, -1]
    finals.append((last.mean(), last.std(ddof=1) if len(last) > 1 else 0.0, label,
                   line.get_color()))
  log = x == "sim_time" and x_scale == "log"
  ax.set_xlabel("rounds trained" if x == "rounds" else
                f"simulated seconds{' (log scale)' if log else ''}")
  if log:  # Asynchronous runs end in a fraction of a synchronous run's time.
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # No crowded 2x10^0 labels.
  ax.set_ylabel(metric.replace("_", " "))
  ax.set_title(f"{metric.replace('_', ' ')}: mean over seeds"
               + ("" if many else " +- sample std") + (f"\n{setup}" if setup else ""),
               fontsize=10)
  ax.grid(alpha=0.3)
  if many:
    finals.sort()
    y = np.arange(len(finals))
    bx.barh(y, [f[0] for f in finals], xerr=[f[1] for f in finals],
            color=[f[3] for f in finals], alpha=0.8)
    bx.set_yticks(y, [f[2] for f in finals], fontsize=8)
    low = min(f[0] - f[1] for f in finals)
    bx.set_xlim(max(0.0, low - 0.05 * abs(low)), None)
    bx.set_xlabel(f"final {metric.replace('_', ' ')} (mean +- sample std over seeds)")
    bx.grid(alpha=0.3, axis="x")
  else:
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)


def setup_line(folders: list[str]) -> str:
  """The jobs' setups from their config.json ("digits, N=50, K=10, 30 rounds"), each distinct one
  once; "" where a job has none."""
  setups = []
  for folder in folders:
    try:
      with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
      data, engine = cfg["data"], cfg["engine"]
      text = (f"{cfg['parts']['dataset']['name']}, N={data['num_clients']}, "
              f"K={engine['clients_per_round']}, {engine['rounds']} rounds")
    except (OSError, ValueError, KeyError, TypeError):
      continue
    if text not in setups:
      setups.append(text)
  return "; ".join(setups)


def main(argv):
  folders = argv[1:]
  if not folders:
    raise app.UsageError("name the job folders to compare (their --out_dir)")
  missing = [f for f in folders if not os.path.isdir(f)]
  if missing:
    raise app.UsageError(f"no such job folder: {', '.join(missing)}")
  jobs = {name: read_job(f, FLAGS.by) for name, f in zip(job_names(folders), folders)}
  text = table(jobs, FLAGS.metric, FLAGS.target, FLAGS.last_k)
  print(text)
  if FLAGS.out:
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
    with open(FLAGS.out + ".md", "w", encoding="utf-8") as f:
      f.write(text + "\n")
    for metric in FLAGS.plot_metrics:
      path = f"{FLAGS.out}_{metric}.{FLAGS.figure_format}"
      figure(jobs, metric, path, FLAGS.x, FLAGS.x_scale, setup_line(folders))
      print(f"figure: {path}")


if __name__ == "__main__":
  cli.launch(main)
