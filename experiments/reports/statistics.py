"""The benchmark's statistics: a mean over seeds with its 95% interval, and a paired comparison of
a method with a baseline on the same seeds (`compare_with_random` adds it to the benchmark's
leaderboard rows).

A cell's interval is Student's t interval of the mean over its n seeds (mean +- t_{0.975, n-1} s /
sqrt(n), s the sample standard deviation); with one seed it is the value alone. A paired comparison
takes each seed's difference (method - baseline, the two runs sharing the seed's data, availability
and model initialization), counts the seeds it wins, ties and loses, and gives the mean difference
its own t interval: a method beats the baseline when that interval lies above 0. Ranks order
only what the intervals separate: a method's rank is a range, from one more than the methods
whose interval lies wholly above its own to where those wholly below it begin (`rank_range`).

Example:
  >>> interval([0.80, 0.82, 0.84]).mean
  0.82
  >>> p = paired([0.9, 0.8, 0.85], [0.8, 0.8, 0.7])
  >>> (p.wins, p.ties, p.losses), round(p.difference.mean, 3)
  ((2, 1, 0), 0.083)
  >>> rank_range(Interval(0.8, 0, 0.7, 0.9, 3), [Interval(0.95, 0, 0.92, 0.98, 3),
  ...                                            Interval(0.85, 0, 0.8, 0.9, 3)])
  (2, 3)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

LEVEL = 0.95  # The intervals' coverage.
TIE = 1e-9  # Differences within this are ties (equal runs give exactly equal accuracies).


class Interval(NamedTuple):
  """A mean over n values, their sample std and the mean's interval [low, high]."""

  mean: float
  std: float
  low: float
  high: float
  n: int

  def text(self) -> str:
    """"mean [low, high]" (the value alone for one value)."""
    if self.n == 1:
      return f"{self.mean:.4f}"
    return f"{self.mean:.4f} [{self.low:.4f}, {self.high:.4f}]"


class Paired(NamedTuple):
  """A method against a baseline on the same seeds: the mean difference's interval and the seeds
  it won, tied and lost."""

  difference: Interval
  wins: int
  ties: int
  losses: int

  @property
  def verdict(self) -> str:
    """"better" or "worse" when the difference's interval excludes 0, else "tie"."""
    d = self.difference
    if d.n > 1 and d.low > 0:
      return "better"
    if d.n > 1 and d.high < 0:
      return "worse"
    return "tie"

  def text(self) -> str:
    """"+0.0123 [+0.0040, +0.0206] better (8/1/1)": the difference, verdict, wins/ties/losses."""
    d = self.difference
    span = f" [{d.low:+.4f}, {d.high:+.4f}]" if d.n > 1 else ""
    return f"{d.mean:+.4f}{span} {self.verdict} ({self.wins}/{self.ties}/{self.losses})"


def interval(values: Sequence[float], level: float = LEVEL) -> Interval:
  """The mean of `values` with its Student's t interval at `level`."""
  a = np.asarray(values, float)
  n = len(a)
  mean = float(a.mean())
  if n == 1:
    return Interval(mean, 0.0, mean, mean, 1)
  std = float(a.std(ddof=1))
  # Imported here: SciPy's statistics take 0.5 s to import, which `experiments.bench` and the
  # launchers' start would pay for nothing.
  from scipy import stats  # pylint: disable=import-outside-toplevel
  half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * std / math.sqrt(n)
  return Interval(mean, std, mean - half, mean + half, n)


def paired(values: Sequence[float], baseline: Sequence[float], level: float = LEVEL) -> Paired:
  """`values` against `baseline`, seed by seed (the same seeds, in the same order)."""
  if len(values) != len(baseline):
    raise ValueError(f"a paired comparison needs the same seeds: {len(values)} values against "
                     f"{len(baseline)}")
  d = np.asarray(values, float) - np.asarray(baseline, float)
  return Paired(interval(d, level), int(np.sum(d > TIE)), int(np.sum(np.abs(d) <= TIE)),
                int(np.sum(d < -TIE)))


def compare_with_random(rows: list[dict], finals: dict[tuple[str, str], list[float]]) -> None:
  """Adds to each row its paired comparison with the random selector of its scenario on the same
  seeds (`statistics.paired`): a `vs_random` cell and its numbers; none where random did not run."""
  for r in rows:
    base = finals.get((r["scenario"], "random"))
    own = finals[r["scenario"], r["selector"]]
    if base is None or r["selector"] == "random" or len(base) != len(own):
      r["vs_random"] = ""
      continue
    p = paired(own, base)
    r["vs_random"] = p.text()
    r.update(vs_random_mean=p.difference.mean, vs_random_low=p.difference.low,
             vs_random_high=p.difference.high, vs_random_wins=p.wins, vs_random_ties=p.ties,
             vs_random_losses=p.losses, vs_random_verdict=p.verdict)


def rank_range(own: Interval, others: Sequence[Interval]) -> tuple[int, int]:
  """The ranks (1 = best) `own` may take among `own` and `others` by their means, given the
  intervals: (1 + those wholly above it, 1 + len(others) - those wholly below it)."""
  best = 1 + sum(o.low > own.high for o in others)
  return best, 1 + len(others) - sum(o.high < own.low for o in others)


def rank_text(best: int, worst: int) -> str:
  """"3" where the intervals fix the rank, "2-9" where they leave a tie."""
  return str(best) if best == worst else f"{best}-{worst}"


def add_ranks(rows: list[dict]) -> None:
  """Adds to each leaderboard row its rank range in its scenario by final accuracy (the rows'
  `final_acc_mean`, `_std`, `_low`, `_high`, `_n`): `rank` as text, `rank_best`, `rank_worst`."""
  cell = {id(r): Interval(*(r[f"final_acc_{k}"] for k in Interval._fields)) for r in rows}
  for r in rows:
    others = [cell[id(o)] for o in rows if o["scenario"] == r["scenario"] and o is not r]
    r["rank_best"], r["rank_worst"] = rank_range(cell[id(r)], others)
    r["rank"] = rank_text(r["rank_best"], r["rank_worst"])
