"""What the parts read in a round: the clients' stats at the global model, and `RoundInputs`.

The engine computes only the stats the parts declare in their `needs` (`parts/types.py` lists the
names); `round_inputs` gathers them with the round's available set, the client arrays, K and the
on-demand functions (gradients of a few clients, update norms, the availability model).

Example:
  >>> sorted(SPLIT_STATS["val"])
  ['val_accuracy', 'val_loss']
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_sel import keys as keylib
from fedjax_sel.client.evaluation import client_gradients, client_metrics
from fedjax_sel.data.federated import ClientPool, rows_with_replacement
from fedjax_sel.engine.description import RoundConfig
from fedjax_sel.engine.state import DataArrays, EngineState, RunValues
from fedjax_sel.engine.training import update_norms
from fedjax_sel.models.bundle import per_example_loss
from fedjax_sel.parts.types import SPLIT_STATS, RoundInputs, Stats


def client_stats(config: RoundConfig, params, arrays: DataArrays, t, seed, ids=None) -> dict:
  """The `[N]` stats the parts need, from the clients in `arrays`; with `ids` (a chunk of client
  ids, N for padding) the per-client gradient and mini-batch stats run for those clients only
  (the others read 0)."""
  n = arrays.counts.shape[1]
  stats = {}
  wanted = set(config.needs)
  if wanted & SPLIT_STATS["train"]:
    m = client_metrics(config.model, params, arrays.train, config.eval_batch_size)
    stats.update(loss=m.loss, accuracy=m.accuracy, entropy=m.entropy)
  for split, pool in (("val", arrays.val), ("test", arrays.test)):
    if wanted & SPLIT_STATS[split]:
      m = client_metrics(config.model, params, pool, config.eval_batch_size)
      stats.update({f"{split}_loss": m.loss, f"{split}_accuracy": m.accuracy})
  who = jnp.arange(n, dtype=jnp.int32) if ids is None else ids
  scatter = (lambda v: v) if ids is None else (
      lambda v: jnp.zeros((n, *v.shape[1:]), v.dtype).at[ids].set(v, mode="drop"))
  if "batch_loss" in wanted:
    stats["batch_loss"] = scatter(batch_loss(config, params, arrays.train, t, seed, who))
  if "grad" in wanted:
    stats["grad"] = jax.tree.map(scatter, client_gradients(config.model, params, arrays.train,
                                                           who))
  if "grad_norm" in wanted:
    stats["grad_norm"] = scatter(client_gradients(config.model, params, arrays.train, who,
                                                  norm_only=True))
  return {k: stats[k] for k in config.needs}


def batch_loss(config: RoundConfig, params, pool: ClientPool, t, seed, ids) -> jax.Array:
  """Loss of each client of `ids` on one random mini-batch of B of its training examples."""
  b = config.local.batch_size
  keys = keylib.client_keys(keylib.round_key(seed, t, keylib.STATS), ids)
  u = jax.vmap(lambda k: jax.random.uniform(k, (b,)))(keys)
  offsets, counts = pool.offsets[ids], pool.counts[ids]
  rows = rows_with_replacement(u, offsets[:, None], counts[:, None], pool.x.shape[0])
  losses = jax.vmap(lambda r: per_example_loss(config.model, params, pool.x[r], pool.y[r]))(rows)
  return jnp.where(counts > 0, jnp.mean(losses, axis=1), 0.0)


def round_inputs(config: RoundConfig, state: EngineState, arrays: DataArrays, run: RunValues,
                 stats=None) -> RoundInputs:
  """What the parts read this round (stats computed unless given, e.g. streamed by the host)."""
  t, params = state.round, state.params
  if stats is None:
    stats = client_stats(config, params, arrays, t, run.seed)
  return RoundInputs(t, params, config.availability.sample(run.seed, t), Stats(stats),
                     state.clients,
                     arrays.counts[0], arrays.label_hist,
                     lambda ids: client_gradients(config.model, params, arrays.train, ids),
                     arrays.public_x, arrays.public_y,
                     lambda r: config.availability.sample(run.seed, r),
                     lambda mask: update_norms(config, params, arrays, run, t, mask), config.k)
