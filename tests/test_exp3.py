"""The EXP3 bandit sampler (`parts/selectors/exp3.py`) against FedLab's
(tests/references/exp3.py), and its unbiasedness."""

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.parts.selectors import exp3
from fedjax_sel.parts.types import ClientState, RoundInputs
from tests.references.exp3 import MultiArmedBanditSampler
from tests.test_sampling import assert_unbiased


def test_weights_and_probabilities_follow_fedlab_over_rounds():
  """Five rounds of FedLab's draws and feedback (a client drawn twice reports once): our
  weights and probabilities stay equal to FedLab's. A small N, T and L make the steps visible."""
  n, k, rounds, bound = 6, 4, 5, 0.05
  theirs = MultiArmedBanditSampler(n, rounds, bound, np.random.RandomState(0))
  weight = jnp.ones(n, jnp.float32)
  rng = np.random.default_rng(1)
  delta = exp3.exp3_delta(n, rounds, bound, 0.4)
  assert delta == pytest.approx(theirs.delta)
  for _ in range(rounds):
    probs = exp3.exp3_probabilities(weight, 0.4)
    np.testing.assert_allclose(np.asarray(probs), theirs.p, rtol=1e-5)
    theirs.sample(k)
    drawn_ids, _ = theirs.last_sampled
    feedback = rng.uniform(0.5, 3.0, n)
    theirs.update(feedback[drawn_ids])
    drawn = np.zeros(n, bool)
    drawn[drawn_ids] = True
    weight = exp3.exp3_update(weight, jnp.asarray(drawn), probs,
                              jnp.asarray(feedback, jnp.float32), delta)
    np.testing.assert_allclose(np.asarray(weight), theirs.w, rtol=1e-4)
  assert np.ptp(theirs.w) > 0.01


def test_exp3_is_unbiased_with_uneven_weights():
  counts = np.array([5, 40, 12, 30, 25, 9, 20, 14])
  sel = exp3.exp3_selector(rounds=10)
  init = sel.init
  sel = sel._replace(init=lambda n, params: init(n, params)._replace(
      weight=jnp.linspace(0.2, 3.0, n)))
  inputs = RoundInputs(jnp.int32(0), None, jnp.ones(8, bool), {}, ClientState.create(8),
                       jnp.asarray(counts), None, k=3)
  assert_unbiased(sel, inputs, jnp.ones(8, bool).at[2].set(False))


def test_refuses_bad_settings():
  with pytest.raises(ValueError, match="eta"):
    exp3.exp3_selector(10, eta=0.0)
  with pytest.raises(ValueError, match="feedback"):
    exp3.exp3_selector(10, feedback="grad")
