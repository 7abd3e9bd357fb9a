"""FedCor (`parts/selectors/fedcor.py`) against its authors' code (tests/references/fedcor.py):
the greedy selection, the GP's likelihood, gradient and Adam fit, the discounted mean; and its
schedule of random rounds and fits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.parts.selectors import fedcor
from fedjax_sel.parts.types import ClientState, RoundInputs, Stats
from tests.references import fedcor as authors


@pytest.mark.parametrize("seed", range(5))
def test_greedy_matches_select_clients(seed):
  rng = np.random.default_rng(seed)
  n, k = 20, 5
  x = rng.normal(size=(6, n)) / np.sqrt(6)
  cov = authors.covariance(x)
  p = rng.dirichlet(np.ones(n))
  discount = np.where(rng.random(n) < 0.3, 0.9 ** rng.integers(1, 4, n), 1.0)
  want = authors.select_clients(cov, None, 0.01, k, p, discount)
  got = fedcor.greedy_select(jnp.asarray(x, jnp.float32), jnp.asarray(p, jnp.float32),
                             jnp.asarray(discount, jnp.float32), jnp.ones(n, bool), k)
  assert sorted(want) == np.flatnonzero(np.asarray(got)).tolist()


def _history(rng, n, epochs):
  values = rng.normal(0.0, 0.3, (len(epochs), n))
  data = {e: np.stack([np.arange(n), v], axis=1)[None] for e, v in zip(epochs, values)}
  weights = 0.9 ** (max(epochs) - np.asarray(epochs, float))
  return values, data, weights


def test_likelihood_gradient_mean_and_fit_match_the_authors():
  rng = np.random.default_rng(0)
  n, d = 8, 10  # A well-conditioned Sigma: float32 against the authors' float64.
  x = rng.normal(size=(d, n)) / np.sqrt(d)
  values, data, weights = _history(rng, n, [0, 1, 2, 4])
  mu = authors.mle_mean(data, n, 0.9)
  observed = jnp.ones(values.shape, bool)
  args = (jnp.asarray(values, jnp.float32), observed, jnp.asarray(weights, jnp.float32))
  np.testing.assert_allclose(np.asarray(fedcor.discounted_mean(*args)), mu, rtol=1e-5,
                             atol=1e-6)
  want_loss, want_grad = authors.gp_train_loss_and_grad(x, mu, data, 0.9)
  xj, muj = jnp.asarray(x, jnp.float32), jnp.asarray(mu, jnp.float32)
  assert float(fedcor.gp_loss(xj, muj, *args)) == pytest.approx(want_loss, rel=1e-3)
  np.testing.assert_allclose(np.asarray(jax.grad(fedcor.gp_loss)(xj, muj, *args)), want_grad,
                             rtol=2e-3, atol=2e-3)
  want_x, _, _ = authors.gp_train(x, data, n, 0.9, max_epoches=30, update_mean=True)
  got_x = fedcor.fit(xj, muj, *args, 30)
  np.testing.assert_allclose(np.asarray(got_x), want_x, rtol=1e-3, atol=1e-4)


def test_unobserved_clients_leave_the_likelihood_as_a_smaller_gaussian():
  """A history row where some clients did not report equals the likelihood over the others."""
  rng = np.random.default_rng(1)
  n = 6
  x = rng.normal(size=(8, n))
  value = rng.normal(size=n)
  seen = np.array([True, False, True, True, False, True])
  ids = np.flatnonzero(seen)
  want = -authors.mvn_logpdf(value[ids], np.zeros(len(ids)), authors.covariance(x, ids))
  got = fedcor.gp_loss(jnp.asarray(x, jnp.float32), jnp.zeros(n), jnp.asarray(value[None]),
                       jnp.asarray(seen[None]), jnp.ones(1))
  assert float(got) == pytest.approx(want, rel=1e-4)


def test_schedule_of_random_rounds_fits_and_discounts():
  """Rounds 0..warmup and every interval-th round after are random; the GP is fitted after the
  warm-up and after each later random round; other rounds choose greedily and discount."""
  n, k = 10, 3
  cfg = fedcor.FedCorConfig(warmup=2, interval=3, history=5, beta=0.5)
  sel = fedcor.fedcor_selector(seed=0, config=cfg)
  state = sel.init(n, None)
  rng = np.random.default_rng(0)
  step = jax.jit(lambda state, key, t, loss: sel.select(state, key, RoundInputs(
      t, None, jnp.ones(n, bool), Stats(loss=loss), ClientState.create(n),
      jnp.ones(n, jnp.int32), None, k=k), jnp.ones(n, bool)))
  fitted, greedy = [], []
  for t in range(8):
    loss = jnp.asarray(rng.random(n), jnp.float32)
    chosen, state = step(state, jax.random.PRNGKey(t), jnp.int32(t), loss)
    assert int(chosen.sum()) == k
    fitted.append(bool(state.fitted))
    greedy.append(bool(jnp.any(state.discount < 1.0)) and not bool(state.pending))
    assert bool(state.evaluated.any()) == (t <= 3 or t % 3 == 0 or (t - 1) % 3 == 0)
  # Random rounds: 0, 1, 2, 3, 6. Fits read the last random round's changes: after round 2
  # (the warm-up's end, 1000 steps), 3 and 6.
  assert fitted == [False, False, False, True, True, False, False, True]
  assert greedy[4] and greedy[5] and not greedy[6]
