"""Vectorized evaluation of one model on every client's data, in one call.

`client_metrics` runs the model over the flat pool in fixed-size batches and sums per-example
loss / correctness / predictive entropy into per-client totals with `segment_sum`: no per-client
padding at all. `client_gradients` computes each client's full-batch gradient of F_k (for gradient
norm selection and DivFL proxies) with clients vmapped in size-sorted chunks.

These `[N]` arrays are the client-state arrays selectors and participation rules read.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_sel.client.chunking import size_sorted_chunks
from fedjax_sel.data.federated import ClientPool
from fedjax_sel.models.bundle import Model, example_metrics, per_example_loss

Params = Any


class ClientMetrics(NamedTuple):
  """Per-client `[N]` means over each client's examples (0 where a client has none)."""

  loss: jax.Array
  accuracy: jax.Array
  entropy: jax.Array
  count: jax.Array

  def pooled(self) -> tuple[jax.Array, jax.Array]:
    """(loss, accuracy) over all examples of all clients (sample-weighted)."""
    n = jnp.maximum(jnp.sum(self.count), 1.0)
    return jnp.sum(self.loss * self.count) / n, jnp.sum(self.accuracy * self.count) / n


def _batched_rows(total: int, batch_size: int) -> tuple[jax.Array, jax.Array]:
  n_batches = max(-(-total // batch_size), 1)
  rows = jnp.arange(n_batches * batch_size).reshape(n_batches, batch_size)
  return jnp.minimum(rows, max(total - 1, 0)), (rows < total)


def client_metrics(model: Model, params: Params, pool: ClientPool,
                   batch_size: int = 512) -> ClientMetrics:
  """Loss, accuracy and mean predictive entropy of `params` on each client's examples."""
  total = pool.x.shape[0]
  num_clients = pool.counts.shape[0]
  if total == 0:
    zeros = jnp.zeros((num_clients,), jnp.float32)
    return ClientMetrics(zeros, zeros, zeros, zeros)
  rows, valid = _batched_rows(total, batch_size)

  def batch(args):
    r, v = args
    m = example_metrics(model, params, pool.x[r], pool.y[r])
    w = v.astype(jnp.float32)
    return jnp.stack([m.loss * w, m.correct * w, m.entropy * w, w])

  sums = jax.lax.map(batch, (rows, valid))  # [n_batches, 4, B]
  owners = pool.client_id[rows].reshape(-1)
  per_client = jax.vmap(lambda s: jax.ops.segment_sum(s.reshape(-1), owners, num_clients))(
      jnp.moveaxis(sums, 1, 0))
  count = per_client[3]
  denom = jnp.maximum(count, 1.0)
  return ClientMetrics(per_client[0] / denom, per_client[1] / denom, per_client[2] / denom, count)


def client_gradients(model: Model, params: Params, pool: ClientPool, clients: jax.Array,
                     batch_size: int = 256, chunk_size: int = 64,
                     norm_only: bool = False):
  """Full-batch gradients of F_k (mean per-sample loss) at `params` for `clients [K]`.

  Args:
    model: the model bundle.
    params: the point of evaluation.
    pool: the pool whose data defines F_k.
    clients: `[K]` client ids.
    batch_size: examples per client per inner step.
    chunk_size: clients vmapped together; clients are sorted by size first.
    norm_only: return `[K]` gradient norms instead of stacked `[K, ...]` gradients.

  Returns:
    Stacked gradients (or their global norms), in the order of `clients`; zero for empty clients.
  """
  counts = pool.counts[clients]
  layout = size_sorted_chunks(counts, chunk_size)
  size = layout.size
  total = pool.x.shape[0]
  pos = jnp.arange(batch_size)

  def sum_loss(p, rows, mask):
    return jnp.sum(per_example_loss(model, p, pool.x[rows], pool.y[rows]) * mask)

  def one_client_batch(b, off, count):
    rows = jnp.clip(off + b * batch_size + pos, 0, total - 1)
    mask = (b * batch_size + pos < count).astype(jnp.float32)
    return jax.grad(sum_loss)(params, rows, mask)

  def run_chunk(args):
    cl, count = args
    off = pool.offsets[cl]
    zeros = jax.tree.map(lambda g: jnp.zeros((size, *g.shape), g.dtype), params)

    def body(b, acc):
      g = jax.vmap(one_client_batch, in_axes=(None, 0, 0))(b, off, count)
      return jax.tree.map(jnp.add, acc, g)

    n_batches = -(-jnp.max(count) // batch_size)
    acc = jax.lax.fori_loop(0, n_batches, body, zeros)
    scale = 1.0 / jnp.maximum(count, 1).astype(jnp.float32)
    grads = jax.tree.map(lambda g: g * scale.reshape(-1, *([1] * (g.ndim - 1))), acc)
    return jax.vmap(optax.tree.norm)(grads) if norm_only else grads

  out = jax.lax.map(run_chunk, (layout.arrange(clients, 0), layout.arrange(counts, 0)))
  return jax.tree.map(layout.unarrange, out)
