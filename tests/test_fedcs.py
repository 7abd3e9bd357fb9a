"""FedCS (`parts/selectors/fedcs.py`) against SelecEval's greedy (tests/references/fedcs.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.parts.selectors import fedcs
from fedjax_sel.parts.types import RoundInputs
from tests.references.fedcs import fedcs_select


@pytest.mark.parametrize("seed", range(6))
def test_greedy_matches_the_reference(seed):
  """Same kept clients, with the broadcast limited by the slowest selected link; a cap of K
  keeps the first K the uncapped greedy keeps."""
  rng = np.random.default_rng(seed)
  n = 15
  compute = rng.lognormal(0.0, 0.8, n).astype(np.float32)
  transfer = rng.lognormal(-1.5, 0.8, n).astype(np.float32)
  candidates = rng.random(n) < 0.7
  ids = np.flatnonzero(candidates).tolist()
  deadline = float(np.median(compute) * 2.5)
  want = fedcs_select(ids, dict(enumerate(compute.tolist())), dict(enumerate(transfer.tolist())),
                      deadline, dist_time=lambda s: max((float(transfer[c]) for c in s),
                                                        default=0.0), eps=0.0)
  got = fedcs.fedcs_greedy(jnp.asarray(candidates), jnp.asarray(compute), jnp.asarray(transfer),
                           deadline, n)
  assert sorted(want) == np.flatnonzero(np.asarray(got)).tolist() and want
  capped = fedcs.fedcs_greedy(jnp.asarray(candidates), jnp.asarray(compute),
                              jnp.asarray(transfer), deadline, 2)
  assert sorted(want[:2]) == np.flatnonzero(np.asarray(capped)).tolist()


def test_selector_asks_a_share_and_keeps_at_most_k():
  n = 40
  rng = np.random.default_rng(0)
  sel = fedcs.fedcs_selector(rng.uniform(0.5, 3.0, n), rng.uniform(0.05, 0.3, n), deadline_s=3.0,
                             request=0.25)
  mask = jnp.asarray(rng.random(n) < 0.6)
  state = sel.init(n, None)
  for t in range(10):
    chosen, _ = sel.select(state, jax.random.PRNGKey(t), RoundInputs.create(jnp.ones(n), k=4),
                           mask)
    assert 1 <= int(chosen.sum()) <= 4 and bool(jnp.all(chosen <= mask))


def test_refuses_bad_settings():
  with pytest.raises(ValueError, match="deadline"):
    fedcs.fedcs_selector([1.0], [1.0], deadline_s=0.0)
  with pytest.raises(ValueError, match="request"):
    fedcs.fedcs_selector([1.0], [1.0], deadline_s=1.0, request=1.5)


def test_runs_with_other_client_times_share_one_program():
  """The clients' times live in the state, not the selection's code: runs whose data (seeds)
  give other times compile one round."""
  from fedjax_sel.engine.signature import signature  # pylint: disable=import-outside-toplevel
  a = fedcs.fedcs_selector(np.full(10, 1.0), np.full(10, 0.5), 3.0)
  b = fedcs.fedcs_selector(np.arange(10.0), np.full(10, 0.2), 3.0)
  assert signature(a.select) == signature(b.select)
