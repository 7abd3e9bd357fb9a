r"""FedALIGN launcher: prioritized FL with aligned non-priority clients, against "None" and "All".

  python -m experiments.fedalign --seeds=0,1,2 --plot
  python -m experiments.fedalign --preset=fmnist --plot          # The paper's Fashion-MNIST setup.
  python -m experiments.fedalign --preset=synth --plot           # SYNTH(1,1) at three noise levels.

Methods (`--methods`): fedalign (the rule), none (FedAvg on the priority clients only) and all
(FedAvg on every client); with --prox_mu > 0 all three train with FedProx. Default data (offline):
digits in uni-class shards, N = 30 clients, 2 priority clients, logistic regression, E = 5, lr 0.1,
full participation, 50 rounds, 3 seeds.

Per run it writes `<out_dir>/<group>/<method>/seed<s>/metrics.jsonl` (group: `main`, or the SYNTH
noise level) with, per round: `priority_objective` (F(w_t), the priority clients' data-weighted
training loss), `priority_test_accuracy` / `priority_test_loss` (on the priority clients' test data),
`test_accuracy` (all clients), `others_trained` / `others_aggregated` (non-priority clients),
`eps`, `closest_gap` (the smallest |F_k - F| of a non-priority client: above eps_t nobody aligns)
and the cost counters; plus `summary.md` and, with --plot, `fedalign.png`.
"""

import os

import numpy as np
from absl import app, flags

import fedjax_sel as fs
from experiments import common, parts
from fedjax_sel import fedalign
from fedjax_sel.data.corruption import LABEL_NOISE_MODES, NOISE_PRESETS, noisy_clients
from fedjax_sel.selectors import all_selector, group_random_selector

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(common)  # --help lists the shared flags too.
for _flag in ("num_priority", "priority_ids", "priority_classes", "eps0", "eps_schedule",
              "warmup_fraction", "align_metric", "align_split"):
  flags.declare_key_flag(_flag)  # The parts' flags FedALIGN uses, in its --help.
common.SWEEPABLE.extend(["eps0"])  # --sweep may vary these (run values or part state).
PRESETS = {
    "fmnist": {"dataset": "fashion_mnist", "partition": "uni_class", "num_clients": 60,
               "num_priority": 2, "model": "logreg", "local_epochs": 5, "lr": 0.1,
               "batch_size": 32, "rounds": 100, "align_metric": "accuracy"},
    "emnist": {"dataset": "tfds", "tfds_name": "emnist/balanced", "partition": "uni_class",
               "num_clients": 60, "num_priority": 2, "model": "mlp", "local_epochs": 5,
               "lr": 0.1, "batch_size": 32, "rounds": 100, "align_metric": "accuracy"},
    "cifar10": {"dataset": "tfds", "tfds_name": "cifar10", "partition": "uni_class",
                "num_clients": 60, "num_priority": 2, "model": "cifar_cnn", "local_epochs": 5,
                "lr": 0.01, "batch_size": 32, "rounds": 100, "align_metric": "accuracy"},
    "synth": {"dataset": "synth", "num_clients": 20, "num_priority": 10, "model": "logreg",
              "local_epochs": 5, "lr": 0.1, "batch_size": 32, "rounds": 100,
              "synth_noise": ["low", "medium", "high"], "align_metric": "accuracy"},
}
flags.DEFINE_enum("preset", None, sorted(PRESETS), "The paper's setups; each value is "
                  "overridable by its flag. " + common.preset_help(PRESETS))
flags.DEFINE_list("methods", ["fedalign", "none", "all"], "Runs to compare: fedalign, none "
                  "(FedAvg on the priority clients only), all (FedAvg on every client).")
flags.DEFINE_enum("participation", "full", ("full", "partial"), "full: every client every round; "
                  "partial: a uniform sample of each group per round.")
flags.DEFINE_integer("priority_per_round", 1, "Partial participation: priority clients sampled per "
                     "round.", lower_bound=1)
flags.DEFINE_integer("others_per_round", 10, "Partial participation: non-priority clients sampled "
                     "per round.", lower_bound=0)
flags.DEFINE_list("synth_noise", ["medium"], f"SYNTH: noise levels of the non-priority clients, "
                  f"one group of runs each; presets {NOISE_PRESETS} as (label noise share, "
                  f"irrelevant points share).")
flags.DEFINE_enum("label_noise_mode", "random", LABEL_NOISE_MODES, "SYNTH noise: random labels "
                  "or flipped to another class.")

