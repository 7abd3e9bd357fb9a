"""Local training of a round's clients in K (or n) static slots, and what is read off it.

`train_slots` trains the clients of a mask in a fixed number of slots (one vmapped, chunked call,
`client/local_training.py`); with a linear aggregator it can fold the aggregate out of training
instead of holding every local model (streaming). The helpers put slot values back at their
clients and keep a diverged client's non-finite model out of every later average.

Example:
  >>> import jax.numpy as jnp
  >>> slots, valid = nonzero_slots(jnp.array([False, True, True, False]), 3)
  >>> slots.tolist(), valid.tolist()
  ([1, 2, 0], [True, True, False])
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel import keys as keylib
from fedjax_sel.client.local_training import LocalResult, local_train
from fedjax_sel.engine.description import RoundConfig
from fedjax_sel.engine.signature import signature
from fedjax_sel.engine.state import DataArrays, RunValues
from fedjax_sel.models.bundle import trainable


class Trained(NamedTuple):
  """Clients trained in static slots.

  Attributes:
    slots: `[S]` int32 client id of each slot (slots past the trained ones repeat client 0).
    valid: `[S]` bool, the slot holds a client that trained.
    result: the `LocalResult`, stacked `[S, ...]` (or the streamed aggregate as its params).
  """

  slots: jax.Array
  valid: jax.Array
  result: LocalResult


def nonzero_slots(mask: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
  """(`[size]` ids of the clients of `mask`, in id order, padded with 0; `[size]` valid)."""
  slots = jnp.nonzero(mask, size=size, fill_value=0)[0].astype(jnp.int32)
  return slots, jnp.arange(size) < jnp.sum(mask)


def sampling_weights(config: RoundConfig, selector_state) -> jax.Array | None:
  """`[N]` the selector's sampling weights after its selection, when it reports them and the
  aggregator applies them; else None (the aggregator weighs the chosen clients itself)."""
  if config.selector.sampling_weights is None or not config.aggregator.applies_sampling_weights:
    return None
  return config.selector.sampling_weights(selector_state).astype(jnp.float32)


class TrainingConfig(NamedTuple):
  """What fixes the compiled training of a cohort: the part of a `RoundConfig` that local
  training reads. Rounds of different selectors, filters, rules and aggregators with one
  training config train alike, so their training compiles once (`programs.train_stage`).

  Attributes:
    model, optimizer, local, max_count, client_sharding, proximal: as in `RoundConfig`.
  """

  model: Any
  optimizer: Any
  local: Any
  max_count: int
  client_sharding: Any
  proximal: bool


def training_config(config: RoundConfig) -> TrainingConfig:
  """The round's `TrainingConfig`."""
  return TrainingConfig(config.model, config.optimizer, config.local, config.max_count,
                        config.client_sharding, config.proximal)


def training_key(config: RoundConfig):
  """The structural signature of the round's training (`signature.py`): equal for rounds that
  train alike, whatever their selector, filter, rule or aggregator."""
  tc = training_config(config)
  return signature(tc._replace(model=tc.model._replace(init=None)))


class Request(NamedTuple):
  """Which clients train this round, in which slots, and how: the training stage's input.

  Attributes:
    slots: `[S]` int32 client id of each slot.
    valid: `[S]` bool, the slot holds a client that trains.
    lr: the round's client learning rate.
    combine: `[S]` weights of the linear aggregate folded out of training (streaming), or None
      (every local model is returned).
  """

  slots: jax.Array
  valid: jax.Array
  lr: jax.Array
  combine: jax.Array | None = None


