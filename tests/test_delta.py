"""DELTA (`parts/selectors/delta.py`) against its authors' code (tests/references/delta.py), and
its unbiasedness."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.parts.selectors import delta
from fedjax_sel.parts.types import ClientState, RoundInputs, RoundOutcome, Stats
from tests.references import delta as authors
from tests.test_sampling import assert_unbiased


@pytest.mark.parametrize("seed", range(4))
def test_practical_update_matches_reweight_prac(seed):
  """The trained clients' new probabilities (their mass kept, the others stale) equal the
  authors' reweight_prac, with their updates as the gradients and data sizes as the L."""
  rng = np.random.default_rng(seed)
  n, dim = 10, 4
  probs = rng.dirichlet(np.ones(n)).astype(np.float32)
  counts = rng.integers(5, 60, n)
  slots = np.array([7, 2, 5, 0])
  g = rng.normal(size=(4, dim)).astype(np.float32)
  want = authors.reweight_prac_C1(probs.astype(float), slots.tolist(), g.astype(float),
                                  counts[slots].astype(float), beta=0.5)
  sel = delta.delta_selector()
  state = sel.init(n, None)._replace(probs=jnp.asarray(probs))
  global_params = {"w": jnp.zeros(dim)}
  outcome = RoundOutcome(jnp.asarray(slots), jnp.ones(4, bool), jnp.ones(4, bool), jnp.zeros(4),
                         {"w": jnp.asarray(g)}, None)
  inputs = RoundInputs(jnp.int32(0), global_params, jnp.ones(n, bool), {}, ClientState.create(n),
                       jnp.asarray(counts), None, k=4)
  new = sel.observe(state, inputs, outcome)
  np.testing.assert_allclose(np.asarray(new.probs), want, rtol=1e-5, atol=1e-7)
  assert float(new.probs.sum()) == pytest.approx(1.0, abs=1e-5)


def test_full_probabilities_match_reweight_prac_theory():
  rng = np.random.default_rng(3)
  n = 9
  g = rng.normal(size=(n, 5)).astype(np.float32)
  counts = rng.integers(5, 60, n)
  want = authors.reweight_prac_theory_C2(g.astype(float), counts.astype(float), beta=0.5)
  got = delta.full_probabilities(jnp.asarray(g), jnp.asarray(counts, jnp.float32),
                                 jnp.ones(n, bool), 0.5)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)


@pytest.mark.parametrize("variant", delta.VARIANTS)
def test_delta_is_unbiased(variant):
  counts = np.array([5, 40, 12, 30, 25, 9, 20, 14])
  sel = delta.delta_selector(variant)
  init = sel.init
  sel = sel._replace(init=lambda n, params: init(n, params)._replace(
      probs=jnp.asarray(np.linspace(1.0, 3.0, n) / np.linspace(1.0, 3.0, n).sum(), jnp.float32)))
  grads = {"w": jax.random.normal(jax.random.PRNGKey(1), (8, 3))}
  inputs = RoundInputs(jnp.int32(0), None, jnp.ones(8, bool), Stats(grad=grads),
                       ClientState.create(8), jnp.asarray(counts), None, k=3)
  assert_unbiased(sel, inputs, jnp.ones(8, bool).at[6].set(False))
