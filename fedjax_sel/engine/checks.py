"""The checks a run's arguments pass before anything is built, uploaded or compiled.

Each raises a `ValueError` or `TypeError` naming the argument and what it accepts
(`run_spec.build_run` calls them in order).

Example:
  >>> check_choice("store", "disk", STORES)
  Traceback (most recent call last):
  ...
  ValueError: store must be one of ('device', 'host', 'auto'), got 'disk'
"""

from __future__ import annotations

import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_sel.client.local_training import samples_per_client
from fedjax_sel.client.system import client_times
from fedjax_sel.data.federated import FederatedDataset
from fedjax_sel.engine.description import LrSchedule
from fedjax_sel.engine.signature import Keyed, signature
from fedjax_sel.models.bundle import Model, model_bytes, param_shapes
from fedjax_sel.parts.asynchronous import AsyncSpec
from fedjax_sel.parts.types import SPLIT_STATS, part_name

NONFINITE = ("stop", "exclude")
STORES = ("device", "host", "auto")
HOST_ROWS = ("auto", "available", "chosen")
MAX_WINDOWS = 2**24  # Availability indices a float32 clock tells apart (`check_clock`).


@functools.lru_cache(maxsize=64)
def _at_round_zero(factor: Keyed) -> float:
  """`factor.value(0)`, a schedule's factor at round 0, as one small program per factor signature
  (op by op, its few operations would each compile)."""
  return float(jax.jit(lambda t: factor.value(t))(np.int32(0)))


def check_arguments(data, optimizer, local, availability, seed, eval_mask, lr_schedule,
                    model=None) -> None:
  """Named errors for arguments of the wrong kind or size, before anything compiles."""
  n = data.num_clients
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
    raise TypeError(f"seed must be an integer, got {seed!r}")
  if not 0 <= int(seed) < 2**31:
    raise ValueError(f"seed must be in 0..2**31-1, got {seed}")
  if isinstance(optimizer, optax.GradientTransformation) or not callable(optimizer):
    raise TypeError("optimizer must be a factory: learning rate -> optax transformation (e.g. "
                    f"`lambda lr: optax.sgd(lr)`), got {type(optimizer).__name__}")
  if lr_schedule is not None and not callable(lr_schedule):
    raise TypeError(f"lr_schedule must be an LrSchedule (constant_lr, step_decay_lr) or a "
                    f"callable round -> learning rate, got {type(lr_schedule).__name__}")
  if local.batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {local.batch_size}")
  if local.num_steps is None and local.num_epochs < 1:
    raise ValueError(f"num_epochs must be >= 1, got {local.num_epochs}")
  if local.num_steps is not None and local.num_steps < 1:
    raise ValueError(f"num_steps must be >= 1 (or None for epochs), got {local.num_steps}")
  if local.micro_batch is not None:
    if local.micro_batch < 1 or local.batch_size % local.micro_batch:
      raise ValueError(f"micro_batch must divide batch_size ({local.batch_size}), got "
                       f"{local.micro_batch}")
    if model is not None and model.train_apply is not None:
      raise ValueError(f"micro_batch: the model {model.name!r} keeps state (BatchNorm), whose "
                       "statistics would be a micro-batch's; use whole batches (None)")
  shape = jax.eval_shape(lambda: availability.sample(0, jnp.int32(0))).shape
  if shape != (n,):
    raise ValueError(f"availability samples masks of shape {shape}, the dataset has {n} clients")
  if eval_mask is not None and np.shape(eval_mask) != (n,):
    raise ValueError(f"eval_mask must have one entry per client ({n}), got shape "
                     f"{np.shape(eval_mask)}")
  if eval_mask is not None and not np.any(np.asarray(eval_mask, bool)):
    raise ValueError("eval_mask selects no client: its clean_* metrics would read 0 every round; "
                     "pass None to skip them")
  if lr_schedule is not None:
    base, factor = ((lr_schedule.base, lr_schedule.factor) if isinstance(lr_schedule, LrSchedule)
                    else (1.0, lr_schedule))
    first = base * _at_round_zero(Keyed(signature(factor), factor))
    if not (math.isfinite(base) and base >= 0 and math.isfinite(first) and first >= 0):
      raise ValueError(f"lr_schedule must give a finite learning rate >= 0, got base {base} and "
                       f"{first} at round 0 (a negative rate runs gradient ascent)")


def check_asynchrony(spec, k: int, num_available: int, clock, filt, participation,
                      on_host: bool) -> None:
  """The asynchronous mode's requirements, else ValueError naming the argument."""
  if not isinstance(spec, AsyncSpec):
    raise TypeError(f"asynchrony must be an AsyncSpec (fedbuff, fedasync), got "
                    f"{type(spec).__name__}")
  if not k <= spec.concurrency <= num_available:
    raise ValueError(f"asynchrony.concurrency must be in {k}..{num_available} (clients_per_round, "
                     f"the buffer size, up to the clients available), got {spec.concurrency}")
  if clock is None:
    raise ValueError("asynchrony needs a system_profile: the clients' speeds order their updates")
  if clock.deadline_s is not None:
    raise ValueError("asynchrony takes no deadline_s: the server steps when K updates arrived")
  if filt is not None:
    raise ValueError(f"asynchrony takes no filter (got {part_name(filt)!r}): a filter decides on "
                     "a round's available set, which the asynchronous mode does not have")
  if participation is not None and part_name(participation) != "everyone":
    raise ValueError(f"asynchrony takes no participation rule (got {part_name(participation)!r})")
  if on_host:
    raise ValueError("asynchrony needs the device store (store='device')")


