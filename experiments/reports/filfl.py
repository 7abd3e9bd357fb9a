"""FilFL's tables and figures: per-run and over-seed accuracy, filter quality (R(greedy)/R(OPT),
weak submodularity), the bad clients filtered in, and the paper's panels."""

import csv
import os

import numpy as np

import fedjax_sel as fs
from experiments.launch import config, report
from fedjax_sel.host.plotting import mean_std


def write_outputs(cfg: config.JobConfig, runs: dict, bad_rows: list) -> None:
  """summary.md (per-run, over-seeds and filter-quality tables; the final train loss over all
  clients and over the uncorrupted ones, which the figure shows), filtered_bad.csv and, with
  --plot, the paper's panels (filfl.png, titled with the filter period h, --filter_period) and
  the OPT ratios (approx_ratio.png)."""
  rows = [(f"{label} seed {i}", recs) for label, group in runs.items()
          for i, recs in zip(cfg.seeds, group)]
  table = (fs.summary_table(rows, clean="uncorrupted clients") + "\n\n" + mean_table(cfg, runs)
           + filter_quality_table(cfg, runs))
  report.write_summary(cfg, table)
  path = os.path.join(cfg.output.out_dir, "filtered_bad.csv")
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f)
    writer.writerow(["run", "seed", "round", "num_filtered", "bad_filtered_in"])
    writer.writerows(bad_rows)
  if cfg.output.plot:
    from fedjax_sel.host.plotting import plot_curves  # pylint: disable=import-outside-toplevel
    path = report.figure_path(cfg, "filfl")
    plot_curves(runs, ["test_accuracy", "clean_train_loss", "test_loss", "num_filtered"], path,
                titles={"test_accuracy": "test accuracy",
                        "clean_train_loss": "train loss (uncorrupted clients)",
                        "test_loss": "test loss", "num_filtered": "|S^f| (filtered-in clients)"},
                title=report.setup_title(cfg, f"{int(cfg.data.corrupt_fraction * 100)}% bad "
                                              "clients, FilFL filters every h = "
                                              f"{cfg.parts.filter.settings.period} rounds"),
                only={"num_filtered": lambda label: not label.startswith("Fed")})
    print(f"figure: {path}")
    ratio_runs = {label: [[dict(r, approx_ratio=r["filter"]["approx_ratio"]) for r in recs
                           if r.get("filter_round") and "approx_ratio" in r.get("filter", {})]
                          for recs in group] for label, group in runs.items()}
    ratio_runs = {k: v for k, v in ratio_runs.items() if all(v)}
    if ratio_runs:
      path = report.figure_path(cfg, "approx_ratio")
      plot_curves(ratio_runs, ["approx_ratio"], path,
                  titles={"approx_ratio": "R(greedy) / R(OPT) per filtering round"},
                  title=report.setup_title(cfg, "OPT on every filtering round"))
      print(f"figure: {path}")


def filter_quality_table(cfg: config.JobConfig, runs: dict) -> str:
  """Per filtered run, over its filtering rounds: min / mean of R(greedy) / R(OPT) (--opt; the
  paper's Figure 6) and of the share of weak-submodularity samples verified per gamma
  (--submod_samples; Appendix D.1)."""
  lines = []
  for label, group in runs.items():
    for seed, recs in zip(cfg.seeds, group):
      rounds = [r for r in recs if r.get("filter_round") and "filter" in r and r["filter"]]
      ratios = [r["filter"]["approx_ratio"] for r in rounds if "approx_ratio" in r["filter"]]
      submod = np.array([r["filter"]["submod_verified"] for r in rounds
                         if "submod_verified" in r["filter"]], dtype=float)
      if not ratios and not submod.size:
        continue
      cells = [f"{min(ratios):.4f} / {np.mean(ratios):.4f}" if ratios else "-"]
      gammas = cfg.parts.filter.settings.gammas
      cells.append(", ".join(f"{g}: {100 * lo:.0f} / {100 * mu:.0f}%" for g, lo, mu in
                             zip(gammas, submod.min(0), submod.mean(0))) if submod.size else "-")
      lines.append(f"| {label} seed {seed} | {len(rounds)} | {cells[0]} | {cells[1]} |")
  if not lines:
    return ""
  head = ["", "", "Filter quality over the filtering rounds:", "",
          "| run | filtering rounds | R(greedy)/R(OPT) min / mean | weak submodularity verified, "
          "gamma: min / mean |", "|---|---|---|---|"]
  return "\n".join(head + lines)


def mean_table(cfg: config.JobConfig, runs: dict) -> str:
  """Over seeds: the final test accuracy (mean +- sample std), the mean accuracy over rounds, and
  the rounds trained until the mean curve reaches 80%."""
  from fedjax_sel.host.plotting import metric_matrix  # pylint: disable=import-outside-toplevel
  seeds = max(len(group) for group in runs.values())
  k = cfg.output.last_k
  lines = [f"| method | final test acc (mean +- sample std, {seeds} seeds) | mean test acc, last "
           f"{k} evaluated rounds | mean test acc over rounds | rounds trained to 80% acc (mean "
           "curve) |", "|---|---|---|---|---|"]
  for label, group in runs.items():
    rounds, acc = metric_matrix(group, "test_accuracy")
    mean_curve = acc.mean(0)
    hit = rounds[np.argmax(mean_curve >= 0.8)] + 1 if (mean_curve >= 0.8).any() else "never"
    lines.append(f"| {label} | {mean_std(acc[:, -1])} | "
                 f"{mean_std(acc[:, -k:].mean(1))} | {acc.mean():.4f} | {hit} |")
  return "\n".join(lines)

