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
from experiments import common
from fedjax_sel import aggregators as aggs
from fedjax_sel import fedsrc
from fedjax_sel.data.corruption import KINDS, corrupt_clients, corruption_kinds
from fedjax_sel.local_training import steps_per_client

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(common)  # --help lists the shared flags too.
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
flags.DEFINE_float("bad_fraction", 0.3, "Share of bad clients, in [0, 1].")
flags.DEFINE_list("bad_kinds", list(KINDS), f"Corruptions split evenly among the bad clients: "
                  f"{KINDS}.")
flags.DEFINE_enum("fedsrc_mode", "paper", fedsrc.MODES, "paper: phi = median + alpha*sigma with "
                  "alpha adapted to the participation target; reference: the reference code's rule "
                  "(median + ref_beta*std, floor --ref_cut).")
flags.DEFINE_float("fedsrc_beta", 0.5, "beta: how much a client's heterogeneity index lowers its "
                   "threshold, Phi_k = phi*(1 - beta*RHI_k), in [0, 0.9].")
flags.DEFINE_float("kappa", 0.7, "kappa: RHI's weight of the class-count index against the label "
                   "entropy, in [0, 1].")
flags.DEFINE_float("participation_target", 0.7, "Share of the sampled clients that should train; "
                   "alpha adapts to hold it on average, in (0, 1].")
flags.DEFINE_float("alpha0", 1.0, "Initial alpha (spread multiplier of the server threshold).")
flags.DEFINE_float("alpha_gain", 1.0, "Alpha's step per unit of participation shortfall.")
flags.DEFINE_float("alpha_max", 5.0, "Upper bound of alpha.")
flags.DEFINE_enum("decision_stat", "val_loss", fedsrc.DECISION_STATS, "The loss a client checks "
                  "against its threshold: on its own held-out data drawn like its training data "
                  "(val_loss: the validation split, corrupted like the training data of a bad "
                  "client; default), its test split (kept clean for global scoring, so blind to "
                  "corruption), one mini-batch, or all its training data.")
flags.DEFINE_float("reinclude_prob", 0.1, "q: probability that an abstaining client trains anyway, "
                   "in [0, 1].")
flags.DEFINE_integer("reinclude_after", 0, "An abstaining client trains anyway after this many "
                     "consecutive abstentions (0 = never).", lower_bound=0)
flags.DEFINE_enum("reported_loss", "train", fedsrc.REPORTED_LOSSES, "What participants report for "
                  "the next threshold: their mean loss over local training (the paper) or the "
                  "loss they checked at the global model (same scale as the decision).")
flags.DEFINE_float("ref_beta", 1.0, "Reference mode: multiplier of the losses' sample std.")
flags.DEFINE_float("ref_cut", 0.0, "Reference mode: floor of the cutoff.")
flags.DEFINE_float("trim_beta", 0.3, "Trimmed mean: share trimmed per side, in [0, 0.5).")
flags.DEFINE_enum("trim_rounding", "floor", aggs.TRIM_ROUNDINGS, "Trimmed mean: int(beta*n) "
                  "(floor, textbook) or ceil(beta*n) (the reference code's) per side.")
flags.DEFINE_string("krum_f", "0.3", "Krum's assumed Byzantine models f: a count (e.g. 2) or a "
                    "fraction of the aggregated models (e.g. 0.3); needs n >= 2f + 3.")
flags.DEFINE_integer("multi_krum_m", 0, "Multi-Krum: models averaged (0 = n - f).", lower_bound=0)
flags.DEFINE_bool("krum_normalized", False, "Krum on L2-normalized models (the FedSRC reference "
                  "code's distance).")
flags.DEFINE_float("fedasl_alpha", 1.0, "FedASL: band around the median loss, in sigmas.")
flags.DEFINE_float("fedasl_beta", 0.2, "FedASL: v_k inside the band, in sigmas.")

for _name, _value in (("rounds", 40), ("num_clients", 50), ("clients_per_round", 10),
                      ("num_available", 0), ("avail_period", 1), ("model", "mlp"),
                      ("local_epochs", 2), ("lr", 0.1), ("batch_size", 16), ("val_fraction", 0.1),
                      ("seeds", ["0", "1", "2"]), ("out_dir", "runs/fedsrc")):
  FLAGS.set_default(_name, _value)


def krum_f():
  text = FLAGS.krum_f
  try:
    return float(text) if "." in text else int(text)
  except ValueError as e:
    raise app.UsageError(f"--krum_f must be a count or a fraction, got {text!r}") from e


def fedsrc_config() -> fedsrc.FedSRCConfig:
  return fedsrc.FedSRCConfig(
      mode=FLAGS.fedsrc_mode, beta=FLAGS.fedsrc_beta, kappa=FLAGS.kappa,
      target=FLAGS.participation_target, alpha0=FLAGS.alpha0, alpha_gain=FLAGS.alpha_gain,
      alpha_max=FLAGS.alpha_max, decision_stat=FLAGS.decision_stat,
      reinclude_prob=FLAGS.reinclude_prob, reinclude_after=FLAGS.reinclude_after,
      reported_loss=FLAGS.reported_loss, ref_beta=FLAGS.ref_beta, cut=FLAGS.ref_cut)


