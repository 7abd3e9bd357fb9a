r"""FilFL launcher: client filtering (DGF / RGF) versus no filtering, with RS / PoC / DivFL selection.

  python -m experiments.filfl --filters=none,dgf,rgf --seeds=0,1,2 --plot

Defaults: digits, N=50 clients (Dirichlet 0.5), n=25 available, K=5 per round, 40% of the clients
with shuffled labels, a 5% stratified public set, h=5, 40 rounds, 3 seeds. `--preset=cifar10|femnist|
shakespeare` sets the paper's setups instead (docs/papers/filfl.md, "The paper's setups"; listed
in --help; explicit flags win; `--fedprox` adds the preset's FedProx mu):

  python -m experiments.filfl --preset=cifar10 --data_dir=DIR       # TFDS cifar10, ArrayRecord
  python -m experiments.filfl --preset=femnist                      # data/leaf/femnist/*.json
  python -m experiments.filfl --preset=shakespeare --fedprox        # data/leaf/shakespeare/*.json
 Per run it writes
`<out_dir>/<filter>/seed<s>/metrics.jsonl` with, per round: test / train accuracy and loss, |S^f|
(`num_filtered`), who was filtered in (`filtered_in`, client ids), R values (`filter.R_*`), the
OPT approximation ratio with `--opt`, the weak-submodularity check with `--submod_samples`; plus
`summary.md`, `filtered_bad.csv` and with `--plot` the paper's panels in `filfl.png`.
"""

import csv
import os

import numpy as np
from absl import app, flags

import fedjax_sel as fs
from experiments import common, parts
from fedjax_sel.data import sources

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(common)  # --help lists the shared flags too.
for _flag in ("selector", "poc_variant", "poc_d", "divfl_proxy", "filter_period",
              "empty_value", "filter_const", "filter_order", "opt", "submod_samples", "gammas"):
  flags.declare_key_flag(_flag)  # The parts' flags FilFL uses, in its --help.
flags.DEFINE_list("filters", ["none", "dgf", "rgf"], "Runs to compare: none (FedAvg/FedProx), dgf, rgf.")
flags.DEFINE_bool("avail_reference", False, "Redraw availability every round during the first "
                  "--avail_period rounds (FilFL reference mode).")
flags.DEFINE_enum("public_mode", "stratified", ("stratified", "per_client"), "Public set source: "
                  "a stratified share of the pool held out by the server, or a share of each "
                  "client's data (--public_fraction).")
flags.DEFINE_string("public_text", None, "Text file cut into 80-char windows as the public set.")
flags.DEFINE_integer("public_size", None, "Keep at most this many public examples (a seeded "
                     "sample; m).", lower_bound=1)

# docs/papers/filfl.md, "The paper's settings". The test split is each client's own (20%, or
# LEAF's 10%).
PRESETS = {
    "cifar10": dict(dataset="tfds", tfds_name="cifar10", partition="dirichlet",
                    dirichlet_alpha=0.5, num_clients=200, num_available=100,
                    clients_per_round=10, local_epochs=5, batch_size=16, lr=0.1, lr_decay=0.998,
                    lr_decay_every=10, weight_decay=1e-3, model="resnet18", norm="batch",
                    rounds=500, filter_period=5, public_mode="stratified", public_fraction=0.01,
                    corrupt_fraction=0.0, eval_every=10),
    "femnist": dict(dataset="leaf", leaf_files=["data/leaf/femnist/*.json"], num_clients=190,
                    num_available=50, clients_per_round=5, local_epochs=2, batch_size=50,
                    lr=0.003, model="leaf_cnn", rounds=500, filter_period=5,
                    public_mode="per_client", public_fraction=0.05, public_size=2000,
                    test_fraction=0.1, corrupt_fraction=0.0, eval_every=10),
    "shakespeare": dict(dataset="leaf", leaf_files=["data/leaf/shakespeare/*.json"],
                        num_clients=143, num_available=100, clients_per_round=10, local_epochs=1,
                        batch_size=64, lr=0.8, model="char_lstm", rounds=250, filter_period=5,
                        public_text=sources.PUBLIC_TEXT, public_size=34, public_fraction=0.0,
                        test_fraction=0.1, corrupt_fraction=0.0, eval_every=10),
}
FEDPROX_MU = {"cifar10": 1.0, "femnist": 1.0, "shakespeare": 0.001}
DATA_HELP = {"cifar10": sources.PREPARE["tfds"].format(name="cifar10"),
             "femnist": sources.PREPARE["femnist"] + " into data/leaf/femnist/",
             "shakespeare": sources.PREPARE["shakespeare"] + " into data/leaf/shakespeare/"}
flags.DEFINE_enum("preset", None, sorted(PRESETS), "The paper's setups; each sets (unless the flag "
                  "is given): " + common.preset_help(PRESETS))
