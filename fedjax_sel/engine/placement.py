"""Where the clients' data live and how a round's rows reach the device (docs/scale.md).

`place(spec)` puts a `RunSpec` (`run_spec.py`) in one of two placements, which share one small
interface (`arrays`, `step(state)`, `steps(state, rounds)`, `evaluate(params)`):
- `DevicePlacement`: every client's data on the device for the whole run (the fast default while
  they fit), padded to the run's `Capacity` so that runs of one job share one compiled round.
- `HostPlacement`: pools in host memory or memory-mapped stores (`data/store.py`); each round
  sends the available clients' rows (prepared on a background thread while the previous round
  runs) or only the chosen clients' rows (stats streamed over the population in chunks, the
  round's choice planned from them by the round's own selection code), and evaluation streams
  the population in chunks.
A step checks the parts' contracts (`contracts.check_contracts`) before it returns.

Examples:
  >>> import numpy as np
  >>> from fedjax_sel import DatasetSpec, build_dataset
  >>> data = build_dataset(DatasetSpec("digits", num_clients=4), seed=0)
  >>> arrays = host_arrays(data, np.ones(4, bool), [data.train, data.val, data.test])
  >>> arrays.counts.shape
  (3, 4)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.client.evaluation import ClientMetrics
from fedjax_sel.data import integrity
from fedjax_sel.data.federated import ClientPool, FederatedDataset, device_pool
from fedjax_sel.data.store import capacity, client_chunks, compact
from fedjax_sel.engine import programs
from fedjax_sel.engine.capacity import SPLITS, fits_on_device, padded_pool
from fedjax_sel.engine.contracts import check_contracts
from fedjax_sel.engine.description import keyed, replicated
from fedjax_sel.engine.evaluation import evaluation_key, pooled_metrics
from fedjax_sel.engine.run_spec import RunSpec, on_mesh
from fedjax_sel.engine.signature import Keyed
from fedjax_sel.engine.state import DataArrays, EngineState
from fedjax_sel.engine.training import training_config, training_key

STREAM_CLIENTS = 4096  # Clients per chunk when the host store streams the population through.


def host_arrays(data: FederatedDataset, eval_mask: np.ndarray, pools: Sequence[ClientPool]
                ) -> DataArrays:
  """`DataArrays` (numpy) of `data` with the given split pools."""
  counts = np.stack([np.asarray(p.counts) for p in (data.train, data.val, data.test)])
  return DataArrays(*pools, np.asarray(data.public_x), np.asarray(data.public_y),
                    np.asarray(data.label_hist), counts, np.asarray(eval_mask, bool))


def padded_arrays(spec: RunSpec) -> DataArrays:
  """The run's `DataArrays` in host memory, padded to its capacity (nothing uploaded)."""
  pools = [padded_pool(getattr(spec.data, s), getattr(spec.capacity, s)) for s in SPLITS]
  return host_arrays(spec.data, spec.eval_mask, pools)


def to_device(arrays: DataArrays, sharding=None) -> DataArrays:
  """The arrays on the device (replicated over the mesh when `sharding` is given)."""
  if sharding is not None:
    return jax.device_put(arrays, sharding)
  # `jax.device_put` compiles nothing (`jnp.asarray` would compile a copy per shape and dtype).
  return DataArrays(*(device_pool(a) if isinstance(a, ClientPool) else jax.device_put(np.asarray(a))
                      for a in arrays))


class _Placement:
  """What both placements share: the run, its keyed config and its compiled programs."""

  def __init__(self, spec: RunSpec):
    self.spec = spec
    self.keyed = keyed(spec.config)
    self.evaluation = Keyed(evaluation_key(spec.config), spec.config)  # Shared by alike runs.
    self.replicated = replicated(spec.config)

  def program(self, fn, static_argnums: tuple[int, ...] = ()):
    """The shared compiled `fn` (`programs.py`), outputs replicated over the clients mesh when
    there is one (every process of a multi-host run then holds the whole state and metrics)."""
    return programs.program(fn, self.replicated, static_argnums)

  def preload(self, state: EngineState) -> None:
    """Reads the stored programs of the round from `state` ahead of their first call
    (`programs.Program.preload`); a placement that sends rows each round has none to read."""
    del state

  def step(self, state: EngineState):
    """One round (one compiled call), its contracts checked."""
    state, metrics = self._step(on_mesh(self.spec.config, state))
    check_contracts(self.spec.config, metrics)
    return state, metrics


