r"""UACS-FL launcher: entropy-based active client selection against random and gradient-norm selection.

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
`client_grad_samples`: gradient norms); plus `summary.md` and, with --plot, `uacs.png`.
"""

import os

import numpy as np
from absl import app, flags

import fedjax_sel as fs
from experiments import common, parts  # parts: --explore_prob.
from fedjax_sel import checkpoint, uacs
from fedjax_sel.data.boundary import SCENARIOS, BoundaryConfig, boundary_dataset, check_config
from fedjax_sel.runner import CHECKPOINT_FILE

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(common)  # --help lists the shared flags too.
flags.declare_key_flag("explore_prob")
common.SWEEPABLE.extend(["explore_prob"])  # --sweep may vary these (run values or part state).
flags.DEFINE_list("methods", list(uacs.METHODS), f"Runs to compare: {uacs.METHODS}.")
flags.DEFINE_list("scenarios", ["1", "2", "3"], "Boundary data scenarios: 1 boundary clients in "
                  "boxes, 2 spread along the whole boundary, 3 like 1 with far clients confined "
                  "to small regions.")
flags.DEFINE_bool("library_data", False, "Use --dataset/--partition (digits, synth, fashion_mnist, "
                  "...) instead of the 2-D boundary data.")
flags.DEFINE_integer("num_boundary", 6, "Boundary clients (holding points near the decision "
                     "boundary).")
flags.DEFINE_integer("samples_per_client", 50, "Points of each far client (one class, away from "
                     "the boundary), >= 1.")
flags.DEFINE_integer("boundary_samples", 50, "Points of each boundary client (near the true "
                     "boundary, both labels), >= 1.")
flags.DEFINE_float("gap0", 0.05, "Minimum distance of far class-0 points to the true boundary.")
flags.DEFINE_float("gap1", 0.5, "Minimum distance of far class-1 points to the true boundary "
                   "(equal gaps: the far clients alone place the boundary right).")
flags.DEFINE_float("box_size", 0.25, "Side of a boundary client's box (scenarios 1, 3).")
flags.DEFINE_float("band", 0.1, "Half-width across the boundary of scenario 2's boundary points.")
flags.DEFINE_float("region_size", 0.2, "Side of a far client's square (scenario 3).")
flags.DEFINE_integer("test_samples", 4000, "Test points drawn uniformly over the square, >= 1.")

for _name, _value in (("rounds", 60), ("num_clients", 100), ("clients_per_round", 10),
                      ("num_available", 0), ("model", "logreg"), ("local_epochs", 1),
                      ("batch_size", 10), ("lr", 0.5), ("weighting", "uniform"),
                      ("seeds", ["0", "1", "2", "3", "4"]), ("out_dir", "runs/uacs")):
  FLAGS.set_default(_name, _value)


def boundary_config(scenario: int) -> BoundaryConfig:
  return BoundaryConfig(scenario=scenario, num_clients=FLAGS.num_clients,
                        num_boundary=FLAGS.num_boundary, samples_per_client=FLAGS.samples_per_client,
                        boundary_samples=FLAGS.boundary_samples, gap0=FLAGS.gap0, gap1=FLAGS.gap1,
                        box_size=FLAGS.box_size, band=FLAGS.band, region_size=FLAGS.region_size,
                        test_samples=FLAGS.test_samples)