def check_clock(spec, rounds: int) -> None:
  """The asynchronous clock of `rounds` server steps of the run `spec` (a `RunSpec`): every
  client's round trip finite, and every availability index the steps can reach told apart
  exactly, else ValueError naming `asynchrony.window_s` (`--avail_window_s`).

  Times are float32 seconds, whose floor(T / window_s) is exact up to `MAX_WINDOWS`; past it the
  index would repeat or overflow and the availability model would be read at the wrong window.
  Without drops a step ends within ceil(K / C) round trips of the slowest client, which bounds
  the horizon of `rounds` steps."""
  config = spec.config
  asynchrony = config.asynchrony
  if asynchrony is None:
    return
  samples = samples_per_client(spec.data.train.counts, config.local)
  durations = np.asarray(client_times(config.clock, samples, 0.0, 0.0, 2.0), np.float64)
  if not np.all(np.isfinite(durations)):
    i = int(np.flatnonzero(~np.isfinite(durations))[0])
    raise ValueError(f"client {i}'s round trip is not a finite number of simulated seconds "
                     f"({durations[i]}): its system profile's speed or bandwidth is too small")
  slowest = float(durations.max())
  horizon = rounds * math.ceil(config.k / asynchrony.concurrency) * slowest
  windows = horizon / asynchrony.window_s
  if not windows < MAX_WINDOWS:
    raise ValueError(
        f"asynchrony.window_s (--avail_window_s) = {asynchrony.window_s:g} s is too small for "
        f"{rounds} server steps: they reach up to {horizon:.4g} simulated seconds (the slowest "
        f"client's round trip is {slowest:.4g} s), {windows:.3g} availability windows, and "
        f"float32 times tell at most {MAX_WINDOWS} apart: use window_s >= "
        f"{horizon / MAX_WINDOWS:.3g}")


def device_memory_bytes() -> int:
  """The first device's memory: its allocator's limit on accelerators, physical memory on CPU."""
  device = jax.devices()[0]
  if device.platform != "cpu":
    return int((device.memory_stats() or {}).get("bytes_limit", 16 * 2**30))
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def model_shapes(model: Model):
  """The model's parameter shapes (`bundle.param_shapes`), traced once per model signature: a
  job's runs build equal models, and three checks read them."""
  return _model_shapes(Keyed(signature(model), model))


@functools.lru_cache(maxsize=64)
def _model_shapes(model: Keyed):
  return param_shapes(model.value)


@functools.lru_cache(maxsize=64)
def _logits_shape(model: Keyed, inputs: jax.ShapeDtypeStruct) -> tuple[int, ...]:
  return tuple(jax.eval_shape(model.value.apply, _model_shapes(model), inputs).shape)


def check_model_fits(model: Model, memory: int | None = None) -> int:
  """The model's parameter bytes from its shapes (nothing allocated); ValueError when three copies
  (the global model, a client's model and its gradient, the least a round holds) exceed the
  device's memory, with the estimate."""
  size = model_bytes(model_shapes(model))
  memory = device_memory_bytes() if memory is None else memory
  if 3 * size > memory:
    raise ValueError(f"the model {model.name!r} has {size / 2**30:.1f} GiB of parameters; a round "
                     f"holds at least three copies ({3 * size / 2**30:.1f} GiB), more than the "
                     f"device's {memory / 2**30:.1f} GiB: choose a smaller model")
  return int(size)


def check_model(model: Model, data: FederatedDataset, init_params) -> None:
  """The model takes the data's inputs and predicts its classes; `init_params` fit the model."""
  if model.num_classes != data.num_classes:
    raise ValueError(f"model {model.name!r} predicts {model.num_classes} classes, the dataset has "
                     f"{data.num_classes}")
  keyed = Keyed(signature(model), model)
  params = _model_shapes(keyed)
  inputs = jax.ShapeDtypeStruct((2, *data.feature_shape), np.asarray(data.train.x[:0]).dtype)
  try:
    logits = _logits_shape(keyed, inputs)
  except Exception as e:  # pylint: disable=broad-except  # Any shape error of a user's model.
    raise ValueError(f"model {model.name!r} cannot take the dataset's inputs of shape "
                     f"{data.feature_shape} ({type(e).__name__}: {e})") from e
  if logits != (2, data.num_classes):
    raise ValueError(f"model {model.name!r} maps a batch of 2 inputs to logits of shape "
                     f"{logits}, expected (2, {data.num_classes})")
  if init_params is not None:
    want, got = jax.tree.structure(params), jax.tree.structure(init_params)
    if want != got:
      raise ValueError(f"init_params has another structure than model {model.name!r}'s "
                       f"parameters ({got} != {want})")
    for path, w, g in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                          jax.tree.leaves(params), jax.tree.leaves(init_params)):
      if tuple(np.shape(g)) != tuple(w.shape):
        raise ValueError(f"init_params{jax.tree_util.keystr(path[0])} has shape "
                         f"{tuple(np.shape(g))}, model {model.name!r} expects {tuple(w.shape)}")


def check_split_stats(data, needs) -> None:
  """A stat over a client's validation or test split needs every client to hold one: a client
  with none would read loss 0 and pass any threshold unseen."""
  for split in ("val", "test"):
    read = sorted(needs & SPLIT_STATS[split])
    empty = int(np.sum(np.asarray(getattr(data, split).counts) == 0)) if read else 0
    if empty:
      raise ValueError(f"{', '.join(read)} is read by the filter, selector or participation rule, "
                       f"but {empty} of {data.num_clients} clients hold no {split} data (their "
                       f"{read[0]} would be 0); give every client a {split} split")


def check_choice(name: str, value, accepted) -> None:
  """`value` is one of `accepted`, else ValueError naming the argument."""
  if value not in accepted:
    raise ValueError(f"{name} must be one of {accepted}, got {value!r}")
