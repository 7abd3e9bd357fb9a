"""Where the clients' data live and how a round's rows reach the device (docs/scale.md).

Two placements share one small interface (`arrays`, `step(state)`, `evaluate(params)`):
- `DevicePlacement`: every client's data on the device for the whole run (the fast default while
  they fit), padded to the job's `Capacity` so that runs of one job share one compiled round.
- `HostPlacement`: pools in host memory or memory-mapped stores (`data/store.py`); each round
  sends the available clients' rows (prepared on a background thread while the previous round
  runs) or only the chosen clients' rows (stats streamed over the population in chunks, the
  round's choice planned from them), and evaluation streams the population in chunks.

Examples:
  >>> import numpy as np
  >>> from fedjax_sel.data.federated import ClientPool
  >>> pool = ClientPool.from_client_arrays([np.ones((3, 2)), np.zeros((1, 2))],
  ...                                      [np.array([0, 1, 0]), np.array([1])])
  >>> padded_pool(pool, 6).x.shape, padded_pool(pool, 6).counts.tolist()
  ((6, 2), [3, 1])
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.client.evaluation import ClientMetrics
from fedjax_sel.data import integrity
from fedjax_sel.data.federated import ClientPool, FederatedDataset, device_pool
from fedjax_sel.data.store import capacity, client_chunks, compact
from fedjax_sel.engine import programs
from fedjax_sel.engine import round as round_lib
from fedjax_sel.engine.round import DataArrays, EngineState

SPLITS = ("train", "val", "test")
STREAM_CLIENTS = 4096  # Clients per chunk when the host store streams the population through.
# Share of device memory the clients' data may take before store="auto" keeps them on the host:
# accelerators need the rest for models and activations; on CPU the device copy sits beside the
# host's.
DEVICE_DATA_SHARE = {"cpu": 0.25, "other": 0.5}


class Capacity(NamedTuple):
  """Static sizes a job's runs share: rows of each split and the largest client's training rows.

  Examples:
    >>> from fedjax_sel import DatasetSpec, build_dataset
    >>> a, b = (build_dataset(DatasetSpec("digits", num_clients=10), seed=s) for s in (0, 1))
    >>> cap = Capacity.of([a, b])
    >>> cap.train >= max(a.train.x.shape[0], b.train.x.shape[0])
    True
  """

  train: int
  val: int
  test: int
  max_count: int

  @staticmethod
  def of(datasets: Sequence[FederatedDataset]) -> Capacity:
    """The smallest capacity that holds every dataset of `datasets`."""
    rows = {s: max(getattr(d, s).x.shape[0] for d in datasets) for s in SPLITS}
    return Capacity(**rows, max_count=max(d.train.max_count for d in datasets))

  def holds(self, data: FederatedDataset) -> bool:
    return (all(getattr(data, s).x.shape[0] <= getattr(self, s) for s in SPLITS)
            and data.train.max_count <= self.max_count)


def padded_pool(pool: ClientPool, rows: int) -> ClientPool:
  """`pool` in `rows` rows: padding rows belong to client N (outside every per-client sum) and no
  client's offset and count reach them, so nothing computed on the pool changes."""
  if pool.x.shape[0] == rows:
    return pool
  return compact(pool, np.arange(pool.num_clients), rows)


def data_bytes(data: FederatedDataset) -> int:
  """Bytes of every client's examples (train, validation and test)."""
  return sum(int(np.prod(p.x.shape)) * p.x.dtype.itemsize + p.y.shape[0] * 4
             for p in (data.train, data.val, data.test))


def fits_on_device(data: FederatedDataset, rows: dict | None = None, buffers: int = 1) -> bool:
  """Whether the data (or `buffers` copies of `rows[split]` rows of each split) fit the first
  device's share of memory (`DEVICE_DATA_SHARE`)."""
  size = data_bytes(data)
  if rows is not None:
    row_bytes = lambda p: int(np.prod(p.x.shape[1:])) * p.x.dtype.itemsize + 12
    size = buffers * sum(rows[s] * row_bytes(getattr(data, s)) for s in SPLITS)
  device = jax.devices()[0]
  if device.platform == "cpu":
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return size <= DEVICE_DATA_SHARE["cpu"] * memory
  memory = (device.memory_stats() or {}).get("bytes_limit", 16 * 2**30)
  return size <= DEVICE_DATA_SHARE["other"] * memory


