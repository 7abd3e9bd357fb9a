"""FedSRC's per-round extras, tables and figure: participation, exclusions by corruption kind,
the savings of self-regulation (samples, uploads), accuracy over seeds."""

import numpy as np

from experiments.launch import build, config, report
from fedjax_sel.client.local_training import steps_per_client
from fedjax_sel.host.plotting import mean_std, metric_matrix
from fedjax_sel.parts.rules import fedsrc


def per_client_samples(cfg: config.JobConfig, data):
  """(training samples a client processes when it trains, samples it evaluates to decide)."""
  counts = np.asarray(data.train.counts)
  loc = cfg.local
  if loc.local_steps is None:
    train = loc.local_epochs * counts
  else:
    train = np.asarray(steps_per_client(counts, build.local_hparams(cfg))) * loc.batch_size
  stat = cfg.parts.rule.settings.decision_stat
  evals = {"test_loss": np.asarray(data.test.counts), "val_loss": np.asarray(data.val.counts),
           "loss": counts,
           "batch_loss": np.full(len(counts), loc.batch_size)}[stat]
  return train.astype(float), evals.astype(float)


def round_extras(cfg: config.JobConfig, kinds, uses_rule: bool, data):
  """The per-round extra of a run: its participation rate and, for a self-regulating run, the
  exclusions by kind and the round's savings."""
  per_client = per_client_samples(cfg, data)

  def extra(state, record):
    del state
    out = {"participation_rate": len(record["trained_clients"]) / max(len(record["selected"]), 1)}
    if uses_rule:
      for key, vals in fedsrc.exclusions([record], kinds).items():
        out[key] = int(vals[0])
      saved = fedsrc.savings([record], *per_client)
      out.update(samples_saved=float(saved.train_samples_saved[0]),
                 net_samples_saved=float(saved.net_samples_saved[0]),
                 uploads_saved=int(saved.uploads_saved[0]))
    return out
  return extra


def saving_row(cfg: config.JobConfig, label: str, group) -> str:
  tot = {}
  counts = {}  # kind -> [sampled, excluded] over the gated rounds of every seed.
  for recs, data, kinds in group:
    s = fedsrc.savings(recs, *per_client_samples(cfg, data))
    for k, v in s.totals().items():
      tot[k] = tot.get(k, 0.0) + v / len(group)
    gated = [r for r in recs if r["rule"].get("gated")]
    for kind in set(kinds.tolist()):
      c = counts.setdefault(kind, [0, 0])
      c[0] += sum(r[f"{kind}_sampled"] for r in gated)
      c[1] += sum(r[f"{kind}_excluded"] for r in gated)
  would = tot["train_samples"] + tot["train_samples_saved"]
  selected = np.mean([sum(len(r["selected"]) for r in recs) for recs, _, _ in group])
  pct = lambda a, b: f"{100 * a / b:.1f}%" if b else "-"
  bad = [c for kind, c in counts.items() if kind != "good"]
  bad_s, bad_x = sum(c[0] for c in bad), sum(c[1] for c in bad)
  good_s, good_x = counts.get("good", [0, 0])
  per_kind = ", ".join(f"{kind} {pct(c[1], c[0])}" for kind, c in sorted(counts.items())
                       if kind != "good")
  return (f"| {label} | {pct(bad_x, bad_s)} ({per_kind}) | {pct(good_x, good_s)} | "
          f"{tot['train_samples_saved']:.3g} ({pct(tot['train_samples_saved'], would)}) | "
          f"{tot['eval_samples']:.3g} | {tot['net_samples_saved']:.3g} "
          f"({pct(tot['net_samples_saved'], would)}) | {tot['uploads_saved']:.0f} "
          f"({pct(tot['uploads_saved'], selected)}) |")


def summary(cfg: config.JobConfig, runs) -> str:
  lines = ["Test accuracy of the global model on every client's test split (kept uncorrupted, bad "
           "clients' included; the records' clean_test_accuracy is the good clients' alone).", "",
           f"| method | final test acc | best test acc | mean test acc, last {cfg.output.last_k} "
           "rounds | mean participation rate | train samples | uploads |", "|" + "---|" * 7]
  for label, group in runs.items():
    recs_list = [g[0] for g in group]
    _, acc = metric_matrix(recs_list, "test_accuracy")
    rate = np.mean([[r["participation_rate"] for r in recs] for recs in recs_list])
    cost = np.mean([recs[-1]["cumulative_cost"]["train_samples"] for recs in recs_list])
    up = np.mean([recs[-1]["cumulative_cost"]["uploads"] for recs in recs_list])
    lines.append(f"| {label} | {mean_std(acc[:, -1])} | {mean_std(acc.max(1))} | "
                 f"{mean_std(acc[:, -cfg.output.last_k:].mean(1))} | {rate:.3f} | {cost:.3g} | "
                 f"{up:.0f} |")
  rule_runs = [label for label in runs if label.startswith("FedSRC")]
  if rule_runs:
    lines += ["", "Savings of the self-regulating runs (means over seeds; exclusions over the "
                  "gated "
              "rounds; net = gross minus 1/3 of a training step per evaluated sample; percentages "
              "of what the sampled clients would have trained and uploaded):", "",
              "| method | bad clients excluded (by kind) | good clients excluded | training "
              "samples saved "
              "(gross) | samples evaluated to decide | net samples saved | uploads saved |",
              "|" + "---|" * 7]
    lines += [saving_row(cfg, label, runs[label]) for label in rule_runs]
  return "\n".join(lines)


def write_outputs(cfg: config.JobConfig, results: dict) -> None:
  """summary.md (accuracy and savings per split) and, with --plot, fedsrc.png."""
  bad = int(cfg.data.corrupt_fraction * 100)
  text = "\n\n".join(f"## {group} ({cfg.parts.dataset.name}, {bad}% bad clients, "
                     f"{len(cfg.seeds)} seeds)\n\n" + summary(cfg, runs)
                     for group, runs in results.items())
  report.write_summary(cfg, text)
  if cfg.output.plot:
    from fedjax_sel.host.plotting import plot_panels  # pylint: disable=import-outside-toplevel
    rows = {group: {label: [g[0] for g in group_runs] for label, group_runs in runs.items()}
            for group, runs in results.items()}
    keys = ["test_accuracy", "participation_rate", "good_excluded"]
    keys += sorted({f"{k}_excluded" for runs in results.values() for group_runs in runs.values()
                    for _, _, kinds in group_runs for k in set(kinds.tolist()) if k != "good"})
    path = report.figure_path(cfg, "fedsrc")
    self_regulating = lambda label: label.startswith("FedSRC")
    titles = {"test_accuracy": "test accuracy (uncorrupted test splits)",
              "participation_rate": "participation rate",
              **{k: f"{k[:-len('_excluded')]} clients excluded" for k in keys
                 if k.endswith("_excluded")}}
    plot_panels(rows, keys, path, titles=titles,
                title=report.setup_title(cfg, f"{bad}% bad clients"),
                only={k: self_regulating for k in keys if k != "test_accuracy"})
    print(f"figure: {path}")

