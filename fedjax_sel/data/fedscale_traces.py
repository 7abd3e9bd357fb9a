"""FedScale's device traces, read as FedScale publishes them: the device capacity file as a system
profile for the clock, the client behaviour trace as an availability trace.

Both are Python pickles in FedScale's repository (`benchmark/dataset/data/device_info/`):

- `client_device_capacity`: `{device id: {"computation": ms, "communication": kbit/s}}`, 500,000
  devices (AI Benchmark's inference latency per sample, MobiPerf's bandwidth). FedScale times a
  client's round as `3 * samples * computation / 1000` seconds of compute (a training step is
  three inferences) plus `2 * model kbit / communication` of transfers, a kbit being 1024 bits.
  As our clock's `SystemProfile`: speed = 1000 / (3 * computation) training samples per second,
  bandwidth = communication * 1024 / 8 bytes per second, so the clock gives FedScale's times.
- `client_behave_trace`: `{client id: {"active": [s, ...], "inactive": [s, ...], "finish_time": s,
  ...}}` (136k users of an input-method app over a week; a device is available while charging):
  session j runs from `active[j]` to `inactive[j]` seconds, the trace repeating every
  `finish_time` seconds. As our availability table, round r is the time `r * round_s`: a client is
  available when that time (modulo its `finish_time`) lies in one of its sessions, ends included.
  FedScale's own check walks the sessions with a cursor moved one session per query; the
  interval test here answers the same for times asked in order without skips, and is stateless.

Pickles can run code when loaded: these are read with an unpickler that admits only plain
containers and numbers (dicts, lists, tuples, strings, ints, floats, booleans, None) and refuses
anything else, naming the class the file asks for. A file carrying NumPy scalars is refused;
docs/data.md gives a one-line conversion of a trusted file to plain values.

Clients map onto devices and users by a seeded draw without replacement (with replacement when
the trace has fewer entries than clients); FedScale itself maps client k to entry k modulo the
trace's size.

Examples:
  >>> import io, pickle
  >>> safe_loads(pickle.dumps({1: {"computation": 20.0, "communication": 8000.0}}), "f")
  {1: {'computation': 20.0, 'communication': 8000.0}}
"""

from __future__ import annotations

import io
import math
import os
import pickle

import numpy as np

CAPACITY_KEYS = ("computation", "communication")
BEHAVIOUR_KEYS = ("active", "inactive", "finish_time")


class _PlainUnpickler(pickle.Unpickler):
  """Plain containers and numbers only: every class or function a pickle names is refused."""

  def __init__(self, file, where: str):
    super().__init__(file)
    self.where = where

  def find_class(self, module, name):
    raise ValueError(f"{self.where}: the pickle holds a {module}.{name} object; only plain "
                     "containers and numbers are read (docs/data.md says how to convert "
                     "a trusted file)")


def safe_loads(data: bytes, where: str):
  """Unpickles `data` admitting only plain containers and numbers (ValueError naming `where`)."""
  try:
    return _PlainUnpickler(io.BytesIO(data), where).load()
  except (pickle.UnpicklingError, EOFError, TypeError, AttributeError) as e:
    raise ValueError(f"{where}: not a readable pickle ({e})") from e


def _load(path: str):
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise ValueError(f"{path}: cannot read it ({e})") from e
  value = safe_loads(data, path)
  if not isinstance(value, dict) or not value:
    raise ValueError(f"{path}: expected a non-empty dict of device or client ids, got "
                     f"{type(value).__name__}")
  return value


def _number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_capacity(path: str) -> dict:
  """`{device id: (computation ms, communication kbit/s)}`, each finite and > 0."""
  out = {}
  for device, entry in _load(path).items():
    if not isinstance(entry, dict) or any(k not in entry for k in CAPACITY_KEYS):
      raise ValueError(f"{path}: device {device!r}: expected a dict with {CAPACITY_KEYS}, got "
                       f"{entry!r:.80}")
    values = tuple(entry[k] for k in CAPACITY_KEYS)
    if not all(_number(v) and v > 0 for v in values):
      raise ValueError(f"{path}: device {device!r}: computation and communication must be "
                       f"numbers > 0, got {values}")
    out[device] = values
  return out


