"""UACS-FL's tables and figure: rounds to 90% / 95% accuracy, the boundary clients' share of the
selections, the client-side costs, and per scenario the data with the learned boundaries, the
accuracy curves and each client's selection frequency."""

import dataclasses

import numpy as np

from experiments.launch import config, report
from fedjax_sel.data.boundary import BoundaryConfig, BoundaryShape
from fedjax_sel.host.plotting import mean_std, metric_matrix, seed_spread


def boundary_config(cfg: config.JobConfig, scenario: int) -> BoundaryConfig:
  """The boundary data of `scenario` as the options set them."""
  options = {f.name: getattr(cfg.options, f.name) for f in dataclasses.fields(BoundaryShape)}
  return BoundaryConfig(scenario=scenario, num_clients=cfg.data.num_clients, **options)


def group_name(scenario) -> str:
  return "library" if scenario == "library" else f"scenario{scenario}"


def first_hit(recs, level):
  """Rounds trained until the test accuracy first reaches `level` (None if never)."""
  for r in recs:
    if r.get("test_accuracy", 0.0) >= level:
      return r["round"] + 1
  return None


def summary(cfg: config.JobConfig, runs, num_boundary: int) -> str:
  lines = ["| method | rounds trained to 90% acc (mean, seeds reaching) | to 95% acc | final test "
           "acc "
           f"| mean test acc, last {cfg.output.last_k} rounds | best test acc | boundary share of "
           "selections | client forward samples | client gradient samples |", "|" + "---|" * 9]
  for label, group in runs.items():
    cells = []
    for level in (0.9, 0.95):
      hits = [h for h in (first_hit(recs, level) for recs in group) if h is not None]
      cells.append(f"{np.mean(hits):.1f} ({len(hits)}/{len(group)})" if hits else
                   f"never (0/{len(group)})")
    final = [[r for r in recs if "test_accuracy" in r][-1]["test_accuracy"] for recs in group]
    k = cfg.output.last_k
    last_k = [np.mean([r["test_accuracy"] for r in recs if "test_accuracy" in r][-k:])
              for recs in group]
    best = [max(r.get("test_accuracy", 0.0) for r in recs) for recs in group]
    picks = sum(len(r["selected"]) for recs in group for r in recs)
    share = (f"{sum(r['boundary_selected'] for recs in group for r in recs) / max(picks, 1):.3f}"
             if num_boundary else "-")
    cost = group[0][-1]["cumulative_cost"]
    lines.append(f"| {label} | {cells[0]} | {cells[1]} | {mean_std(final)} | "
                 f"{mean_std(last_k)} | {mean_std(best)} | {share} | "
                 f"{cost['client_eval_samples']:.3g} | "
                 f"{cost['client_grad_samples']:.3g} |")
  if num_boundary:
    n = cfg.data.num_clients
    lines.append(f"\n(boundary clients are {num_boundary} of {n}: random selection picks them "
                 f"at a share of about {num_boundary / n:.3f})")
  return "\n".join(lines)


def write_outputs(cfg: config.JobConfig, results, loaded, finals, scenarios) -> None:
  """summary.md (per scenario) and, with --plot, uacs.png."""
  explore = cfg.parts.selector.settings.explore_prob
  parts = []
  for scenario in scenarios:
    group = group_name(scenario)
    nb = 0 if scenario == "library" else cfg.options.num_boundary
    parts.append(f"## {group} (m = {cfg.engine.clients_per_round}, eps = {explore}, "
                 f"{len(cfg.seeds)} seeds)\n\n" + summary(cfg, results[group], nb))
  text = "\n\n".join(parts)
  report.write_summary(cfg, text)
  if cfg.output.plot:
    path = report.figure_path(cfg, "uacs")
    plot(cfg, results, loaded, finals, scenarios, path)
    print(f"figure: {path}")


def plot(cfg: config.JobConfig, results, loaded, finals, scenarios, path: str) -> None:
  """Per scenario: the data with boundary clients and true / learned boundaries (seed 0), test
  accuracy per round (mean and std over seeds), selection frequency of each client."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  seed = cfg.seeds[0]
  fig, axes = plt.subplots(len(scenarios), 3, figsize=(15, 4.4 * len(scenarios) + 0.8),
                           squeeze=False)
  for row, scenario in zip(axes, scenarios):
    group = group_name(scenario)
    data, is_b = loaded[(seed, group)]
    ax = row[0]
    if scenario != "library":
      box = boundary_config(cfg, scenario)
      x, y, owner = (np.asarray(data.train.x), np.asarray(data.train.y),
                     np.asarray(data.train.client_id))
      near = is_b[owner]
      ax.scatter(x[~near, 0], x[~near, 1], c=y[~near], cmap="coolwarm", s=3, alpha=0.4)
      ax.scatter(x[near, 0], x[near, 1], c=y[near], cmap="coolwarm", s=14, marker="^",
                 edgecolors="k", linewidths=0.4, label="boundary clients")
      d = box.domain
      g = np.linspace(-d, d, 200)
      gx, gy = np.meshgrid(g, g)
      grid = np.stack([gx.ravel(), gy.ravel()], axis=1).astype(np.float32)
      a, b, c = box.line
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
    # One row per method, one column per client, the share of rounds it was selected as the
    # colour (seed 0: client ids mean the same clients as in the data panel); red ticks under
    # the boundary clients.
    ax = row[2]
    methods = list(results[group])
    shares = np.zeros((len(methods), data.num_clients))
    for i, runs in enumerate(results[group].values()):
      for r in runs[0]:
        shares[i, np.asarray(r["selected"], int)] += 1.0 / len(runs[0])
    image = ax.imshow(shares, aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0,
                      interpolation="nearest")
    ax.set_xticks(np.flatnonzero(is_b), minor=True)
    ax.tick_params(axis="x", which="minor", length=9, width=2, color="C3")
    ax.set_yticks(range(len(methods)), methods, fontsize=8)
    fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02, label="share of rounds selected")
    ax.set_title(f"{group}: selection frequency (seed {seed}; red ticks: boundary)",
                 fontsize=10)
    ax.set_xlabel("client id")
    ax.set_ylabel("method")
  handles, labels = axes[0][1].get_legend_handles_labels()
  fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
  seeds = len(cfg.seeds)
  spread = f"mean +- sample std over {seeds} seeds" if seeds > 1 else "1 seed"
  fig.suptitle(f"UACS-FL: {cfg.engine.clients_per_round} clients selected per round, "
               f"{cfg.engine.rounds} rounds, eps = {cfg.parts.selector.settings.explore_prob} "
               f"({spread})", fontsize=11)
  height = 4.4 * len(scenarios) + 0.8
  fig.tight_layout(rect=(0, 0.5 / height, 1, 1 - 0.4 / height))
  fig.savefig(path, dpi=110)
  plt.close(fig)

