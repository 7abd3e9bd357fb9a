"""Shared fixtures: small federated datasets built in-process (no downloads).

Tests compile with XLA's backend optimization level 0 (here, before JAX starts; launcher
subprocesses inherit it): a test runs each compiled program a few times, so compiling is most of
its time, and level 0 compiles about a quarter faster. Semantics do not change; set
`FEDJAX_SEL_TEST_XLA_OPT=default` to run the suite on fully optimized programs.
"""

import os

if os.environ.get("FEDJAX_SEL_TEST_XLA_OPT", "0") != "default":
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_backend_optimization_level=0").strip()

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from fedjax_sel.data.federated import split_clients
from fedjax_sel.engine import programs
from fedjax_sel.host.compilation import use_persistent_cache
from fedjax_sel.models import from_flax

use_persistent_cache()  # Worker processes and later runs load what another compiled.

# XLA:CPU maps each compiled or loaded executable's code into the process, and a test process keeps
# every program it ran (JAX's caches, `programs.program`): past Linux's vm.max_map_count (65,530 by
# default) the next load fails inside XLA and the process dies with a segmentation fault (every
# serial run of the whole suite did, at 480-810 tests: two test files alone hold 18,600 maps).
# Above `MAX_MAPS` the caches are dropped, which unmaps them (18,600 -> 600), and tests reload.
MAX_MAPS = 30_000


def _maps() -> int:
  try:
    with open("/proc/self/maps", "rb") as f:
      return f.read().count(b"\n")
  except OSError:  # Not Linux: no such limit to keep under.
    return 0


@pytest.fixture(autouse=True)
def _bounded_memory_maps():
  yield
  if _maps() > MAX_MAPS:
    programs.program.cache_clear()
    jax.clear_caches()
    gc.collect()


def ragged_dataset(sizes, num_classes=4, dim=6, seed=0, test_fraction=0.25):
  """Clients of the given sizes with linearly separable-ish labels."""
  rng = np.random.default_rng(seed)
  w = rng.normal(size=(dim, num_classes))
  xs, ys = [], []
  for n in sizes:
    x = rng.normal(size=(n, dim)).astype(np.float32)
    xs.append(x)
    ys.append(np.argmax(x @ w + 0.3 * rng.normal(size=(n, num_classes)), axis=1))
  return split_clients(xs, ys, num_classes=num_classes, val_fraction=0.0,
                       test_fraction=test_fraction, seed=seed)


class _BatchNormMLP(nn.Module):
  """Dense, BatchNorm, ReLU, Dense: the smallest model with batch statistics."""

  num_classes: int = 4

  @nn.compact
  def __call__(self, x, train=False, mask=None):
    mask = None if mask is None else jnp.broadcast_to(mask[:, None].astype(bool), (x.shape[0], 12))
    norm = nn.BatchNorm(use_running_average=not train, momentum=0.9, use_fast_variance=False)
    h = norm(nn.Dense(12)(x.reshape(x.shape[0], -1)), mask=mask)
    return nn.Dense(self.num_classes)(nn.relu(h))


def batch_norm_mlp(input_shape=(6,), num_classes=4):
  """A stateful `Model` (flax variables with `batch_stats`) for ragged_dataset-shaped data."""
  return from_flax(_BatchNormMLP(num_classes), input_shape, num_classes, "bn_mlp", stateful=True)


class _DropoutMLP(nn.Module):
  """Dense, ReLU, Dropout, Dense: training-time randomness, as users write it in flax."""

  num_classes: int = 4
  rate: float = 0.5

  @nn.compact
  def __call__(self, x, train=False):
    h = nn.relu(nn.Dense(16)(x.reshape(x.shape[0], -1)))
    return nn.Dense(self.num_classes)(nn.Dropout(self.rate, deterministic=not train)(h))


def dropout_mlp(input_shape=(6,), num_classes=4, rate=0.5):
  """A stochastic `Model` (dropout in training) for ragged_dataset-shaped data."""
  return from_flax(_DropoutMLP(num_classes, rate), input_shape, num_classes, f"dropout_{rate}",
                   stochastic=True)


@pytest.fixture
def small_data():
  return ragged_dataset([23, 5, 40, 1, 17, 9, 31, 12, 3, 28])
