"""Flax modules of the papers' models. Inputs are NHWC images, flat vectors or token indices.

- `LogisticRegression`: `[B, ...] -> [B, C]` (flattened input, one dense layer).
- `MLP`: `[B, ...] -> [B, C]`, ReLU hidden layers.
- `LeafCNN`: LEAF FEMNIST CNN, conv5x5 32, pool, conv5x5 64, pool, dense 2048, dense C.
- `CifarCNN`: small CIFAR CNN (conv5x5 32, pool, conv5x5 64, pool, dense 512, dense 128, dense C).
- `ResNet18`: CIFAR-style ResNet18, GroupNorm (default) or BatchNorm (`norm="batch"`: running
  statistics in the `batch_stats` collection, updated over the real examples of a batch when
  `train=True`; see `bundle.from_flax(..., stateful=True)`).
- `CharLSTM`: `[B, T] int -> [B, V]`, 8-d embedding, two LSTM(256) layers (forget bias 1), logits
  of the character after the window.
- `WordLSTM`: `[B, T] int -> [B, V]`, fedjax's Stack Overflow language model (Reddi et al. 2021):
  96-d embedding, LSTM(670), tanh, projection to 96, logits of the word after the window.
"""

from __future__ import annotations

from collections.abc import Sequence

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


class _TwoConvCNN(nn.Module):
  """conv5x5 32, pool, conv5x5 64, pool, then ReLU dense layers of `hidden` and the logits."""

  num_classes: int
  hidden: tuple[int, ...]
  conv_impl: str = "auto"

  @nn.compact
  def __call__(self, x):
    x = max_pool_2x2(nn.relu(PatchConv(32, (5, 5), impl=self.conv_impl)(x)))
    x = max_pool_2x2(nn.relu(PatchConv(64, (5, 5), impl=self.conv_impl)(x)))
    x = x.reshape(x.shape[0], -1)
    for h in self.hidden:
      x = nn.relu(nn.Dense(h)(x))
    return nn.Dense(self.num_classes)(x)


class LeafCNN(_TwoConvCNN):
  num_classes: int = 62
  hidden: tuple[int, ...] = (2048,)


class CifarCNN(_TwoConvCNN):
  num_classes: int = 10
  hidden: tuple[int, ...] = (512, 128)


NORMS = ("group", "batch")
# PyTorch's BatchNorm2d momentum 0.1 (the FilFL reference ResNet18), in flax's convention.
BATCH_NORM_MOMENTUM = 0.9


class _Norm(nn.Module):
  """GroupNorm, or BatchNorm over the examples where `mask [B]` is 1 (all when None)."""

  kind: str
  features: int

  @nn.compact
  def __call__(self, x, train: bool, mask=None):
    if self.kind == "group":
      return nn.GroupNorm(num_groups=min(32, self.features // 2))(x)
    mask = None if mask is None else jnp.broadcast_to(
        mask.reshape(-1, *([1] * (x.ndim - 1))).astype(bool), x.shape)
    # Two-pass variance: E[x^2] - E[x]^2 loses the variance of a small partial batch to rounding.
    return nn.BatchNorm(use_running_average=not train, momentum=BATCH_NORM_MOMENTUM,
                        epsilon=1e-5, use_fast_variance=False)(x, mask=mask)


class _Block(nn.Module):
  features: int
  stride: int
  conv_impl: str
  norm: str

  @nn.compact
  def __call__(self, x, train, mask):
    conv = lambda k, s=1: PatchConv(self.features, (k, k), (s, s), use_bias=False,
                                    impl=self.conv_impl)
    norm = lambda y: _Norm(self.norm, self.features)(y, train, mask)
    y = nn.relu(norm(conv(3, self.stride)(x)))
    y = norm(conv(3)(y))
    if self.stride != 1 or x.shape[-1] != self.features:
      x = norm(conv(1, self.stride)(x))
    return nn.relu(x + y)


class ResNet18(nn.Module):
  num_classes: int = 10
  width: int = 64
  conv_impl: str = "auto"
  norm: str = "group"

  @nn.compact
  def __call__(self, x, train: bool = False, mask=None):
    x = PatchConv(self.width, (3, 3), use_bias=False, impl=self.conv_impl)(x)
    x = nn.relu(_Norm(self.norm, self.width)(x, train, mask))
    for stage, mult in enumerate((1, 2, 4, 8)):
      for block in range(2):
        stride = 2 if stage > 0 and block == 0 else 1
        x = _Block(self.width * mult, stride, self.conv_impl, self.norm)(x, train, mask)
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


class WordLSTM(nn.Module):
  vocab_size: int
  embed_dim: int = 96
  units: int = 670

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(self.vocab_size, self.embed_dim)(tokens.astype(jnp.int32))
    h = _LSTMLayer(self.units)(x)[:, -1]
    return nn.Dense(self.vocab_size)(nn.Dense(self.embed_dim)(jnp.tanh(h)))
