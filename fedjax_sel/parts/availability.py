"""Client availability S_t: a pure function of (seed, round) (docs/engine.md, 'The round').

Models:
  - `uniform_availability`: exactly n clients drawn uniformly, redrawn every `period` rounds.
  - `probability_availability`: client k available with its own probability p_k, independently.
  - `diurnal_availability`: p_k(t) follows a day cycle with a per-client phase (time zones).
  - `trace_availability`: a recorded trace read from a file (`read_trace`: CSV or JSON).

`Availability.num_available` is the most clients available at once (a static capacity: it sizes
the slots of a filter that trains every available client and the host store's rows); the models
whose count varies draw at most that many, keeping a random subset when more are available. A
round with fewer than K available clients selects and trains those available (its metrics'
`num_available` and `num_selected` say so).

Examples:
  >>> avail = uniform_availability(num_clients=10, num_available=4, period=5)
  >>> int(avail.sample(0, 3).sum()), bool((avail.sample(0, 3) == avail.sample(0, 4)).all())
  (4, True)
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel import keys as keylib
from fedjax_sel import registry
from fedjax_sel.data import fedscale_traces


class Availability(NamedTuple):
  """`sample(seed, round) -> [N] bool`; jit-able in both arguments."""

  sample: Callable[[jax.Array, jax.Array], jax.Array]
  num_available: int


def uniform_availability(num_clients: int, num_available: int, period: int = 5,
                         redraw_first_period: bool = False) -> Availability:
  """n clients drawn uniformly without replacement, redrawn every `period` rounds.

  Args:
    num_clients: N.
    num_available: n, in 1..N.
    period: rounds between redraws (`avail_period`), >= 1.
    redraw_first_period: also redraw every round during the first `period` rounds (FilFL's
      reference mode).
  """
  if not 1 <= num_available <= num_clients:
    raise ValueError(f"num_available must be in 1..{num_clients} (num_clients), "
                     f"got {num_available}")
  if period < 1:
    raise ValueError(f"avail_period must be >= 1, got {period}")

  def sample(seed, round_idx):
    epoch = round_idx // period
    if redraw_first_period:
      epoch = jnp.where(round_idx < period, round_idx, period + epoch)
    u = jax.random.uniform(keylib.round_key(seed, epoch, keylib.AVAILABILITY), (num_clients,))
    chosen = jax.lax.top_k(u, num_available)[1]
    return jnp.zeros((num_clients,), bool).at[chosen].set(True)

  return Availability(sample, num_available)


def _at_most(mask: jax.Array, capacity: int, key: jax.Array) -> jax.Array:
  """`mask` with at most `capacity` clients: a uniform subset of them when it holds more."""
  if capacity >= mask.shape[0]:
    return mask
  u = jnp.where(mask, jax.random.uniform(key, mask.shape), -1.0)
  keep = jax.lax.top_k(u, capacity)[1]
  return jnp.zeros(mask.shape, bool).at[keep].set(True) & mask


def _check_capacity(num_clients: int, capacity: int | None) -> int:
  capacity = num_clients if capacity is None else capacity
  if not 1 <= capacity <= num_clients:
    raise ValueError(f"avail_capacity must be in 1..{num_clients} (num_clients), got {capacity}")
  return capacity


def probability_availability(probabilities, capacity: int | None = None,
                             period: int = 1) -> Availability:
  """Client k is available with probability `probabilities[k]`, independently of the others and
  of earlier draws, redrawn every `period` rounds; at most `capacity` at once (default N).

  Examples:
    >>> avail = probability_availability([0.0, 1.0, 0.5])
    >>> mask = avail.sample(0, 7)
    >>> bool(mask[0]), bool(mask[1])
    (False, True)
  """
  p = np.asarray(probabilities, np.float32)
  if p.ndim != 1 or not p.size or not np.all(np.isfinite(p)) or np.any((p < 0) | (p > 1)):
    raise ValueError(f"availability probabilities must be a non-empty [N] array in [0, 1], got "
                     f"shape {p.shape} with values {p.min() if p.size else None}.."
                     f"{p.max() if p.size else None}")
  if period < 1:
    raise ValueError(f"avail_period must be >= 1, got {period}")
  capacity = _check_capacity(p.shape[0], capacity)

  def sample(seed, round_idx):
    key = keylib.round_key(seed, round_idx // period, keylib.AVAILABILITY)
    draw, cap = jax.random.split(key)
    return _at_most(jax.random.uniform(draw, p.shape) < p, capacity, cap)

  return Availability(sample, capacity)


def diurnal_probability(t, day_rounds: int, mean: float, amplitude: float, phase) -> jax.Array:
  """p_k(t) = clip(mean + amplitude cos(2 pi (t / day_rounds - phase_k)), 0, 1): highest at the
  client's local noon (t / day_rounds = phase_k mod 1)."""
  angle = 2.0 * jnp.pi * (jnp.asarray(t, jnp.float32) / day_rounds - phase)
  return jnp.clip(mean + amplitude * jnp.cos(angle), 0.0, 1.0)


