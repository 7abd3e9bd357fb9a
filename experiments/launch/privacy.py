"""The launchers' side of differential privacy (docs/papers/privacy.md): checks, calibration, the
budget, per-round accounting in the records and the summary's guarantee.

A job is private when its aggregator is one of `fedjax_sel/privacy/aggregators.py`'s
(`--aggregator=dp_fedavg|dp_adaptive|dp_ftrl`). Before any data, `resolve` refuses what the
accountant cannot cover (a selector reading private data without `--dp_selection=privatized` or
`unaccounted`, a filter or a rule, the asynchronous mode, a Poisson cap whose truncation the RDP
accountant would miss), calibrates z for `--dp_noise_for_epsilon` and, for `--dp_target_epsilon`,
cuts `--rounds` to the last round within the budget (the runs then end there, records and summary
kept). Each run's records carry `dp_epsilon` (at `dp_delta`), the noise std, the clip norm, the
share of clipped updates and the updates in the private sum (`extra`); the summary states the
guarantee (`summary`).

Example:
  >>> from experiments.launch import config
  >>> cfg = config.updated(config.JobConfig(), aggregator="dp_fedavg", num_clients=100,
  ...                      num_available=100, dp_noise=1.0, rounds=10)
  >>> accounting(cfg).sampling, round(delta(cfg), 7)
  ('uniform', 0.0063096)
"""

from __future__ import annotations

import functools
import math

import numpy as np
from absl import app

import fedjax_sel as fs
from experiments.launch import build
from experiments.launch import config as cfglib
from fedjax_sel.privacy import accountant as acct
from fedjax_sel.privacy import aggregators as dp
from fedjax_sel.privacy import selection

# The truncation chance (over the run) of a Poisson cap that the RDP accountant may leave out, as
# a share of delta: the reported delta then grows by at most (1 + e^eps) times this.
TRUNCATION_SHARE = 1e-3
UNACCOUNTED = ("the guarantee covers the aggregate only: the selector's choice reads private data "
               "that is not accounted (--dp_selection=unaccounted)")


def private(cfg: cfglib.JobConfig) -> bool:
  """Whether the job aggregates privately."""
  return cfg.parts.aggregator.name in dp.MECHANISMS


def settings(cfg: cfglib.JobConfig) -> dp.PrivacySettings:
  return cfg.parts.aggregator.settings


def _full_availability(cfg: cfglib.JobConfig) -> bool:
  """Whether every client is available every round (the default model with n = N)."""
  avail = cfg.parts.availability
  return (avail.name == cfglib.JobConfig().parts.availability.name
          and build.num_available(cfg) == cfg.data.num_clients)


def sampling(cfg: cfglib.JobConfig) -> str:
  """How the accountant may amplify: the selector's sampling (`selection.AMPLIFIED`) when every
  client is available every round, else "none"."""
  if not _full_availability(cfg):
    return "none"
  return selection.AMPLIFIED.get(cfg.parts.selector.name, "none")


def sample_rate(cfg: cfglib.JobConfig) -> float:
  return float(getattr(cfg.parts.selector.settings, "sample_rate", 0.0))


def delta(cfg: cfglib.JobConfig) -> float:
  """The run's delta: `--dp_delta`, else 1 / N^1.1."""
  return settings(cfg).delta or acct.default_delta(cfg.data.num_clients)


def accounting(cfg: cfglib.JobConfig) -> acct.Accounting:
  """The accountant's view of a run's config."""
  s = settings(cfg)
  how = sampling(cfg)
  restart = 0
  if cfg.parts.aggregator.name == "dp_ftrl":
    restart = s.restart or max(1, math.ceil(cfg.data.num_clients / cfg.engine.clients_per_round))
  # Every "stats" selector of the package reads one statistic a round (`statistics_read`).
  stats = (s.stats_noise,) if s.selection == "privatized" else ()
  return acct.Accounting(dp.MECHANISMS[cfg.parts.aggregator.name], s.noise, cfg.data.num_clients,
                         cfg.engine.clients_per_round, how,
                         sample_rate(cfg) if how == "poisson" else 0.0, restart, stats,
                         s.accountant)