for _name, _value in (("rounds", 50), ("num_clients", 30), ("partition", "uni_class"),
                      ("model", "logreg"), ("local_epochs", 5), ("lr", 0.1), ("batch_size", 32),
                      ("seeds", ["0", "1", "2"]), ("weighting", "examples"),
                      ("out_dir", "runs/fedalign"), ("clients_per_round", 1), ("num_available", 0)):
  FLAGS.set_default(_name, _value)

LABELS = {"fedalign": "FedALIGN", "none": "None", "all": "All"}


def check_flags():
  common.apply_preset(PRESETS, FLAGS.preset)
  bad = [m for m in FLAGS.methods if m not in LABELS]
  if bad or not FLAGS.methods:
    raise app.UsageError(f"--methods must list values among {sorted(LABELS)}, got {FLAGS.methods}")
  common.check_finite()
  parts.check_fedalign()
  unknown = [lvl for lvl in FLAGS.synth_noise if lvl not in NOISE_PRESETS]
  if FLAGS.dataset == "synth" and (unknown or not FLAGS.synth_noise):
    raise app.UsageError(f"--synth_noise must list levels among {sorted(NOISE_PRESETS)}, got "
                         f"{FLAGS.synth_noise}")


def groups() -> list[str]:
  return list(FLAGS.synth_noise) if FLAGS.dataset == "synth" else ["main"]


def load(seed, group):
  data = common.load_data(seed)
  priority = parts.priority_mask(data.num_clients, data.label_hist, seed)
  if group != "main":
    label_noise, irrelevant = NOISE_PRESETS[group]
    data = noisy_clients(data, ~priority, label_noise, irrelevant, seed=seed + 300,
                         mode=FLAGS.label_noise_mode)
  return data, priority


def eps0_for(group) -> float:
  if group == "high" and not FLAGS["eps0"].present:
    return 0.4
  return FLAGS.eps0


def eps0_text(groups) -> str:
  """eps_0 for the figure's title: one value, or each group's where they differ."""
  values = {group: eps0_for(group) for group in groups}
  if len(set(values.values())) == 1:
    return str(next(iter(values.values())))
  return ", ".join(f"{v} ({group})" for group, v in values.items())


def make_rule(method, priority, group):
  if method == "none":
    return fedalign.priority_only(priority)
  if method == "all":
    return fs.everyone()
  return parts.fedalign_rule(priority, eps0_for(group))


def participation_parts(priority):
  """(availability, selector, K) of full or partial participation."""
  n = len(priority)
  if FLAGS.participation == "full":
    return fs.uniform_availability(n, n), all_selector(), n
  groups_of = {"others_per_round": int((~priority).sum()),
               "priority_per_round": int(priority.sum())}
  for flag, count in groups_of.items():  # A default larger than its group takes the whole group.
    if FLAGS[flag].present and FLAGS[flag].value > count:
      raise app.UsageError(f"--{flag}={FLAGS[flag].value} cannot apply: its group holds {count} "
                           f"clients; accepted 0..{count}")
  sizes = (min(FLAGS.others_per_round, groups_of["others_per_round"]),
           min(FLAGS.priority_per_round, groups_of["priority_per_round"]))
  return (fs.uniform_availability(n, n), group_random_selector(priority.astype(np.int32), sizes),
          max(sum(sizes), 1))


def round_extras(priority):
  def extra(state, record):
    del state
    trained = np.asarray(record["trained_clients"], int)
    aggregated = np.asarray(record["aggregated_clients"], int)
    out = {"others_trained": int((~priority[trained]).sum()),
           "others_aggregated": int((~priority[aggregated]).sum())}
    if "eps" in record["rule"]:
      out.update(eps=record["rule"]["eps"], closest_gap=record["rule"]["closest_gap"])
    if "clean_train_loss" in record:
      out.update(priority_objective=record["clean_train_loss"],
                 priority_test_accuracy=record["clean_test_accuracy"],
                 priority_test_loss=record["clean_test_loss"])
    return out
  return extra


