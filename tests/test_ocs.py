"""Optimal client sampling (`parts/selectors/ocs.py`) against its authors' AOCS and the paper's
exact optimum (tests/references/ocs.py), its unbiasedness, and the cohort's updates in a round."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjax_sel as fs
from fedjax_sel.parts.selectors import ocs
from fedjax_sel.parts.types import ClientState, RoundInputs
from tests.references import ocs as authors
from tests.test_sampling import assert_unbiased


@pytest.mark.parametrize("seed", range(5))
def test_probabilities_match_the_authors_and_the_optimum(seed):
  rng = np.random.default_rng(seed)
  n = 32
  u = rng.lognormal(0.0, 1.2, n).astype(np.float32)
  for m in (3.0, 8.0, 20.0):
    want = authors.aocs_authors(u, m, j_max=4)
    got = ocs.aocs_probabilities(jnp.asarray(u), jnp.ones(n, bool), m, 4)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=1e-6)
    exact = ocs.aocs_probabilities(jnp.asarray(u), jnp.ones(n, bool), m, 100)
    np.testing.assert_allclose(np.asarray(exact), authors.ocs_exact_paper(u, m), rtol=1e-4,
                               atol=1e-6)
    assert float(exact.sum()) == pytest.approx(m, rel=1e-4)


def _fixed_norms(norms):
  def update_norms(mask):
    return jnp.where(mask, norms, 0.0), jnp.where(mask, 10.0, 0.0)
  return update_norms


def test_ocs_is_unbiased():
  """With the whole mask as the cohort, the aggregate's mean is full participation's."""
  counts = np.array([5, 40, 12, 30, 25, 9, 20, 14])
  norms = jnp.asarray(np.random.default_rng(0).lognormal(0.0, 1.0, 8), jnp.float32)
  inputs = RoundInputs(jnp.int32(0), None, jnp.ones(8, bool), {}, ClientState.create(8),
                       jnp.asarray(counts), None, update_norms=_fixed_norms(norms), k=8)
  assert_unbiased(ocs.ocs_selector(budget=3.0 / 8.0), inputs, jnp.ones(8, bool).at[3].set(False))


def test_the_cohort_trains_and_uploaders_send_that_update(small_data):
  """In a round, the cohort's norms are those of the updates the uploaders then send; the rest
  of the cohort's training is charged in the selector's costs."""
  model = fs.build_model("logreg", small_data.feature_shape, small_data.num_classes)
  n = small_data.num_clients
  sim = fs.Simulator(model, small_data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=4),
                     fs.uniform_availability(n, n), ocs.ocs_selector(budget=0.5), fs.fedavg(),
                     4, 0, lr_schedule=fs.constant_lr(0.1))
  state = sim.init()
  new_state, metrics = sim.step(state)
  sel = new_state.selector_state
  assert int(sel.cohort) == 4 and float(sel.probs.sum()) == pytest.approx(2.0, rel=1e-4)
  uploads = int(metrics["num_trained"])
  assert uploads == int((sel.weights > 0).sum())
  assert float(metrics["cost"]["client_grad_samples"]) == pytest.approx(float(sel.samples))
  assert (float(sel.samples) > 0) == (uploads < 4)
  assert int(metrics["gradients_computed"]) == 4