FLAG_OF = {"beta": "fedsrc_beta", "target": "participation_target", "cut": "ref_cut",
           "fedsrc_mode": "fedsrc_mode", "participation": "participation_target"}


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
  kinds = [k for k in FLAGS.bad_kinds if k not in KINDS]
  if kinds or not FLAGS.bad_kinds:
    raise app.UsageError(f"--bad_kinds must be among {KINDS}, got {FLAGS.bad_kinds}")
  # NaN and inf fail the range checks below and fedsrc.check_config's; lr has no upper bound.
  common.check_finite()
  if not 0.0 <= FLAGS.bad_fraction <= 1.0:
    raise app.UsageError(f"--bad_fraction must be in [0, 1], got {FLAGS.bad_fraction}")
  try:
    fedsrc.check_config(fedsrc_config())
  except ValueError as e:
    field = str(e).split()[0]
    raise app.UsageError(f"--{FLAG_OF.get(field, field)}: {e}") from e
  if FLAGS.decision_stat == "val_loss" and FLAGS.val_fraction <= 0:
    raise app.UsageError("--decision_stat=val_loss needs --val_fraction > 0 (each client's "
                         "held-out data)")
  used = set(FLAGS.methods) | set(FLAGS.fedsrc_with)
  krum_used = used & {"krum", "multi_krum"}
  for name in {"trimmed_mean", "fedasl"} | krum_used:  # The aggregators' own argument checks.
    try:
      make_aggregator(name)
    except ValueError as e:
      raise app.UsageError(f"{AGGREGATOR_FLAGS[name]}: {e}") from e
  if krum_used:
    try:
      aggs.check_krum(FLAGS.clients_per_round, krum_f())
    except ValueError as e:
      raise app.UsageError(f"--krum_f / --clients_per_round: {e}") from e
  if "multi_krum" in used:
    most = FLAGS.clients_per_round - aggs.byzantine_count(FLAGS.clients_per_round, krum_f())
    if FLAGS.multi_krum_m > most:
      raise app.UsageError(f"--multi_krum_m={FLAGS.multi_krum_m} cannot apply: Multi-Krum "
                           f"averages at most n - f = {most} of the K={FLAGS.clients_per_round} "
                           f"models; accepted 0 (= n - f) to {most}")


AGGREGATOR_FLAGS = {"trimmed_mean": "--trim_beta / --trim_rounding", "krum": "--krum_f",
                    "multi_krum": "--krum_f / --multi_krum_m",
                    "fedasl": "--fedasl_alpha / --fedasl_beta"}


def make_aggregator(name):
  if name in ("fedsrc", "fedavg"):
    return fs.fedavg(FLAGS.weighting)
  if name == "median":
    return aggs.coordinate_median()
  if name == "trimmed_mean":
    return aggs.trimmed_mean(FLAGS.trim_beta, FLAGS.trim_rounding)
  if name in ("krum", "multi_krum"):
    multi = FLAGS.multi_krum_m if name == "multi_krum" else None
    return aggs.krum(krum_f(), multi=multi, normalize=FLAGS.krum_normalized)
  return aggs.fedasl(FLAGS.fedasl_alpha, FLAGS.fedasl_beta)


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
  kinds = tuple(FLAGS.bad_kinds)
  data, _ = corrupt_clients(data, FLAGS.bad_fraction, kinds, seed=seed + 100)
  return data, corruption_kinds(data.num_clients, FLAGS.bad_fraction, kinds, seed=seed + 100)


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
            rule = fedsrc.fedsrc_rule(fedsrc_config()) if uses_rule else None
            sim = fs.Simulator(common.model_for(data), data, common.optimizer(),
                               common.local_hparams(), common.availability(),
                               fs.random_selector(FLAGS.clients_per_round),
                               make_aggregator(agg_name),
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
  lines = ["| method | final clean test acc | best clean test acc | mean clean test acc, last 10 "
           "rounds | mean participation rate | train samples | uploads |", "|" + "---|" * 7]
  for label, group in runs.items():
    recs_list = [g[0] for g in group]
    _, acc = metric_matrix(recs_list, "test_accuracy")
    rate = np.mean([[r["participation_rate"] for r in recs] for recs in recs_list])
    cost = np.mean([recs[-1]["cumulative_cost"]["train_samples"] for recs in recs_list])
    up = np.mean([recs[-1]["cumulative_cost"]["uploads"] for recs in recs_list])
    lines.append(f"| {label} | {common.mean_std(acc[:, -1])} | {common.mean_std(acc.max(1))} | "
                 f"{common.mean_std(acc[:, -10:].mean(1))} | {rate:.3f} | {cost:.3g} | {up:.0f} |")
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
  text = "\n\n".join(f"## {group} ({FLAGS.dataset}, {int(FLAGS.bad_fraction * 100)}% bad clients, "
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
    path = os.path.join(FLAGS.out_dir, "fedsrc.png")
    plot_panels(rows, keys, path, titles={"test_accuracy": "clean test accuracy",
                                          "participation_rate": "participation rate"})
    print(f"figure: {path}")


if __name__ == "__main__":
  app.run(common.cli(main))