def run_config(cfg: cfglib.JobConfig) -> cfglib.JobConfig:
  """A run's config with its automatic settings in place: the denominator q n (Poisson) or K, and
  z calibrated for `--dp_noise_for_epsilon` over `--rounds`."""
  if not private(cfg):
    return cfg
  s = settings(cfg)
  values = {}
  if not s.denominator:
    poisson = selection.AMPLIFIED.get(cfg.parts.selector.name) == "poisson"
    values["dp_denominator"] = (sample_rate(cfg) * build.num_available(cfg) if poisson
                                else float(cfg.engine.clients_per_round))
  if s.noise_for_epsilon:
    values["dp_noise"] = _calibrated(accounting(cfg), cfg.engine.rounds, delta(cfg),
                                     s.noise_for_epsilon)
  return cfglib.updated(cfg, **values)


@functools.lru_cache(maxsize=64)
def _curve(acc: acct.Accounting, rounds: int, at: float) -> np.ndarray:
  return acct.epsilons(acc, rounds, at)


@functools.lru_cache(maxsize=64)
def _calibrated(acc: acct.Accounting, rounds: int, at: float, target: float) -> float:
  return acct.noise_for_epsilon(acc, rounds, at, target)


def resolve(cfg: cfglib.JobConfig) -> cfglib.JobConfig:
  """The job checked for privacy before any data, its rounds cut to `--dp_target_epsilon`
  (usage errors name the flag)."""
  if not private(cfg):
    return cfg
  s = settings(cfg)
  if cfg.engine.mode == "async":
    raise app.UsageError(f"--aggregator={cfg.parts.aggregator.name} needs --mode=sync: an "
                         "asynchronous step's staleness weights change each update's sensitivity")
  others = tuple(f"--{cfglib.PART_FLAG[kind]}={getattr(cfg.parts, kind).name}"
                 for kind in ("filter", "rule") if getattr(cfg.parts, kind) is not None)
  try:
    selection.check_selection(cfg.parts.selector.name, s.selection, others)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  runs = [run_config(run) for _, _, run in cfg.runs()]
  for run in runs:
    _check_accounting(run)
  if s.target_epsilon:
    within = [acct.rounds_within(accounting(r), r.engine.rounds, delta(r), s.target_epsilon)
              for r in runs]
    last = min(within)
    if last < 1:
      raise app.UsageError(f"--dp_target_epsilon={s.target_epsilon:g}: one round already spends "
                           "more; raise the noise (--dp_noise) or the budget")
    if last < cfg.engine.rounds:
      print(f"note: --dp_target_epsilon={s.target_epsilon:g} is reached after round {last}: the "
            f"runs stop there (of --rounds={cfg.engine.rounds})", flush=True)
      cfg = cfglib.updated(cfg, rounds=last)
  return cfg


def _check_accounting(run: cfglib.JobConfig) -> None:
  acc = accounting(run)
  try:
    acc.check()
  except ValueError as e:
    raise app.UsageError(f"--aggregator={run.parts.aggregator.name}: {e}") from e
  p = acct.truncation_probability(acc, run.engine.rounds)
  if acc.accountant == "rdp" and p > TRUNCATION_SHARE * delta(run):
    cap = acct.smallest_cap(acc.num_clients, acc.sample_rate, run.engine.rounds,
                            TRUNCATION_SHARE * delta(run))
    raise app.UsageError(f"--clients_per_round={acc.cohort} caps Poisson sampling where the RDP "
                         f"accountant cannot ignore it (a round draws more than K with chance "
                         f"{p:.2g} over the run, above {TRUNCATION_SHARE:g} delta): set "
                         f"--clients_per_round >= {cap}, or --dp_accountant=pld, which accounts "
                         "for the cap")


