"""Gaussian noise for private aggregates, drawn from explicit keys (never a global generator).

`gaussian_like` draws one isotropic Gaussian the shape of a model. `tree_prefix_noise` is the
noise of a binary-tree (tree-aggregation) prefix sum (Dwork et al. 2010; Kairouz et al. 2021,
DP-FTRL): the prefix of steps `1..s` is the union of at most `depth` dyadic intervals, one per set
bit of s, and each interval (a node of the tree) carries its own Gaussian; a node's noise derives
from the tree's key and the node alone, so every prefix that contains a node redraws the same
noise without keeping it.

Example:
  >>> import jax, jax.numpy as jnp
  >>> key = jax.random.PRNGKey(0)
  >>> like = jnp.zeros(3)
  >>> n3 = tree_prefix_noise(key, like, 1.0, jnp.int32(3), depth=2)   # nodes (0, 3) + (1, 1)
  >>> bool(jnp.allclose(n3, node_noise(key, like, 1.0, 0, 3) + node_noise(key, like, 1.0, 1, 1)))
  True
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp


def gaussian_like(key: jax.Array, like: Any, std) -> Any:
  """A float32 tree shaped as `like` with independent N(0, std^2) entries (a key per leaf)."""
  leaves, treedef = jax.tree.flatten(like)
  keys = jax.random.split(key, max(len(leaves), 1))
  noise = [std * jax.random.normal(k, jnp.shape(leaf), jnp.float32)
           for k, leaf in zip(keys, leaves)]
  return jax.tree.unflatten(treedef, noise)


def tree_depth(steps: int) -> int:
  """Levels of the tree over `steps` steps: `ceil(log2(steps + 1))`, the most nodes a prefix sums
  (and the most nodes one step's value enters)."""
  return max(1, math.ceil(math.log2(steps + 1)))


def node_noise(key: jax.Array, like: Any, std, level, index) -> Any:
  """The noise of node `index` (1-based) of `level` of the tree of `key`: the dyadic interval of
  steps `(index - 1) 2^level + 1 .. index 2^level`."""
  return gaussian_like(jax.random.fold_in(jax.random.fold_in(key, level), index), like, std)


def tree_prefix_noise(key: jax.Array, like: Any, std, step: jax.Array, depth: int) -> Any:
  """The noise of the prefix sum of steps `1..step` (0 for step 0): the sum, over the set bits l
  of `step`, of the noise of node `step >> l` of level l."""
  total = jax.tree.map(lambda leaf: jnp.zeros(jnp.shape(leaf), jnp.float32), like)
  for level in range(depth):
    on = ((step >> level) & 1).astype(jnp.float32)
    node = node_noise(key, like, std, level, step >> level)
    total = jax.tree.map(lambda t, n, on=on: t + on * n, total, node)
  return total
