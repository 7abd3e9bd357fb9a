r"""FedSRC launcher: self-regulating clients against FedAvg and robust aggregators, with savings.

  python -m experiments.fedsrc --seeds=0,1,2 --plot
  python -m experiments.fedsrc --dataset=fashion_mnist --model=mlp --hidden=200,100 --plot

Methods (`--methods`): fedsrc (the rule, FedAvg aggregation), fedavg, median, trimmed_mean, krum,
multi_krum, fedasl; `--fedsrc_with=median,...` adds runs of FedSRC combined with a robust
aggregator. Default data (offline): digits, 50 clients, 30% bad clients split evenly among label
shuffling, label flipping and Gaussian feature noise, IID and non-IID (80% of each client's data
from one class) splits (`--splits`), an MLP, 10 clients sampled per round, 40 rounds, 3 seeds.
A client decides on its validation split (10% of its data, corrupted like its training data when it
is a bad client); test splits stay clean and score the global model.

Per run it writes `<out_dir>/<split>/<method>/seed<s>/metrics.jsonl` with, per round: clean test
accuracy and loss, `participation_rate`, the threshold (`rule.phi`, `rule.alpha`), `<kind>_excluded`
and `<kind>_sampled` for good clients and each corruption kind, and the round's savings
(`samples_saved`, `net_samples_saved`, `uploads_saved`) in the self-regulating runs; plus `summary.md`
(accuracy and savings tables) and, with --plot, `fedsrc.png`.
"""

import os

import numpy as np
from absl import app, flags

import fedjax_sel as fs
from experiments import common, parts
from fedjax_sel import fedsrc
from fedjax_sel.local_training import steps_per_client

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(common)  # --help lists the shared flags too.
for _flag in ("fedsrc_mode", "fedsrc_beta", "kappa", "participation_target", "alpha0", "alpha_gain",
              "alpha_max", "decision_stat", "reinclude_prob", "reinclude_after", "reported_loss",
              "ref_beta", "ref_cut", "trim_beta", "trim_rounding", "krum_f", "multi_krum_m",
              "krum_normalized", "fedasl_alpha", "fedasl_beta"):
  flags.declare_key_flag(_flag)  # The parts' flags FedSRC uses, in its --help.
common.SWEEPABLE.extend(["participation_target", "fedsrc_beta"])  # Run values or part state.
SPLITS = {"iid": {"partition": "iid"},
          "noniid": {"partition": "dominant", "dominant_fraction": 0.8},
          "extreme": {"partition": "k_classes", "classes_per_client": 2}}
METHODS = {"fedsrc": "FedSRC", "fedavg": "FedAvg", "median": "Median",
           "trimmed_mean": "Trimmed mean", "krum": "Krum", "multi_krum": "Multi-Krum",
           "fedasl": "FedASL"}

flags.DEFINE_list("methods", list(METHODS), f"Runs to compare: {list(METHODS)}.")
flags.DEFINE_list("fedsrc_with", [], "Extra runs: FedSRC's rule combined with these aggregators "
                  f"(among {[m for m in METHODS if m != 'fedsrc']}).")
flags.DEFINE_list("splits", ["iid", "noniid"], "Data splits, one group of runs each: iid, noniid "
                  "(80% of each client's data from one class), extreme (two classes per client). "
                  "Natively federated data (synth, leaf) ignore it.")

for _name, _value in (("rounds", 40), ("num_clients", 50), ("clients_per_round", 10),
                      ("num_available", 0), ("avail_period", 1), ("model", "mlp"),
                      ("local_epochs", 2), ("lr", 0.1), ("batch_size", 16), ("val_fraction", 0.1),
                      ("seeds", ["0", "1", "2"]), ("corrupt_fraction", 0.3),
                      ("out_dir", "runs/fedsrc")):
  FLAGS.set_default(_name, _value)


