"""The benchmark's statistics (`experiments/reports/statistics.py`) against a plain computation:
Student's t intervals from a printed table's quantiles, paired differences by a loop."""

import math

import numpy as np
import pytest

from experiments.reports import statistics

# t_{0.975, df} from a printed table of Student's t distribution.
T975 = {1: 12.706, 2: 4.303, 4: 2.776, 9: 2.262}
RANDOM = [0.81, 0.84, 0.79, 0.86, 0.80, 0.83, 0.82, 0.85, 0.78, 0.84]  # Ten seeds' final accuracy.
OORT = [0.84, 0.86, 0.83, 0.86, 0.84, 0.85, 0.85, 0.87, 0.82, 0.86]


@pytest.mark.parametrize("n", [2, 3, 5, 10])
def test_the_interval_is_the_mean_plus_minus_t_s_over_root_n(n):
  values = RANDOM[:n]
  got = statistics.interval(values)
  mean = sum(values) / n
  std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
  half = T975[n - 1] * std / math.sqrt(n)
  assert got.n == n and got.mean == pytest.approx(mean) and got.std == pytest.approx(std)
  assert got.low == pytest.approx(mean - half, abs=2e-4) and got.high == pytest.approx(
      mean + half, abs=2e-4)  # The table's quantiles have three decimals.


def test_one_seed_is_its_value_with_no_interval():
  assert statistics.interval([0.7]) == (0.7, 0.0, 0.7, 0.7, 1)
  assert statistics.interval([0.7]).text() == "0.7000"


def test_a_paired_comparison_counts_seeds_and_intervals_the_mean_difference():
  got = statistics.paired(OORT, RANDOM)
  diffs = [a - b for a, b in zip(OORT, RANDOM)]
  wins = sum(d > 1e-9 for d in diffs)
  ties = sum(abs(d) <= 1e-9 for d in diffs)
  assert (got.wins, got.ties, got.losses) == (wins, ties, len(diffs) - wins - ties) == (9, 1, 0)
  mean = float(np.mean(diffs))
  half = T975[9] * float(np.std(diffs, ddof=1)) / math.sqrt(10)
  assert got.difference.mean == pytest.approx(mean)
  assert got.difference.low == pytest.approx(mean - half, abs=1e-4)
  assert got.verdict == "better" and got.difference.low > 0
  assert statistics.paired(RANDOM, OORT).verdict == "worse"
  assert statistics.paired(RANDOM[:3], [0.8, 0.86, 0.78]).verdict == "tie"
  with pytest.raises(ValueError, match="same seeds"):
    statistics.paired(OORT, RANDOM[:3])


def test_the_leaderboard_pairs_each_selector_with_random_on_its_scenario():
  rows = [{"scenario": "s", "selector": "random"}, {"scenario": "s", "selector": "oort"},
          {"scenario": "t", "selector": "oort"}]
  statistics.compare_with_random(rows, {("s", "random"): RANDOM, ("s", "oort"): OORT,
                                   ("t", "oort"): OORT})
  assert rows[0]["vs_random"] == "" and rows[2]["vs_random"] == ""  # No random in scenario t.
  assert rows[1]["vs_random_verdict"] == "better" and rows[1]["vs_random_wins"] == 9
  assert rows[1]["vs_random"].endswith("better (9/1/0)")


def test_ranks_order_only_what_the_intervals_separate():
  """Per selector, the ranks a plain loop over the intervals allows: 1 + those wholly above it,
  down to where those wholly below it begin; overlapping intervals share a range."""
  seeds = {"a": OORT, "b": RANDOM, "c": [v - 0.1 for v in RANDOM], "d": [v + 0.005 for v in RANDOM]}
  rows = []
  for name, values in seeds.items():
    cell = statistics.interval(values)
    rows.append({"scenario": "s", "selector": name,
                 **{f"final_acc_{k}": v for k, v in cell._asdict().items()}})
  statistics.add_ranks(rows)
  for r in rows:
    low, high = r["final_acc_low"], r["final_acc_high"]
    others = [o for o in rows if o is not r]
    best = 1 + sum(o["final_acc_low"] > high for o in others)
    worst = len(rows) - sum(o["final_acc_high"] < low for o in others)
    assert (r["rank_best"], r["rank_worst"]) == (best, worst)
  assert {r["selector"]: r["rank"] for r in rows} == {"a": "1-3", "b": "1-3", "c": "4", "d": "1-3"}