def diurnal_availability(num_clients: int, day_rounds: int = 24, mean: float = 0.5,
                         amplitude: float = 0.4, capacity: int | None = None,
                         phase_seed: int = 0) -> Availability:
  """A day cycle: client k is available in round t with `diurnal_probability` (independently),
  its phase uniform in [0, 1) drawn once from `phase_seed` (clients in different time zones);
  at most `capacity` at once (default N).

  Examples:
    >>> avail = diurnal_availability(100, day_rounds=10, mean=0.5, amplitude=0.5)
    >>> int(avail.sample(0, 3).sum()) > 0
    True
  """
  if day_rounds < 1:
    raise ValueError(f"diurnal_period must be >= 1 rounds, got {day_rounds}")
  for name, value in (("diurnal_mean", mean), ("diurnal_amplitude", amplitude)):
    if not (np.isfinite(value) and 0.0 <= value <= 1.0):
      raise ValueError(f"{name} must be in [0, 1], got {value}")
  capacity = _check_capacity(num_clients, capacity)
  phase = np.random.default_rng([phase_seed, 17]).random(num_clients).astype(np.float32)

  def sample(seed, round_idx):
    key = keylib.round_key(seed, round_idx, keylib.AVAILABILITY)
    draw, cap = jax.random.split(key)
    p = diurnal_probability(round_idx, day_rounds, mean, amplitude, phase)
    return _at_most(jax.random.uniform(draw, (num_clients,)) < p, capacity, cap)

  return Availability(sample, capacity)


def read_trace(path: str, num_clients: int) -> np.ndarray:
  """A recorded availability trace as a `[rounds, N]` bool table.

  Formats (by extension):
    - `.csv`: a header `client,start,end`, then one row per interval: client `client` is
      available in rounds `start <= t < end` (integers).
    - `.json`: `{"rounds": T (optional), "available": {"<client>": [[start, end], ...]}}`.
  The table covers rounds 0..T-1 (T: "rounds", else the largest `end`); a run longer than the
  trace cycles through it.

  Raises:
    ValueError: naming the file (and line), for a malformed file, an unknown client (outside
      0..N-1), an interval that is empty or negative, or a trace in which nobody is ever available.
  """
  intervals = []  # (client, start, end, where)
  rounds = None
  try:
    if path.endswith(".csv"):
      with open(path, encoding="utf-8-sig", newline="") as f:  # A spreadsheet's BOM is fine.
        rows = list(csv.reader(f))
      if not rows or [c.strip() for c in rows[0]] != ["client", "start", "end"]:
        raise ValueError("the first line must be the header client,start,end")
      for i, row in enumerate(rows[1:], start=2):
        if not row:
          continue
        if len(row) != 3:
          raise ValueError(f"line {i}: expected client,start,end, got {row}")
        intervals.append((*(_integer(v, f"line {i}") for v in row), f"line {i}"))
    elif path.endswith(".json"):
      with open(path, encoding="utf-8") as f:
        blob = json.load(f)
      if not isinstance(blob, dict) or not isinstance(blob.get("available"), dict):
        raise ValueError('expected {"available": {"<client>": [[start, end], ...]}}')
      if "rounds" in blob:
        rounds = _integer(blob["rounds"], "rounds")
      for client, spans in blob["available"].items():
        if not isinstance(spans, list):
          raise ValueError(f"client {client}: expected a list of [start, end] pairs")
        for span in spans:
          if not isinstance(span, list) or len(span) != 2:
            raise ValueError(f"client {client}: {span!r} is not a [start, end] pair")
          intervals.append((_integer(client, "a client id"), _integer(span[0], f"client {client}"),
                            _integer(span[1], f"client {client}"), f"client {client}"))
    else:
      raise ValueError("an availability trace must be a .csv or .json file")
  except (OSError, UnicodeDecodeError, json.JSONDecodeError, csv.Error, ValueError) as e:
    raise ValueError(f"{path}: {e}") from e
  for client, start, end, where in intervals:
    if not 0 <= client < num_clients:
      raise ValueError(f"{path}: {where}: client {client} is not one of the {num_clients} "
                       f"clients (0..{num_clients - 1})")
    if not 0 <= start < end:
      raise ValueError(f"{path}: {where}: interval [{start}, {end}) must have 0 <= start < end")
  length = rounds if rounds is not None else max((end for _, _, end, _ in intervals), default=0)
  if length < 1:
    raise ValueError(f"{path}: the trace covers no round")
  table = np.zeros((length, num_clients), bool)
  for client, start, end, _ in intervals:
    table[start:min(end, length), client] = True
  if not table.any():
    raise ValueError(f"{path}: no client is ever available in the trace")
  return table