def check_flags():
  bad = [m for m in FLAGS.methods if m not in METHODS]
  if bad or not (FLAGS.methods or FLAGS.fedsrc_with):
    raise app.UsageError(f"--methods must list values among {sorted(METHODS)}, got {FLAGS.methods}")
  bad = [m for m in FLAGS.fedsrc_with if m not in METHODS or m == "fedsrc"]
  if bad:
    raise app.UsageError(f"--fedsrc_with must list aggregators among "
                         f"{sorted(set(METHODS) - {'fedsrc'})}, got {FLAGS.fedsrc_with}")
  bad = [s for s in FLAGS.splits if s not in SPLITS]
  if bad or not FLAGS.splits:
    raise app.UsageError(f"--splits must list values among {sorted(SPLITS)}, got {FLAGS.splits}")
  common.check_corruption()
  # NaN and inf fail the range checks below and fedsrc.check_config's; lr has no upper bound.
  common.check_finite()
  parts.check_fedsrc()
  # The aggregators' own argument checks (trimmed mean's and FedASL's always: their flags' ranges).
  parts.check_aggregators(set(FLAGS.methods) | set(FLAGS.fedsrc_with) | {"trimmed_mean", "fedasl"})


def groups() -> list[str]:
  return ["natural"] if FLAGS.dataset in ("synth", "leaf") else list(FLAGS.splits)


def load(seed, group):
  data = common.load_data(seed, **SPLITS.get(group, {}))
  split = {"val_loss": data.val, "test_loss": data.test}.get(FLAGS.decision_stat)
  if split is not None and (split.counts == 0).any():
    flag = "--val_fraction" if FLAGS.decision_stat == "val_loss" else "--test_fraction"
    raise app.UsageError(f"{int((split.counts == 0).sum())} clients hold no data to decide on "
                         f"with --decision_stat={FLAGS.decision_stat} (their check would pass "
                         f"unseen); raise {flag} or lower --num_clients")
  data, _, kinds = common.corrupt(data, seed)
  return data, kinds


def runs_to_do():
  out = [(m, METHODS[m], m == "fedsrc", m) for m in FLAGS.methods]
  out += [(f"fedsrc+{a}", f"FedSRC+{METHODS[a]}", True, a) for a in FLAGS.fedsrc_with]
  return out


def per_client_samples(data):
  """(training samples a client processes when it trains, samples it evaluates to decide)."""
  counts = np.asarray(data.train.counts)
  if FLAGS.local_steps is None:
    train = FLAGS.local_epochs * counts
  else:
    train = np.asarray(steps_per_client(counts, common.local_hparams())) * FLAGS.batch_size
  evals = {"test_loss": np.asarray(data.test.counts), "val_loss": np.asarray(data.val.counts),
           "loss": counts,
           "batch_loss": np.full(len(counts), FLAGS.batch_size)}[FLAGS.decision_stat]
  return train.astype(float), evals.astype(float)


def round_extras(kinds, uses_rule, data):
  per_client = per_client_samples(data)

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


def main(argv):
  del argv
  common.init_distributed()
  check_flags()
  seeds = common.seeds()
  loaded = {(s, g): load(s, g) for g in groups() for s in seeds}
  results = {}
  for group in groups():
    runs = results.setdefault(group, {})
    options = common.engine_options([loaded[(s, group)][0] for s in seeds])
    for key, label, uses_rule, agg_name in runs_to_do():
      jobs = []
      for value in common.sweep_values():
        with common.swept(value):
          for seed in seeds:
            data, kinds = loaded[(seed, group)]
            rule = fedsrc.fedsrc_rule(parts.fedsrc_config()) if uses_rule else None
            sim = fs.Simulator(common.model_for(data), data, common.optimizer(),
                               common.local_hparams(), common.availability(),
                               fs.random_selector(FLAGS.clients_per_round),
                               parts.make_aggregator(agg_name),
                               FLAGS.clients_per_round, seed, participation=rule,
                               lr_schedule=common.lr_schedule(), eval_mask=kinds == "good",
                               **options)
            print(f"== {group} {label} seed {seed}: {data.name}, N={data.num_clients}, bad "
                  f"clients {int((kinds != 'good').sum())}")
            jobs.append(common.make_run(sim, (group, key, f"seed{seed}"),
                                        f"{group} {label} s{seed} ",
                                        round_extras(kinds, uses_rule, data)))
      for suffix, group_runs in common.by_sweep(common.run_all(jobs), len(seeds)):
        runs[label + suffix] = [(recs, *loaded[(seed, group)])
                                for seed, recs in zip(seeds, group_runs)]
  if common.writer():  # Process 0 of a multi-host run.
    write_outputs(results)


