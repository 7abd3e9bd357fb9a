"""Curves of per-round metrics, mean and standard deviation over seeds (matplotlib).

Example:
  >>> plot_curves({"FedAvg": [records_seed0, records_seed1]}, ["test_accuracy"], "fig.png")
  ... # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np


def metric_matrix(runs: list[list[dict]], key: str) -> tuple[np.ndarray, np.ndarray]:
  """(rounds, [seeds, rounds] values) of `key` over the rounds every seed recorded it."""
  per_seed = [{r["round"]: r[key] for r in recs if key in r} for recs in runs]
  rounds = sorted(set.intersection(*(set(d) for d in per_seed)))
  return np.array(rounds), np.array([[d[t] for t in rounds] for d in per_seed], dtype=float)


def plot_curves(groups: dict[str, list[list[dict]]], keys: list[str], path: str,
                titles: dict[str, str] | None = None) -> None:
  """One panel per metric key; one line (mean) and band (std) per labelled group of seeds."""
  plot_panels({"": groups}, keys, path, titles)


def plot_panels(rows: dict[str, dict[str, list[list[dict]]]], keys: list[str], path: str,
                titles: dict[str, str] | None = None) -> None:
  """A grid: one row per named set of runs (e.g. a noise level), one column per metric key; one
  line (mean over seeds) and band (std) per labelled group of seeds."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  fig, axes = plt.subplots(len(rows), len(keys), figsize=(4.2 * len(keys), 3.4 * len(rows)),
                           squeeze=False)
  for axrow, (row_name, groups) in zip(axes, rows.items()):
    for ax, key in zip(axrow, keys):
      for label, runs in groups.items():
        rounds, vals = metric_matrix(runs, key)
        if not len(rounds):
          continue
        mean, std = vals.mean(0), vals.std(0)
        ax.plot(rounds, mean, label=label)
        ax.fill_between(rounds, mean - std, mean + std, alpha=0.2)
      ax.set_xlabel("round")
      title = (titles or {}).get(key, key)
      ax.set_title(f"{row_name}: {title}" if row_name else title)
      ax.grid(alpha=0.3)
    axrow[0].legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
