"""Shared fixtures: small federated datasets built in-process (no downloads)."""

import numpy as np
import pytest

from fedjax_sel.data.federated import split_clients


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


@pytest.fixture
def small_data():
  return ragged_dataset([23, 5, 40, 1, 17, 9, 31, 12, 3, 28])