def check_flags() -> list:
  bad = [m for m in FLAGS.methods if m not in uacs.METHODS]
  if bad or not FLAGS.methods:
    raise app.UsageError(f"--methods must list values among {sorted(uacs.METHODS)}, got "
                         f"{FLAGS.methods}")
  common.check_finite()
  if not 0.0 <= FLAGS.explore_prob <= 1.0:
    raise app.UsageError(f"--explore_prob must be in [0, 1], got {FLAGS.explore_prob}")
  if not 1 <= FLAGS.clients_per_round <= FLAGS.num_clients:
    raise app.UsageError(f"--clients_per_round (m) must be in 1..{FLAGS.num_clients} "
                         f"(--num_clients), got {FLAGS.clients_per_round}")
  if FLAGS.library_data:
    return ["library"]
  try:
    scenarios = [int(s) for s in FLAGS.scenarios]
  except ValueError as e:
    raise app.UsageError(f"--scenarios must be integers among {SCENARIOS}, got "
                         f"{FLAGS.scenarios}") from e
  if not scenarios or any(s not in SCENARIOS for s in scenarios):
    raise app.UsageError(f"--scenarios must be among {SCENARIOS}, got {FLAGS.scenarios}")
  for s in scenarios:
    try:
      check_config(boundary_config(s))
    except ValueError as e:
      name = str(e).split()[0]
      raise app.UsageError(f"--{name}: {e}") from e
  common.check_out_dir()
  common.claim_out_dir()  # The boundary data do not pass through common.load_data.
  return scenarios


def make_selector(method):
  m = FLAGS.clients_per_round
  if method == "entropy_eps":
    return uacs.entropy_selector(m, FLAGS.explore_prob)
  if method == "entropy":
    return uacs.entropy_selector(m, 0.0)
  if method == "grad_norm":
    return uacs.grad_norm_selector(m)
  return fs.random_selector(m)


def load(scenario, seed):
  if scenario == "library":
    data = common.load_data(seed)
    return data, np.zeros(data.num_clients, bool)
  return boundary_dataset(boundary_config(scenario), seed)


def group_name(scenario) -> str:
  return "library" if scenario == "library" else f"scenario{scenario}"


def main(argv):
  del argv
  common.init_distributed()
  common.refuse_corruption("UACS-FL's launcher")
  scenarios = check_flags()
  seeds = common.seeds()
  loaded = {(s, k): load(s, k) for s in scenarios for k in seeds}
  n = FLAGS.num_clients
  results, finals = {}, {}
  for scenario in scenarios:
    group = group_name(scenario)
    runs = results.setdefault(group, {})
    options = common.engine_options([loaded[(scenario, s)][0] for s in seeds])
    for method in FLAGS.methods:
      label = uacs.METHODS[method]
      jobs, keys = [], []
      for value in common.sweep_values():
        with common.swept(value):
          for seed in seeds:
            data, is_boundary = loaded[(scenario, seed)]
            model = common.model_for(data)
            sim = fs.Simulator(model, data, common.optimizer(), common.local_hparams(),
                               common.availability(),
                               make_selector(method), fs.fedavg(FLAGS.weighting),
                               FLAGS.clients_per_round, seed, lr_schedule=common.lr_schedule(),
                               **options)

            key = (group, label + common.swept_suffix(), seed)

            def extra(state, record, is_boundary=is_boundary, key=key, model=model):
              if record["round"] == FLAGS.rounds - 1:
                finals[key] = (model, state.params)
              picked = np.asarray(record["selected"], int)
              return {"boundary_selected": int(is_boundary[picked].sum())}

            print(f"== {group} {label} seed {seed}: {data.name}, N={n}, boundary clients "
                  f"{np.flatnonzero(is_boundary).tolist()}")
            jobs.append(common.make_run(sim, (group, method, f"seed{seed}"),
                                        f"{group} {label} s{seed} ", extra))
            keys.append(key)
      for suffix, group_runs in common.by_sweep(common.run_all(jobs), len(seeds)):
        runs[label + suffix] = group_runs
      for key, job in zip(keys, jobs):  # Runs that finished earlier: read their final model back.
        if key not in finals:
          path = os.path.join(job.folder, CHECKPOINT_FILE)
          state, _ = checkpoint.load(path, job.sim.init())
          finals[key] = (job.sim.model, state.params)
  if common.writer():  # Process 0 of a multi-host run.
    write_outputs(results, loaded, finals, scenarios)


