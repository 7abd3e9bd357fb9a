"""Selectors whose work grows faster than N say so before round 0 (`engine/footprints.py`): at
N = 5,000 FedCor and clustered sampling by similarity are warned with their estimates, or refused
when the GP fit factors one matrix per live history row; at N = 20,000 both are refused with their
memory estimates instead of running out of memory; a linear selector is neither. Every run here
is only built (nothing compiles)."""

import re
import warnings

import numpy as np
import optax
import pytest

import fedjax_sel as fs
from fedjax_sel.data.federated import ClientPool, FederatedDataset, label_histogram
from fedjax_sel.engine import footprints
from fedjax_sel.parts.selectors.clustered import clustered_selector
from fedjax_sel.parts.selectors.delta import delta_selector
from fedjax_sel.parts.selectors.fedcor import fedcor_selector
from fedjax_sel.parts.selectors.ocs import ocs_selector


def _population(n: int) -> FederatedDataset:
  """N clients of one 2-D training example and one test example each (two classes)."""
  rng = np.random.default_rng(0)

  def pool():
    ids = np.arange(n, dtype=np.int32)
    return ClientPool(rng.normal(size=(n, 2)).astype(np.float32), ids % 2, ids, ids,
                      np.ones(n, np.int32))
  train, test = pool(), pool()
  empty = ClientPool(np.zeros((0, 2), np.float32), np.zeros(0, np.int32), np.zeros(0, np.int32),
                     np.zeros(n, np.int32), np.zeros(n, np.int32))
  return FederatedDataset(train, empty, test, np.zeros((0, 2), np.float32), np.zeros(0, np.int32),
                          2, label_histogram(train, 2), name=f"population/{n}")


def _build(selector, n: int, available: int | None = None):
  data = _population(n)
  return fs.build_run(fs.build_model("logreg", (2,), 2), data, optax.sgd,
                      fs.LocalHParams(batch_size=1, chunk_size=8),
                      fs.uniform_availability(n, available or n), selector, fs.fedavg(), 10,
                      seed=0)


@pytest.fixture(name="memory_24gib")
def _memory_24gib(monkeypatch):
  """A device of 24 GiB (this project's CPU machine), whatever the machine running the test."""
  monkeypatch.setattr(footprints, "device_memory_bytes", lambda: 24 * 2**30)


@pytest.mark.parametrize("selector, estimate", [
    (fedcor_selector(), r"takes about [\d.]+ h in its costliest round \(the GP fit after the "
                           r"warm-up: 1000 Adam steps, each factoring the \[N, N\] covariance "
                           r"once\) and 1\.3 GiB of memory"),
    (clustered_selector("similarity"), r"takes about \d+ min in its costliest round \(every "
                                          r"round: Ward's 4999 merges"),
])
def test_a_selector_costing_more_than_linear_in_n_warns_with_its_estimate(selector, estimate,
                                                                         memory_24gib):
  name = selector.spec["name"]
  with pytest.warns(UserWarning, match=rf"the selector '{name}' at N = 5000 clients {estimate}"):
    spec = _build(selector, 5000)
  assert spec.num_clients == 5000


def test_fedcor_fitting_one_factor_per_history_row_is_refused(memory_24gib):
  with pytest.raises(ValueError, match=r"'fedcor' at N = 5000 clients takes about [\d.]+ h .*"
                                       r"once per live history row \(16: clients' availability "
                                       r"varies\).*more than 12 h a round; run it with fewer "
                                       r"clients, or a shorter fedcor warmup or history"):
    _build(fedcor_selector(), 5000, available=500)


@pytest.mark.parametrize("selector, memory, over", [
    (fedcor_selector(), "20.9", "more than 50% of the device's 24.0 GiB and more than 12 h"),
    (clustered_selector("similarity"), "4.8", "more than 12 h a round"),
])
def test_at_20000_clients_both_are_refused_with_their_memory_estimate(selector, memory, over,
                                                                      memory_24gib):
  name = selector.spec["name"]
  with pytest.raises(ValueError, match=rf"the selector '{name}' at N = 20000 clients takes about "
                                       rf".* and {memory} GiB of memory, estimated before round 0 "
                                       rf".*: {re.escape(over)}"):
    _build(selector, 20000)


@pytest.mark.parametrize("selector", [fs.random_selector(), clustered_selector("size"),
                                      ocs_selector(), delta_selector()])
def test_a_linear_selector_at_20000_clients_is_neither_warned_nor_refused(selector, memory_24gib):
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    _build(selector, 20000)
  assert not [w for w in caught if "costliest round" in str(w.message)]