class DevicePlacement(_Placement):
  """All of a run's data on the device, padded to its capacity: `host` holds them padded in host
  memory, and they are uploaded the first time `arrays` is read (a run advanced in a `RunBatch`
  is uploaded once, with the batch's, never on its own). With `stages` (a synchronous round), a
  step is the round's three programs called one by one (`round.py`): its training is then the
  program of every run that trains alike (`training.training_key`)."""

  def __init__(self, spec: RunSpec, stages: bool = False):
    super().__init__(spec)
    self.host = padded_arrays(spec)
    self.stages = stages and spec.config.asynchrony is None
    self.training = (Keyed(training_key(spec.config), training_config(spec.config))
                     if self.stages else None)

  @functools.cached_property
  def arrays(self) -> DataArrays:
    return to_device(self.host, self.replicated)

  def preload(self, state: EngineState) -> None:
    """The round's program (or its first stage: the others read what it returns) and the
    evaluation, read from the store ahead of their first call."""
    state = on_mesh(self.spec.config, state)
    self.program(programs.plan_stage if self.stages else programs.step).preload(
        self.keyed, state, self.arrays, self.spec.run_values)
    self.program(programs.evaluate).preload(self.evaluation, state.params, self.arrays)

  def _step(self, state: EngineState):
    if not self.stages:
      return self.program(programs.step)(self.keyed, state, self.arrays, self.spec.run_values)
    values, arrays = self.spec.run_values, self.arrays
    plan = self.program(programs.plan_stage)(self.keyed, state, arrays, values)
    trained = self.program(programs.train_stage)(self.training, state.params, arrays.train,
                                                 values.seed, values.prox_mu, state.round,
                                                 plan.cohort.request)
    return self.program(programs.finish_stage)(self.keyed, state, arrays, values, plan, trained)

  def steps(self, state: EngineState, num_rounds: int):
    """`num_rounds` rounds in one compiled call (a `lax.scan`); metrics stacked."""
    state, metrics = self.program(programs.steps, (4,))(
        self.keyed, on_mesh(self.spec.config, state), self.arrays, self.spec.run_values,
        num_rounds)
    check_contracts(self.spec.config, metrics)
    return state, metrics

  def evaluate(self, params) -> dict:
    return self.program(programs.evaluate)(self.evaluation, params, self.arrays)


