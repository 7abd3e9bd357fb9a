"""FedALIGN's tables and figure: priority accuracy over seeds, the non-priority clients included,
the alignment gap against eps_t, and the round FedALIGN first leads None."""

import numpy as np

from experiments.launch import config, report
from fedjax_sel.host.plotting import mean_std, metric_matrix
from fedjax_sel.parts.rules import fedalign

HIGH_NOISE_EPS0 = 0.4  # eps_0 of the high-noise SYNTH group unless --eps0 is given (the paper's).


def eps0_for(cfg: config.JobConfig, group: str) -> float:
  """eps_0 of a group's FedALIGN runs."""
  high = cfg.options.high_noise_eps0
  return high if group == "high" and high is not None else cfg.parts.rule.settings.eps0


def eps0_text(cfg: config.JobConfig, groups) -> str:
  """eps_0 for the figure's title: one value, or each group's where they differ."""
  values = {group: eps0_for(cfg, group) for group in groups}
  if len(set(values.values())) == 1:
    return str(next(iter(values.values())))
  return ", ".join(f"{v} ({group})" for group, v in values.items())


def summary(cfg: config.JobConfig, runs: dict, warmup: int) -> str:
  """Per method: final / best / post-warm-up mean priority test accuracy, the round where FedALIGN
  first leads None, included non-priority clients and costs."""
  lines = ["| method | final priority acc | best priority acc | mean priority acc after warm-up | "
           f"mean priority acc, last {cfg.output.last_k} rounds | final acc (all clients) | "
           "non-priority aggregated / round | non-priority trained / round | closest "
           "non-priority gap / eps_t (after warm-up) | train samples | uploads |",
           "|" + "---|" * 11]
  curves = {}
  for label, group in runs.items():
    rounds, acc = metric_matrix(group, "priority_test_accuracy")
    _, all_acc = metric_matrix(group, "test_accuracy")
    curves[label] = (rounds, acc.mean(0))
    post = rounds >= warmup
    agg = np.mean([[r["others_aggregated"] for r in recs if r["round"] >= warmup]
                   for recs in group])
    trn = np.mean([[r["others_trained"] for r in recs if r["round"] >= warmup] for recs in group])
    post_recs = [r for recs in group for r in recs if r["round"] >= warmup and "eps" in r]
    gap = (f"{np.mean([r['closest_gap'] for r in post_recs]):.3f} / "
           f"{np.mean([r['eps'] for r in post_recs]):.3f}" if post_recs else "-")
    cost = np.mean([recs[-1]["cumulative_cost"]["train_samples"] for recs in group])
    up = np.mean([recs[-1]["cumulative_cost"]["uploads"] for recs in group])
    lines.append(f"| {label} | {mean_std(acc[:, -1])} | {mean_std(acc.max(1))} | "
                 f"{mean_std(acc[:, post].mean(1))} | "
                 f"{mean_std(acc[:, -cfg.output.last_k:].mean(1))} | "
                 f"{mean_std(all_acc[:, -1])} | "
                 f"{agg:.2f} | {trn:.2f} | {gap} | {cost:.3g} | {up:.0f} |")
  lead = [lb for lb in curves if lb.startswith("FedALIGN")]
  none = [lb for lb in curves if lb.startswith("None")]
  if lead and none:
    (r, fa), (_, nn) = curves[lead[0]], curves[none[0]]
    ahead = np.flatnonzero((fa > nn) & (r >= warmup))
    first = int(r[ahead[0]]) + 1 if len(ahead) else "never"
    lines.append(f"\nRounds trained when FedALIGN's mean priority accuracy first leads None's "
                 f"(after the warm-up): {first}.")
  return "\n".join(lines)


def write_outputs(cfg: config.JobConfig, results: dict) -> None:
  """summary.md (per noise group) and, with --plot, fedalign.png."""
  rule = cfg.parts.rule.settings
  warmup = fedalign.warmup_rounds(cfg.engine.rounds, rule.warmup_fraction)
  text = []
  for group, runs in results.items():
    text.append(f"## {group} (eps_0 = {eps0_for(cfg, group)}, warm-up {warmup} rounds, "
                f"{len(cfg.seeds)} seeds)\n\n" + summary(cfg, runs, warmup))
  out = "\n\n".join(text)
  report.write_summary(cfg, out)
  if cfg.output.plot:
    from fedjax_sel.host.plotting import plot_panels  # pylint: disable=import-outside-toplevel
    keys = ["priority_test_accuracy", "priority_objective", "test_accuracy", "others_aggregated",
            "eps", "closest_gap"]
    metric = "loss" if rule.metric == "loss" else "accuracy"  # What the clients align on.
    titles = {"priority_test_accuracy": "priority test accuracy",
              "priority_objective": "priority training loss after the round",
              "test_accuracy": "test accuracy (all clients)",
              "others_aggregated": "non-priority clients aggregated",
              "eps": f"eps_t ({metric} units)",
              "closest_gap": f"closest non-priority {metric} gap to the priority clients'"}
    path = report.figure_path(cfg, "fedalign")
    plot_panels(results, keys, path, titles=titles,
                title=report.setup_title(cfg, f"{cfg.options.participation} participation, "
                                              f"{rule.num_priority} priority clients, eps_0 = "
                                              f"{eps0_text(cfg, results)}, aligned on "
                                              f"{rule.metric}", with_k=False),
                only={key: (lambda label: label == "FedALIGN")
                      for key in ("eps", "closest_gap", "others_aggregated")})
    print(f"figure: {path}")

