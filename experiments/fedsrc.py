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
(`samples_saved`, `net_samples_saved`, `uploads_saved`) in the self-regulating runs; plus
`summary.md` (accuracy and savings tables) and, with --plot, `fedsrc.png`
(`experiments/reports/fedsrc.py`).
"""

import dataclasses

from absl import app

from experiments.launch import build, cli, config, flag_binding
from experiments.launch.config import option
from experiments.launch.job import Job
from experiments.reports import fedsrc as fedsrc_report
from fedjax_sel.data.builders import source

SPLITS = {"iid": {"partition": "iid"},
          "noniid": {"partition": "dominant", "dominant_fraction": 0.8},
          "extreme": {"partition": "k_classes", "classes_per_client": 2}}
METHODS = {"fedsrc": "FedSRC", "fedavg": "FedAvg", "median": "Median",
           "trimmed_mean": "Trimmed mean", "krum": "Krum", "multi_krum": "Multi-Krum",
           "fedasl": "FedASL"}


@dataclasses.dataclass(frozen=True)
class FedSRCOptions:
  """The FedSRC launcher's own settings."""

  methods: tuple[str, ...] = option(tuple(METHODS), f"Runs to compare: {list(METHODS)}.",
                                    result=False)
  fedsrc_with: tuple[str, ...] = option((), "Extra runs: FedSRC's rule combined with these "
                                        f"aggregators (among {list(METHODS)[1:]}).",
                                        result=False)
  splits: tuple[str, ...] = option(("iid", "noniid"), "Data splits, one group of runs each: iid, "
                                   "noniid (80% of each client's data from one class), extreme "
                                   "(two classes per client). Natively federated data (synth, "
                                   "leaf) ignore it.", result=False)


DEFAULTS = config.updated(
    config.JobConfig(launcher="experiments.fedsrc", options=FedSRCOptions(), seeds=(0, 1, 2),
                     parts=config.PartsConfig(rule=config.part("rule", "fedsrc"))),
    rounds=40, num_clients=50, clients_per_round=10, num_available=0, avail_period=1,
    model="mlp", local_epochs=2, lr=0.1, batch_size=16, val_fraction=0.1, corrupt_fraction=0.3,
    out_dir="runs/fedsrc")
BINDING = flag_binding.define(DEFAULTS,
                              choose=("server_optimizer", "availability", "dataset", "model"),
                              parts={"rule": ("fedsrc",), "aggregator": None})


def _listed(flag: str, values, accepted) -> None:
  bad = [v for v in values if v not in accepted]
  if bad:
    raise app.UsageError(f"--{flag} must list values among {sorted(accepted)}, got "
                         f"{','.join(values)}")


def resolve(cfg: config.JobConfig, given: frozenset) -> config.JobConfig:
  """A method per --methods and --fedsrc_with value, each aggregator with its settings; a
  setting flag of an aggregator no method uses is refused."""
  cfg = build.store_clients(cfg, given)
  opts = cfg.options
  _listed("methods", opts.methods, METHODS)
  _listed("fedsrc_with", opts.fedsrc_with, set(METHODS) - {"fedsrc"})
  _listed("splits", opts.splits, SPLITS)
  if not (opts.methods or opts.fedsrc_with):
    raise app.UsageError(f"--methods must list values among {sorted(METHODS)}, got none")
  if not opts.splits:
    raise app.UsageError(f"--splits must list values among {sorted(SPLITS)}, got none")
  used = {"fedavg" if m == "fedsrc" else m for m in opts.methods} | set(opts.fedsrc_with)
  for setting, names in BINDING.setting_owners("aggregator").items():
    if flag_binding.given(setting) and not used & names:
      raise app.UsageError(f"--{setting} is a setting of {'/'.join(sorted(names))}, which no "
                           "method of --methods / --fedsrc_with uses: drop it or add one")
  agg = lambda name: ("aggregator", config.Part(name, flag_binding.part_settings(
      "aggregator", name, cfg)))
  methods = [config.Method(m, METHODS[m], (agg("fedavg"),) if m == "fedsrc"
                           else (("rule", None), agg(m))) for m in opts.methods]
  methods += [config.Method(f"fedsrc+{a}", f"FedSRC+{METHODS[a]}", (agg(a),))
              for a in opts.fedsrc_with]
  return dataclasses.replace(cfg, methods=tuple(methods))


def groups(cfg: config.JobConfig) -> list[str]:
  """The groups of runs: the --splits, or `natural` for natively federated data."""
  spec = build.dataset_spec(cfg)
  return ["natural"] if source(spec).federated else list(cfg.options.splits)


def load(cfg: config.JobConfig, seed: int, group: str):
  """(data of split `group` with corrupted clients, `[N]` kind of each client)."""
  data = build.load_data(cfg, seed, **SPLITS.get(group, {}))
  stat = cfg.parts.rule.settings.decision_stat
  split = {"val_loss": data.val, "test_loss": data.test}.get(stat)
  if split is not None and (split.counts == 0).any():
    flag = "--val_fraction" if stat == "val_loss" else "--test_fraction"
    raise app.UsageError(f"{int((split.counts == 0).sum())} clients hold no data to decide on "
                         f"with --decision_stat={stat} (their check would pass unseen); raise "
                         f"{flag} or lower --num_clients")
  data, _, kinds = build.corrupt(cfg, data, seed)
  return data, kinds


def execute(job: Job) -> None:
  cfg = job.cfg
  build.check_corruption(cfg)
  build.check_population(cfg)
  build.check_runs(cfg)
  job.start()

  def build_run(spec):
    data, kinds = spec.data
    print(f"== {spec.group} {spec.method.label} seed {spec.seed}: {data.name}, "
          f"N={data.num_clients}, bad clients {int((kinds != 'good').sum())}")
    sim = build.simulator(spec.run, data, spec.seed, capacity=spec.capacity,
                          eval_mask=kinds == "good")
    return sim, fedsrc_report.round_extras(cfg, kinds, spec.run.parts.rule is not None, data)

  runs, loaded = job.run_groups(groups(cfg), lambda seed, g: load(cfg, seed, g), build_run)
  results = {g: {name: [(recs, *loaded[(seed, g)]) for seed, recs in zip(cfg.seeds, group)]
                 for name, group in by_name.items()} for g, by_name in runs.items()}
  if job.writes:  # Process 0 of a multi-host run.
    fedsrc_report.write_outputs(cfg, results)


main = cli.launcher_main(BINDING, resolve, execute)


if __name__ == "__main__":
  cli.launch(main, BINDING)
