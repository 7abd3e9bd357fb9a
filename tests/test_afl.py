"""AFL (`parts/selectors/afl.py`) against Plato's implementation (tests/references/afl.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.parts.selectors import afl
from fedjax_sel.parts.types import ClientState, RoundInputs, RoundOutcome
from tests.references import afl as plato


def inputs_for(counts, k):
  n = len(counts)
  return RoundInputs(jnp.int32(1), None, jnp.ones(n, bool), {}, ClientState.create(n),
                     jnp.asarray(counts), None, k=k)


@pytest.mark.parametrize("seed", range(4))
def test_probabilities_match_plato(seed):
  """The weighted draw's probabilities equal Plato's, with some clients never valued."""
  rng = np.random.default_rng(seed)
  n = 17
  values = rng.normal(3.0, 40.0, n)
  values[rng.random(n) < 0.3] = -np.inf
  for alpha1, alpha2 in ((0.75, 0.01), (0.3, 0.05), (0.0, 0.02)):
    want = plato.round_probabilities(values.tolist(), alpha1, alpha2)
    got = afl.afl_probabilities(jnp.asarray(values, jnp.float32), jnp.ones(n, bool), alpha1,
                                alpha2)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=1e-7)


def test_selection_counts_and_valuations():
  """floor((1 - alpha3) K) clients come from the weighted draw (only valued ones), the rest
  uniformly; a trained client's valuation is the paper's (or Plato's) from its training loss."""
  n, k = 12, 5
  counts = np.arange(1, n + 1) * 4
  valuation = jnp.where(jnp.arange(n) < 6, jnp.arange(n, dtype=jnp.float32), -jnp.inf)
  state = afl.AFLState(valuation)
  for alpha1 in (0.5, 0.0):
    # alpha1 = 0.5 leaves out the lowest 6: the 6 unvalued, so all 6 valued clients stay; with
    # alpha1 = 0 likewise: the int(0.8 * 5) = 4 weighted draws come from clients 0..5.
    sel = afl.afl_selector(alpha1=alpha1, alpha2=1.0, alpha3=0.2)
    probs = afl.afl_probabilities(valuation, jnp.ones(n, bool), alpha1, 1.0)
    assert bool(jnp.all((probs > 0) == (jnp.arange(n) < 6)))
    for t in range(20):
      chosen, _ = sel.select(state, jax.random.PRNGKey(t), inputs_for(counts, k),
                             jnp.ones(n, bool))
      assert int(chosen.sum()) == k and int(chosen[:6].sum()) >= 4
  outcome = RoundOutcome(jnp.array([2, 7]), jnp.array([True, True]), jnp.array([True, True]),
                         jnp.array([0.5, 2.0]), None, None)
  for paper in (True, False):
    sel = afl.afl_selector(valuation="paper" if paper else "plato")
    new = sel.observe(sel.init(n, None), inputs_for(counts, k), outcome)
    want = [plato.valuation(counts[i], loss, paper) for i, loss in ((2, 0.5), (7, 2.0))]
    np.testing.assert_allclose(np.asarray(new.valuation)[[2, 7]], want, rtol=1e-6)
    assert int(jnp.sum(jnp.isfinite(new.valuation))) == 2


def test_first_round_is_uniform():
  """Before any valuation the weighted draw is empty: K uniform clients of the mask."""
  sel = afl.afl_selector()
  mask = jnp.array([True, False, True, True, True, False])
  hits = np.zeros(6)
  for t in range(300):
    chosen, _ = sel.select(sel.init(6, None), jax.random.PRNGKey(t), inputs_for([5] * 6, 3), mask)
    assert int(chosen.sum()) == 3 and bool(jnp.all(chosen <= mask))
    hits += np.asarray(chosen)
  assert np.all(np.abs(hits[[0, 2, 3, 4]] / 300 - 0.75) < 0.1)


def test_refuses_bad_settings():
  with pytest.raises(ValueError, match="alpha1"):
    afl.afl_selector(alpha1=1.0)
  with pytest.raises(ValueError, match="valuation"):
    afl.afl_selector(valuation="sum")