def host_arrays(data: FederatedDataset, eval_mask: np.ndarray, pools: Sequence[ClientPool]
                ) -> DataArrays:
  """`DataArrays` (numpy) of `data` with the given split pools."""
  counts = np.stack([np.asarray(p.counts) for p in (data.train, data.val, data.test)])
  return DataArrays(*pools, np.asarray(data.public_x), np.asarray(data.public_y),
                    np.asarray(data.label_hist), counts, np.asarray(eval_mask, bool))


def to_device(arrays: DataArrays, sharding=None) -> DataArrays:
  """The arrays on the device (replicated over the mesh when `sharding` is given)."""
  if sharding is not None:
    return jax.device_put(arrays, sharding)
  return DataArrays(*(device_pool(a) if isinstance(a, ClientPool) else jnp.asarray(a)
                      for a in arrays))


class DevicePlacement:
  """All of a run's data on the device, padded to `capacity`: `host` holds them padded in host
  memory, and they are uploaded the first time `arrays` is read (a run advanced in a `RunBatch`
  is uploaded once, with the batch's, never on its own)."""

  def __init__(self, sim, capacity_: Capacity):
    self.sim = sim
    pools = [padded_pool(getattr(sim.data, s), getattr(capacity_, s)) for s in SPLITS]
    self.host = host_arrays(sim.data, sim.eval_mask, pools)

  @functools.cached_property
  def arrays(self) -> DataArrays:
    return to_device(self.host, self.sim.replicated)

  def step(self, state: EngineState):
    sim = self.sim
    return sim.program(programs.step)(sim.keyed, state, self.arrays, sim.run_values)

  def steps(self, state: EngineState, num_rounds: int):
    sim = self.sim
    return sim.program(programs.steps, (4,))(sim.keyed, state, self.arrays, sim.run_values,
                                             num_rounds)

  def evaluate(self, params) -> dict:
    return self.sim.program(programs.evaluate)(self.sim.keyed, params, self.arrays)


