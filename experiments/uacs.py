r"""UACS-FL launcher: entropy-based active client selection against random and gradient-norm
selection.

  python -m experiments.uacs --scenarios=1,2,3 --seeds=0,1,2,3,4 --plot

Methods (`--methods`): entropy_eps (Entropy+Eps-Greedy, eps = --explore_prob), entropy (Entropy
Based, eps = 0), random, grad_norm (Gradient Norm). Default data: the 2-D boundary data of
`fedjax_sel/data/boundary.py` (100 clients, 6 near the boundary), logistic regression, m = 10
clients per round, uniform mean of the m local models, 60 rounds. `--library_data` runs the same
methods on the library's datasets instead (--dataset, --partition, ...: digits, synth,
fashion_mnist IDX).

Per run it writes `<out_dir>/scenario<s>/<method>/seed<k>/metrics.jsonl` with, per round: test
accuracy and loss, the selected ids (`selected`), how many boundary clients were selected
(`boundary_selected`), the cost counters (`client_eval_samples`: entropy forward passes,
`client_grad_samples`: gradient norms); plus `summary.md` and, with --plot, `uacs.png`
(`experiments/reports/uacs.py`).
"""

import dataclasses
import os

import numpy as np
from absl import app

from experiments.launch import build, cli, config, flag_binding
from experiments.launch.config import option
from experiments.launch.job import Job
from experiments.reports import uacs as uacs_report
from fedjax_sel import registry
from fedjax_sel.data.boundary import SCENARIOS, BoundaryShape, boundary_dataset, check_config
from fedjax_sel.host import checkpoint
from fedjax_sel.host.runner import CHECKPOINT_FILE
from fedjax_sel.parts.selectors import uacs


@dataclasses.dataclass(frozen=True)
class UACSOptions(BoundaryShape):
  """The UACS-FL launcher's own settings: its methods, and the boundary data's (`BoundaryShape`,
  whose fields are flags too)."""

  methods: tuple[str, ...] = option(tuple(uacs.METHODS), f"Runs to compare: {list(uacs.METHODS)}.",
                                    result=False)
  scenarios: tuple[str, ...] = option(("1", "2", "3"), "Boundary data scenarios: 1 boundary "
                                      "clients in boxes, 2 spread along the whole boundary, 3 "
                                      "like 1 with far clients confined to small regions.",
                                      result=False)
  library_data: bool = option(False, "Use --dataset/--partition (digits, synth, fashion_mnist, "
                              "...) instead of the 2-D boundary data.")


DEFAULTS = config.updated(
    config.JobConfig(launcher="experiments.uacs", options=UACSOptions(), seeds=(0, 1, 2, 3, 4),
                     parts=config.PartsConfig(selector=config.part("selector", "entropy"))),
    rounds=60, num_clients=100, clients_per_round=10, num_available=0, model="logreg",
    local_epochs=1, batch_size=10, lr=0.5, weighting="uniform", out_dir="runs/uacs")
BINDING = flag_binding.define(DEFAULTS, exclude=("corrupt_fraction", "corrupt_kinds"),
                              choose=("server_optimizer", "availability", "dataset", "model"),
                              parts={"selector": ("entropy",), "aggregator": ("fedavg",)})
SELECTORS = {"entropy_eps": None,  # The job's selector: entropy with --explore_prob.
             "entropy": config.part("selector", "entropy", explore_prob=0.0),
             "random": config.part("selector", "random"),
             "grad_norm": config.part("selector", "grad_norm")}


def resolve(cfg: config.JobConfig, given: frozenset) -> config.JobConfig:
  """N from a store (with --library_data), a method per --methods value."""
  cfg = build.store_clients(cfg, given)
  methods = cfg.options.methods
  bad = [m for m in methods if m not in uacs.METHODS]
  if bad or not methods:
    raise app.UsageError(f"--methods must list values among {sorted(uacs.METHODS)}, got "
                         f"{','.join(methods)}")
  return dataclasses.replace(cfg, methods=tuple(
      config.Method(m, uacs.METHODS[m], () if SELECTORS[m] is None else
                    (("selector", SELECTORS[m]),)) for m in methods))


def scenarios(cfg: config.JobConfig) -> list:
  """The --scenarios as integers (checked with their boundary data), or ["library"]."""
  if cfg.options.library_data:
    return ["library"]
  text = ",".join(cfg.options.scenarios)
  try:
    chosen = [int(s) for s in cfg.options.scenarios]
  except ValueError as e:
    raise app.UsageError(f"--scenarios must be integers among {SCENARIOS}, got {text}") from e
  if not chosen or any(s not in SCENARIOS for s in chosen):
    raise app.UsageError(f"--scenarios must be among {SCENARIOS}, got {text}")
  for s in chosen:
    try:
      check_config(uacs_report.boundary_config(cfg, s))
    except registry.SettingError as e:
      flag = {"scenario": "scenarios"}.get(e.field, e.field)
      raise app.UsageError(f"--{flag} {e.message}") from e
  return chosen


def check(cfg: config.JobConfig) -> list:
  """The job's settings, before any data; returns its scenarios."""
  k, n = cfg.engine.clients_per_round, cfg.data.num_clients
  if not 1 <= k <= n:
    raise app.UsageError(f"--clients_per_round (m) must be in 1..{n} (--num_clients), got {k}")
  build.check_runs(cfg)
  chosen = scenarios(cfg)
  build.check_population(cfg)
  return chosen


def load(cfg: config.JobConfig, scenario, seed: int):
  """(data, `[N]` boundary-client mask: none for the library's data)."""
  if scenario == "library":
    data = build.load_data(cfg, seed)
    return data, np.zeros(data.num_clients, bool)
  return boundary_dataset(uacs_report.boundary_config(cfg, scenario), seed)


def execute(job: Job) -> None:
  cfg = job.cfg
  chosen = check(cfg)
  job.start()
  scenario_of = {uacs_report.group_name(s): s for s in chosen}
  finals, sims = {}, {}

  def build_run(spec):
    data, is_boundary = spec.data
    model = build.model_for(spec.run, data)
    sim = build.simulator(spec.run, data, spec.seed, model=model, capacity=spec.capacity)
    key = (spec.group, spec.name, spec.seed)
    sims[key] = (sim, os.path.join(cfg.output.out_dir, *spec.path))
    last = spec.run.engine.rounds - 1

    def extra(state, record):
      if record["round"] == last:
        finals[key] = (model, state.params)
      picked = np.asarray(record["selected"], int)
      return {"boundary_selected": int(is_boundary[picked].sum())}

    print(f"== {spec.group} {spec.method.label} seed {spec.seed}: {data.name}, "
          f"N={data.num_clients}, boundary clients {np.flatnonzero(is_boundary).tolist()}")
    return sim, extra

  results, loaded = job.run_groups(list(scenario_of),
                                   lambda seed, g: load(cfg, scenario_of[g], seed), build_run)
  for key, (sim, folder) in sims.items():  # Runs that finished earlier: their final model.
    if key not in finals:
      state, _ = checkpoint.load(os.path.join(folder, CHECKPOINT_FILE), sim.initial_state())
      finals[key] = (sim.config.model, state.params)
  if job.writes:  # Process 0 of a multi-host run.
    uacs_report.write_outputs(cfg, results, loaded, finals, chosen)


main = cli.launcher_main(BINDING, resolve, execute)


if __name__ == "__main__":
  cli.launch(main, BINDING)