def saving_row(label, group) -> str:
  tot = {}
  counts = {}  # kind -> [sampled, excluded] over the gated rounds of every seed.
  for recs, data, kinds in group:
    s = fedsrc.savings(recs, *per_client_samples(data))
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


def summary(runs) -> str:
  from fedjax_sel.plotting import metric_matrix  # pylint: disable=import-outside-toplevel
  lines = ["| method | final clean test acc | best clean test acc | mean clean test acc, last "
           f"{FLAGS.last_k} "
           "rounds | mean participation rate | train samples | uploads |", "|" + "---|" * 7]
  for label, group in runs.items():
    recs_list = [g[0] for g in group]
    _, acc = metric_matrix(recs_list, "test_accuracy")
    rate = np.mean([[r["participation_rate"] for r in recs] for recs in recs_list])
    cost = np.mean([recs[-1]["cumulative_cost"]["train_samples"] for recs in recs_list])
    up = np.mean([recs[-1]["cumulative_cost"]["uploads"] for recs in recs_list])
    lines.append(f"| {label} | {common.mean_std(acc[:, -1])} | {common.mean_std(acc.max(1))} | "
                 f"{common.mean_std(acc[:, -FLAGS.last_k:].mean(1))} | {rate:.3f} | {cost:.3g} | "
                 f"{up:.0f} |")
  rule_runs = [label for label in runs if label.startswith("FedSRC")]
  if rule_runs:
    lines += ["", "Savings of the self-regulating runs (means over seeds; exclusions over the gated "
              "rounds; net = gross minus 1/3 of a training step per evaluated sample; percentages "
              "of what the sampled clients would have trained and uploaded):", "",
              "| method | bad clients excluded (by kind) | good clients excluded | training samples saved "
              "(gross) | samples evaluated to decide | net samples saved | uploads saved |",
              "|" + "---|" * 7]
    lines += [saving_row(label, runs[label]) for label in rule_runs]
  return "\n".join(lines)


def write_outputs(results):
  bad = int(FLAGS.corrupt_fraction * 100)
  text = "\n\n".join(f"## {group} ({FLAGS.dataset}, {bad}% bad clients, "
                     f"{len(common.seeds())} seeds)\n\n" + summary(runs)
                     for group, runs in results.items())
  print(text)
  with open(os.path.join(FLAGS.out_dir, "summary.md"), "w", encoding="utf-8") as f:
    f.write(text + "\n")
  if FLAGS.plot:
    from fedjax_sel.plotting import plot_panels  # pylint: disable=import-outside-toplevel
    rows = {group: {label: [g[0] for g in group_runs] for label, group_runs in runs.items()}
            for group, runs in results.items()}
    keys = ["test_accuracy", "participation_rate", "good_excluded"]
    keys += sorted({f"{k}_excluded" for runs in results.values() for group_runs in runs.values()
                    for _, _, kinds in group_runs for k in set(kinds.tolist()) if k != "good"})
    path = common.figure_path("fedsrc")
    self_regulating = lambda label: label.startswith("FedSRC")
    titles = {"test_accuracy": "clean test accuracy", "participation_rate": "participation rate",
              **{k: f"{k[:-len('_excluded')]} clients excluded" for k in keys
                 if k.endswith("_excluded")}}
    plot_panels(rows, keys, path, titles=titles, title=common.setup_title(f"{bad}% bad clients"),
                only={k: self_regulating for k in keys if k != "test_accuracy"})
    print(f"figure: {path}")


if __name__ == "__main__":
  app.run(common.cli(main))