def _integer(value, where: str) -> int:
  try:
    number = float(value)
  except (TypeError, ValueError):
    raise ValueError(f"{where}: {value!r} is not an integer") from None
  if not np.isfinite(number) or number != int(number):
    raise ValueError(f"{where}: {value!r} is not an integer")
  return int(number)


def trace_availability(table, capacity: int | None = None) -> Availability:
  """Availability from a `[rounds, N]` bool table (`read_trace`), cycling past its end; at most
  `capacity` at once (default: the most the trace has available in one round).

  Examples:
    >>> avail = trace_availability(np.array([[True, False], [False, True]]))
    >>> [avail.sample(0, t).tolist() for t in range(3)]
    [[True, False], [False, True], [True, False]]
  """
  table = np.asarray(table, bool)
  if table.ndim != 2 or not table.size:
    raise ValueError(f"an availability trace must be a [rounds, N] table, got shape {table.shape}")
  most = int(table.sum(axis=1).max())
  capacity = _check_capacity(table.shape[1], most if capacity is None else capacity)
  rows = jnp.asarray(table)

  def sample(seed, round_idx):
    mask = rows[jnp.asarray(round_idx) % rows.shape[0]]
    return _at_most(mask, capacity, keylib.round_key(seed, round_idx, keylib.AVAILABILITY))

  return Availability(sample, capacity)