flags.DEFINE_bool("fedprox", False, "FedProx local objective with the preset's mu (" + ", ".join(
    f"{k}: {v}" for k, v in FEDPROX_MU.items()) + "); without a preset, set --prox_mu.")

for _name, _value in (("rounds", 40), ("num_clients", 50), ("num_available", 25),
                      ("clients_per_round", 5), ("public_fraction", 0.05), ("seeds", ["0", "1", "2"]),
                      ("weighting", "uniform"), ("eval_every", 2), ("lr", 0.1),
                      ("corrupt_fraction", 0.4), ("corrupt_kinds", ["shuffle"]),
                      ("out_dir", "runs/filfl")):
  FLAGS.set_default(_name, _value)

LABELS = {"none": "FedAvg", "dgf": "FilFL-DGF", "rgf": "FilFL-RGF"}


def apply_preset():
  common.apply_preset(PRESETS, FLAGS.preset)
  if FLAGS.fedprox and not FLAGS["prox_mu"].present:
    if FLAGS.preset is None:
      raise app.UsageError("--fedprox takes its mu from --preset; without a preset set --prox_mu")
    FLAGS.prox_mu = FEDPROX_MU[FLAGS.preset]


def check_flags():
  bad = [f for f in FLAGS.filters if f not in LABELS]
  if bad or not FLAGS.filters:
    raise app.UsageError(f"--filters must list values among {sorted(LABELS)}, got {FLAGS.filters}")
  common.check_corruption()
  available = FLAGS.num_available or FLAGS.num_clients
  if FLAGS.opt and available > 16:
    raise app.UsageError(f"--opt enumerates 2^n subsets: needs --num_available <= 16, got "
                         f"n = {available}")
  if FLAGS.public_fraction <= 0 and FLAGS.public_text is None and set(FLAGS.filters) - {"none"}:
    raise app.UsageError("filtering needs a public set: set --public_fraction > 0 or --public_text")
  if FLAGS.selector not in ("random", "poc", "divfl"):
    raise app.UsageError(f"--selector: FilFL selects with random, poc or divfl, got "
                         f"{FLAGS.selector} (experiments/run.py composes the others)")
  parts.check_selector(FLAGS.clients_per_round, FLAGS.num_available or FLAGS.num_clients)
  for name in set(FLAGS.filters) - {"none"}:
    parts.check("filter", name, parts.context(FLAGS.clients_per_round))


def load(seed):
  hint = f"The {FLAGS.preset} preset needs {DATA_HELP[FLAGS.preset]}." if FLAGS.preset else ""
  data = common.load_data(seed, hint, public_mode=FLAGS.public_mode, public_text=FLAGS.public_text,
                          public_size=FLAGS.public_size)
  data, bad, _ = common.corrupt(data, seed)
  return data, bad


def main(argv):
  del argv
  common.init_distributed()
  apply_preset()
  check_flags()
  seeds = common.seeds()
  loaded = {s: load(s) for s in seeds}  # All data errors surface before any training.
  runs = {}
  bad_rows = []
  options = common.engine_options([data for data, _ in loaded.values()])
  for filt_name in FLAGS.filters:
    label = LABELS[filt_name]
    if FLAGS.prox_mu and filt_name == "none":
      label = "FedProx"
    jobs = []
    for value in common.sweep_values():
      with common.swept(value):
        for seed in seeds:
          data, bad = loaded[seed]
          model = common.model_for(data)
          filt = parts.make_filter(filt_name, model)
          sim = fs.Simulator(model, data, common.optimizer(), common.local_hparams(),
                             common.availability(FLAGS.avail_reference),
                             parts.make_selector(FLAGS.clients_per_round),
                             fs.fedavg(FLAGS.weighting), FLAGS.clients_per_round,
                             seed, filter=filt, lr_schedule=common.lr_schedule(), eval_mask=~bad,
                             **options)
          print(f"== {label} seed {seed}: {data.name}, N={data.num_clients}, "
                f"bad clients={int(bad.sum())}, public m={len(data.public_y)}, model={model.name}"
                f"{' (BatchNorm)' if model.train_apply else ''}")
          jobs.append(common.make_run(sim, (filt_name, f"seed{seed}"), f"{label} s{seed} "))
    for suffix, group in common.by_sweep(common.run_all(jobs), len(seeds)):
      runs[label + suffix] = group
      for seed, recs in zip(seeds, group):
        bad = loaded[seed][1]
        for r in recs:
          if r.get("filtered_in") is not None and r["filter_round"]:
            ids = np.array(r["filtered_in"], dtype=int)
            bad_rows.append((label + suffix, seed, r["round"], len(ids),
                             int(bad[ids].sum()) if len(ids) else 0))
  if common.writer():  # Process 0 of a multi-host run.
    write_outputs(runs, bad_rows)


