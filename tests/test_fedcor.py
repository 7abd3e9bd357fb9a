"""FedCor (`parts/selectors/fedcor.py`) against its authors' code (tests/references/fedcor.py):
the greedy selection, the GP's likelihood, gradient and Adam fit, the discounted mean; and its
schedule of random rounds and fits."""

import re

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


def test_gradient_over_rows_of_different_clients_between_empty_rows_matches_the_authors():
  """Two runs on the runs axis, each history a ring buffer whose live rows observed different
  clients, with empty rows (weight 0, junk values) between them and a different number of live
  rows per run: `gp_grad` visits only the live rows, and equals the authors' gradient."""
  rng = np.random.default_rng(2)
  n, d, rows, gamma = 8, 10, 9, 0.9
  xs, mus, values, observed, weights, wants = [], [], [], [], [], []
  for live_rows in ([1, 4, 6, 7], [0, 2, 3, 5, 8]):
    x = rng.normal(size=(d, n)) / np.sqrt(d)
    value = rng.normal(0.0, 0.3, (rows, n))
    seen = rng.random((rows, n)) < 0.7
    epochs = {r: 10 + i for i, r in enumerate(live_rows)}
    weight = np.array([gamma ** (max(epochs.values()) - epochs[r]) if r in epochs else 0.0
                       for r in range(rows)])
    mu = rng.normal(0.0, 0.1, n)
    data = {epochs[r]: np.stack([np.flatnonzero(seen[r]), value[r, seen[r]]], axis=1)[None]
            for r in live_rows}
    wants.append(authors.gp_train_loss_and_grad(x, mu, data, gamma)[1])
    xs.append(x), mus.append(mu), values.append(value), observed.append(seen)
    weights.append(weight)
  f32 = lambda a: jnp.asarray(np.stack(a), jnp.float32)
  got = jax.jit(jax.vmap(fedcor.gp_grad))(f32(xs), f32(mus), f32(values),
                                           jnp.asarray(np.stack(observed)), f32(weights))
  np.testing.assert_allclose(np.asarray(got), np.stack(wants), rtol=2e-3, atol=2e-3)


def _lapack_shapes(fn, *args):
  """The array shapes of every LAPACK call in `fn`'s compiled program."""
  text = jax.jit(fn).lower(*args).compile().as_text()
  calls = [line for line in text.splitlines() if 'custom_call_target="lapack_' in line]
  assert calls
  return {shape for line in calls for shape in re.findall(r"f32\[([\d,]*)\]", line)}


@pytest.mark.parametrize("everyone", [False, True], ids=["rows_apart", "rows_shared"])
def test_the_fit_under_the_runs_axis_factors_and_solves_one_matrix_at_a_time(everyone):
  """jaxlib 0.10's CPU LAPACK kernels run a batch of matrices on XLA:CPU's thread pool and block a
  pool thread until it is done; two at once deadlock a 2-core machine (a FedCor job hung so). So
  under vmap, as the engine runs a batch of runs, no factor or solve may be batched."""
  runs, n, rows = 2, 6, 4
  rng = np.random.default_rng(3)
  observed = np.ones((runs, rows, n), bool) if everyone else rng.random((runs, rows, n)) < 0.7
  args = (jnp.asarray(rng.normal(size=(runs, 3, n)), jnp.float32), jnp.zeros((runs, n)),
          jnp.asarray(rng.normal(size=(runs, rows, n)), jnp.float32), jnp.asarray(observed),
          jnp.ones((runs, rows)))
  for fn in (jax.vmap(lambda *a: fedcor.fit(*a, 3)), jax.vmap(fedcor.gp_grad)):
    shapes = _lapack_shapes(fn, *args)
    assert all(shape.count(",") <= 1 for shape in shapes), shapes


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