def load_trace_availability(path: str, num_clients: int,
                            capacity: int | None = None) -> Availability:
  """`trace_availability(read_trace(path, num_clients), capacity)`."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"availability trace {path}: no such file")
  return trace_availability(read_trace(path, num_clients), capacity)


# --- Registered names (fedjax_sel.registry) ------------------------------------------------------
# The probabilities and phases describe the population, so they are drawn with a fixed seed (the
# availability's, not the run's): every run seed of a job sees the same population and shares one
# compiled round.

def _capacity(capacity: int) -> int | None:
  return capacity or None


def _capacity_setting():
  """The setting the probability, diurnal and trace models share (one flag, --avail_capacity)."""
  return registry.setting(0, "Most clients available at once (sizes FilFL's training slots; 0: "
                          "the number of clients, or the trace's largest round).",
                          flag="avail_capacity")


def _period_setting():
  """The setting the uniform and probability models share (one flag, --avail_period)."""
  return registry.setting(5, "Rounds between redraws of the available clients.",
                          flag="avail_period", within=">= 1")


@dataclasses.dataclass(frozen=True)
class UniformSettings:
  """Exactly n clients available, redrawn every period."""

  num_available: int = registry.setting(25, "n, clients available per round (0: all clients).",
                                        flag="num_available")
  period: int = _period_setting()
  redraw_first_period: bool = registry.setting(False, "Redraw availability every round during the "
                                               "first --avail_period rounds (FilFL reference "
                                               "mode).", flag="avail_reference")

  def check(self, context: registry.BuildContext) -> None:
    if not 0 <= self.num_available <= context.num_clients:
      raise registry.SettingError("num_available", f"must be in 0..{context.num_clients} "
                                  f"(--num_clients; 0: all), got {self.num_available}")


@registry.register("availability", "uniform", UniformSettings)
def _uniform(settings: UniformSettings, context: registry.BuildContext) -> Availability:
  """Exactly n clients available, drawn uniformly and redrawn every period."""
  n = context.num_clients
  return uniform_availability(n, settings.num_available or n, settings.period,
                              redraw_first_period=settings.redraw_first_period)


@dataclasses.dataclass(frozen=True)
class ProbabilitySettings:
  """Each client available with its own probability."""

  prob_range: tuple[str, ...] = registry.setting(("0.2", "0.8"), "Each client's availability "
                                                 "probability is drawn uniformly in [low, high] "
                                                 "(within [0, 1]).", flag="avail_prob_range")
  period: int = _period_setting()
  capacity: int = _capacity_setting()

  def bounds(self) -> tuple[float, float]:
    try:
      low, high = (float(v) for v in self.prob_range)
    except ValueError as e:
      raise registry.SettingError("prob_range", f"must be two numbers low,high, got "
                                  f"{','.join(self.prob_range)}") from e
    if not 0.0 <= low <= high <= 1.0:
      raise registry.SettingError("prob_range", f"must satisfy 0 <= low <= high <= 1, got {low}, "
                                  f"{high}")
    return low, high

  def check(self, context: registry.BuildContext) -> None:
    self.bounds()
    _capacity_check(self.capacity, context)


def _capacity_check(capacity: int, context: registry.BuildContext) -> None:
  try:
    _check_capacity(context.num_clients, _capacity(capacity))
  except ValueError as e:
    raise registry.SettingError("capacity", f"is refused: {e}") from e


@registry.register("availability", "probability", ProbabilitySettings)
def _probability(settings: ProbabilitySettings, context: registry.BuildContext) -> Availability:
  """Client k available with its own probability, drawn once in the range."""
  low, high = settings.bounds()
  probs = np.random.default_rng(0).uniform(low, high, context.num_clients)
  return probability_availability(probs, _capacity(settings.capacity), settings.period)


@dataclasses.dataclass(frozen=True)
class DiurnalSettings:
  """A day cycle of availability, each client with its own phase."""

  day_rounds: int = registry.setting(24, "Rounds in one day.", flag="diurnal_period", within=">= 1")
  mean: float = registry.setting(0.5, "Mean availability probability.", flag="diurnal_mean",
                                 within="[0, 1]")
  amplitude: float = registry.setting(0.4, "Swing of the probability over the day (the probability "
                                      "is clipped to [0, 1] at each round).",
                                      flag="diurnal_amplitude", within="[0, 1]")
  capacity: int = _capacity_setting()

  def check(self, context: registry.BuildContext) -> None:
    _capacity_check(self.capacity, context)


@registry.register("availability", "diurnal", DiurnalSettings)
def _diurnal(settings: DiurnalSettings, context: registry.BuildContext) -> Availability:
  """A day cycle of availability probabilities, each client with its own phase."""
  return diurnal_availability(context.num_clients, settings.day_rounds, settings.mean,
                              settings.amplitude, _capacity(settings.capacity))


FEDSCALE = "fedscale:"  # --avail_trace=fedscale:FILE reads FedScale's client behaviour pickle.


@dataclasses.dataclass(frozen=True)
class TraceSettings:
  """A recorded availability trace."""

  path: str | None = registry.setting(None, "A CSV (header client,start,end: client available in "
                                      "rounds start <= t < end) or JSON ({\"available\": "
                                      "{\"<client>\": [[start, end], ...]}, \"rounds\": T}) file, "
                                      "or fedscale:FILE (FedScale's client_behave_trace pickle); "
                                      "cycled past its end.", flag="avail_trace")
  capacity: int = _capacity_setting()
  round_s: float = registry.setting(60.0, "A fedscale:FILE trace's seconds per round (in "
                                    "--mode=async give --avail_window_s the same value).",
                                    flag="avail_trace_round_s")

  def check(self, context: registry.BuildContext) -> None:
    if self.path is None:
      raise registry.SettingError("path", "=FILE is needed: the recorded trace to read")
    if not self.round_s > 0:
      raise registry.SettingError("round_s", f"must be > 0 seconds, got {self.round_s}")
    _capacity_check(self.capacity, context)


@registry.register("availability", "trace", TraceSettings)
def _trace(settings: TraceSettings, context: registry.BuildContext) -> Availability:
  """Clients available as a recorded trace says (cycled past its end)."""
  try:
    if settings.path.startswith(FEDSCALE):
      path = settings.path.removeprefix(FEDSCALE)
      if not os.path.isfile(path):
        raise FileNotFoundError(f"availability trace {path}: no such file")
      table = fedscale_traces.availability_table(path, context.num_clients, settings.round_s)
      return trace_availability(table, _capacity(settings.capacity))
    return load_trace_availability(settings.path, context.num_clients,
                                   _capacity(settings.capacity))
  except (ValueError, FileNotFoundError) as e:
    raise registry.SettingError("path", f"={settings.path}: {e}") from e
