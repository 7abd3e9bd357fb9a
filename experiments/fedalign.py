r"""FedALIGN launcher: prioritized FL with aligned non-priority clients, against "None" and "All".

  python -m experiments.fedalign --seeds=0,1,2 --plot
  python -m experiments.fedalign --preset=fmnist --plot          # The paper's Fashion-MNIST setup.
  python -m experiments.fedalign --preset=synth --plot           # SYNTH(1,1) at three noise levels.

Methods (`--methods`): fedalign (the rule), none (FedAvg on the priority clients only) and all
(FedAvg on every client); with --prox_mu > 0 all three train with FedProx. Default data (offline):
digits in uni-class shards, N = 30 clients, 2 priority clients, logistic regression, E = 5, lr 0.1,
full participation, 50 rounds, 3 seeds.

Per run it writes `<out_dir>/<group>/<method>/seed<s>/metrics.jsonl` (group: `main`, or the SYNTH
noise level) with, per round: `priority_objective` (F(w_{t+1}), the priority clients'
data-weighted training loss after the round), `priority_test_accuracy` / `priority_test_loss`
(on the priority clients' test data), `test_accuracy` (all clients), `others_trained` /
`others_aggregated` (non-priority clients), `eps`, `closest_gap` (the smallest gap |F_k - F| of a
non-priority client in --align_metric, loss or accuracy: above eps_t nobody aligns) and the cost
counters; plus `summary.md` and, with --plot, `fedalign.png`
(`experiments/reports/fedalign.py`).
"""

import dataclasses

import numpy as np
from absl import app

import fedjax_sel as fs
from experiments.launch import build, cli, config, flag_binding
from experiments.launch.config import option
from experiments.launch.job import Job
from experiments.reports import fedalign as fedalign_report
from fedjax_sel.data.corruption import LABEL_NOISE_MODES, NOISE_PRESETS, noisy_clients
from fedjax_sel.parts.rules import fedalign
from fedjax_sel.parts.selectors.baselines import all_selector, group_random_selector

LABELS = {"fedalign": "FedALIGN", "none": "None", "all": "All"}
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
GROUP_DEFAULTS = {"priority_per_round": 1, "others_per_round": 10}  # Capped at the group's size.


@dataclasses.dataclass(frozen=True)
class FedALIGNOptions:
  """The FedALIGN launcher's own settings."""

  preset: str | None = option(None, "The paper's setups; each value is overridable by its flag. "
                              + config.preset_help(PRESETS), choices=tuple(sorted(PRESETS)),
                              result=False)
  methods: tuple[str, ...] = option(("fedalign", "none", "all"), "Runs to compare: fedalign, "
                                    "none (FedAvg on the priority clients only), all (FedAvg on "
                                    "every client).", result=False)
  participation: str = option("full", "full: every client every round; partial: a uniform "
                              "sample of each group per round.", choices=("full", "partial"))
  priority_per_round: int | None = option(None, "Partial participation: priority clients sampled "
                                          "per round (default 1, or the whole group if smaller).",
                                          within=">= 1")
  others_per_round: int | None = option(None, "Partial participation: non-priority clients "
                                        "sampled per round (default 10, or the whole group if "
                                        "smaller).", within=">= 0")
  synth_noise: tuple[str, ...] = option(("medium",), "SYNTH: noise levels of the non-priority "
                                        "clients, one group of runs each; presets "
                                        f"{NOISE_PRESETS} as (label noise share, irrelevant "
                                        "points share).")
  label_noise_mode: str = option("random", "SYNTH noise: random labels or flipped to another "
                                 "class.", choices=LABEL_NOISE_MODES)
  high_noise_eps0: float | None = option(None, "eps_0 of the high SYNTH noise group (default "
                                         f"{fedalign_report.HIGH_NOISE_EPS0} unless --eps0 is "
                                         "given, then --eps0).", within=">= 0")


DEFAULTS = config.updated(
    config.JobConfig(launcher="experiments.fedalign", options=FedALIGNOptions(), seeds=(0, 1, 2),
                     parts=config.PartsConfig(rule=config.part("rule", "fedalign"))),
    rounds=50, num_clients=30, partition="uni_class", model="logreg", local_epochs=5, lr=0.1,
    batch_size=32, out_dir="runs/fedalign", clients_per_round=1, num_available=0)
# Its own participation (full, or per group) and its own noise (--synth_noise): no availability,
# K or corruption flags.
NOT_USED = ("clients_per_round", "corrupt_fraction", "corrupt_kinds")
BINDING = flag_binding.define(DEFAULTS, exclude=NOT_USED,
                              choose=("server_optimizer", "dataset", "model"),
                              parts={"rule": ("fedalign",), "aggregator": ("fedavg",)})


