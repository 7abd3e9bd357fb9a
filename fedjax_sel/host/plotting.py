"""Figures of per-round metrics: mean and sample standard deviation over seeds (matplotlib).

Every figure reads the same way: at most `MAX_COLUMNS` panels a row, x in rounds trained (the
record of round t is the model after t + 1 rounds; runs on the simulated clock add a panel of test
accuracy over simulated seconds), each panel's y axis labelled with its unit, one
line style and marker per method so equal curves stay visible, one legend below the panels (off the
data), and a title stating the setup and the number of seeds. A panel is drawn only for metrics a
method has (`only` keeps, per metric, the methods it applies to: no filtered-set line for FedAvg).

Examples:
  >>> fig = panels_figure({"": {"FedAvg": [[{"round": 0, "test_accuracy": 0.5}]]}},
  ...                     ["test_accuracy"], title="digits")
  >>> fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel()
  ('rounds trained', 'accuracy')
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

MAX_COLUMNS = 4
OVER_TIME = "@sim_time"  # A key's suffix for its panel over simulated seconds (`time_matrix`).
STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "x", "P", "*")
# Units of the y axes, by metric name (first match of a suffix or name).
UNITS = (("approx_ratio", "ratio R(greedy) / R(OPT)"), ("accuracy", "accuracy"),
         ("loss", "cross-entropy (nats)"), ("objective", "cross-entropy (nats)"),
         ("num_", "clients"), ("others_", "clients per round"),
         ("participation_rate", "share of the selected clients"),
         ("_excluded", "clients excluded per round"), ("eps", "tolerance (metric units)"),
         ("closest_gap", "gap (metric units)"), ("time_s", "simulated seconds"))


def bounds_of(key: str) -> tuple[float, float]:
  """The range a metric's values can take (a seed band is clipped to it): accuracies, shares and
  ratios in [0, 1], counts, losses and times >= 0, others unbounded."""
  unit = unit_of(key)
  if unit in ("accuracy", "share of the selected clients"):
    return 0.0, 1.0
  if "clients" in unit or unit in ("cross-entropy (nats)", "simulated seconds"):
    return 0.0, math.inf
  return -math.inf, math.inf


def is_count(key: str) -> bool:
  """Whether a metric counts clients (integer ticks)."""
  unit = unit_of(key)
  return "clients" in unit and not unit.startswith("share")


def unit_of(key: str) -> str:
  return next((unit for name, unit in UNITS if name in key), key.replace("_", " "))


def seed_spread(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Mean and sample standard deviation over the seeds (axis 0) of `[seeds, rounds]` values;
  a zero spread for one seed."""
  mean = values.mean(0)
  return mean, values.std(0, ddof=1) if len(values) > 1 else np.zeros_like(mean)


def mean_std(values) -> str:
  """"mean +- sample std" of per-seed values (the value alone for one seed).

    >>> mean_std([0.5, 0.7])
    '0.6000 +- 0.1414'
  """
  values = np.asarray(values, float)
  if len(values) == 1:
    return f"{values[0]:.4f}"
  return f"{values.mean():.4f} +- {values.std(ddof=1):.4f}"


def metric_matrix(runs: list[list[dict]], key: str) -> tuple[np.ndarray, np.ndarray]:
  """(rounds, [seeds, rounds] values) of `key` over the rounds every seed recorded it; for a
  `OVER_TIME` key, (simulated seconds, values) from `time_matrix`."""
  if key.endswith(OVER_TIME):
    return time_matrix(runs, key.removesuffix(OVER_TIME))
  per_seed = [{r["round"]: r[key] for r in recs if key in r} for recs in runs]
  rounds = sorted(set.intersection(*(set(d) for d in per_seed)))
  return np.array(rounds), np.array([[d[t] for t in rounds] for d in per_seed], dtype=float)


def time_matrix(runs: list[list[dict]], key: str, points: int = 100
                ) -> tuple[np.ndarray, np.ndarray]:
  """(simulated seconds, [seeds, points] values) of `key`: each seed's value as of each time (the
  last one it reached; before its first, its first) on a grid from the earliest seed's first
  record up to the shortest seed's end; empty where a seed has no record of it.

    >>> time_matrix([[{"round": 0, "acc": 0.5, "cumulative_cost": {"sim_time_s": 2.0}},
    ...               {"round": 1, "acc": 0.7, "cumulative_cost": {"sim_time_s": 4.0}}]],
    ...             "acc", points=3)[1].tolist()
    [[0.5, 0.5, 0.7]]
  """
  seeds = [[(r["cumulative_cost"]["sim_time_s"], r[key]) for r in recs
            if key in r and "cumulative_cost" in r] for recs in runs]
  if not all(seeds):
    return np.array([]), np.zeros((len(runs), 0))
  grid = np.linspace(min(seed[0][0] for seed in seeds), min(seed[-1][0] for seed in seeds),
                     points)
  values = []
  for seed in seeds:
    times = np.array([t for t, _ in seed])
    index = np.clip(np.searchsorted(times, grid, side="right") - 1, 0, len(seed) - 1)
    values.append(np.array([v for _, v in seed], float)[index])
  return grid, np.array(values)


def clocked(rows: dict[str, dict[str, list[list[dict]]]]) -> bool:
  """Whether the runs ran on the simulated clock (their records' time moves)."""
  return any(recs[-1].get("cumulative_cost", {}).get("sim_time_s", 0) > 0
             for groups in rows.values() for runs in groups.values() for recs in runs if recs)


