"""The privacy accountant of a run: its configuration as dp-accounting events, epsilon by round.

Accounting runs on the host, from the configuration alone (no round need run): `Accounting`
says which mechanism, noise multiplier, sampling and privatized selection a run has; `round_events`
turns that into Google's `dp_accounting` events and `epsilon` asks dp-accounting's RDP or PLD
accountant (never an accountant written here). How each case is accounted (docs/papers/privacy.md,
"Accounting"):

* Poisson sampling with rate q (`sampling="poisson"`), add-or-remove-one adjacency, sensitivity S:
  RDP, `PoissonSampledDpEvent(q, GaussianDpEvent(z))` (the cap's truncation bounded apart,
  `truncation_probability`); PLD, `TruncatedSubsampledGaussianDpEvent(N, q, K, z)`, the capped
  mechanism itself.
* A uniform cohort of K of N without replacement (`"uniform"`), replace-one adjacency: a replaced
  client moves the sum by up to 2S, so `SampledWithoutReplacementDpEvent(N, K,
  GaussianDpEvent(z / 2))` (RDP only).
* Any other choice (`"none"`: a selector reading metadata, or privatized statistics): no
  amplification; adding a client may displace another from the cohort, so the sum moves by up to
  2S: `GaussianDpEvent(z / 2)` per round, composed with a `GaussianDpEvent(sigma_s)` per private
  statistic read.
* DP-FTRL: each client enters each tree at most once; per tree of s rounds
  `SingleEpochTreeAggregationDpEvent(z, s)` under replace-special (zero-out) adjacency (RDP), the
  trees composed, whatever the (data-independent) selection.

Adaptive clipping is accounted as one Gaussian of multiplier z (Andrew et al.'s Theorem 1).

Example (the TF Privacy / Abadi et al. MNIST setting, q = 256 / 60000, z = 1.12, 14063 steps):
  >>> acc = Accounting("fedavg", 1.12, num_clients=60000, cohort=256, sampling="poisson",
  ...                  sample_rate=256 / 60000)
  >>> round(epsilon(acc, 14063, 1e-5), 2)
  2.52
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
  import dp_accounting as dpa

MECHANISMS = ("fedavg", "adaptive", "ftrl")
SAMPLINGS = ("poisson", "uniform", "none")


@functools.cache
def _dpa():
  """Google's dp-accounting, imported on its first use: the 1-2 s its import (and SciPy's) takes
  are paid by runs with DP only (the registry imports this module in every launcher)."""
  import dp_accounting  # pylint: disable=import-outside-toplevel
  return dp_accounting


class _LeftOutOrders(logging.Filter):
  """Drops dp-accounting's note that an RDP order did not converge and is left out of the minimum
  (it writes one per order and call, hundreds of lines a run; the result is unchanged)."""

  def filter(self, record: logging.LogRecord) -> bool:
    return "failed to converge" not in record.getMessage()


@contextlib.contextmanager
def _quiet():
  logger = logging.getLogger("absl")
  left_out = _LeftOutOrders()
  logger.addFilter(left_out)
  try:
    yield
  finally:
    logger.removeFilter(left_out)


def _binom():
  from scipy import stats  # pylint: disable=import-outside-toplevel
  return stats.binom


class Accounting(NamedTuple):
  """What the accountant reads of a run.

  Attributes:
    mechanism: "fedavg", "adaptive" or "ftrl".
    noise_multiplier: z.
    num_clients: N, the clients the selection draws from.
    cohort: K, the fixed cohort (or Poisson's cap).
    sampling: "poisson", "uniform" or "none" (no amplification).
    sample_rate: q (Poisson).
    rounds_per_tree: DP-FTRL's rounds between restarts.
    selection_noise: noise multipliers of the private statistics the selector reads each round
      (privatized selection; empty otherwise).
    accountant: "rdp" or "pld".
  """

  mechanism: str
  noise_multiplier: float
  num_clients: int
  cohort: int
  sampling: str
  sample_rate: float = 0.0
  rounds_per_tree: int = 0
  selection_noise: tuple[float, ...] = ()
  accountant: str = "rdp"

  def relation(self) -> dpa.NeighboringRelation:
    """The adjacency its events are stated in."""
    if self.mechanism == "ftrl":
      return _dpa().NeighboringRelation.REPLACE_SPECIAL
    relation = _dpa().NeighboringRelation
    return relation.REPLACE_ONE if self.sampling == "uniform" else relation.ADD_OR_REMOVE_ONE

  def check(self) -> None:
    """ValueError naming what the accountant cannot state."""
    if self.mechanism not in MECHANISMS or self.sampling not in SAMPLINGS:
      raise ValueError(f"mechanism must be one of {MECHANISMS} and sampling one of {SAMPLINGS}, "
                       f"got {self.mechanism!r}, {self.sampling!r}")
    if self.accountant == "pld" and (self.mechanism == "ftrl" or self.sampling == "uniform"):
      raise ValueError("dp-accounting's PLD accountant states neither tree aggregation nor "
                       "sampling without replacement: use the RDP accountant (--dp_accountant=rdp)")
    if self.sampling == "poisson" and self.selection_noise:
      raise ValueError("Poisson sampling reads nothing: it has no statistics to privatize")


def _gaussian(z: float) -> dpa.DpEvent:
  return _dpa().GaussianDpEvent(z)


def round_events(acc: Accounting, rounds: int) -> dpa.DpEvent:
  """The dp-accounting event of `rounds` rounds of the run."""
  acc.check()
  selection = [_dpa().SelfComposedDpEvent(_gaussian(s), rounds) for s in acc.selection_noise]
  z = acc.noise_multiplier
  if acc.mechanism == "ftrl":
    full, rest = divmod(rounds, acc.rounds_per_tree)
    trees = [_dpa().SingleEpochTreeAggregationDpEvent(z, acc.rounds_per_tree)] * full
    trees += [_dpa().SingleEpochTreeAggregationDpEvent(z, rest)] if rest else []
    return _dpa().ComposedDpEvent(trees + selection)
  if acc.sampling == "poisson":
    dp = _dpa()
    one = (dp.TruncatedSubsampledGaussianDpEvent(acc.num_clients, acc.sample_rate, acc.cohort, z)
           if acc.accountant == "pld" else dp.PoissonSampledDpEvent(acc.sample_rate, _gaussian(z)))
  elif acc.sampling == "uniform":
    one = _dpa().SampledWithoutReplacementDpEvent(acc.num_clients, acc.cohort, _gaussian(z / 2))
  else:
    one = _gaussian(z / 2)
  return _dpa().ComposedDpEvent([_dpa().SelfComposedDpEvent(one, rounds)] + selection)


def new_accountant(acc: Accounting) -> dpa.PrivacyAccountant:
  """A fresh dp-accounting accountant of the run's kind and adjacency."""
  if acc.accountant == "pld":
    return _dpa().pld.pld_privacy_accountant.PLDAccountant(acc.relation())
  return _dpa().rdp.rdp_privacy_accountant.RdpAccountant(neighboring_relation=acc.relation())


def epsilon(acc: Accounting, rounds: int, delta: float) -> float:
  """Epsilon at `delta` after `rounds` rounds (inf when z = 0; 0 for no round)."""
  if rounds <= 0:
    return 0.0
  if acc.noise_multiplier <= 0:
    return math.inf
  accountant = new_accountant(acc)
  with _quiet():
    accountant.compose(round_events(acc, rounds))
  return float(accountant.get_epsilon(delta))


PLD_POINTS = 12  # Rounds at which a PLD curve is computed (each takes seconds).


def epsilons(acc: Accounting, rounds: int, delta: float) -> np.ndarray:
  """`[rounds]` epsilon after each of rounds 1..`rounds`. RDP: each round's own (for a mechanism
  that repeats one event a round, each event's RDP is computed once and scaled by t, the very
  arithmetic of `RdpAccountant.compose(event, t)`). PLD (seconds per point): at `PLD_POINTS`
  rounds evenly spread up to the last, each round given the epsilon of the next of those (an upper
  bound: epsilon grows with the rounds)."""
  if acc.accountant != "pld" and (acc.mechanism == "ftrl" or acc.noise_multiplier <= 0):
    return np.array([epsilon(acc, t, delta) for t in range(1, rounds + 1)])
  if acc.accountant != "pld":
    parts = []
    for event in round_events(acc, 1).events:
      accountant = new_accountant(acc)
      with _quiet():
        accountant.compose(event.event)  # One round of each repeated event.
      parts.append(accountant.rdp)
    orders = new_accountant(acc).orders
    out = []
    for t in range(1, rounds + 1):
      rdp = np.zeros_like(orders, dtype=np.float64)
      for part in parts:
        rdp += t * part
      out.append(float(_dpa().rdp.rdp_privacy_accountant.compute_epsilon(orders, rdp, delta)[0]))
    return np.array(out)
  points = np.unique(np.ceil(np.linspace(0, rounds, PLD_POINTS + 1)[1:]).astype(int))
  at = {int(t): epsilon(acc, int(t), delta) for t in points}
  return np.array([at[int(points[np.searchsorted(points, t)])] for t in range(1, rounds + 1)])


def default_delta(num_clients: int) -> float:
  """The default delta, `1 / N^1.1` (below 1 / N, as a user-level guarantee needs).

  >>> default_delta(1000) < 1 / 1000
  True
  """
  return 1.0 / num_clients ** 1.1


def noise_for_epsilon(acc: Accounting, rounds: int, delta: float, target: float) -> float:
  """The smallest noise multiplier whose `rounds` rounds spend at most `target` at `delta`
  (dp-accounting's `calibrate_dp_mechanism`)."""
  with _quiet():
    return float(_dpa().mechanism_calibration.calibrate_dp_mechanism(
        lambda: new_accountant(acc),
        lambda z: round_events(acc._replace(noise_multiplier=z), rounds), target, delta,
        _dpa().mechanism_calibration.LowerEndpointAndGuess(1e-3, 1.0)))


def rounds_within(acc: Accounting, rounds: int, delta: float, budget: float) -> int:
  """The most rounds, up to `rounds`, whose epsilon stays within `budget` (0 if not one)."""
  low, high = 0, rounds
  while low < high:
    mid = (low + high + 1) // 2
    if epsilon(acc, mid, delta) <= budget:
      low = mid
    else:
      high = mid - 1
  return low


def truncation_probability(acc: Accounting, rounds: int) -> float:
  """Poisson sampling: the chance that any of `rounds` rounds draws more than the cap K, a
  union bound `rounds * P(Binomial(N, q) > K)` (0 for other samplings, and for DP-FTRL, whose
  guarantee does not rest on the sampling)."""
  if acc.sampling != "poisson" or acc.mechanism == "ftrl":
    return 0.0
  return min(1.0, rounds * float(_binom().sf(acc.cohort, acc.num_clients, acc.sample_rate)))


def smallest_cap(num_clients: int, sample_rate: float, rounds: int, probability: float) -> int:
  """The smallest cap K whose `truncation_probability` over `rounds` rounds is at most
  `probability`.

  >>> smallest_cap(1000, 0.01, 100, 1e-9)
  37
  """
  return int(_binom().isf(probability / rounds, num_clients, sample_rate))
