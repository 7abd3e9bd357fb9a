"""The round engine (SPEC section 0): one jit-compiled call per round.

A `Simulator` holds the static pieces (model, data, optimizer, components); its `step(state)` runs
one round as a single compiled function of an `EngineState` pytree. Nothing in a round returns to
the host; the client axis of local training is sharded over all local devices when there are
several.

Example:
  >>> import optax
  >>> from fedjax_sel import (DatasetSpec, build_dataset, build_model, fedavg, random_selector,
  ...                         uniform_availability)
  >>> data = build_dataset(DatasetSpec("digits", num_clients=20), seed=0)
  >>> model = build_model("logreg", data.feature_shape, data.num_classes)
  >>> sim = Simulator(model, data, lambda lr: optax.sgd(lr), LocalHParams(batch_size=10),
  ...                 uniform_availability(20, 10), random_selector(5), fedavg(), 5, seed=0)
  >>> state, metrics = sim.step(sim.init())
  >>> int(state.round), int(metrics["num_trained"])
  (1, 5)
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_sel import keys as keylib
from fedjax_sel.availability import Availability
from fedjax_sel.components import (SPLIT_STATS, STAT_NAMES, AggregateInputs, Aggregator,
                                   ClientState, Filter, Participation, RoundInputs, RoundOutcome,
                                   Selector, everyone)
from fedjax_sel.data.federated import (ClientPool, FederatedDataset, device_pool,
                                       rows_with_replacement)
from fedjax_sel.data.store import capacity, client_chunks, compact
from fedjax_sel.evaluation import client_gradients, client_metrics
from fedjax_sel.local_training import (LocalHParams, LocalResult, OptimizerFactory,
                                       auto_chunk_size, default_memory_budget, local_train,
                                       step_cost)
from fedjax_sel.models.bundle import Model, example_metrics, per_example_loss


class Costs(NamedTuple):
  """Cumulative cost counters (SPEC section 0).

  Attributes:
    client_eval_samples: samples evaluated by clients (forward passes for selection / rules).
    client_grad_samples: samples whose loss gradient clients computed for selection (a forward and
      a backward pass each: gradient norms, DivFL proxies).
    train_samples: training samples processed by clients.
    uploads: models uploaded to the server.
    downloads: models downloaded by clients.
    server_public_samples: samples of the public set evaluated by the server (filtering).
  """

  client_eval_samples: jax.Array
  client_grad_samples: jax.Array
  train_samples: jax.Array
  uploads: jax.Array
  downloads: jax.Array
  server_public_samples: jax.Array

  @staticmethod
  def zeros() -> "Costs":
    return Costs(*(jnp.zeros((), jnp.float32) for _ in range(6)))


class EngineState(NamedTuple):
  """Everything a run carries from round to round (a pytree: checkpoint it to resume)."""

  round: jax.Array
  params: Any
  clients: ClientState
  filter_state: Any
  selector_state: Any
  participation_state: Any
  aggregator_state: Any
  filtered: jax.Array
  prev_available: jax.Array
  costs: Costs


class DataArrays(NamedTuple):
  """Device copies of the dataset passed to the compiled round as arguments."""

  train: ClientPool
  val: ClientPool
  test: ClientPool
  public_x: jax.Array
  public_y: jax.Array
  label_hist: jax.Array
  counts: jax.Array  # [3, N] every client's train / validation / test example counts.


def constant_lr(lr: float) -> Callable[[jax.Array], jax.Array]:
  return lambda t: jnp.asarray(lr, jnp.float32)


def step_decay_lr(lr: float, decay: float, every: int) -> Callable[[jax.Array], jax.Array]:
  """lr * decay ** (t // every), e.g. FilFL's x0.998 every 10 rounds."""
  return lambda t: jnp.asarray(lr, jnp.float32) * jnp.power(decay, (t // every).astype(jnp.float32))


class _Picked(NamedTuple):
  """What the filter / select / train part of a round produced (both `lax.cond` branches)."""

  fmask: jax.Array
  filter_state: Any
  info: dict
  chosen: jax.Array
  selector_state: Any
  train_mask: jax.Array
  aggregate_mask: jax.Array
  participation_state: Any
  slots: jax.Array
  valid: jax.Array
  result: LocalResult
  train_samples: jax.Array
  uploads: jax.Array
  downloads: jax.Array


NONFINITE = ("stop", "exclude")
STORES = ("device", "host", "auto")
HOST_ROWS = ("auto", "available", "chosen")
STREAM_CLIENTS = 4096  # Clients per chunk when the host store streams the population through.
# Share of device memory the clients' data may take before store="auto" keeps them on the host:
# accelerators need the rest for models and activations; on CPU the device copy sits beside the
# host's.
DEVICE_DATA_SHARE = {"cpu": 0.25, "other": 0.5}


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
    size = buffers * sum(rows[s] * row_bytes(getattr(data, s)) for s in ("train", "val", "test"))
  device = jax.devices()[0]
  if device.platform == "cpu":
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return size <= DEVICE_DATA_SHARE["cpu"] * memory
  memory = (device.memory_stats() or {}).get("bytes_limit", 16 * 2**30)
  return size <= DEVICE_DATA_SHARE["other"] * memory


def _check_arguments(data, optimizer, local, availability, seed, eval_mask) -> None:
  """Named errors for arguments of the wrong kind or size, before anything compiles."""
  n = data.num_clients
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
    raise TypeError(f"seed must be an integer, got {seed!r}")
  if isinstance(optimizer, optax.GradientTransformation) or not callable(optimizer):
    raise TypeError("optimizer must be a factory: learning rate -> optax transformation (e.g. "
                    f"`lambda lr: optax.sgd(lr)`), got {type(optimizer).__name__}")
  if local.num_steps is None and local.num_epochs < 1:
    raise ValueError(f"num_epochs must be >= 1, got {local.num_epochs}")
  if local.num_steps is not None and local.num_steps < 1:
    raise ValueError(f"num_steps must be >= 1 (or None for epochs), got {local.num_steps}")
  shape = jax.eval_shape(lambda: availability.sample(0, jnp.int32(0))).shape
  if shape != (n,):
    raise ValueError(f"availability samples masks of shape {shape}, the dataset has {n} clients")
  if eval_mask is not None and np.shape(eval_mask) != (n,):
    raise ValueError(f"eval_mask must have one entry per client ({n}), got shape "
                     f"{np.shape(eval_mask)}")


def _check_split_stats(data, needs) -> None:
  """A stat over a client's validation or test split needs every client to hold one: a client
  with none would read loss 0 and pass any threshold unseen."""
  for split in ("val", "test"):
    read = sorted(needs & SPLIT_STATS[split])
    empty = int(np.sum(np.asarray(getattr(data, split).counts) == 0)) if read else 0
    if empty:
      raise ValueError(f"{', '.join(read)} is read by the filter, selector or participation rule, "
                       f"but {empty} of {data.num_clients} clients hold no {split} data (their "
                       f"{read[0]} would be 0); give every client a {split} split")


def _finite_slots(res: LocalResult) -> jax.Array:
  """`[K]` bool: the slot's local model and training loss are all finite."""
  ok = jnp.isfinite(res.train_loss)
  for leaf in jax.tree.leaves(res.params):
    ok &= jnp.all(jnp.isfinite(leaf.reshape(leaf.shape[0], -1)), axis=1)
  return ok


def _without_nonfinite(res: LocalResult, global_params) -> tuple[jax.Array, LocalResult]:
  """(`[K]` finite mask, `res` with each non-finite slot's model replaced by the global model), so
  that no later average, median or distance sees a NaN; the slot's loss becomes NaN, which keeps
  it marked non-finite when the slots are gathered again."""
  finite = _finite_slots(res)
  params = jax.tree.map(
      lambda p, g: jnp.where(finite.reshape(-1, *([1] * g.ndim)), p, g[None]), res.params,
      global_params)
  return finite, res._replace(params=params, train_loss=jnp.where(finite, res.train_loss, jnp.nan))


def _nonzero_slots(mask: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
  slots = jnp.nonzero(mask, size=size, fill_value=0)[0].astype(jnp.int32)
  return slots, jnp.arange(size) < jnp.sum(mask)


class Simulator:
  """A federated simulation with pluggable availability, filter, selector, rule and aggregator.

  Args:
    model: the model bundle.
    data: the federated dataset.
    optimizer: learning rate -> optax client optimizer.
    local: static local-training settings.
    availability: S_t sampler.
    selector: picks A_t from the filtered-in set.
    aggregator: combines the trained models.
    clients_per_round: K, the number of training slots.
    seed: run seed; every key derives from (seed, round, purpose, client id).
    filter: optional filter of the available set (FilFL).
    participation: optional client-side rule (FedALIGN, FedSRC); default: everyone selected trains.
    lr_schedule: round -> client learning rate.
    eval_batch_size: batch of the vectorized evaluations.
    init_params: optional initial global model (default: `model.init` from the seed).
    eval_mask: optional `[N]` bool; `evaluate` then also reports `clean_{train,test}_loss` /
      `clean_{train,test}_accuracy` over these clients' training and test data (e.g. the
      non-corrupted ones, or FedALIGN's priority clients).
    store: where the clients' data live: "device" (all of it, the fast default when it fits),
      "host" (host memory or a memory-mapped store, `data/store.py`), or "auto" (host when the
      data exceed `DEVICE_DATA_SHARE` of the device's memory). Evaluation then streams the
      population through the device in chunks.
    host_rows: with store="host", which rows reach the device each round: "available" (the
      round's available clients', prepared on a background thread while the previous round
      runs; per-client stats and gradients exist for them only, which is all that masked
      selection and the rules read; DivFL's first-round table covers only them), "chosen" (stats
      streamed over all N clients in chunks, the round's choice planned from them, then only the
      chosen clients' rows; a selector that reads client data beyond its stats, like DivFL, is
      refused when it chooses unplanned clients), or "auto" ("available" when two rounds of
      available rows fit the device's share, else "chosen").
    nonfinite: "stop" (default: a non-finite model or loss reaches the metrics, and `run` stops
      there) or "exclude" (a client whose local model or loss is not finite is left out of the
      aggregate and of FilFL's candidates, and counted in the `nonfinite_clients` metric: what a
      real server does with a diverged upload).
  """

  def __init__(self, model: Model, data: FederatedDataset, optimizer: OptimizerFactory,
               local: LocalHParams, availability: Availability, selector: Selector,
               aggregator: Aggregator, clients_per_round: int, seed: int,
               filter: Filter | None = None,  # pylint: disable=redefined-builtin
               participation: Participation | None = None,
               lr_schedule: Callable[[jax.Array], jax.Array] | None = None,
               eval_batch_size: int = 512, init_params: Any = None, eval_mask=None,
               nonfinite: str = "stop", store: str = "device", host_rows: str = "auto"):
    n = data.num_clients
    if store not in STORES:
      raise ValueError(f"store must be one of {STORES}, got {store!r}")
    if host_rows not in HOST_ROWS:
      raise ValueError(f"host_rows must be one of {HOST_ROWS}, got {host_rows!r}")
    if nonfinite not in NONFINITE:
      raise ValueError(f"nonfinite must be one of {NONFINITE}, got {nonfinite!r}")
    self.exclude_nonfinite = nonfinite == "exclude"
    _check_arguments(data, optimizer, local, availability, seed, eval_mask)
    if not 1 <= clients_per_round <= availability.num_available:
      raise ValueError(f"clients_per_round (K) must be in 1..{availability.num_available} "
                       f"(clients available per round), got {clients_per_round}")
    if local.batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {local.batch_size}")
    self.model, self.data, self.optimizer, self.local = model, data, optimizer, local
    self.availability, self.selector, self.aggregator = availability, selector, aggregator
    self.filter = filter
    self.participation = participation or everyone()
    self.k = clients_per_round
    self.seed = seed
    self.num_clients = n
    self.lr_schedule = lr_schedule or constant_lr(0.1)
    self.eval_batch_size = eval_batch_size
    self.max_count = data.train.max_count
    self.init_params = init_params
    self.eval_mask = None if eval_mask is None else jnp.asarray(eval_mask, bool)
    needs = set(selector.needs) | set(self.participation.needs)
    if filter is not None:
      needs |= set(filter.needs)
    unknown = needs - set(STAT_NAMES)
    if unknown:
      raise ValueError(f"unknown stats {sorted(unknown)}; accepted: {STAT_NAMES}")
    self.needs = tuple(sorted(needs))
    _check_split_stats(data, needs)
    self.mesh = None
    self.client_sharding = None
    if jax.device_count() > 1:
      self.mesh = jax.make_mesh((jax.device_count(),), ("clients",),
                                axis_types=(jax.sharding.AxisType.Auto,))
      self.client_sharding = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec("clients"))
      self._replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
    if local.chunk_size is None:
      cost = step_cost(model, optimizer, local, model.init(jax.random.PRNGKey(0)),
                       data.feature_shape)
      slots = max(clients_per_round, availability.num_available)
      budget = local.memory_budget_bytes or default_memory_budget()
      self.local = local._replace(chunk_size=auto_chunk_size(cost, budget, slots))
    # Stream a linear aggregate out of local training when nothing needs the K local models.
    self.stream = (aggregator.linear_weights is not None and not selector.reads_local_models
                   and not self.exclude_nonfinite
                   and not self.participation.reads_local_models
                   and (filter is None or not filter.trains_available))
    self.on_host = store == "host" or (store == "auto" and not fits_on_device(data))
    self.host_rows = None
    if self.on_host:
      available_rows = {split: capacity(getattr(data, split), availability.num_available)
                        for split in ("train", "val", "test")}
      self.host_rows = host_rows
      if host_rows == "auto":
        self.host_rows = "available" if fits_on_device(data, available_rows, buffers=2) else (
            "chosen")
      trains_all = filter is not None and filter.trains_available
      self._slots = max(clients_per_round, availability.num_available if trains_all else 0)
      # Clients per transfer: the capacity of the round's rows is that many clients' worth.
      self._chunk_clients = (availability.num_available if self.host_rows == "available"
                             else self._slots)
      self._capacity = {split: capacity(getattr(data, split), self._chunk_clients)
                        for split in ("train", "val", "test")}
      # Clients per chunk when streaming the population (stats, evaluation): fewer dispatches.
      self._stream_clients = min(n, max(self._chunk_clients, STREAM_CLIENTS))
      self._stream_capacity = {split: capacity(getattr(data, split), self._stream_clients)
                               for split in ("train", "val", "test")}
      self._chunk_stats = self._jit(lambda p, a, t, ids: self._stats(p, a, t, ids))
      self._plan_fn = self._jit(self._plan)
      self._avail_host = self._jit(lambda t: availability.sample(seed, t))
      self._prefetcher = ThreadPoolExecutor(max_workers=1)
      self._pending = None
      self._metrics_fn = self._jit(lambda p, pool: client_metrics(model, p, pool,
                                                                self.eval_batch_size))
    self.arrays = self._device_arrays()
    self._step = self._jit(self._round)
    self._steps = self._jit(self._rounds, static_argnums=2)
    self._evaluate = self._jit(self._evaluate_impl)
    self._evaluate_public = self._jit(self._public_metrics)

  def _jit(self, fn, **kw):
    """`jax.jit` whose outputs are replicated over the clients mesh, when there is one: every
    process of a multi-host run then holds the whole state and metrics (and reads them)."""
    if self.mesh is None:
      return jax.jit(fn, **kw)
    return jax.jit(fn, out_shardings=self._replicated, **kw)

  def _global(self, tree):
    """`tree` placed on every device of the mesh (the same values in every process)."""
    return tree if self.mesh is None else jax.device_put(tree, self._replicated)

  def _device_arrays(self, ids=None, capacities=None) -> DataArrays:
    """The data the compiled round reads: every client's, or in host mode the clients `ids`'
    (in `capacities` rows per split, default the round's)."""
    d = self.data
    if self.on_host:
      if ids is None:  # Shapes only, for the first compile's placeholders.
        ids = np.zeros((0,), np.int64)
      capacities = capacities or self._capacity
      pools = [device_pool(compact(getattr(d, split), ids, capacities[split]))
               for split in ("train", "val", "test")]
    else:
      pools = [device_pool(d.train), device_pool(d.val), device_pool(d.test)]
    counts = np.stack([np.asarray(p.counts) for p in (d.train, d.val, d.test)])
    arrays = DataArrays(*pools, jnp.asarray(d.public_x), jnp.asarray(d.public_y),
                        jnp.asarray(d.label_hist), jnp.asarray(counts))
    return self._global(arrays)

  # ---------------------------------------------------------------------------------------------
  def init(self) -> EngineState:
    """The state before round 0."""
    params = self.init_params
    if params is None:
      params = self.model.init(keylib.round_key(self.seed, 0, keylib.INIT))
    n = self.num_clients
    state = EngineState(
        round=jnp.zeros((), jnp.int32), params=params, clients=ClientState.create(n),
        filter_state=self.filter.init(n) if self.filter is not None else (),
        selector_state=self.selector.init(n, params), participation_state=self.participation.init(n),
        aggregator_state=self.aggregator.init(params), filtered=jnp.zeros((n,), bool),
        prev_available=jnp.zeros((n,), bool), costs=Costs.zeros())
    return self._global(state)

  def step(self, state: EngineState) -> tuple[EngineState, dict]:
    """Runs one round (one compiled call; in host mode, after this round's available clients'
    rows reach the device, and with the next round's rows prepared meanwhile)."""
    state = self._global(state)
    if not self.on_host:
      return self._step(state, self.arrays)
    if self.host_rows == "chosen":
      return self._step_chosen_rows(state)
    t = int(state.round)
    pending, self._pending = self._pending, None
    arrays = pending[1].result() if pending is not None and pending[0] == t else (
        self._round_arrays(t))
    out = self._step(state, arrays)
    self._pending = (t + 1, self._prefetcher.submit(self._round_arrays, t + 1))
    return out

  def _step_chosen_rows(self, state: EngineState) -> tuple[EngineState, dict]:
    """Host store, rows of the chosen clients only: stats streamed over the population in chunks,
    the round's choice planned from them, then only those clients' rows sent to the device."""
    t = int(state.round)
    stats = {}
    for ids in client_chunks(self.num_clients, self._stream_clients):
      padded = np.full((self._stream_clients,), self.num_clients, np.int32)
      padded[:len(ids)] = ids
      chunk = self._chunk_stats(state.params, self._device_arrays(ids, self._stream_capacity),
                                jnp.int32(t), padded)
      stats = chunk if not stats else jax.tree.map(jnp.add, stats, chunk)
    need = np.asarray(self._plan_fn(state, self.arrays, stats))
    new_state, metrics = self._step(state, self._device_arrays(np.flatnonzero(need)), stats)
    if np.any(np.asarray(metrics["selected"]) & ~need):
      raise RuntimeError(
          f"round {t}: the selector chose clients its plan did not (it reads client data beyond "
          "its stats, e.g. DivFL's gradients): use host_rows='available' or store='device'")
    return new_state, metrics

  def _round_arrays(self, t: int) -> DataArrays:
    ids = np.flatnonzero(np.asarray(self._avail_host(jnp.int32(t))))
    return self._device_arrays(ids)

  def steps(self, state: EngineState, num_rounds: int) -> tuple[EngineState, dict]:
    """Runs `num_rounds` rounds in one compiled call (a `lax.scan` over rounds); the metrics come
    back stacked with a leading `[num_rounds]` axis. Use it when nothing needs the host between
    rounds: for small models it removes the per-round dispatch."""
    if self.on_host:
      raise ValueError("steps() runs rounds without the host; with store='host' call step()")
    return self._steps(self._global(state), self.arrays, num_rounds)

  def _rounds(self, state, arrays, num_rounds):
    return jax.lax.scan(lambda s, _: self._round(s, arrays), state, None, length=num_rounds)

  def evaluate(self, params) -> dict:
    """Global model metrics: pooled test and train loss/accuracy, and on the public set."""
    if self.on_host:
      return self._evaluate_streamed(params)
    return self._evaluate(params, self.arrays)

  def _evaluate_streamed(self, params) -> dict:
    """`evaluate` over the population in chunks of clients (host mode)."""
    n = self.num_clients
    out = {}
    for split in ("test", "train"):
      pool = getattr(self.data, split)
      sums = np.zeros((3, n))
      for ids in client_chunks(n, self._stream_clients):
        m = self._metrics_fn(params, device_pool(compact(pool, ids, self._stream_capacity[split])))
        sums += np.stack([np.asarray(m.loss) * np.asarray(m.count),
                          np.asarray(m.accuracy) * np.asarray(m.count), np.asarray(m.count)])
      masks = {"": np.ones(n, bool)}
      if self.eval_mask is not None:
        masks["clean_"] = np.asarray(self.eval_mask)
      for prefix, mask in masks.items():
        count = max(sums[2][mask].sum(), 1.0)
        out[f"{prefix}{split}_loss"] = jnp.float32(sums[0][mask].sum() / count)
        out[f"{prefix}{split}_accuracy"] = jnp.float32(sums[1][mask].sum() / count)
    if self.data.public_y.shape[0]:
      out.update(self._evaluate_public(params, self.arrays.public_x, self.arrays.public_y))
    return out

  # ---------------------------------------------------------------------------------------------
  def _stats(self, params, arrays: DataArrays, t, ids=None) -> dict:
    """The `[N]` stats the parts need, from the clients in `arrays`; with `ids` (a chunk of client
    ids, N for padding) the per-client gradient and mini-batch stats run for those clients only
    (the others read 0)."""
    stats = {}
    wanted = set(self.needs)
    if wanted & SPLIT_STATS["train"]:
      m = client_metrics(self.model, params, arrays.train, self.eval_batch_size)
      stats.update(loss=m.loss, accuracy=m.accuracy, entropy=m.entropy)
    for split, pool in (("val", arrays.val), ("test", arrays.test)):
      if wanted & SPLIT_STATS[split]:
        m = client_metrics(self.model, params, pool, self.eval_batch_size)
        stats.update({f"{split}_loss": m.loss, f"{split}_accuracy": m.accuracy})
    who = jnp.arange(self.num_clients, dtype=jnp.int32) if ids is None else ids
    scatter = (lambda v: v) if ids is None else (
        lambda v: jnp.zeros((self.num_clients, *v.shape[1:]), v.dtype).at[ids].set(v, mode="drop"))
    if "batch_loss" in wanted:
      stats["batch_loss"] = scatter(self._batch_loss(params, arrays.train, t, who))
    if "grad" in wanted:
      stats["grad"] = jax.tree.map(scatter, client_gradients(self.model, params, arrays.train,
                                                             who))
    if "grad_norm" in wanted:
      stats["grad_norm"] = scatter(client_gradients(self.model, params, arrays.train, who,
                                                    norm_only=True))
    return {k: stats[k] for k in self.needs}

  def _batch_loss(self, params, pool: ClientPool, t, ids) -> jax.Array:
    """Loss of each client of `ids` on one random mini-batch of B of its training examples."""
    b = self.local.batch_size
    keys = keylib.client_keys(keylib.round_key(self.seed, t, keylib.STATS), ids)
    u = jax.vmap(lambda k: jax.random.uniform(k, (b,)))(keys)
    offsets, counts = pool.offsets[ids], pool.counts[ids]
    rows = rows_with_replacement(u, offsets[:, None], counts[:, None], pool.x.shape[0])
    losses = jax.vmap(lambda r: per_example_loss(self.model, params, pool.x[r], pool.y[r]))(rows)
    return jnp.where(counts > 0, jnp.mean(losses, axis=1), 0.0)

  def _train(self, params, arrays, mask, size, t, lr,
             aggregate_mask=None) -> tuple[jax.Array, jax.Array, LocalResult]:
    """Trains the clients of `mask` in `size` slots; with `aggregate_mask` (streaming mode) the
    result's params are the linear aggregate of the clients in `mask & aggregate_mask`."""
    slots, valid = _nonzero_slots(mask, size)
    keys = keylib.client_keys(keylib.round_key(self.seed, t, keylib.TRAIN), slots)
    combine = None
    if aggregate_mask is not None:
      combine = self.aggregator.linear_weights(valid & aggregate_mask[slots],
                                               arrays.train.counts[slots])
    res = local_train(self.model, self.optimizer, self.local, params, arrays.train, slots, valid,
                      keys, lr, self.max_count, self.client_sharding, combine)
    return slots, valid, res

  def _select(self, state, inputs, fmask, t):
    chosen, sel_state = self.selector.select(
        state.selector_state, keylib.round_key(self.seed, t, keylib.SELECT), inputs, fmask)
    train_m, agg_m, part_state = self.participation.apply(
        state.participation_state, keylib.round_key(self.seed, t, keylib.PARTICIPATE), inputs,
        chosen)
    return chosen, sel_state, train_m & chosen, agg_m & train_m & chosen, part_state

  def _inputs(self, state: EngineState, arrays: DataArrays, stats) -> RoundInputs:
    t, params = state.round, state.params
    return RoundInputs(t, params, self.availability.sample(self.seed, t),
                       self._stats(params, arrays, t) if stats is None else stats, state.clients,
                       arrays.counts[0], arrays.label_hist,
                       lambda ids: client_gradients(self.model, params, arrays.train, ids))

  def _plan(self, state: EngineState, arrays: DataArrays, stats) -> jax.Array:
    """`[N]` bool: the clients whose rows the round will train on (host store, rows of the chosen
    clients only): every available client on a round when FilFL trains them all, else the
    selector's choice, made as the round will make it (same state, keys and stats)."""
    inputs = self._inputs(state, arrays, stats)
    t, avail = inputs.round, inputs.available
    filt, fmask = self.filter, avail
    if filt is not None:
      filter_round = (t % filt.period == 0) | jnp.any(avail != state.prev_available)
      fresh = avail
      if not filt.trains_available:
        fresh = filt.apply(state.filter_state, keylib.round_key(self.seed, t, keylib.FILTER),
                           inputs, avail, None)[0] & avail
      fmask = jnp.where(filter_round, fresh, state.filtered & avail)
    chosen, _ = self.selector.select(state.selector_state,
                                     keylib.round_key(self.seed, t, keylib.SELECT), inputs, fmask)
    if filt is not None and filt.trains_available:
      return jnp.where(filter_round, avail, chosen)
    return chosen

  def _round(self, state: EngineState, arrays: DataArrays, stats=None):
    t = state.round
    params = state.params
    lr = self.lr_schedule(t)
    inputs = self._inputs(state, arrays, stats)
    avail = inputs.available
    changed = jnp.any(avail != state.prev_available)
    filt = self.filter
    filter_round = jnp.asarray(False)
    if filt is not None:
      filter_round = (t % filt.period == 0) | changed
    fkey = keylib.round_key(self.seed, t, keylib.FILTER)
    n_avail = self.availability.num_available

    def select_and_train(fmask, fstate, info, local):
      chosen, sel_state, train_m, agg_m, part_state = self._select(state, inputs, fmask, t)
      if local is None:
        slots, valid, res = self._train(params, arrays, train_m, self.k, t, lr,
                                        agg_m if self.stream else None)
        trained_models = jnp.sum(valid)
        train_samples = jnp.sum(res.samples)
      else:  # Aggregate the already-trained models of the selected clients (no retraining).
        slots_n, valid_n, res_n = local
        slots, valid = _nonzero_slots(train_m, self.k)
        where = jnp.zeros((self.num_clients,), jnp.int32).at[slots_n].set(jnp.arange(n_avail))
        res = jax.tree.map(lambda a: a[where[slots]], res_n)
        res = res._replace(train_loss=jnp.where(valid, res.train_loss, 0.0),
                           samples=jnp.where(valid, res.samples, 0.0))
        trained_models = jnp.sum(valid_n)
        train_samples = jnp.sum(res_n.samples)
      return _Picked(fmask, fstate, info, chosen, sel_state, train_m, agg_m, part_state, slots,
                     valid, res, train_samples.astype(jnp.float32),
                     trained_models.astype(jnp.float32),
                     jnp.maximum(trained_models, jnp.sum(chosen)).astype(jnp.float32))

    def filter_branch(_):
      local = self._train(params, arrays, avail, n_avail, t, lr) if filt.trains_available else None
      if local is not None and self.exclude_nonfinite:
        finite, clean = _without_nonfinite(local[2], params)
        local = (local[0], local[1] & finite, clean)
      fmask, fstate, info = filt.apply(state.filter_state, fkey, inputs, avail, local)
      return select_and_train(fmask & avail, fstate, info, local)

    if filt is None:
      picked = select_and_train(avail, state.filter_state, {}, None)
    else:
      info_shape = jax.eval_shape(filter_branch, None).info
      info_zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), info_shape)
      reuse = lambda _: select_and_train(state.filtered & avail, state.filter_state, info_zeros,
                                         None)
      picked = jax.lax.cond(filter_round, filter_branch, reuse, None)
    (fmask, fstate, info, chosen, sel_state, train_m, agg_m, part_state, slots, valid, res,
     train_samples, trained_models, downloads) = picked

    trained = valid & train_m[slots]
    finite = jnp.ones_like(trained)
    if self.exclude_nonfinite:
      finite, res = _without_nonfinite(res, params)
    aggregated = trained & agg_m[slots] & finite
    num_examples = arrays.train.counts[slots]
    if self.stream:
      any_weight = jnp.sum(self.aggregator.linear_weights(aggregated, num_examples)) > 0
      new_params = jax.tree.map(lambda a, g: jnp.where(any_weight, a, g), res.params, params)
      agg_state, local_models = state.aggregator_state, None
    else:
      new_params, agg_state = self.aggregator.apply(
          state.aggregator_state, params, res.params,
          AggregateInputs(aggregated, num_examples, res.train_loss))
      local_models = res.params

    outcome = RoundOutcome(slots, trained, aggregated, res.train_loss, local_models, new_params)
    sel_state = self.selector.observe(sel_state, inputs, outcome)
    part_state = self.participation.observe(part_state, inputs, outcome)
    did = jnp.zeros((self.num_clients,), bool).at[slots].max(trained)
    clients = self._update_clients(state.clients, t, chosen, did, slots, trained, res.train_loss)

    sel_report = self.selector.report(sel_state)
    evals, grads, evaluators = self._stat_costs(arrays, avail, chosen,
                                                sel_report.get("evaluated", avail))
    grads += jnp.asarray(sel_report.get("gradient_samples", 0.0), jnp.float32)
    gradients_computed = (self.num_clients * len({"grad", "grad_norm"} & set(self.needs))
                          + jnp.asarray(sel_report.get("gradients_computed", 0), jnp.int32))
    # The clients that evaluated the model for the selector's or filter's stats downloaded it.
    downloads = jnp.maximum(downloads, jnp.sum(evaluators).astype(jnp.float32))
    round_costs = Costs(
        client_eval_samples=evals,
        client_grad_samples=grads,
        train_samples=train_samples,
        uploads=trained_models,
        downloads=downloads,
        server_public_samples=jnp.asarray(info.get("public_samples", 0.0), jnp.float32))
    costs = jax.tree.map(jnp.add, state.costs, round_costs)

    w = jnp.where(trained & finite, res.samples, 0.0)
    agg = jnp.zeros((self.num_clients,), bool).at[slots].max(aggregated)
    metrics = {
        "round": t,
        "lr": lr,
        "num_available": jnp.sum(avail),
        "num_filtered": jnp.sum(fmask),
        "num_selected": jnp.sum(chosen),
        "num_trained": jnp.sum(trained),
        "num_aggregated": jnp.sum(aggregated),
        "filter_round": filter_round,
        "local_train_loss": jnp.sum(jnp.where(w > 0, res.train_loss, 0.0) * w)
                            / jnp.maximum(jnp.sum(w), 1.0),
        "nonfinite_clients": jnp.sum(trained & ~finite),
        "model_finite": jnp.all(jnp.stack([jnp.all(jnp.isfinite(a))
                                           for a in jax.tree.leaves(new_params)])),
        "cost": round_costs._asdict(),
        "cumulative_cost": costs._asdict(),
        "filter": info,
        "selected": chosen,
        "trained_clients": did,
        "aggregated_clients": agg,
        "rule": self.participation.report(part_state),
        "selector": sel_report,
        "gradients_computed": gradients_computed,
    }
    if filt is not None:
      metrics["filtered_in"] = fmask
    new_state = EngineState(t + 1, new_params, clients, fstate, sel_state, part_state, agg_state,
                            fmask, avail, costs)
    return new_state, metrics

  def _stat_costs(self, arrays: DataArrays, avail, chosen,
                  sel_evaluated) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Samples clients evaluated (forward) and differentiated (forward and backward) to compute
    this round's stats, and the `[N]` clients that evaluated for the selector or filter: a stat
    the filter reads costs every available client; one the selector reads, the clients its report
    names as `evaluated` (power-of-choice's d candidates; default every available client); one
    only the participation rule reads, the selected clients (they alone decide)."""
    evals = grads = jnp.zeros((), jnp.float32)
    evaluators = jnp.zeros_like(avail)
    filter_needs = set(self.filter.needs) if self.filter is not None else set()
    train, val, test = arrays.counts
    groups = ((SPLIT_STATS["train"], train, False), (SPLIT_STATS["val"], val, False),
              (SPLIT_STATS["test"], test, False),
              ({"batch_loss"}, jnp.where(train > 0, self.local.batch_size, 0), False),
              ({"grad", "grad_norm"}, train, True))
    for names, per_client, backward in groups:
      wanted = names & set(self.needs)
      if not wanted:
        continue
      who = jnp.zeros_like(avail)
      if wanted & filter_needs:
        who |= avail
      if wanted & set(self.selector.needs):
        who |= sel_evaluated & avail
      evaluators |= who
      if wanted & set(self.participation.needs):
        who |= chosen
      samples = jnp.sum(jnp.where(who, per_client, 0)).astype(jnp.float32)
      if backward:
        grads += samples
      else:
        evals += samples
    return evals, grads, evaluators

  @staticmethod
  def _update_clients(clients: ClientState, t, chosen, did, slots, trained,
                      train_loss) -> ClientState:
    """`did`: `[N]` bool, the clients that trained and uploaded this round."""
    loss = clients.last_loss.at[slots].set(jnp.where(trained, train_loss, clients.last_loss[slots]))
    skipped = chosen & ~did
    return ClientState(
        last_loss=loss,
        last_round=jnp.where(did, t, clients.last_round),
        participations=clients.participations + did.astype(jnp.int32),
        consecutive_skips=jnp.where(did, 0, clients.consecutive_skips + skipped.astype(jnp.int32)))

  def _evaluate_impl(self, params, arrays: DataArrays) -> dict:
    out = {}
    for split, pool in (("test", arrays.test), ("train", arrays.train)):
      m = client_metrics(self.model, params, pool, self.eval_batch_size)
      out[f"{split}_loss"], out[f"{split}_accuracy"] = m.pooled()
      if self.eval_mask is not None:
        clean = m._replace(count=jnp.where(self.eval_mask, m.count, 0.0))
        out[f"clean_{split}_loss"], out[f"clean_{split}_accuracy"] = clean.pooled()
    if self.data.public_y.shape[0]:
      out.update(self._public_metrics(params, arrays.public_x, arrays.public_y))
    return out

  def _public_metrics(self, params, x, y) -> dict:
    m = example_metrics(self.model, params, x, y)
    return {"public_loss": jnp.mean(m.loss), "public_accuracy": jnp.mean(m.correct)}


def to_host(tree) -> Any:
  """Device pytree -> numpy / Python scalars (for JSON)."""
  return jax.tree.map(lambda a: np.asarray(a).item() if np.ndim(a) == 0 else np.asarray(a), tree)
