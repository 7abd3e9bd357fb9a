r"""FilFL launcher: client filtering (DGF / RGF) versus no filtering, with RS / PoC / DivFL
selection.

  python -m experiments.filfl --filters=none,dgf,rgf --seeds=0,1,2 --plot

Defaults: digits, N=50 clients (Dirichlet 0.5), n=25 available, K=5 per round, 40% of the clients
with shuffled labels, a 5% stratified public set, filtering every h=5 rounds (--filter_period),
40 rounds, 3 seeds.
`--preset=cifar10|femnist|shakespeare` sets the paper's setups instead (docs/papers/filfl.md, "The
paper's setups"; listed in --help; explicit flags win; `--fedprox` adds the preset's FedProx mu):

  python -m experiments.filfl --preset=cifar10 --data_dir=DIR       # TFDS cifar10, ArrayRecord
  python -m experiments.filfl --preset=femnist                      # data/leaf/femnist/*.json
  python -m experiments.filfl --preset=shakespeare --fedprox        # data/leaf/shakespeare/*.json
  python -m experiments.filfl --preset=femnist --dataset=emnist     # fedjax's federated EMNIST

Per run it writes `<out_dir>/<filter>/seed<s>/metrics.jsonl` with, per round: test / train accuracy
and loss, |S^f| (`num_filtered`), who was filtered in (`filtered_in`, client ids), R values
(`filter.R_*`), the OPT approximation ratio with `--opt`, the weak-submodularity check with
`--submod_samples`; plus `summary.md`, `filtered_bad.csv` and with `--plot` the paper's panels in
`filfl.png` (`experiments/reports/filfl.py`).
"""

import dataclasses

import numpy as np
from absl import app

from experiments.launch import build, cli, config, flag_binding
from experiments.launch.config import option
from experiments.launch.job import Job
from experiments.reports import filfl as filfl_report
from fedjax_sel.data import sources

LABELS = {"none": "FedAvg", "dgf": "FilFL-DGF", "rgf": "FilFL-RGF"}
SELECTORS = ("random", "poc", "divfl")
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


@dataclasses.dataclass(frozen=True)
class FilFLOptions:
  """The FilFL launcher's own settings."""

  filters: tuple[str, ...] = option(("none", "dgf", "rgf"), "Runs to compare: none "
                                    "(FedAvg/FedProx), dgf, rgf.", result=False)
  public_mode: str = option("stratified", "Public set source: a stratified share of the pool "
                            "held out by the server, or a share of each client's data "
                            "(--public_fraction).", choices=("stratified", "per_client"))
  public_text: str | None = option(None, "Text file cut into 80-char windows as the public set.")
  public_size: int | None = option(None, "Keep at most this many public examples (a seeded "
                                   "sample; m).", within=">= 1")
  preset: str | None = option(None, "The paper's setups; each sets (unless the flag is given): "
                              + config.preset_help(PRESETS), choices=tuple(sorted(PRESETS)),
                              result=False)
  fedprox: bool = option(False, "FedProx local objective with the preset's mu (" + ", ".join(
      f"{k}: {v}" for k, v in FEDPROX_MU.items()) + "); without a preset, set --prox_mu.",
                         result=False)


DEFAULTS = config.updated(
    config.JobConfig(launcher="experiments.filfl", options=FilFLOptions(),
                     parts=config.PartsConfig(filter=config.part("filter", "dgf"))),
    rounds=40, num_clients=50, num_available=25, clients_per_round=5, public_fraction=0.05,
    weighting="uniform", eval_every=2, lr=0.1, corrupt_fraction=0.4, corrupt_kinds=["shuffle"],
    out_dir="runs/filfl")
DEFAULTS = dataclasses.replace(DEFAULTS, seeds=(0, 1, 2))
BINDING = flag_binding.define(DEFAULTS, choose=("selector", "server_optimizer", "availability",
                                               "dataset", "model"),
                              parts={"filter": ("dgf",)})