def main(argv):
  del argv
  common.init_distributed()
  common.refuse_corruption("FedALIGN's launcher (its SYNTH noise: --synth_noise)")
  check_flags()
  seeds = common.seeds()
  loaded = {(s, g): load(s, g) for g in groups() for s in seeds}  # Data errors before training.
  suffix = "+Prox" if FLAGS.prox_mu else ""
  results = {}
  for group in groups():
    runs = results.setdefault(group, {})
    options = common.engine_options([loaded[(s, group)][0] for s in seeds])
    for method in FLAGS.methods:
      label = LABELS[method] + suffix
      jobs = []
      for value in common.sweep_values():
        with common.swept(value):
          for seed in seeds:
            data, priority = loaded[(seed, group)]
            model = common.model_for(data)
            avail, selector, k = participation_parts(priority)
            sim = fs.Simulator(model, data, common.optimizer(), common.local_hparams(), avail,
                               selector, fs.fedavg(FLAGS.weighting), k, seed,
                               participation=make_rule(method, priority, group),
                               lr_schedule=common.lr_schedule(), eval_mask=priority, **options)
            print(f"== {group} {label} seed {seed}: {data.name}, N={data.num_clients}, priority "
                  f"{np.flatnonzero(priority).tolist()}")
            jobs.append(common.make_run(sim, (group, method, f"seed{seed}"),
                                        f"{group} {label} s{seed} ", round_extras(priority)))
      for suffix, group_runs in common.by_sweep(common.run_all(jobs), len(seeds)):
        runs[label + suffix] = group_runs
  if common.writer():  # Process 0 of a multi-host run.
    write_outputs(results)


def summary(runs: dict, warmup: int) -> str:
  """Per method: final / best / post-warm-up mean priority test accuracy, the round where FedALIGN
  first leads None, included non-priority clients and costs."""
  from fedjax_sel.plotting import metric_matrix  # pylint: disable=import-outside-toplevel
  lines = ["| method | final priority acc | best priority acc | mean priority acc after warm-up | "
           f"mean priority acc, last {FLAGS.last_k} rounds | final acc (all clients) | "
           "non-priority aggregated / round | non-priority trained / round | closest "
           "non-priority gap / eps_t (after warm-up) | train samples | uploads |",
           "|" + "---|" * 11]
  curves = {}
  for label, group in runs.items():
    rounds, acc = metric_matrix(group, "priority_test_accuracy")
    _, all_acc = metric_matrix(group, "test_accuracy")
    curves[label] = (rounds, acc.mean(0))
    post = rounds >= warmup
    agg = np.mean([[r["others_aggregated"] for r in recs if r["round"] >= warmup] for recs in group])
    trn = np.mean([[r["others_trained"] for r in recs if r["round"] >= warmup] for recs in group])
    post_recs = [r for recs in group for r in recs if r["round"] >= warmup and "eps" in r]
    gap = (f"{np.mean([r['closest_gap'] for r in post_recs]):.3f} / "
           f"{np.mean([r['eps'] for r in post_recs]):.3f}" if post_recs else "-")
    cost = np.mean([recs[-1]["cumulative_cost"]["train_samples"] for recs in group])
    up = np.mean([recs[-1]["cumulative_cost"]["uploads"] for recs in group])
    lines.append(f"| {label} | {common.mean_std(acc[:, -1])} | {common.mean_std(acc.max(1))} | "
                 f"{common.mean_std(acc[:, post].mean(1))} | "
                 f"{common.mean_std(acc[:, -FLAGS.last_k:].mean(1))} | "
                 f"{common.mean_std(all_acc[:, -1])} | "
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


def write_outputs(results):
  warmup = fedalign.warmup_rounds(FLAGS.rounds, FLAGS.warmup_fraction)
  text = []
  for group, runs in results.items():
    text.append(f"## {group} (eps_0 = {eps0_for(group)}, warm-up {warmup} rounds, "
                f"{len(common.seeds())} seeds)\n\n" + summary(runs, warmup))
  out = "\n\n".join(text)
  print(out)
  with open(os.path.join(FLAGS.out_dir, "summary.md"), "w", encoding="utf-8") as f:
    f.write(out + "\n")
  if FLAGS.plot:
    from fedjax_sel.plotting import plot_panels  # pylint: disable=import-outside-toplevel
    keys = ["priority_test_accuracy", "priority_objective", "test_accuracy", "others_aggregated",
            "eps", "closest_gap"]
    titles = {"priority_test_accuracy": "priority test accuracy",
              "priority_objective": "priority training loss F(w_t)",
              "test_accuracy": "test accuracy (all clients)",
              "others_aggregated": "non-priority clients aggregated",
              "eps": "eps_t", "closest_gap": "closest non-priority |F_k - F|"}
    path = common.figure_path("fedalign")
    plot_panels(results, keys, path, titles=titles,
                title=common.setup_title(f"{FLAGS.participation} participation, "
                                         f"{FLAGS.num_priority} priority clients, eps_0 = "
                                         f"{eps0_text(results)}, aligned on "
                                         f"{FLAGS.align_metric}",
                                         with_k=False),
                only={key: (lambda label: label == "FedALIGN")
                      for key in ("eps", "closest_gap", "others_aggregated")})
    print(f"figure: {path}")


if __name__ == "__main__":
  app.run(common.cli(main))
