"""TiFL (`parts/selectors/tifl.py`) against FLGo's and fltk's code (tests/references/tifl.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.parts.selectors import tifl
from fedjax_sel.parts.types import ClientState, RoundInputs, Stats
from tests.references import tifl as theirs


@pytest.mark.parametrize("n,m", [(20, 5), (9, 4), (17, 3)])
def test_tiers_match_fltk(n, m):
  latency = np.random.default_rng(n).lognormal(0.0, 1.0, n)
  groups, _ = theirs.tifl_tiers(latency, m, "fltk")
  tiers = tifl.latency_tiers(latency, m)
  for t, members in enumerate(groups):
    assert sorted(members.tolist()) == np.flatnonzero(tiers == t).tolist()
  if n % m == 0:  # FLGo's equal split agrees.
    flgo, _ = theirs.tifl_tiers(latency, m, "flgo")
    assert [sorted(g.tolist()) for g in flgo] == [sorted(g.tolist()) for g in groups]


@pytest.mark.parametrize("seed", range(4))
def test_probabilities_match_change_probs(seed):
  rng = np.random.default_rng(seed)
  acc = rng.random(6)
  credits = rng.integers(0, 3, 6)
  credits[rng.integers(6)] = 2
  want = theirs.tifl_tier_probabilities(acc, credits, "flgo")
  got = tifl.tier_probabilities(jnp.asarray(acc, jnp.float32), jnp.asarray(credits))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


def test_rounds_take_one_tier_spend_credits_and_follow_accuracy():
  """Each round's clients come from one tier; after I rounds the least accurate tier is the
  likeliest; a tier out of credits is never chosen."""
  n, k = 12, 2
  latency = np.arange(n, dtype=np.float32)  # Tiers {0,1,2}, {3,4,5}, ...
  sel = tifl.tifl_selector(latency, rounds=8, num_tiers=4, interval=2)
  state = sel.init(n, None)
  accuracy = jnp.asarray(np.repeat([0.9, 0.2, 0.6, 0.8], 3), jnp.float32)
  counts = np.zeros(4, int)
  for t in range(8):
    inputs = RoundInputs(jnp.int32(t), None, jnp.ones(n, bool), Stats(accuracy=accuracy),
                         ClientState.create(n), jnp.ones(n, jnp.int32), None, k=k)
    chosen, state = sel.select(state, jax.random.PRNGKey(t), inputs, jnp.ones(n, bool))
    ids = np.flatnonzero(np.asarray(chosen))
    assert len(ids) == k and len(set(ids // 3)) == 1
    counts[ids[0] // 3] += 1
    assert bool(state.evaluated.any()) == (t >= 2 and t % 2 == 0)
    if t == 2:
      assert np.asarray(state.probs).tolist() == pytest.approx([0.1, 0.4, 0.3, 0.2])
  assert counts.tolist() == [2, 2, 2, 2]  # ceil(8 / 4) credits each: all spent.
  assert np.asarray(state.credits).tolist() == [0, 0, 0, 0]