def request(config: RoundConfig, arrays: DataArrays, mask, size: int, lr, aggregate_mask=None,
            weights=None) -> Request:
  """The clients of `mask` in `size` slots; with `aggregate_mask` (streaming mode) the weights of
  the linear aggregate of the clients in `mask & aggregate_mask`: the aggregator's, or the
  selector's sampling weights `weights` (`[N]`) when given."""
  slots, valid = nonzero_slots(mask, size)
  combine = None
  if aggregate_mask is not None:
    if weights is None:
      combine = config.aggregator.linear_weights(valid & aggregate_mask[slots],
                                                 arrays.train.counts[slots])
    else:
      combine = jnp.where(valid & aggregate_mask[slots], weights[slots], 0.0)
  return Request(slots, valid, lr, combine)


def train(config: TrainingConfig, params, pool, seed, prox_mu, t, req: Request) -> Trained:
  """Local training of the request's clients from `params` with the round's keys (seed, round
  `t`, client id); with `req.combine`, the result's params are that linear aggregate."""
  keys = keylib.client_keys(keylib.round_key(seed, t, keylib.TRAIN), req.slots)
  res = local_train(config.model, config.optimizer, config.local, params, pool, req.slots,
                    req.valid, keys, req.lr, config.max_count, config.client_sharding,
                    req.combine, prox_mu=prox_mu if config.proximal else None)
  return Trained(req.slots, req.valid, res)


def train_slots(config: RoundConfig, params, arrays: DataArrays, run: RunValues, mask, size, t,
                lr, aggregate_mask=None, weights=None) -> Trained:
  """Trains the clients of `mask` in `size` slots (`request`, then `train`)."""
  return train(training_config(config), params, arrays.train, run.seed, run.prox_mu, t,
               request(config, arrays, mask, size, lr, aggregate_mask, weights))


def update_norms(config: RoundConfig, params, arrays: DataArrays, run: RunValues, t,
                 mask) -> tuple[jax.Array, jax.Array]:
  """`([N] norms, [N] samples)`: the clients of `mask` (at most K) trained in K slots with the
  round's keys, the norm of each one's update of the trainable weights and its samples."""
  lr = run.lr * config.lr_factor(t)
  slots, valid, res = train_slots(config, params, arrays, run, mask, config.k, t, lr)
  start = trainable(config.model, params)
  moved = jax.tree.map(lambda w, g: (w - g[None]).astype(jnp.float32),
                       trainable(config.model, res.params), start)
  norms = jnp.sqrt(sum(jnp.sum(a.reshape(a.shape[0], -1) ** 2, axis=1)
                       for a in jax.tree.leaves(moved)))
  n = mask.shape[0]
  return (jnp.zeros((n,), jnp.float32).at[slots].max(jnp.where(valid, norms, 0.0)),
          per_client(mask, slots, valid, res.samples))


def per_client(like, slots, valid, values) -> jax.Array:
  """`[N]` float32: each valid slot's value at its client (0 elsewhere)."""
  return jnp.zeros(like.shape, jnp.float32).at[slots].add(
      jnp.where(valid, values, 0.0).astype(jnp.float32))


def all_finite(tree) -> jax.Array:
  """Whether every value of every leaf of `tree` is finite."""
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in jax.tree.leaves(tree)]))


def _finite_slots(res: LocalResult) -> jax.Array:
  """`[K]` bool: the slot's local model and training loss are all finite."""
  ok = jnp.isfinite(res.train_loss)
  for leaf in jax.tree.leaves(res.params):
    ok &= jnp.all(jnp.isfinite(leaf.reshape(leaf.shape[0], -1)), axis=1)
  return ok


def without_nonfinite(res: LocalResult, global_params) -> tuple[jax.Array, LocalResult]:
  """(`[K]` finite mask, `res` with each non-finite slot's model replaced by the global model), so
  that no later average, median or distance sees a NaN; the slot's loss becomes NaN, which keeps
  it marked non-finite when the slots are gathered again."""
  finite = _finite_slots(res)
  params = jax.tree.map(
      lambda p, g: jnp.where(finite.reshape(-1, *([1] * g.ndim)), p, g[None]), res.params,
      global_params)
  return finite, res._replace(params=params, train_loss=jnp.where(finite, res.train_loss, jnp.nan))
