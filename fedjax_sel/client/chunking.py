"""Clients sorted by size and cut into fixed-size chunks, the layout of every per-client vmap.

Sorting first keeps a chunk's members close in size, so a loop that runs to the chunk's largest
client wastes little on padding; fixed-size chunks keep shapes static and bound memory.

Examples:
  >>> import jax.numpy as jnp
  >>> chunks = size_sorted_chunks(jnp.array([3, 9, 1, 5, 7]), chunk_size=2)
  >>> chunks.arrange(jnp.array([10, 11, 12, 13, 14]), fill=-1).tolist()
  [[11, 14], [13, 10], [12, -1]]
  >>> chunks.unarrange(chunks.arrange(jnp.arange(5), fill=0)).tolist()
  [0, 1, 2, 3, 4]
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class SizeSortedChunks(NamedTuple):
  """A layout of K slots: `order` sorts them by decreasing size (stable); `size` slots a chunk."""

  order: jax.Array
  size: int
  num_chunks: int

  @property
  def num_slots(self) -> int:
    return self.order.shape[0]

  def arrange(self, a: jax.Array, fill) -> jax.Array:
    """`[K, ...] -> [num_chunks, size, ...]` in sorted order, padded with `fill`."""
    pad = self.num_chunks * self.size - self.num_slots
    a = jnp.concatenate([a[self.order], jnp.full((pad, *a.shape[1:]), fill, a.dtype)])
    return a.reshape(self.num_chunks, self.size, *a.shape[1:])

  def unarrange(self, a: jax.Array) -> jax.Array:
    """`[num_chunks, size, ...] -> [K, ...]` back in the original slot order."""
    flat = a.reshape(self.num_chunks * self.size, *a.shape[2:])[:self.num_slots]
    return flat[jnp.argsort(self.order)]


def size_sorted_chunks(sizes: jax.Array, chunk_size: int | None, multiple: int = 1
                       ) -> SizeSortedChunks:
  """Layout of `sizes [K]` in chunks of `chunk_size` (None: one chunk), rounded up to `multiple`
  (the device count, so a chunk shards evenly)."""
  num_slots = sizes.shape[0]
  size = min(chunk_size or num_slots, num_slots)
  size = -(-size // multiple) * multiple
  return SizeSortedChunks(jnp.argsort(-sizes, stable=True), size, -(-num_slots // size))
