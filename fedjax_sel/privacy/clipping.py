"""Per-client clipping of model updates to an L2 norm, the first step of every private aggregate.

A client's update is its whole model delta `w^k - w_t`, every leaf together (user-level privacy:
one client, one vector). `clip_factors` says how much of each update a mechanism keeps,
`min(1, S / ||delta_k||)`; with S = inf every factor is exactly 1.

Example:
  >>> import jax.numpy as jnp
  >>> deltas = {"w": jnp.array([[3.0, 4.0], [0.3, 0.4]])}
  >>> norms = update_norms(deltas)
  >>> norms.tolist(), clip_factors(norms, 1.0).tolist()
  ([5.0, 0.5], [0.20000000298023224, 1.0])
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def updates(global_params: Any, client_params: Any) -> Any:
  """The stacked `[K, ...]` updates `w^k - w_t` in float32."""
  return jax.tree.map(lambda c, g: c.astype(jnp.float32) - g.astype(jnp.float32), client_params,
                      global_params)


def update_norms(deltas: Any) -> jax.Array:
  """`[K]` L2 norms of stacked updates `[K, ...]`, over all their leaves together."""
  squares = [jnp.sum(jnp.square(leaf.reshape(leaf.shape[0], -1)), axis=1)
             for leaf in jax.tree.leaves(deltas)]
  return jnp.sqrt(sum(squares))


def clip_factors(norms: jax.Array, clip) -> jax.Array:
  """`[K]` factors `min(1, clip / norm)` that bring each update within norm `clip` (1 for a zero
  update and for `clip = inf`)."""
  norms = norms.astype(jnp.float32)
  return jnp.where(norms > clip, clip / jnp.maximum(norms, 1e-30), 1.0).astype(jnp.float32)
