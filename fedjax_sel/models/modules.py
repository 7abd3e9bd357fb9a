"""Flax modules of the papers' models. Inputs are NHWC images, flat vectors or token indices.

- `LogisticRegression`: `[B, ...] -> [B, C]` (flattened input, one dense layer).
- `MLP`: `[B, ...] -> [B, C]`, ReLU hidden layers.
- `LeafCNN`: LEAF FEMNIST CNN, conv5x5 32, pool, conv5x5 64, pool, dense 2048, dense C.
- `CifarCNN`: small CIFAR CNN (conv5x5 32, pool, conv5x5 64, pool, dense 512, dense 128, dense C).
- `ResNet18`: CIFAR-style ResNet18 with GroupNorm.
- `CharLSTM`: `[B, T] int -> [B, V]`, 8-d embedding, two LSTM(256) layers (forget bias 1), logits
  of the character after the window.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_sel.models.conv import PatchConv
from fedjax_sel.models.pooling import max_pool_2x2


class LogisticRegression(nn.Module):
  num_classes: int

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.num_classes)(x.reshape(x.shape[0], -1))


class MLP(nn.Module):
  num_classes: int
  hidden: Sequence[int] = (200, 200)

  @nn.compact
  def __call__(self, x):
    x = x.reshape(x.shape[0], -1)
    for h in self.hidden:
      x = nn.relu(nn.Dense(h)(x))
    return nn.Dense(self.num_classes)(x)


class LeafCNN(nn.Module):
  num_classes: int = 62
  conv_impl: str = "patches"

  @nn.compact
  def __call__(self, x):
    x = max_pool_2x2(nn.relu(PatchConv(32, (5, 5), impl=self.conv_impl)(x)))
    x = max_pool_2x2(nn.relu(PatchConv(64, (5, 5), impl=self.conv_impl)(x)))
    x = nn.relu(nn.Dense(2048)(x.reshape(x.shape[0], -1)))
    return nn.Dense(self.num_classes)(x)


class CifarCNN(nn.Module):
  num_classes: int = 10
  conv_impl: str = "patches"

  @nn.compact
  def __call__(self, x):
    x = max_pool_2x2(nn.relu(PatchConv(32, (5, 5), impl=self.conv_impl)(x)))
    x = max_pool_2x2(nn.relu(PatchConv(64, (5, 5), impl=self.conv_impl)(x)))
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(nn.Dense(512)(x))
    x = nn.relu(nn.Dense(128)(x))
    return nn.Dense(self.num_classes)(x)


class _Block(nn.Module):
  features: int
  stride: int
  conv_impl: str

  @nn.compact
  def __call__(self, x):
    norm = lambda: nn.GroupNorm(num_groups=min(32, self.features // 2))
    y = PatchConv(self.features, (3, 3), (self.stride,) * 2, use_bias=False, impl=self.conv_impl)(x)
    y = nn.relu(norm()(y))
    y = norm()(PatchConv(self.features, (3, 3), use_bias=False, impl=self.conv_impl)(y))
    if self.stride != 1 or x.shape[-1] != self.features:
      x = PatchConv(self.features, (1, 1), (self.stride,) * 2, use_bias=False, impl=self.conv_impl)(x)
      x = norm()(x)
    return nn.relu(x + y)


class ResNet18(nn.Module):
  num_classes: int = 10
  width: int = 64
  conv_impl: str = "patches"

  @nn.compact
  def __call__(self, x):
    x = PatchConv(self.width, (3, 3), use_bias=False, impl=self.conv_impl)(x)
    x = nn.relu(nn.GroupNorm(num_groups=min(32, self.width // 2))(x))
    for stage, mult in enumerate((1, 2, 4, 8)):
      for block in range(2):
        stride = 2 if stage > 0 and block == 0 else 1
        x = _Block(self.width * mult, stride, self.conv_impl)(x)
    return nn.Dense(self.num_classes)(jnp.mean(x, axis=(1, 2)))


class _LSTMCell(nn.Module):
  """One LSTM step; `gx` is the input projection, gates (i, f, g, o), forget-gate bias +1."""

  units: int

  @nn.compact
  def __call__(self, carry, gx):
    c, h = carry
    i, f, g, o = jnp.split(gx + nn.Dense(4 * self.units, use_bias=False)(h), 4, axis=-1)
    c = jax.nn.sigmoid(f + 1.0) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return (c, h), h


class _LSTMLayer(nn.Module):
  """One LSTM layer over `[B, T, D] -> [B, T, units]`."""

  units: int

  @nn.compact
  def __call__(self, xs):
    gates_x = nn.Dense(4 * self.units)(xs)
    zeros = jnp.zeros((xs.shape[0], self.units), xs.dtype)
    scan = nn.scan(_LSTMCell, variable_broadcast="params", split_rngs={"params": False},
                   in_axes=1, out_axes=1)
    _, hs = scan(self.units)((zeros, zeros), gates_x)
    return hs


class CharLSTM(nn.Module):
  vocab_size: int
  embed_dim: int = 8
  units: int = 256
  layers: int = 2

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(self.vocab_size, self.embed_dim)(tokens.astype(jnp.int32))
    for _ in range(self.layers):
      x = _LSTMLayer(self.units)(x)
    return nn.Dense(self.vocab_size)(x[:, -1])
