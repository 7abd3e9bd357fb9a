r"""Generic launcher: FedAvg / FedProx with random selection on any dataset, model and partition.

  python -m experiments.run --dataset=digits --partition=dirichlet --rounds=30 --out_dir=runs/fedavg
  python -m experiments.run --seeds=0,1,2 --sweep=lr:0.05,0.1,0.2   # 9 runs, one batched program

Writes `<out_dir>/seed<s>/metrics.jsonl` (`<out_dir>/<name>=<value>/seed<s>/` with --sweep; one
JSON line per round, flushed as it comes), prints
per-round progress and a final summary table (also saved as `<out_dir>/summary.md`).
"""

import os

from absl import app, flags

import fedjax_sel as fs
from experiments import common

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(common)  # --help lists the shared flags too.


def main(argv):
  del argv
  common.init_distributed()
  seeds = common.seeds()
  datasets = {s: common.load_data(s) for s in seeds}  # Fails on bad data flags before training.
  options = common.engine_options(list(datasets.values()))
  label = "FedProx" if FLAGS.prox_mu else "FedAvg"
  if FLAGS.server_opt != "none":
    label += f" + server {FLAGS.server_opt}"
  jobs = []
  for value in common.sweep_values():
    with common.swept(value):
      for seed in seeds:
        data = datasets[seed]
        sim = fs.Simulator(
            common.model_for(data), data, common.optimizer(), common.local_hparams(),
            common.availability(), fs.random_selector(FLAGS.clients_per_round),
            fs.fedavg(FLAGS.weighting), FLAGS.clients_per_round, seed,
            lr_schedule=common.lr_schedule(), **options)
        print(f"== {label} seed {seed}: {data.name}, N={data.num_clients}, model={FLAGS.model}")
        jobs.append(common.make_run(sim, (f"seed{seed}",), f"{label} s{seed} "))
  groups = {label + suffix: runs for suffix, runs in common.by_sweep(common.run_all(jobs),
                                                                     len(seeds))}
  table = fs.summary_table([(f"{name} seed {s}", r) for name, runs in groups.items()
                            for s, r in zip(seeds, runs)])
  print(table)
  if not common.writer():  # Process 0 of a multi-host run writes the files.
    return
  with open(os.path.join(FLAGS.out_dir, "summary.md"), "w", encoding="utf-8") as f:
    f.write(table + "\n")
  if FLAGS.plot:
    from fedjax_sel.plotting import plot_curves  # pylint: disable=import-outside-toplevel
    path = os.path.join(FLAGS.out_dir, "curves.png")
    plot_curves(groups, ["test_accuracy", "train_loss", "test_loss"], path)
    print(f"figure: {path}")


if __name__ == "__main__":
  app.run(common.cli(main))