def first_hit(recs, level):
  """Rounds trained until the test accuracy first reaches `level` (None if never)."""
  for r in recs:
    if r.get("test_accuracy", 0.0) >= level:
      return r["round"] + 1
  return None


def summary(runs, num_boundary) -> str:
  lines = ["| method | rounds trained to 90% acc (mean, seeds reaching) | to 95% acc | final test acc "
           f"| mean test acc, last {FLAGS.last_k} rounds | best test acc | boundary share of "
           "selections | client forward samples | client gradient samples |", "|" + "---|" * 9]
  for label, group in runs.items():
    cells = []
    for level in (0.9, 0.95):
      hits = [h for h in (first_hit(recs, level) for recs in group) if h is not None]
      cells.append(f"{np.mean(hits):.1f} ({len(hits)}/{len(group)})" if hits else
                   f"never (0/{len(group)})")
    final = [[r for r in recs if "test_accuracy" in r][-1]["test_accuracy"] for recs in group]
    last_k = [np.mean([r["test_accuracy"] for r in recs if "test_accuracy" in r][-FLAGS.last_k:])
              for recs in group]
    best = [max(r.get("test_accuracy", 0.0) for r in recs) for recs in group]
    picks = sum(len(r["selected"]) for recs in group for r in recs)
    share = (f"{sum(r['boundary_selected'] for recs in group for r in recs) / max(picks, 1):.3f}"
             if num_boundary else "-")
    cost = group[0][-1]["cumulative_cost"]
    lines.append(f"| {label} | {cells[0]} | {cells[1]} | {common.mean_std(final)} | "
                 f"{common.mean_std(last_k)} | {common.mean_std(best)} | {share} | {cost['client_eval_samples']:.3g} | "
                 f"{cost['client_grad_samples']:.3g} |")
  if num_boundary:
    lines.append(f"\n(boundary clients are {num_boundary} of {FLAGS.num_clients}: random selection "
                 f"picks them at a share of about {num_boundary / FLAGS.num_clients:.3f})")
  return "\n".join(lines)


def write_outputs(results, loaded, finals, scenarios):
  parts = []
  for scenario in scenarios:
    group = group_name(scenario)
    nb = 0 if scenario == "library" else FLAGS.num_boundary
    parts.append(f"## {group} (m = {FLAGS.clients_per_round}, eps = {FLAGS.explore_prob}, "
                 f"{len(common.seeds())} seeds)\n\n" + summary(results[group], nb))
  text = "\n\n".join(parts)
  print(text)
  with open(os.path.join(FLAGS.out_dir, "summary.md"), "w", encoding="utf-8") as f:
    f.write(text + "\n")
  if FLAGS.plot:
    path = common.figure_path("uacs")
    plot(results, loaded, finals, scenarios, path)
    print(f"figure: {path}")