def resolve(cfg: config.JobConfig, given: frozenset) -> config.JobConfig:
  """The preset (under the flags given), the high-noise eps_0, a method per --methods value."""
  opts = cfg.options
  if opts.preset is not None:
    cfg = config.updated(cfg, given, **PRESETS[opts.preset])
    opts = cfg.options
  cfg = build.store_clients(cfg, given)
  bad = [m for m in opts.methods if m not in LABELS]
  if bad or not opts.methods:
    raise app.UsageError(f"--methods must list values among {sorted(LABELS)}, got "
                         f"{','.join(opts.methods)}")
  unknown = [lvl for lvl in opts.synth_noise if lvl not in NOISE_PRESETS]
  if cfg.parts.dataset.name == "synth" and (unknown or not opts.synth_noise):
    raise app.UsageError(f"--synth_noise must list levels among {sorted(NOISE_PRESETS)}, got "
                         f"{','.join(opts.synth_noise)}")
  if "high_noise_eps0" not in given and "eps0" not in given:
    cfg = config.updated(cfg, high_noise_eps0=fedalign_report.HIGH_NOISE_EPS0)
  suffix = "+Prox" if cfg.local.prox_mu else ""
  methods = tuple(config.Method(m, LABELS[m] + suffix, () if m == "fedalign" else
                                (("rule", None),)) for m in opts.methods)
  return dataclasses.replace(cfg, methods=methods)


def groups(cfg: config.JobConfig) -> list[str]:
  return list(cfg.options.synth_noise) if cfg.parts.dataset.name == "synth" else ["main"]


def load(cfg: config.JobConfig, seed: int, group: str):
  """(data, with noisy non-priority clients in a SYNTH noise group, `[N]` priority mask)."""
  data = build.load_data(cfg, seed)
  priority = build.priority_mask(cfg, data.num_clients, data.label_hist, seed)
  if group != "main":
    label_noise, irrelevant = NOISE_PRESETS[group]
    data = noisy_clients(data, ~priority, label_noise, irrelevant, seed=seed + 300,
                         mode=cfg.options.label_noise_mode)
  return data, priority


def participation_parts(cfg: config.JobConfig, priority):
  """(availability, selector, K) of full or partial participation."""
  n = len(priority)
  opts = cfg.options
  if opts.participation == "full":
    return fs.uniform_availability(n, n), all_selector(), n
  counts = {"others_per_round": int((~priority).sum()),
            "priority_per_round": int(priority.sum())}
  sizes = {}
  for name, count in counts.items():
    asked = getattr(opts, name)
    if asked is not None and asked > count:
      raise app.UsageError(f"--{name}={asked} cannot apply: its group holds {count} clients; "
                           f"accepted 0..{count}")
    sizes[name] = min(GROUP_DEFAULTS[name], count) if asked is None else asked
  sizes = (sizes["others_per_round"], sizes["priority_per_round"])
  return (fs.uniform_availability(n, n), group_random_selector(priority.astype(np.int32), sizes),
          max(sum(sizes), 1))


def make_rule(run: config.JobConfig, method: str, priority, group: str):
  if method == "none":
    return fedalign.priority_only(priority)
  if method == "all":
    return fs.everyone()
  s = run.parts.rule.settings
  high = run.options.high_noise_eps0
  return fedalign.fedalign_rule(priority, run.engine.rounds,
                                eps0=high if group == "high" and high is not None else s.eps0,
                                schedule=s.schedule, warmup_fraction=s.warmup_fraction,
                                metric=s.metric, split=s.split)


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


def execute(job: Job) -> None:
  cfg = job.cfg
  build.check_population(cfg)
  build.check_runs(cfg)
  job.start()

  def build_run(spec):
    data, priority = spec.data
    avail, selector, k = participation_parts(cfg, priority)
    print(f"== {spec.group} {spec.method.label} seed {spec.seed}: {data.name}, "
          f"N={data.num_clients}, priority {np.flatnonzero(priority).tolist()}")
    rule = make_rule(spec.run, spec.method.key, priority, spec.group)
    sim = build.simulator(spec.run, data, spec.seed, capacity=spec.capacity, eval_mask=priority,
                          own=build.OwnParts(avail, selector, rule, k))
    return sim, round_extras(priority)

  results, _ = job.run_groups(groups(cfg), lambda seed, g: load(cfg, seed, g), build_run)
  if job.writes:  # Process 0 of a multi-host run.
    fedalign_report.write_outputs(cfg, results)


main = cli.launcher_main(BINDING, resolve, execute)


if __name__ == "__main__":
  cli.launch(main, BINDING)