def write_outputs(runs, bad_rows):
  rows = [(f"{label} seed {i}", recs) for label, group in runs.items()
          for i, recs in zip(common.seeds(), group)]
  table = fs.summary_table(rows) + "\n\n" + mean_table(runs) + filter_quality_table(runs)
  print(table)
  with open(os.path.join(FLAGS.out_dir, "summary.md"), "w", encoding="utf-8") as f:
    f.write(table + "\n")
  with open(os.path.join(FLAGS.out_dir, "filtered_bad.csv"), "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f)
    writer.writerow(["run", "seed", "round", "num_filtered", "bad_filtered_in"])
    writer.writerows(bad_rows)
  if FLAGS.plot:
    from fedjax_sel.plotting import plot_curves  # pylint: disable=import-outside-toplevel
    path = common.figure_path("filfl")
    plot_curves(runs, ["test_accuracy", "clean_train_loss", "test_loss", "num_filtered"], path,
                titles={"test_accuracy": "test accuracy",
                        "clean_train_loss": "train loss (uncorrupted clients)",
                        "test_loss": "test loss", "num_filtered": "|S^f| (filtered-in clients)"},
                title=common.setup_title(f"{int(FLAGS.corrupt_fraction * 100)}% bad clients, "
                                         f"h = {FLAGS.filter_period}"),
                only={"num_filtered": lambda label: not label.startswith("Fed")})
    print(f"figure: {path}")
    ratio_runs = {label: [[dict(r, approx_ratio=r["filter"]["approx_ratio"]) for r in recs
                           if r.get("filter_round") and "approx_ratio" in r.get("filter", {})]
                          for recs in group] for label, group in runs.items()}
    ratio_runs = {k: v for k, v in ratio_runs.items() if all(v)}
    if ratio_runs:
      path = common.figure_path("approx_ratio")
      plot_curves(ratio_runs, ["approx_ratio"], path,
                  titles={"approx_ratio": "R(greedy) / R(OPT) per filtering round"},
                  title=common.setup_title("OPT on every filtering round"))
      print(f"figure: {path}")


def filter_quality_table(runs) -> str:
  """Per filtered run, over its filtering rounds: min / mean of R(greedy) / R(OPT) (--opt; the
  paper's Figure 6) and of the share of weak-submodularity samples verified per gamma
  (--submod_samples; Appendix D.1)."""
  lines = []
  for label, group in runs.items():
    for seed, recs in zip(common.seeds(), group):
      rounds = [r for r in recs if r.get("filter_round") and "filter" in r and r["filter"]]
      ratios = [r["filter"]["approx_ratio"] for r in rounds if "approx_ratio" in r["filter"]]
      submod = np.array([r["filter"]["submod_verified"] for r in rounds
                         if "submod_verified" in r["filter"]], dtype=float)
      if not ratios and not submod.size:
        continue
      cells = [f"{min(ratios):.4f} / {np.mean(ratios):.4f}" if ratios else "-"]
      cells.append(", ".join(f"{g}: {100 * lo:.0f} / {100 * mu:.0f}%" for g, lo, mu in
                             zip(FLAGS.gammas, submod.min(0), submod.mean(0))) if submod.size else "-")
      lines.append(f"| {label} seed {seed} | {len(rounds)} | {cells[0]} | {cells[1]} |")
  if not lines:
    return ""
  head = ["", "", "Filter quality over the filtering rounds:", "",
          "| run | filtering rounds | R(greedy)/R(OPT) min / mean | weak submodularity verified, "
          "gamma: min / mean |", "|---|---|---|---|"]
  return "\n".join(head + lines)


def mean_table(runs) -> str:
  """Over seeds: the final test accuracy (mean +- sample std), the mean accuracy over rounds, and
  the rounds trained until the mean curve reaches 80%."""
  from fedjax_sel.plotting import metric_matrix  # pylint: disable=import-outside-toplevel
  seeds = max(len(group) for group in runs.values())
  k = FLAGS.last_k
  lines = [f"| method | final test acc (mean +- sample std, {seeds} seeds) | mean test acc, last "
           f"{k} evaluated rounds | mean test acc over rounds | rounds trained to 80% acc (mean "
           "curve) |", "|---|---|---|---|---|"]
  for label, group in runs.items():
    rounds, acc = metric_matrix(group, "test_accuracy")
    mean_curve = acc.mean(0)
    hit = rounds[np.argmax(mean_curve >= 0.8)] + 1 if (mean_curve >= 0.8).any() else "never"
    lines.append(f"| {label} | {common.mean_std(acc[:, -1])} | "
                 f"{common.mean_std(acc[:, -k:].mean(1))} | {acc.mean():.4f} | {hit} |")
  return "\n".join(lines)


if __name__ == "__main__":
  app.run(common.cli(main))