def built(cfg: cfglib.JobConfig, spec: fs.RunSpec) -> fs.RunSpec:
  """A built run whose selector reads its statistics privatized (`selection.privatized`) when
  the run says `--dp_selection=privatized`."""
  if not private(cfg) or settings(cfg).selection != "privatized":
    return spec
  s = settings(cfg)
  selector = selection.privatized(spec.config.selector, s.stats_noise, s.stats_clip)
  if selection.statistics_read(selector) != len(accounting(cfg).selection_noise):
    raise app.UsageError(f"--selector={cfg.parts.selector.name} reads "
                         f"{selection.statistics_read(selector)} statistics a round; the "
                         "accountant composes one")
  return spec._replace(config=spec.config._replace(selector=selector))


def extra(cfg: cfglib.JobConfig):
  """`(state, record) -> dict` of a run's privacy metrics (None for a run that is not private)."""
  if not private(cfg):
    return None
  acc, at = accounting(cfg), delta(cfg)
  curve = _curve(acc, cfg.engine.rounds, at)
  note = {"dp_guarantee": "aggregate only"} if settings(cfg).selection == "unaccounted" else {}

  def metrics(state, record) -> dict:
    agg = state.aggregator_state
    return {"dp_epsilon": float(curve[record["round"]]), "dp_delta": at,
            "dp_noise_multiplier": acc.noise_multiplier, "dp_noise_std": float(agg.noise_std),
            "dp_clip": float(agg.round_clip), "dp_clipped_share": float(agg.clipped_share),
            "dp_aggregated": int(agg.aggregated), **note}

  return metrics


RELATIONS = {"poisson": "add-or-remove-one client, amplified by Poisson sampling with rate q",
             "uniform": "replace-one client, amplified by sampling K of N without replacement",
             "none": "one client added or removed (sensitivity 2S: it may displace another from "
                     "the cohort), no amplification by sampling"}


def summary(cfg: cfglib.JobConfig, groups: dict[str, list[list[dict]]]) -> str:
  """The summary's privacy section: the guarantee stated once, then per run its epsilon."""
  if not private(cfg):
    return ""
  run = run_config(cfg)
  acc = accounting(run)
  what = ("zero-out (replace-special) adjacency, each client in each tree of "
          f"{acc.rounds_per_tree} rounds at most once (tree aggregation, no sampling)"
          if acc.mechanism == "ftrl" else RELATIONS[acc.sampling])
  lines = ["## Differential privacy", "",
           f"User-level ({cfg.parts.aggregator.name}, {acc.accountant.upper()} accountant of "
           f"dp-accounting) for the sequence of global models: {what}."]
  if acc.selection_noise:
    lines.append(f"The selector's statistics are privatized (noise multiplier "
                 f"{acc.selection_noise[0]:g}, clip {settings(cfg).stats_clip:g}) and composed.")
  if settings(cfg).selection == "unaccounted":
    lines.append(f"**Warning: {UNACCOUNTED}.**")
  p = acct.truncation_probability(acc, run.engine.rounds)
  if acc.sampling == "poisson" and acc.accountant == "rdp":
    lines.append(f"Poisson's cap K = {acc.cohort} truncates some round with chance at most "
                 f"{p:.2g}: the guarantee holds at delta + (1 + e^eps) x {p:.2g}.")
  lines += ["", "| run | seeds | noise multiplier | epsilon (final round) | delta |",
            "|---|---|---|---|---|"]
  for name, runs in groups.items():
    last = [recs[-1] for recs in runs if recs and "dp_epsilon" in recs[-1]]
    if last:
      eps = np.array([r["dp_epsilon"] for r in last])
      lines.append(f"| {name} | {len(last)} | {last[0]['dp_noise_multiplier']:.4g} | "
                   f"{eps.max():.4g} | {last[0]['dp_delta']:.3g} |")
  return "\n".join(lines)


def title_note(cfg: cfglib.JobConfig) -> str:
  """What a figure's title adds: the guarantee's scope when the selection is unaccounted."""
  if private(cfg) and settings(cfg).selection == "unaccounted":
    return "DP guarantee: aggregate only"
  return ""