def plot(results, loaded, finals, scenarios, path):
  """Per scenario: the data with boundary clients and true / learned boundaries (seed 0), test
  accuracy per round (mean and std over seeds), selection frequency of each client."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  from fedjax_sel.plotting import metric_matrix, seed_spread  # pylint: disable=import-outside-toplevel
  seed = common.seeds()[0]
  fig, axes = plt.subplots(len(scenarios), 3, figsize=(15, 4.4 * len(scenarios) + 0.8),
                           squeeze=False)
  for row, scenario in zip(axes, scenarios):
    group = group_name(scenario)
    data, is_b = loaded[(scenario, seed)]
    ax = row[0]
    if scenario != "library":
      cfg = boundary_config(scenario)
      x, y, owner = (np.asarray(data.train.x), np.asarray(data.train.y),
                     np.asarray(data.train.client_id))
      near = is_b[owner]
      ax.scatter(x[~near, 0], x[~near, 1], c=y[~near], cmap="coolwarm", s=3, alpha=0.4)
      ax.scatter(x[near, 0], x[near, 1], c=y[near], cmap="coolwarm", s=14, marker="^",
                 edgecolors="k", linewidths=0.4, label="boundary clients")
      d = cfg.domain
      g = np.linspace(-d, d, 200)
      gx, gy = np.meshgrid(g, g)
      grid = np.stack([gx.ravel(), gy.ravel()], axis=1).astype(np.float32)
      a, b, c = cfg.line
      ax.contour(gx, gy, (a * gx + b * gy + c), levels=[0.0], colors="k", linestyles=":")
      for i, label in enumerate(results[group]):
        model, params = finals[(group, label, seed)]
        logits = np.asarray(model.apply(params, jnp.asarray(grid)))
        margin = (logits[:, 1] - logits[:, 0]).reshape(gx.shape)
        ax.contour(gx, gy, margin, levels=[0.0], colors=[f"C{i}"])
        ax.plot([], [], color=f"C{i}", label=label)
      ax.plot([], [], "k:", label="true boundary")
      ax.set_xlim(-d, d)
      ax.set_ylim(-d, d)
      ax.legend(fontsize=7, loc="lower right")
      ax.set_xlabel("feature 1")
      ax.set_ylabel("feature 2")
    ax.set_title(f"{group}: data and learned boundaries (seed {seed})", fontsize=10)
    ax = row[1]
    styles, markers = ("-", "--", "-.", ":"), ("o", "s", "^", "D")
    for i, (label, runs) in enumerate(results[group].items()):
      rounds, vals = metric_matrix(runs, "test_accuracy")
      mean, std = seed_spread(vals)
      ax.plot(rounds + 1, mean, styles[i % 4], marker=markers[i % 4], color=f"C{i}",
              markevery=max(len(rounds) // 8, 1), ms=4, label=label)
      if len(runs) > 1:
        ax.fill_between(rounds + 1, mean - std, mean + std, color=f"C{i}", alpha=0.15)
    ax.set_title(f"{group}: test accuracy", fontsize=10)
    ax.set_xlabel("rounds trained")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel("accuracy")
    ax.grid(alpha=0.3)
    ax = row[2]
    methods = list(results[group])
    width = 0.8 / len(methods)
    for k in np.flatnonzero(is_b):  # The boundary clients, shaded.
      ax.axvspan(k - 0.5, k + 0.5, color="0.85", lw=0)
    for i, (label, runs) in enumerate(results[group].items()):
      freq = np.zeros(data.num_clients)
      recs = runs[0]  # Seed 0: client ids mean the same clients as in the data panel.
      for r in recs:
        freq[np.asarray(r["selected"], int)] += 1
      ids = np.arange(data.num_clients) - 0.4 + (i + 0.5) * width
      ax.vlines(ids, 0, freq / len(recs), color=f"C{i}", lw=1.0)  # Stems: ids are unrelated.
      ax.plot(ids, freq / len(recs), markers[i % 4], color=f"C{i}", ms=2.5, linestyle="none")
    ax.set_title(f"{group}: selection frequency (seed {seed}; shaded: boundary)", fontsize=10)
    ax.set_xlabel("client id")
    ax.set_ylabel("share of rounds selected")
  handles, labels = axes[0][1].get_legend_handles_labels()
  fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
  seeds = len(common.seeds())
  spread = f"mean +- sample std over {seeds} seeds" if seeds > 1 else "1 seed"
  fig.suptitle(f"UACS-FL: {FLAGS.clients_per_round} clients selected per round, "
               f"{FLAGS.rounds} rounds, eps = {FLAGS.explore_prob} ({spread})", fontsize=11)
  height = 4.4 * len(scenarios) + 0.8
  fig.tight_layout(rect=(0, 0.5 / height, 1, 1 - 0.4 / height))
  fig.savefig(path, dpi=110)
  plt.close(fig)


if __name__ == "__main__":
  app.run(common.cli(main))
