"""System heterogeneity and a simulated clock: how long each client and each round take
(docs/papers/beyond.md).

A `SystemProfile` gives every client a compute speed (training samples per second) and a network
bandwidth (bytes per second, for the model's download and upload). From what a client did in a
round, its time is

  (training samples + evaluated samples / 3 + gradient samples) / speed
    + (downloads + uploads) * model bytes / bandwidth,

an evaluated sample costing a third of a training step (one forward pass of forward and backward)
and a gradient sample one step. A round lasts as long as its slowest client: every client that
downloaded the model (to evaluate statistics for the selector, filter or rule, or to train) or
uploaded one (its local model, or FilFL's candidates on filtering rounds). With a deadline, the
server stops waiting then: a client that trained but finishes later is a straggler, left out of the
aggregate, and the round lasts the deadline. The round's metrics carry `round_time_s`,
`stragglers` and the cumulative `sim_time_s` (in the costs), so time-to-accuracy is a result every
method reports. Not timed: the server's own work (aggregation, FilFL's filter on the public set) and
DivFL's gradient refreshes (a selector-side statistic without a per-client count).

Examples:
  >>> import numpy as np
  >>> clock = Clock(SystemProfile(np.array([100.0, 50.0]), np.array([1e6, 1e6])), model_bytes=1e6)
  >>> client_times(clock, train=np.array([200, 100]), evaluated=np.array([0, 30]),
  ...              gradient=np.array([0, 0]), transfers=np.array([2, 1])).tolist()
  [4.0, 3.200000047683716]
"""

from __future__ import annotations

import csv
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.data import fedscale_traces
from fedjax_sel.parts.types import FORWARD_COST

PROFILE_FIELDS = ("client", "speed", "bandwidth")


class SystemProfile(NamedTuple):
  """Per-client `[N]` compute speed (training samples / s) and bandwidth (bytes / s)."""

  speed: np.ndarray
  bandwidth: np.ndarray


class Clock(NamedTuple):
  """What times a round: the clients' profile, the model's size in bytes (a download or upload),
  and an optional deadline in seconds (None: wait for every client)."""

  profile: SystemProfile
  model_bytes: float
  deadline_s: float | None = None


def check_profile(profile: SystemProfile, num_clients: int, where: str = "system profile") -> None:
  """Both arrays `[N]`, finite and > 0, else ValueError naming `where`."""
  for name in ("speed", "bandwidth"):
    a = np.asarray(getattr(profile, name), np.float64)
    if a.shape != (num_clients,):
      raise ValueError(f"{where}: {name} must have one entry per client ({num_clients}), got "
                       f"shape {a.shape}")
    if not np.all(np.isfinite(a) & (a > 0)):
      k = int(np.flatnonzero(~(np.isfinite(a) & (a > 0)))[0])
      raise ValueError(f"{where}: client {k}'s {name} must be a finite number > 0, got {a[k]}")


def lognormal_profiles(num_clients: int, seed: int = 0, speed_median: float = 100.0,
                       speed_sigma: float = 0.8, bandwidth_median: float = 1e6,
                       bandwidth_sigma: float = 0.8) -> SystemProfile:
  """Speeds and bandwidths drawn log-normally around their medians (device fleets span orders of
  magnitude; FedScale's device traces are heavy-tailed), independently per client, from `seed`.

  Examples:
    >>> p = lognormal_profiles(1000, speed_median=100.0, speed_sigma=0.5)
    >>> 90 < float(np.median(p.speed)) < 110
    True
  """
  for name, value in (("speed_median", speed_median), ("bandwidth_median", bandwidth_median)):
    if not (np.isfinite(value) and value > 0):
      raise ValueError(f"{name} must be a finite number > 0, got {value}")
  for name, value in (("speed_sigma", speed_sigma), ("bandwidth_sigma", bandwidth_sigma)):
    if not (np.isfinite(value) and value >= 0):
      raise ValueError(f"{name} must be a finite number >= 0, got {value}")
  rng = np.random.default_rng([seed, 23])
  return SystemProfile(
      (speed_median * rng.lognormal(0.0, speed_sigma, num_clients)).astype(np.float32),
      (bandwidth_median * rng.lognormal(0.0, bandwidth_sigma, num_clients)).astype(np.float32))


def read_profiles(path: str, num_clients: int) -> SystemProfile:
  """A CSV with the header `client,speed,bandwidth` and one row per client 0..N-1 (speed in
  training samples / s, bandwidth in bytes / s).

  Raises:
    ValueError: naming the file and line: a malformed row, an unknown or repeated client, a
      missing client, a value that is not finite and > 0.
  """
  try:
    with open(path, encoding="utf-8-sig", newline="") as f:  # A spreadsheet's BOM is fine.
      rows = list(csv.reader(f))
  except (OSError, UnicodeDecodeError, csv.Error) as e:
    raise ValueError(f"{path}: not a readable CSV file ({e})") from e
  if not rows or tuple(c.strip() for c in rows[0]) != PROFILE_FIELDS:
    raise ValueError(f"{path}: the first line must be the header {','.join(PROFILE_FIELDS)}")
  speed, bandwidth = np.full(num_clients, np.nan), np.full(num_clients, np.nan)
  seen = np.zeros(num_clients, bool)
  for i, row in enumerate(rows[1:], start=2):
    if not row:
      continue
    try:
      client, s, b = int(row[0]), float(row[1]), float(row[2])
    except (ValueError, IndexError):
      raise ValueError(f"{path}: line {i}: expected client,speed,bandwidth, got {row}") from None
    if not 0 <= client < num_clients or seen[client]:
      raise ValueError(f"{path}: line {i}: client {client} is unknown (0..{num_clients - 1}) or "
                       "listed twice")
    if not (np.isfinite(s) and s > 0 and np.isfinite(b) and b > 0):
      raise ValueError(f"{path}: line {i}: client {client}'s speed {s} and bandwidth {b} must be "
                       "finite and > 0")
    speed[client], bandwidth[client], seen[client] = s, b, True
  if not seen.all():
    raise ValueError(f"{path}: no row for clients {np.flatnonzero(~seen)[:10].tolist()}")
  profile = SystemProfile(speed.astype(np.float32), bandwidth.astype(np.float32))
  check_profile(profile, num_clients, path)
  return profile


def fedscale_profile(path: str, num_clients: int, seed: int = 0) -> SystemProfile:
  """The profile of `num_clients` clients drawn onto FedScale's device capacity file
  (`data/fedscale_traces.py`: its pickle read safely, times as FedScale computes them)."""
  return SystemProfile(*fedscale_traces.device_speeds(path, num_clients, seed))


def client_times(clock: Clock, train, evaluated, gradient, transfers) -> jax.Array:
  """`[N]` seconds each client spends in a round, from its `[N]` training samples, evaluated
  samples, gradient samples and model transfers (downloads plus uploads)."""
  speed = jnp.asarray(clock.profile.speed, jnp.float32)
  bandwidth = jnp.asarray(clock.profile.bandwidth, jnp.float32)
  work = (jnp.asarray(train, jnp.float32) + FORWARD_COST * jnp.asarray(evaluated, jnp.float32)
          + jnp.asarray(gradient, jnp.float32))
  return work / speed + jnp.asarray(transfers, jnp.float32) * clock.model_bytes / bandwidth