def panels_figure(rows: dict[str, dict[str, list[list[dict]]]], keys: list[str],
                  titles: dict[str, str] | None = None, title: str = "",
                  only: dict[str, Callable[[str], bool]] | None = None):
  """The figure of `plot_panels` (not saved), for callers and tests."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  from matplotlib import ticker  # pylint: disable=import-outside-toplevel

  if "test_accuracy" in keys and clocked(rows):  # On the clock: accuracy over time as well.
    keys = [*keys, "test_accuracy" + OVER_TIME]
  groups_panels = []  # Per named set of runs, its (row name, key, {label: runs}) that have data.
  for row_name, groups in rows.items():
    drawn_here = []
    for key in keys:
      keep = (only or {}).get(key, lambda label: True)
      drawn = {label: runs for label, runs in groups.items()
               if keep(label) and len(metric_matrix(runs, key)[0])}
      if drawn:
        drawn_here.append((row_name, key, drawn))
    if drawn_here:
      groups_panels.append(drawn_here)
  labels = list(dict.fromkeys(label for groups in rows.values() for label in groups))
  seeds = max((len(runs) for groups in rows.values() for runs in groups.values()), default=0)
  columns = min(MAX_COLUMNS, max((len(g) for g in groups_panels), default=1))
  # Each named set of runs starts a row of its own, so a row never mixes two of them.
  slots, panels = [], []
  for group in groups_panels:
    first = math.ceil(len(slots) / columns) * columns
    slots += [None] * (first - len(slots))
    for panel in group:
      slots.append(len(panels))
      panels.append(panel)
  lines = max(math.ceil(len(slots) / columns), 1)
  legend_rows = math.ceil(len(labels) / 4)
  height = 3.5 * lines + 0.8 + 0.3 * legend_rows
  fig, axes = plt.subplots(lines, columns, figsize=(4.4 * columns, height), squeeze=False)
  used = [ax for ax, slot in zip(axes.flat, slots) if slot is not None]
  for ax, (row_name, key, drawn) in zip(used, panels):
    for j, (label, runs) in enumerate(drawn.items()):
      i = labels.index(label)
      rounds, vals = metric_matrix(runs, key)
      mean, std = seed_spread(vals)
      x = rounds if key.endswith(OVER_TIME) else rounds + 1
      color = f"C{i % 10}"  # One color, style and marker per method in every panel.
      step = max(len(x) // 8, 1)  # Markers shifted per method: equal curves show both.
      # Methods drawn first in a panel are wider underneath: a curve equal to a later one shows.
      under = len(drawn) - 1 - j
      ax.plot(x, mean, STYLES[i % len(STYLES)], color=color, marker=MARKERS[i % len(MARKERS)],
              markevery=(i * max(step // len(labels), 1) % step, step),
              markersize=4 + 1.0 * under, linewidth=1.5 + 0.7 * under, label=label)
      if len(runs) > 1:  # The band within what the metric can take (no count below 0).
        low, high = bounds_of(key)
        ax.fill_between(x, np.clip(mean - std, low, high), np.clip(mean + std, low, high),
                        color=color, alpha=0.15)
    if is_count(key):  # Whole clients, from 0 (an all-zero panel shows 0 and 1, not +-0.04).
      top = max(ax.get_ylim()[1], 1)
      ax.set_ylim(bottom=-0.04 * top, top=top)  # A line at 0 stays visible above the axis.
      ax.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    base = key.removesuffix(OVER_TIME)
    name = (titles or {}).get(base, base.replace("_", " "))
    if key.endswith(OVER_TIME):
      name += " over simulated time"
      ax.set_xlabel("simulated seconds")
    else:
      ax.set_xlabel("rounds trained")
      ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.set_title(f"{row_name}: {name}" if row_name else name, fontsize=10)
    ax.set_ylabel(unit_of(base))
    ax.grid(alpha=0.3)
  for ax in axes.flat:
    ax.set_visible(any(ax is u for u in used))
  handles = {}
  for ax in axes.flat:
    for handle, label in zip(*ax.get_legend_handles_labels()):
      handles.setdefault(label, handle)
  spread = f"mean +- sample std over {seeds} seeds" if seeds > 1 else "1 seed"
  fig.suptitle(f"{title} ({spread})" if title else spread, fontsize=11)
  fig.legend(list(handles.values()), list(handles), loc="lower center",
             ncol=min(len(handles), 4), frameon=False)
  fig.tight_layout(rect=(0, (0.15 + 0.3 * legend_rows) / height, 1, 1 - 0.45 / height))
  return fig


def plot_panels(rows: dict[str, dict[str, list[list[dict]]]], keys: list[str], path: str,
                titles: dict[str, str] | None = None, title: str = "",
                only: dict[str, Callable[[str], bool]] | None = None) -> None:
  """A grid of panels, one per (named set of runs, metric key) that has data, at most
  `MAX_COLUMNS` a row; one line (mean over seeds) and band (sample std) per labelled group of
  seeds; each named set of runs starts a row of its own."""
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig = panels_figure(rows, keys, titles, title, only)
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_curves(groups: dict[str, list[list[dict]]], keys: list[str], path: str,
                titles: dict[str, str] | None = None, title: str = "",
                only: dict[str, Callable[[str], bool]] | None = None) -> None:
  """`plot_panels` of one set of runs: one panel per metric key."""
  plot_panels({"": groups}, keys, path, titles, title, only)
