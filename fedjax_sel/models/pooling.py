"""2x2 max pooling as a reshape and a max, with `flax.linen.max_pool`'s values.

Why: `nn.max_pool` lowers to `reduce_window`, whose gradient is a `select_and_scatter` that
XLA:CPU runs slowly; on even-sized inputs the non-overlapping 2x2 windows are a reshape away, and
the max over the window axes differentiates into plain elementwise ops. The forward pass keeps
`reduce_window` (faster than the reshaped max on CPU); only the gradient takes the reshaped form.
The LEAF CNN round ran about 25% faster with it on CPU (docs/performance.md). Gradients equal
`nn.max_pool`'s except where a window holds tied maxima (the gradient is then shared among them
instead of going to the first).

Examples:
  >>> import jax.numpy as jnp
  >>> max_pool_2x2(jnp.arange(16.0).reshape(1, 4, 4, 1))[0, :, :, 0].tolist()
  [[5.0, 7.0], [13.0, 15.0]]
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


def _window_max(x: jax.Array) -> jax.Array:
  return nn.max_pool(x, (2, 2), strides=(2, 2), padding="SAME")


def _reshape_max(x: jax.Array) -> jax.Array:
  b, h, w, c = x.shape
  return jnp.max(x.reshape(b, h // 2, 2, w // 2, 2, c), axis=(2, 4))


@jax.custom_vjp
def _pool_even(x: jax.Array) -> jax.Array:
  return _window_max(x)


def _pool_even_fwd(x):
  return _window_max(x), x


def _pool_even_bwd(x, g):
  return jax.vjp(_reshape_max, x)[1](g)


_pool_even.defvjp(_pool_even_fwd, _pool_even_bwd)


def max_pool_2x2(x: jax.Array) -> jax.Array:
  """`[B, H, W, C] -> [B, ceil(H/2), ceil(W/2), C]`, stride 2, SAME padding (odd sizes: plain
  `nn.max_pool`)."""
  _, h, w, _ = x.shape
  if h % 2 or w % 2:
    return _window_max(x)
  return _pool_even(x)
