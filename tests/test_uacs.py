"""UACS-FL: entropy == numpy, top-m and ties == argsort, exploration frequency, grad norms, data."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_sel as fs
from fedjax_sel.client.evaluation import client_gradients, client_metrics
from fedjax_sel.data.boundary import (BoundaryConfig, boundary_clients, boundary_dataset,
                                      signed_distance)
from fedjax_sel.data.federated import ClientPool, device_pool
from fedjax_sel.models import Model
from fedjax_sel.models.bundle import per_example_loss
from fedjax_sel.parts.selectors import uacs
from fedjax_sel.parts.selectors.baselines import random_selector
from fedjax_sel.parts.types import RoundInputs


def logits_model(num_classes):
  """A 'model' whose logits are its inputs: entropy is then a function of the data alone."""
  return Model(init=lambda key: {}, apply=lambda params, x: x, num_classes=num_classes, name="id")


def np_entropy(logits):
  z = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
  p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
  with np.errstate(divide="ignore", invalid="ignore"):
    return -np.sum(np.where(p > 0, p * np.log(p), 0.0), axis=1)


@pytest.mark.parametrize("num_classes", [2, 7])
def test_alpha_equals_numpy_mean_entropy_with_near_zero_probabilities(num_classes):
  rng = np.random.default_rng(num_classes)
  sizes = [5, 1, 12, 3]
  xs = [rng.normal(0, 3, (n, num_classes)).astype(np.float32) for n in sizes]
  xs[2][:4] *= 60.0  # Probabilities that underflow to 0 in float32.
  xs[1][0] = 0.0  # A uniform prediction: entropy log C.
  ys = [rng.integers(0, num_classes, n) for n in sizes]
  pool = device_pool(ClientPool.from_client_arrays(xs, ys))
  got = np.asarray(client_metrics(logits_model(num_classes), {}, pool, batch_size=4).entropy)
  want = [np_entropy(x).mean() for x in xs]
  assert np.isfinite(got).all()
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got[1], np.log(num_classes), rtol=1e-6)


def np_top_m(scores, mask, m):
  idx = np.flatnonzero(mask)
  order = idx[np.argsort(-scores[idx], kind="stable")]  # Ties keep the lower index first.
  return np.sort(order[:m])


def stats_inputs(m, **stats):
  return RoundInputs(0, None, None, {k: jnp.asarray(v) for k, v in stats.items()}, None, None, None,
                     k=m)


@pytest.mark.parametrize("seed", range(5))
def test_top_m_and_ties_equal_numpy_argsort(seed):
  rng = np.random.default_rng(seed)
  n, m = 25, 6
  scores = np.round(rng.random(n), 1).astype(np.float32)  # Many ties.
  mask = rng.random(n) < 0.7
  for sel, stat in ((uacs.entropy_selector(eps=0.0), "entropy"),
                    (uacs.grad_norm_selector(), "grad_norm")):
    chosen, _ = sel.select(sel.init(n, None), jax.random.PRNGKey(seed),
                           stats_inputs(m, **{stat: scores}), jnp.asarray(mask))
    np.testing.assert_array_equal(np.flatnonzero(np.asarray(chosen)), np_top_m(scores, mask, m))


def test_exploration_frequency_and_uniformity():
  n, m, eps, draws = 12, 3, 0.3, 6000
  mask = np.ones(n, bool)
  mask[[0, 5]] = False
  scores = np.arange(n, dtype=np.float32)
  sel = uacs.entropy_selector(eps)
  keys = jax.random.split(jax.random.PRNGKey(0), draws)
  chosen, state = jax.jit(jax.vmap(lambda k: sel.select(
      sel.init(n, None), k, stats_inputs(m, entropy=scores), jnp.asarray(mask))))(keys)
  chosen, explored = np.asarray(chosen), np.asarray(state.explored)
  se = np.sqrt(eps * (1 - eps) / draws)
  assert abs(explored.mean() - eps) < 3 * se
  greedy = np.zeros(n, bool)
  greedy[np_top_m(scores, mask, m)] = True
  assert (chosen[~explored] == greedy).all()
  # Exploring: every client of the mask is picked with probability m / |mask|.
  freq = chosen[explored].mean(axis=0)
  p = m / mask.sum()
  se = np.sqrt(p * (1 - p) / explored.sum())
  assert (freq[~mask] == 0).all()
  assert (np.abs(freq[mask] - p) < 4 * se).all(), freq


@pytest.mark.parametrize("name", ["entropy", "grad_norm", "random"])
def test_selections_stay_in_mask_with_size_min_m(name):
  rng = np.random.default_rng(1)
  n = 15
  for trial in range(20):
    mask = rng.random(n) < rng.uniform(0.05, 1.0)
    m = int(rng.integers(1, n + 1))
    sel = {"entropy": uacs.entropy_selector(0.5), "grad_norm": uacs.grad_norm_selector(),
           "random": random_selector()}[name]
    inputs = stats_inputs(m, entropy=rng.random(n), grad_norm=rng.random(n))
    chosen, _ = sel.select(sel.init(n, None), jax.random.PRNGKey(trial), inputs, jnp.asarray(mask))
    chosen = np.asarray(chosen)
    assert (chosen <= mask).all() and chosen.sum() == min(m, mask.sum())


def test_grad_norms_equal_per_client_grad():
  data, _ = boundary_dataset(BoundaryConfig(num_clients=8, num_boundary=2, samples_per_client=9,
                                            boundary_samples=13), seed=0)
  model = fs.build_model("mlp", data.feature_shape, 2, hidden=(8,))
  params = model.init(jax.random.PRNGKey(1))
  got = np.asarray(client_gradients(model, params, device_pool(data.train), jnp.arange(8),
                                    batch_size=4, chunk_size=3, norm_only=True))
  for k in range(8):
    x, y = data.train.client(k)
    g = jax.grad(lambda p: jnp.mean(per_example_loss(model, p, x, y)))(params)
    want = np.sqrt(sum(float(jnp.sum(a ** 2)) for a in jax.tree.leaves(g)))
    np.testing.assert_allclose(got[k], want, rtol=1e-4)


@pytest.mark.parametrize("scenario", [1, 2, 3])
def test_boundary_data_follows_its_definition(scenario):
  cfg = BoundaryConfig(scenario=scenario, num_clients=20, num_boundary=4, samples_per_client=30)
  xs, ys, is_b = boundary_clients(cfg, seed=3)
  assert is_b.sum() == 4
  for x, y, b in zip(xs, ys, is_b):
    d = signed_distance(x, cfg.line)
    np.testing.assert_array_equal(y, (d > 0).astype(int))
    assert (np.abs(x) <= cfg.domain + 1e-6).all()
    if b:
      limit = cfg.band if scenario == 2 else cfg.box_size * np.sqrt(2) / 2
      assert np.abs(d).max() <= limit + 1e-5
    else:
      assert len(set(y.tolist())) == 1
      gap = cfg.gap1 if y[0] == 1 else cfg.gap0
      assert np.abs(d).min() >= gap - 1e-6
      if scenario == 3:
        assert np.ptp(x, axis=0).max() <= cfg.region_size
  xs2, _, _ = boundary_clients(cfg, seed=3)
  assert all((a == b).all() for a, b in zip(xs, xs2))


@pytest.mark.parametrize("kw,match", [
    (dict(scenario=4), "scenario"), (dict(num_boundary=120), "num_boundary"),
    (dict(samples_per_client=0), "samples_per_client"), (dict(gap1=2.0), "gap1")])
def test_bad_boundary_config_raises(kw, match):
  with pytest.raises(ValueError, match=match):
    boundary_clients(BoundaryConfig(**kw), seed=0)


def test_entropy_selection_costs_and_boundary_picks_in_a_run():
  data, is_b = boundary_dataset(BoundaryConfig(num_clients=30, num_boundary=3,
                                               samples_per_client=20), seed=0)
  model = fs.build_model("logreg", data.feature_shape, 2)
  import optax  # pylint: disable=import-outside-toplevel
  counts = np.asarray(data.train.counts)
  for sel, field in ((uacs.entropy_selector(0.0), "client_eval_samples"),
                     (uacs.grad_norm_selector(), "client_grad_samples")):
    sim = fs.Simulator(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=10),
                       fs.uniform_availability(30, 30), sel, fs.fedavg("uniform"), 3, 0,
                       lr_schedule=fs.constant_lr(0.5))
    recs = fs.run(sim, 8, progress=None)
    assert all(r["cost"][field] == counts.sum() for r in recs)
    other = ({"client_eval_samples", "client_grad_samples"} - {field}).pop()
    assert all(r["cost"][other] == 0 for r in recs)
    if field == "client_eval_samples":  # Once trained, entropy points at the boundary clients.
      assert set(recs[-1]["selected"]) == set(np.flatnonzero(is_b).tolist())
