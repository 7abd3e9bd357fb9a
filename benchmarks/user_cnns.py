"""CNNs as a user writes them in flax from the model guide (`models.PatchConv`,
`models.max_pool_2x2`), for the benchmarks that set them beside the library's own models
(`user_models.py`) and beside PyTorch (`peers.py`).

- `UserCifarCNN`: the library's CIFAR CNN written out by a user.
- `SimpleCNN`: pfl-research's `simple_cnn` benchmark model (conv 3x3 32, conv 3x3 64, pool,
  dropout 0.25, dense 128, dropout 0.5).

Each takes `conv` and `pool` so that the same network can be built with flax's own `nn.Conv` and
`nn.max_pool` (`flax_pool`).
"""

from __future__ import annotations

import flax.linen as nn
import jax

from fedjax_sel import models


class UserCifarCNN(nn.Module):
  """The library's CIFAR CNN as a user writes it from the guide (conv impl at its default); with
  `hidden=(2048,)`, the LEAF CNN."""

  num_classes: int
  conv: type = models.PatchConv
  pool: object = staticmethod(models.max_pool_2x2)
  hidden: tuple[int, ...] = (512, 128)

  @nn.compact
  def __call__(self, x):
    x = self.pool(nn.relu(self.conv(32, (5, 5))(x)))
    x = self.pool(nn.relu(self.conv(64, (5, 5))(x)))
    x = x.reshape((x.shape[0], -1))
    for h in self.hidden:
      x = nn.relu(nn.Dense(h)(x))
    return nn.Dense(self.num_classes)(x)


def flax_pool(x: jax.Array) -> jax.Array:
  """flax's 2x2 max pooling, as a user writes it without the guide."""
  return nn.max_pool(x, (2, 2), strides=(2, 2), padding="SAME")


class SimpleCNN(nn.Module):
  """pfl-research's `simple_cnn`, as a flax user writes it."""

  num_classes: int
  conv: type = models.PatchConv
  pool: object = staticmethod(models.max_pool_2x2)

  @nn.compact
  def __call__(self, x, train=False):
    x = nn.relu(self.conv(32, (3, 3), padding="VALID")(x))
    x = nn.relu(self.conv(64, (3, 3), padding="VALID")(x))
    x = nn.Dropout(0.25, deterministic=not train)(self.pool(x))
    x = nn.relu(nn.Dense(128)(x.reshape((x.shape[0], -1))))
    x = nn.Dropout(0.5, deterministic=not train)(x)
    return nn.Dense(self.num_classes)(x)
