"""Selectors: pure functions over client-state arrays that pick at most K clients from a mask.

Each factory returns a `Selector(init, select, needs)`; `select(state, key, inputs, mask)` returns a
`[N]` bool mask with `min(K, |mask|)` clients, all inside `mask`.

Example:
  >>> import jax, jax.numpy as jnp
  >>> sel = random_selector(2)
  >>> mask = jnp.array([True, False, True, True])
  >>> chosen, _ = sel.select(sel.init(4), jax.random.PRNGKey(0), None, mask)
  >>> int(chosen.sum()), bool((chosen <= mask).all())
  (2, True)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_sel.components import Selector


def top_k_mask(scores: jax.Array, mask: jax.Array, k: int) -> jax.Array:
  """`[N]` bool: the k highest `scores` inside `mask` (ties to the lower index), or all of `mask`
  when it holds fewer than k."""
  k = min(k, scores.shape[0])
  masked = jnp.where(mask, scores, -jnp.inf)
  _, idx = jax.lax.top_k(masked, k)
  take = jnp.arange(k) < jnp.sum(mask)
  return jnp.zeros(scores.shape, bool).at[idx].max(take)


def random_selector(k: int) -> Selector:
  """Uniform sample of K clients without replacement from the mask (RS)."""
  if k < 1:
    raise ValueError(f"clients per round must be >= 1, got {k}")

  def select(state, key, inputs, mask):
    del inputs
    return top_k_mask(jax.random.uniform(key, mask.shape), mask, k), state

  return Selector(init=lambda n: (), select=select)
