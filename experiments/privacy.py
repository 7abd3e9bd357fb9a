r"""Differential privacy's results (docs/papers/privacy.md, "Results"): test accuracy against
epsilon for DP-FedAvg (Poisson and uniform sampling, two fixed clip norms), adaptive clipping,
DP-FTRL and power of choice with privatized losses, beside non-private FedAvg.

  python -m experiments.privacy --out_dir=experiments/results/privacy

Each method is one `experiments.run` job over `--seeds` and a sweep of the noise multiplier
(`--sweep=dp_noise:...`, one batched program per method) on Fashion-MNIST split over 1000 clients,
every client available every round (so Poisson and uniform sampling are amplified). The jobs'
folders stay under `--jobs_dir`; `<out_dir>/privacy.md` holds the table (final epsilon at
delta = 1 / N^1.1 and final test accuracy, mean +- std over the seeds) and
`<out_dir>/privacy_accuracy_vs_epsilon.png` the figure.
"""

import json
import os
import subprocess
import sys

import numpy as np
from absl import app, flags

flags.DEFINE_string("out_dir", "experiments/results/privacy", "Folder of the results.")
flags.DEFINE_string("jobs_dir", "runs/privacy", "Folder of the jobs (their runs' records).")
flags.DEFINE_integer("rounds", 100, "Rounds of every run.")
flags.DEFINE_bool("run", True, "Run the jobs (--norun: read the finished jobs under --jobs_dir and "
                  "write the table and figure again).")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of every method.")
flags.DEFINE_list("noise", ["0.7", "1", "1.5", "2", "3"], "Noise multipliers z of every private "
                  "method (swept in one batched program).")
FLAGS = flags.FLAGS

N, Q, K = 1000, 0.05, 50
COMMON = ["--dataset=fashion_mnist", f"--num_clients={N}", f"--num_available={N}",
          "--model=logreg", "--lr=0.1", "--eval_every=10", "--log_every=10"]
POISSON = ["--selector=poisson", f"--sample_rate={Q}", "--clients_per_round=94"]
UNIFORM = ["--selector=random", f"--clients_per_round={K}"]
# (folder, label, flags); None: the non-private reference.
METHODS = [
    ("fedavg", "FedAvg (no privacy), uniform K=50",
     ["--aggregator=fedavg", "--weighting=uniform", *UNIFORM]),
    ("dp_fedavg_poisson", "DP-FedAvg, Poisson q=0.05, S=1",
     ["--aggregator=dp_fedavg", *POISSON, "--dp_clip=1"]),
    ("dp_fedavg_poisson_s02", "DP-FedAvg, Poisson q=0.05, S=0.2",
     ["--aggregator=dp_fedavg", *POISSON, "--dp_clip=0.2"]),
    ("dp_fedavg_uniform", "DP-FedAvg, uniform K=50, S=1",
     ["--aggregator=dp_fedavg", *UNIFORM, "--dp_clip=1"]),
    ("dp_adaptive_poisson", "Adaptive clipping (median), Poisson q=0.05",
     ["--aggregator=dp_adaptive", *POISSON, "--dp_clip=0.1"]),
    ("dp_ftrl_uniform", "DP-FTRL (trees of 20 rounds), uniform K=50",
     ["--aggregator=dp_ftrl", *UNIFORM, "--dp_clip=1"]),
    ("dp_fedavg_poc", "DP-FedAvg + power of choice (privatized losses), K=50",
     ["--aggregator=dp_fedavg", "--selector=poc", "--poc_d=100", f"--clients_per_round={K}",
      "--dp_clip=1", "--dp_selection=privatized", "--dp_stats_noise=1", "--dp_stats_clip=3"]),
]


def run_jobs(jobs: str) -> None:
  for folder, _, extra in METHODS:
    private = extra[0] != "--aggregator=fedavg"
    sweep = [f"--sweep=dp_noise:{','.join(FLAGS.noise)}"] if private else []
    cmd = [sys.executable, "-m", "experiments.run", *COMMON, *extra, *sweep,
           f"--rounds={FLAGS.rounds}", f"--seeds={','.join(FLAGS.seeds)}", "--overwrite",
           f"--out_dir={os.path.join(jobs, folder)}"]
    print(" ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True)


def final(path: str) -> dict:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()][-1]


def collect(jobs: str) -> list[tuple[str, str, float, float, float, int]]:
  """(method, z, epsilon, accuracy mean, std, seeds) per method and noise multiplier."""
  rows = []
  for folder, label, _ in METHODS:
    job = os.path.join(jobs, folder)
    tags = sorted((d for d in os.listdir(job) if d.startswith("dp_noise=")),
                  key=lambda d: float(d.split("=")[1])) or [""]
    for tag in tags:
      records = [final(os.path.join(job, tag, f"seed{s}", "metrics.jsonl")) for s in FLAGS.seeds]
      acc = np.array([r["test_accuracy"] for r in records])
      eps = records[0].get("dp_epsilon", float("inf"))
      rows.append((label, tag.split("=")[1] if tag else "0", eps, acc.mean(), acc.std(ddof=1),
                   len(acc)))
  return rows


def write(out: str, rows) -> None:
  lines = ["| method | z | epsilon (delta = 1/N^1.1) | final test accuracy | seeds |",
           "|---|---|---|---|---|"]
  lines += [f"| {m} | {z} | {e:.3g} | {a:.4f} +- {s:.4f} | {n} |" for m, z, e, a, s, n in rows]
  with open(os.path.join(out, "privacy.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(8, 6.5))
  for label in dict.fromkeys(r[0] for r in rows):
    mine = [r for r in rows if r[0] == label]
    if mine[0][2] == float("inf"):
      ax.axhline(mine[0][3], color="k", ls="--", label=label)
      continue
    ax.errorbar([r[2] for r in mine], [r[3] for r in mine], yerr=[r[4] for r in mine],
                marker="o", capsize=3, label=label)
  ax.set_xscale("log")
  ax.set_xlabel("epsilon after the last round (delta = 1 / N^1.1, RDP)")
  ax.set_ylabel("final test accuracy (mean and sample std over the seeds)")
  ax.set_title(f"Fashion-MNIST, N = {N}, logreg, {FLAGS.rounds} rounds, "
               f"{len(FLAGS.seeds)} seeds; z in {{{', '.join(FLAGS.noise)}}}")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
  fig.tight_layout()
  fig.savefig(os.path.join(out, "privacy_accuracy_vs_epsilon.png"), dpi=120)


def main(argv):
  del argv
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  if FLAGS.run:
    run_jobs(FLAGS.jobs_dir)
  write(FLAGS.out_dir, collect(FLAGS.jobs_dir))


if __name__ == "__main__":
  app.run(main)