class HostPlacement(_Placement):
  """Clients' data in host memory or memory-mapped; each round's rows sent to the device.

  Args:
    spec: the run (its `host_rows`: "available", "chosen" or "auto", see `Simulator`).
  """

  def __init__(self, spec: RunSpec):
    super().__init__(spec)
    host_rows = spec.host_rows
    data, cfg = spec.data, spec.config
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
    self._stream_clients = min(spec.num_clients, max(self._chunk_clients, STREAM_CLIENTS))
    self._stream_capacity = {s: capacity(getattr(data, s), self._stream_clients) for s in SPLITS}
    self._prefetcher = ThreadPoolExecutor(max_workers=1)
    self._pending = None
    self.arrays = self._arrays(np.zeros((0,), np.int64))  # Shapes for placeholders.

  def _arrays(self, ids, capacities=None) -> DataArrays:
    """The clients `ids`' rows (in `capacities` rows per split, default the round's)."""
    capacities = capacities or self._capacity
    data = self.spec.data
    pools = [compact(getattr(data, s), ids, capacities[s]) for s in SPLITS]
    for split, pool in zip(SPLITS, pools):  # Refused before anything trains on them.
      integrity.check_rows(pool, f"data.{split} (rows read from the host store)",
                           data.num_classes)
    return to_device(host_arrays(data, self.spec.eval_mask, pools), self.replicated)

  def _round_arrays(self, t: int) -> DataArrays:
    avail = self.program(programs.availability)(self.keyed, self.spec.run_values.seed,
                                                jnp.int32(t))
    return self._arrays(np.flatnonzero(np.asarray(avail)))

  def _step(self, state: EngineState):
    """One round, after this round's rows reach the device (with the next round's rows prepared
    meanwhile, when sending the available clients' rows)."""
    if self.host_rows == "chosen":
      return self._step_chosen_rows(state)
    t = int(state.round)
    pending, self._pending = self._pending, None
    arrays = pending[1].result() if pending is not None and pending[0] == t else (
        self._round_arrays(t))
    out = self.program(programs.step)(self.keyed, state, arrays, self.spec.run_values)
    self._pending = (t + 1, self._prefetcher.submit(self._round_arrays, t + 1))
    return out

  def _step_chosen_rows(self, state: EngineState):
    """Stats streamed over the population in chunks, the round's choice planned from them, then
    only those clients' rows sent to the device."""
    run = self.spec.run_values
    n = self.spec.num_clients
    t = int(state.round)
    stats = {}
    for ids in client_chunks(n, self._stream_clients):
      padded = np.full((self._stream_clients,), n, np.int32)
      padded[:len(ids)] = ids
      chunk = self.program(programs.chunk_stats)(
          self.keyed, state.params, self._arrays(ids, self._stream_capacity), jnp.int32(t),
          run.seed, padded)
      stats = chunk if not stats else jax.tree.map(jnp.add, stats, chunk)
    need = np.asarray(self.program(programs.plan)(self.keyed, state, self.arrays, run, stats))
    new_state, metrics = self.program(programs.step)(
        self.keyed, state, self._arrays(np.flatnonzero(need)), run, stats)
    if np.any(np.asarray(metrics["selected"]) & ~need):
      raise RuntimeError(
          f"round {t}: the selector chose clients its plan did not (it reads client data beyond "
          "its stats, e.g. DivFL's gradients): use host_rows='available' or store='device'")
    return new_state, metrics

  def steps(self, state, num_rounds):
    raise ValueError("steps() runs rounds without the host; with store='host' call step()")

  def evaluate(self, params) -> dict:
    """`evaluate` over the population in chunks of clients: each client's metrics from its
    chunk, pooled as on the device (`evaluation.pooled_metrics`)."""
    data = self.spec.data
    n = self.spec.num_clients
    metrics_fn = self.program(programs.pool_metrics)
    per_split = {}
    for split in ("test", "train") + (("val",) if data.val.y.shape[0] else ()):
      pool = getattr(data, split)
      fields = [np.zeros(n, np.float32) for _ in ClientMetrics._fields]
      for ids in client_chunks(n, self._stream_clients):
        rows = compact(pool, ids, self._stream_capacity[split])
        integrity.check_rows(rows, f"data.{split} (rows read from the host store)",
                             data.num_classes)
        m = metrics_fn(self.evaluation, params, device_pool(rows))
        for field, values in zip(fields, m):
          field[ids] = np.asarray(values)[ids]
      per_split[split] = ClientMetrics(*(jnp.asarray(f) for f in fields))
    config = self.spec.config
    mask = jnp.asarray(self.spec.eval_mask) if config.clean_metrics else None
    out = pooled_metrics(config, per_split, mask)
    if data.public_y.shape[0]:
      out.update(self.program(programs.public)(self.evaluation, params, self.arrays.public_x,
                                               self.arrays.public_y))
    return out


def place(spec: RunSpec, stages: bool = False) -> DevicePlacement | HostPlacement:
  """The run's placement: on the host when its spec keeps the data there, else on the device
  (with `stages`, its round as three programs: `DevicePlacement`)."""
  return HostPlacement(spec) if spec.on_host else DevicePlacement(spec, stages)