def read_behaviour(path: str) -> dict:
  """`{client id: (active [s], inactive [s], finish_time s)}`, checked: as many starts as ends,
  each session `0 <= active <= inactive`, in order, and `finish_time > 0`."""
  out = {}
  for client, entry in _load(path).items():
    if not isinstance(entry, dict) or any(k not in entry for k in BEHAVIOUR_KEYS):
      raise ValueError(f"{path}: client {client!r}: expected a dict with {BEHAVIOUR_KEYS}")
    active, inactive, finish = (entry[k] for k in BEHAVIOUR_KEYS)
    if (not isinstance(active, list) or not isinstance(inactive, list)
        or len(active) != len(inactive) or not active
        or not all(_number(v) for v in active + inactive)):
      raise ValueError(f"{path}: client {client!r}: active and inactive must be lists of as many "
                       "numbers (session starts and ends)")
    a, b = np.asarray(active, np.float64), np.asarray(inactive, np.float64)
    if (a < 0).any() or (b < a).any() or (np.diff(a) < 0).any():
      raise ValueError(f"{path}: client {client!r}: sessions must satisfy 0 <= active <= "
                       "inactive, in increasing order")
    if not (_number(finish) and finish > 0):
      raise ValueError(f"{path}: client {client!r}: finish_time must be a number > 0, got "
                       f"{finish!r}")
    out[client] = (a, b, float(finish))
  return out


def assign(num_entries: int, num_clients: int, seed: int) -> np.ndarray:
  """`[N]` positions of the trace entries our clients take: a seeded draw without replacement
  (with replacement when the trace has fewer entries than clients)."""
  rng = np.random.default_rng([seed, 29])
  return rng.choice(num_entries, num_clients, replace=num_entries < num_clients)


def device_speeds(path: str, num_clients: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """`[N]` speeds (training samples / s) and bandwidths (bytes / s) of `num_clients` clients drawn
  onto the capacity file's devices: speed = 1000 / (3 computation), bandwidth = communication *
  128 (`client.system.fedscale_profile` makes them the clock's profile)."""
  devices = list(read_capacity(path).values())
  picked = np.array([devices[i] for i in assign(len(devices), num_clients, seed)], np.float64)
  return ((1000.0 / (3.0 * picked[:, 0])).astype(np.float32),
          (picked[:, 1] * 1024.0 / 8.0).astype(np.float32))


def availability_table(path: str, num_clients: int, round_s: float, seed: int = 0,
                       rounds: int | None = None) -> np.ndarray:
  """`[rounds, N]` bool: client k available in round r when `r * round_s` (modulo its
  finish_time) lies in one of its sessions; `rounds` defaults to the longest finish_time's."""
  if not round_s > 0:
    raise ValueError(f"round_s must be > 0 seconds, got {round_s}")
  users = list(read_behaviour(path).values())
  picked = [users[i] for i in assign(len(users), num_clients, seed)]
  if rounds is None:
    rounds = max(1, math.ceil(max(u[2] for u in picked) / round_s))
  # The table, and per client its rounds' times and one comparison per session, before any is made.
  need = rounds * (num_clients + 8 + 2 * max(len(u[0]) for u in picked))
  memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  if need > memory // 2:
    raise ValueError(f"{path}: the availability table of rounds of {round_s} s is {rounds} rounds "
                     f"x {num_clients} clients (its longest cycle, {max(u[2] for u in picked):.4g} "
                     f"s), about {need / 2**30:.4g} GiB to build, more than half of this "
                     f"machine's {memory / 2**30:.4g} GiB: use longer rounds "
                     f"(--avail_trace_round_s) or fewer clients")
  times = np.arange(rounds, dtype=np.float64) * round_s
  table = np.zeros((rounds, num_clients), bool)
  for k, (active, inactive, finish) in enumerate(picked):
    t = np.mod(times, finish)[:, None]
    table[:, k] = ((active[None] <= t) & (t <= inactive[None])).any(axis=1)
  if not table.any():
    raise ValueError(f"{path}: none of the {num_clients} clients drawn is ever available at "
                     f"rounds of {round_s} s")
  return table