def resolve(cfg: config.JobConfig, given: frozenset) -> config.JobConfig:
  """The preset (under the flags given), --fedprox's mu, and a method per --filters value."""
  opts = cfg.options
  if opts.preset is not None:
    preset = PRESETS[opts.preset]
    if "dataset" in given:  # Another dataset (e.g. emnist for femnist): not the preset's files.
      preset = {k: v for k, v in preset.items() if k not in ("leaf_files", "tfds_name")}
    cfg = config.updated(cfg, given, **preset)
  cfg = build.store_clients(cfg, given)
  if opts.fedprox and "prox_mu" not in given:
    if opts.preset is None:
      raise app.UsageError("--fedprox takes its mu from --preset; without a preset set --prox_mu")
    cfg = config.updated(cfg, prox_mu=FEDPROX_MU[opts.preset])
  bad = [f for f in opts.filters if f not in LABELS]
  if bad or not opts.filters:
    raise app.UsageError(f"--filters must list values among {sorted(LABELS)}, got "
                         f"{','.join(opts.filters)}")
  settings = cfg.parts.filter.settings
  methods = tuple(config.Method(
      name, "FedProx" if cfg.local.prox_mu and name == "none" else LABELS[name],
      (("filter", None if name == "none" else config.Part(name, settings)),))
                  for name in opts.filters)
  return dataclasses.replace(cfg, methods=methods)


def check(cfg: config.JobConfig) -> None:
  """The job's settings, before any data."""
  build.check_corruption(cfg)
  build.check_population(cfg)
  selector = cfg.parts.selector.name
  if selector not in SELECTORS:
    raise app.UsageError(f"--selector: FilFL selects with {', '.join(SELECTORS)}, got "
                         f"{selector} (experiments/run.py composes the others)")
  filtering = any(m.key != "none" for m in cfg.methods)
  if cfg.parts.filter.settings.opt and build.num_available(cfg) > 16:
    raise app.UsageError(f"--opt enumerates 2^n subsets: needs --num_available <= 16, got "
                         f"n = {build.num_available(cfg)}")
  if filtering and cfg.data.public_fraction <= 0 and cfg.options.public_text is None:
    raise app.UsageError("filtering needs a public set: set --public_fraction > 0 or "
                         "--public_text")
  build.check_runs(cfg)


def load(cfg: config.JobConfig, seed: int):
  """(data with the public set and the corrupted clients, `[N]` bad mask)."""
  opts = cfg.options
  hint = f"The {opts.preset} preset needs {DATA_HELP[opts.preset]}." if opts.preset else ""
  data = build.load_data(cfg, seed, hint, public_mode=opts.public_mode,
                         public_text=opts.public_text, public_size=opts.public_size)
  data, bad, _ = build.corrupt(cfg, data, seed)
  return data, bad


def execute(job: Job) -> None:
  cfg = job.cfg
  check(cfg)
  job.start()

  def build_run(spec):
    data, bad = spec.data
    model = build.model_for(spec.run, data)
    print(f"== {spec.method.label} seed {spec.seed}: {data.name}, N={data.num_clients}, "
          f"bad clients={int(bad.sum())}, public m={len(data.public_y)}, model={model.name}"
          f"{' (BatchNorm)' if model.train_apply else ''}")
    return build.simulator(spec.run, data, spec.seed, model=model, capacity=spec.capacity,
                           eval_mask=~bad), None

  results, loaded = job.run_groups([""], lambda seed, _: load(cfg, seed), build_run)
  runs = results[""]
  bad_rows = []
  for name, group in runs.items():
    for seed, recs in zip(cfg.seeds, group):
      bad = loaded[(seed, "")][1]
      for r in recs:
        if r.get("filtered_in") is not None and r["filter_round"]:
          ids = np.array(r["filtered_in"], dtype=int)
          bad_rows.append((name, seed, r["round"], len(ids),
                           int(bad[ids].sum()) if len(ids) else 0))
  if job.writes:  # Process 0 of a multi-host run.
    filfl_report.write_outputs(cfg, runs, bad_rows)


main = cli.launcher_main(BINDING, resolve, execute)


if __name__ == "__main__":
  cli.launch(main, BINDING)
