"""REFL's selection (`parts/selectors/refl.py`) against its authors' rule
(tests/references/refl.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.parts.selectors import refl
from fedjax_sel.parts.types import RoundInputs
from tests.references import refl as authors


def _inputs(later, k):
  return RoundInputs(jnp.int32(3), None, None, {}, None, None, None,
                     available_at=lambda r: jnp.asarray(later), k=k)


@pytest.mark.parametrize("seed", range(6))
def test_least_available_first_as_the_authors_plan(seed):
  """With a perfect predictor: the priority clients (available now, gone next round) are those of
  REFL's getPriority; all of them are picked when at most K (avail_priority 2's must), the rest
  drawn from the others; K of them otherwise. REFL's random base selector takes one client fewer
  (its `len - 1`); we take K."""
  rng = np.random.default_rng(seed)
  n, k = 20, 5
  now = rng.random(n) < 0.7
  later = rng.random(n) < (0.8 if seed % 2 else 0.4)
  online = np.flatnonzero(now).tolist()
  priority = (now & ~later).astype(int)
  must, pool, draw = authors.refl_ips_plan(online, priority, k, avail_priority=2)
  sel = refl.refl_selector(accuracy=1.0)
  for t in range(5):
    chosen, state = sel.select(sel.init(n, None), jax.random.PRNGKey(t), _inputs(later, k),
                               jnp.asarray(now))
    ids = set(np.flatnonzero(np.asarray(chosen)).tolist())
    assert np.flatnonzero(np.asarray(state.priority)).tolist() == authors.refl_ips_sets(
        online, priority)[0]
    assert set(must) <= ids and ids <= set(must) | set(pool)
    assert len(ids) == min(k, len(online)) and draw <= len(ids) - len(must)


def test_an_imperfect_predictor_leaves_a_share_out():
  """accuracy 0.5 keeps int(|P| / 2) priority clients and int(|R| / 2) others each round."""
  n = 12
  now = np.ones(n, bool)
  later = np.arange(n) >= 6  # Clients 0..5 leave.
  sel = refl.refl_selector(accuracy=0.5)
  for t in range(5):
    chosen, state = sel.select(sel.init(n, None), jax.random.PRNGKey(t), _inputs(later, 8),
                               jnp.asarray(now))
    assert int(state.priority.sum()) == 3 and bool(jnp.all(state.priority[6:] == 0))
    assert int(chosen.sum()) == 6 and bool(jnp.all(chosen[:6] == state.priority[:6]))


def test_refuses_bad_accuracy():
  with pytest.raises(ValueError, match="accuracy"):
    refl.refl_selector(accuracy=0.0)
