r"""Generic launcher: any selector, filter, participation rule, aggregator and server optimizer on
any dataset, model and partition.

  python -m experiments.run --dataset=digits --partition=dirichlet --rounds=30 --out_dir=runs/fedavg
  python -m experiments.run --seeds=0,1,2 --sweep=lr:0.05,0.1,0.2   # 9 runs, one batched program
  python -m experiments.run --selector=oort --system_profile=lognormal --deadline_s=20
  python -m experiments.run --selector=entropy --rule=fedsrc --aggregator=krum --server_opt=adam
  python -m experiments.run --filter=dgf --selector=poc --rule=fedalign

Parts (`experiments/parts.py` holds their settings' flags): `--selector` random, poc, divfl,
entropy, grad_norm, oort; `--filter` none, dgf, rgf (FilFL; a 5% public set unless
`--public_fraction` says otherwise); `--rule` none, fedalign (priority clients from
`--num_priority` / `--priority_ids` / `--priority_classes`; the clean metrics are theirs), fedsrc
(its `--decision_stat=val_loss` gets a 10% validation split unless `--val_fraction` is given);
`--aggregator` fedavg, median, trimmed_mean, krum, multi_krum, fedasl; `--server_opt` none, sgd,
momentum, adam, yogi, adagrad. The defaults are FedAvg (FedProx with `--prox_mu`) with random
selection. `--corrupt_fraction` corrupts that share of the clients (`--corrupt_kinds`: shuffle,
flip, noise), as FilFL's and FedSRC's launchers do; the clean_* metrics then leave them out.

Writes `<out_dir>/seed<s>/metrics.jsonl` (`<out_dir>/<name>=<value>/seed<s>/` with --sweep; one
JSON line per round, flushed as it comes), prints per-round progress and a final summary table
(also saved as `<out_dir>/summary.md`).
"""

import os

from absl import app, flags

import fedjax_sel as fs
from experiments import common, config, flag_binding, parts
from fedjax_sel import fedsrc

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(common)  # --help lists the shared flags too.
flags.adopt_module_key_flags(parts)  # And every part's settings.
flag_binding.define_choices(("filter", "rule", "aggregator"))

SWEEPABLE = {"lr": "local.lr", "prox_mu": "local.prox_mu"}  # --sweep NAME: config field.
CONFIG_FILE = "config.json"
DEFAULT_PUBLIC_FRACTION = 0.05
DEFAULT_VAL_FRACTION = 0.1


def apply_part_defaults() -> None:
  """What a part needs from the data, unless the user set it: a public set for a filter, a
  validation split for FedSRC's val_loss decision and FedALIGN's val split."""
  if FLAGS.filter != "none" and not FLAGS["public_fraction"].present:
    FLAGS.public_fraction = DEFAULT_PUBLIC_FRACTION
  wants_val = ((FLAGS.rule == "fedsrc" and FLAGS.decision_stat == "val_loss")
               or (FLAGS.rule == "fedalign" and FLAGS.align_split == "val"))
  if wants_val and not FLAGS["val_fraction"].present:
    FLAGS.val_fraction = DEFAULT_VAL_FRACTION


def check_parts() -> None:
  """Each part's settings, and the combinations that cannot run, before any data."""
  k = FLAGS.clients_per_round
  common.check_counts()  # K <= n <= N before the availability model is built on them.
  parts.check_selector(k, common.availability().num_available)
  if FLAGS.filter != "none" and FLAGS.public_fraction <= 0:
    raise app.UsageError(f"--filter={FLAGS.filter} evaluates models on a public set: set "
                         "--public_fraction > 0")
  if FLAGS.rule == "fedsrc":
    parts.check_fedsrc()
  if FLAGS.rule == "fedalign":
    parts.check_fedalign()
  parts.check_aggregators({FLAGS.aggregator})


def label() -> str:
  """The run's name from its parts: FedAvg (FedProx) plus whatever differs from it."""
  name = ["FedProx" if FLAGS.prox_mu else "FedAvg"]
  for flag, default in (("selector", "random"), ("filter", "none"), ("rule", "none"),
                        ("aggregator", "fedavg"), ("server_opt", "none")):
    if FLAGS[flag].value != default:
      name.append(f"{flag} {FLAGS[flag].value}")
  return " + ".join(name)


def main(argv):
  del argv
  common.init_distributed()
  apply_part_defaults()
  check_parts()
  seeds = common.seeds()
  common.check_corruption()
  job = flag_binding.job_config(sweepable=SWEEPABLE)
  datasets = {s: common.corrupt(common.load_data(s), s)[:2] for s in seeds}  # Data errors first.
  if common.writer():  # The typed job, resolved (the part defaults above applied).
    common.write_text(os.path.join(FLAGS.out_dir, CONFIG_FILE), config.to_json(job))
  options = common.engine_options([data for data, _ in datasets.values()])
  name = label()
  jobs = []
  k = FLAGS.clients_per_round
  for value in common.sweep_values():
    with common.swept(value):
      for seed in seeds:
        data, bad = datasets[seed]
        model = common.model_for(data)
        rule = None
        eval_mask = ~bad if bad.any() else None  # clean_* metrics: the uncorrupted clients.
        if FLAGS.rule == "fedsrc":
          rule = fedsrc.fedsrc_rule(parts.fedsrc_config())
        elif FLAGS.rule == "fedalign":
          priority = parts.priority_mask(data.num_clients, data.label_hist, seed)
          rule = parts.fedalign_rule(priority)
          eval_mask = priority & ~bad  # The priority clients' clean data.
        sim = fs.Simulator(
            model, data, common.optimizer(), common.local_hparams(), common.availability(),
            parts.make_selector(k, data=data, profile=options["system_profile"]),
            parts.make_aggregator(FLAGS.aggregator), k, seed,
            filter=parts.make_filter(FLAGS.filter, model), participation=rule,
            eval_mask=eval_mask, lr_schedule=common.lr_schedule(), **options)
        print(f"== {name} seed {seed}: {data.name}, N={data.num_clients}, "
              f"bad clients={int(bad.sum())}, model={FLAGS.model}")
        jobs.append(common.make_run(sim, (f"seed{seed}",), f"{name} s{seed} "))
  groups = {name + suffix: runs for suffix, runs in common.by_sweep(common.run_all(jobs),
                                                                    len(seeds))}
  table = fs.summary_table([(f"{group} seed {s}", r) for group, runs in groups.items()
                            for s, r in zip(seeds, runs)])
  print(table)
  if not common.writer():  # Process 0 of a multi-host run writes the files.
    return
  with open(os.path.join(FLAGS.out_dir, "summary.md"), "w", encoding="utf-8") as f:
    f.write(table + "\n")
  if FLAGS.plot:
    from fedjax_sel.plotting import plot_curves  # pylint: disable=import-outside-toplevel
    path = common.figure_path("curves")
    plot_curves(groups, ["test_accuracy", "train_loss", "test_loss"], path,
                title=common.setup_title(name))
    print(f"figure: {path}")


if __name__ == "__main__":
  app.run(common.cli(main))