class HostPlacement:
  """Clients' data in host memory or memory-mapped; each round's rows sent to the device.

  Args:
    sim: the simulator.
    host_rows: "available", "chosen" or "auto" (see `Simulator`).
  """

  def __init__(self, sim, host_rows: str):
    self.sim = sim
    data, cfg = sim.data, sim.config
    n_avail = cfg.availability.num_available
    available_rows = {s: capacity(getattr(data, s), n_avail) for s in SPLITS}
    if host_rows == "auto":
      host_rows = "available" if fits_on_device(data, available_rows, buffers=2) else "chosen"
    self.host_rows = host_rows
    trains_all = cfg.filter is not None and cfg.filter.trains_available
    slots = max(cfg.k, n_avail if trains_all else 0)
    # Clients per transfer: the capacity of the round's rows is that many clients' worth.
    self._chunk_clients = n_avail if host_rows == "available" else slots
    self._capacity = {s: capacity(getattr(data, s), self._chunk_clients) for s in SPLITS}
    # Clients per chunk when streaming the population (stats, evaluation): fewer dispatches.
    self._stream_clients = min(sim.num_clients, max(self._chunk_clients, STREAM_CLIENTS))
    self._stream_capacity = {s: capacity(getattr(data, s), self._stream_clients) for s in SPLITS}
    self._prefetcher = ThreadPoolExecutor(max_workers=1)
    self._pending = None
    self.arrays = self._arrays(np.zeros((0,), np.int64))  # Shapes for placeholders.

  def _arrays(self, ids, capacities=None) -> DataArrays:
    """The clients `ids`' rows (in `capacities` rows per split, default the round's)."""
    capacities = capacities or self._capacity
    data = self.sim.data
    pools = [compact(getattr(data, s), ids, capacities[s]) for s in SPLITS]
    for split, pool in zip(SPLITS, pools):  # Refused before anything trains on them.
      integrity.check_rows(pool, f"data.{split} (rows read from the host store)",
                           data.num_classes)
    return to_device(host_arrays(data, self.sim.eval_mask, pools), self.sim.replicated)

  def _round_arrays(self, t: int) -> DataArrays:
    sim = self.sim
    avail = sim.program(programs.availability)(sim.keyed, sim.run_values.seed, jnp.int32(t))
    return self._arrays(np.flatnonzero(np.asarray(avail)))

  def step(self, state: EngineState):
    """One round, after this round's rows reach the device (with the next round's rows prepared
    meanwhile, when sending the available clients' rows)."""
    if self.host_rows == "chosen":
      return self._step_chosen_rows(state)
    sim = self.sim
    t = int(state.round)
    pending, self._pending = self._pending, None
    arrays = pending[1].result() if pending is not None and pending[0] == t else (
        self._round_arrays(t))
    out = sim.program(programs.step)(sim.keyed, state, arrays, sim.run_values)
    self._pending = (t + 1, self._prefetcher.submit(self._round_arrays, t + 1))
    return out

  def _step_chosen_rows(self, state: EngineState):
    """Stats streamed over the population in chunks, the round's choice planned from them, then
    only those clients' rows sent to the device."""
    sim = self.sim
    n = sim.num_clients
    t = int(state.round)
    stats = {}
    for ids in client_chunks(n, self._stream_clients):
      padded = np.full((self._stream_clients,), n, np.int32)
      padded[:len(ids)] = ids
      chunk = sim.program(programs.chunk_stats)(
          sim.keyed, state.params, self._arrays(ids, self._stream_capacity), jnp.int32(t),
          sim.run_values.seed, padded)
      stats = chunk if not stats else jax.tree.map(jnp.add, stats, chunk)
    need = np.asarray(sim.program(programs.plan)(sim.keyed, state, self.arrays, sim.run_values,
                                                 stats))
    new_state, metrics = sim.program(programs.step)(
        sim.keyed, state, self._arrays(np.flatnonzero(need)), sim.run_values, stats)
    if np.any(np.asarray(metrics["selected"]) & ~need):
      raise RuntimeError(
          f"round {t}: the selector chose clients its plan did not (it reads client data beyond "
          "its stats, e.g. DivFL's gradients): use host_rows='available' or store='device'")
    return new_state, metrics

  def steps(self, state, num_rounds):
    raise ValueError("steps() runs rounds without the host; with store='host' call step()")

  def evaluate(self, params) -> dict:
    """`evaluate` over the population in chunks of clients: each client's metrics from its
    chunk, pooled as on the device (`round.pooled_metrics`)."""
    sim = self.sim
    n = sim.num_clients
    metrics_fn = sim.program(programs.pool_metrics)
    per_split = {}
    for split in ("test", "train"):
      pool = getattr(sim.data, split)
      fields = [np.zeros(n, np.float32) for _ in ClientMetrics._fields]
      for ids in client_chunks(n, self._stream_clients):
        rows = compact(pool, ids, self._stream_capacity[split])
        integrity.check_rows(rows, f"data.{split} (rows read from the host store)",
                             sim.data.num_classes)
        m = metrics_fn(sim.keyed, params, device_pool(rows))
        for field, values in zip(fields, m):
          field[ids] = np.asarray(values)[ids]
      per_split[split] = ClientMetrics(*(jnp.asarray(f) for f in fields))
    mask = jnp.asarray(sim.eval_mask) if sim.config.clean_metrics else None
    out = round_lib.pooled_metrics(sim.config, per_split, mask)
    if sim.data.public_y.shape[0]:
      out.update(sim.program(programs.public)(sim.keyed, params, self.arrays.public_x,
                                              self.arrays.public_y))
    return out
