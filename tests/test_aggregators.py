"""Robust aggregators against direct numpy transcriptions of their textbook definitions."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.parts import aggregators as agg
from fedjax_sel.parts.types import AggregateInputs


def stacked(k, seed, ties=False):
  rng = np.random.default_rng(seed)
  tree = {"w": rng.normal(size=(k, 3, 2)), "b": rng.normal(size=(k, 4))}
  if ties:  # Repeated values in every coordinate.
    tree = {n: np.round(a * 2) / 2 for n, a in tree.items()}
  return {n: a.astype(np.float32) for n, a in tree.items()}


def np_median(rows):
  return np.median(rows, axis=0)


def np_trimmed(rows, beta, rounding):
  n = len(rows)
  t = math.floor(beta * n) if rounding == "floor" else math.ceil(beta * n)
  t = min(t, (n - 1) // 2)
  s = np.sort(rows, axis=0)
  return s[t:n - t].mean(axis=0)


def np_krum_scores(flat, f):
  n = len(flat)
  closest = max(n - f - 2, 1)
  scores = []
  for i in range(n):
    d = sorted(float(np.sum((flat[i] - flat[j]) ** 2)) for j in range(n) if j != i)
    scores.append(sum(d[:closest]))
  return np.array(scores)


def flat(tree, idx):
  return np.concatenate([tree["b"][idx].reshape(len(idx), -1),
                         tree["w"][idx].reshape(len(idx), -1)], axis=1)


def run(aggregator, tree, mask, losses=None, dtype=jnp.float32):
  k = len(mask)
  params = jax.tree.map(lambda a: jnp.asarray(a, dtype), tree)
  glob = jax.tree.map(lambda a: jnp.zeros(a.shape[1:], dtype), tree)
  losses = np.zeros(k, np.float32) if losses is None else losses
  inputs = AggregateInputs(jnp.asarray(mask), jnp.ones(k), jnp.asarray(losses, jnp.float32))
  new, _ = jax.jit(aggregator.apply)((), glob, params, inputs)
  return jax.tree.map(lambda a: np.asarray(a, np.float32), new)


def masked_cases():
  for k, n_in, ties in ((7, 7, False), (8, 6, False), (9, 5, True), (6, 6, True)):
    mask = np.zeros(k, bool)
    mask[np.random.default_rng(k).permutation(k)[:n_in]] = True
    yield k, mask, ties


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("k,mask,ties", list(masked_cases()))
def test_median_and_trimmed_mean_equal_numpy(k, mask, ties, dtype):
  tree = stacked(k, seed=k, ties=ties)
  # Masked-out slots hold huge values: they must not move anything.
  tree = {n: np.where(mask.reshape(-1, *[1] * (a.ndim - 1)), a, 1e6).astype(np.float32)
          for n, a in tree.items()}
  ref_tree = jax.tree.map(lambda a: np.asarray(jnp.asarray(a, dtype), np.float32), tree)
  idx = np.flatnonzero(mask)
  atol = 1e-6 if dtype == jnp.float32 else 2e-2
  got = run(agg.coordinate_median(), tree, mask, dtype=dtype)
  for name in tree:
    np.testing.assert_allclose(got[name], np_median(ref_tree[name][idx]), atol=atol)
  for beta in (0.0, 0.2, 0.3):
    for rounding in agg.TRIM_ROUNDINGS:
      got = run(agg.trimmed_mean(beta, rounding), tree, mask, dtype=dtype)
      for name in tree:
        np.testing.assert_allclose(got[name], np_trimmed(ref_tree[name][idx], beta, rounding),
                                   atol=atol, err_msg=f"beta={beta} {rounding}")


def test_trim_counts_canonical_and_ceil():
  assert int(agg.trim_count(jnp.asarray(10), 0.3, "floor")) == 3
  assert int(agg.trim_count(jnp.asarray(7), 0.3, "floor")) == 2
  assert int(agg.trim_count(jnp.asarray(7), 0.3, "ceil")) == 3
  assert int(agg.trim_count(jnp.asarray(3), 0.45, "ceil")) == 1  # Leaves one value.


@pytest.mark.parametrize("k,mask,ties", list(masked_cases()))
@pytest.mark.parametrize("f", [1, 0.2])
def test_krum_scores_and_choice_equal_brute_force(k, mask, ties, f):
  tree = stacked(k, seed=10 + k, ties=ties)
  idx = np.flatnonzero(mask)
  n = len(idx)
  count = f if isinstance(f, int) else int(f * n)
  rows = agg.flatten_stack(jax.tree.map(jnp.asarray, tree))
  scores = np.asarray(agg.krum_scores(rows, jnp.asarray(mask), f))
  want = np_krum_scores(flat(tree, idx), count)
  np.testing.assert_allclose(scores[idx], want, rtol=1e-4, atol=1e-4)
  assert np.isinf(scores[~mask]).all()
  # Krum: the best-scored model (ties to the lower slot).
  best = idx[np.argmin(want)]
  got = run(agg.krum(f), tree, mask)
  for name in tree:
    np.testing.assert_allclose(got[name], tree[name][best], atol=1e-6)
  # Multi-Krum with m = 3, and with m = n - f.
  for multi, m in ((3, 3), (0, n - count)):
    pick = idx[np.argsort(want, kind="stable")[:m]]
    got = run(agg.krum(f, multi=multi), tree, mask)
    for name in tree:
      np.testing.assert_allclose(got[name], tree[name][pick].mean(0), atol=1e-5)


def test_normalized_krum_scores_directions():
  rows = jnp.array([[1.0, 0.0], [10.0, 0.0], [0.0, 1.0], [0.0, 3.0], [1.0, 1.0]])
  s = np.asarray(agg.krum_scores(rows, jnp.ones(5, bool), 0, normalize=True))
  unit = np.asarray(rows) / np.linalg.norm(np.asarray(rows), axis=1, keepdims=True)
  np.testing.assert_allclose(s, np_krum_scores(unit, 0), rtol=1e-5, atol=1e-6)


def test_krum_condition_is_checked():
  agg.check_krum(7, 2)
  with pytest.raises(ValueError, match="n >= 2f \\+ 3"):
    agg.check_krum(6, 2)
  with pytest.raises(ValueError, match="n >= 2f \\+ 3"):
    agg.check_krum(10, 0.4)
  with pytest.raises(ValueError, match="krum_f"):
    agg.krum(0.7)


def np_fedasl(losses, alpha, beta):
  med = np.median(losses)
  s = np.sqrt(np.mean((losses - med) ** 2))
  if s == 0:
    return np.full(len(losses), 1.0 / len(losses))
  v = np.where(np.abs(losses - med) <= alpha * s, beta * s, np.abs(losses - med))
  w = 1.0 / v
  return w / w.sum()


@pytest.mark.parametrize("losses", [
    [0.5, 0.7, 0.6, 3.0, 0.55, 0.65], [1.0, 2.0, 3.0, 4.0, 5.0], [0.4, 0.4, 0.4, 0.4]])
def test_fedasl_equals_formula_including_zero_spread(losses):
  k = len(losses) + 2
  mask = np.array([True] * len(losses) + [False, False])
  full = np.array(list(losses) + [100.0, -5.0], np.float32)
  w = np.asarray(agg.fedasl_weights(jnp.asarray(full), jnp.asarray(mask), 1.0, 0.2))
  np.testing.assert_allclose(w[mask], np_fedasl(np.array(losses, np.float64), 1.0, 0.2), rtol=1e-5)
  assert (w[~mask] == 0).all() and np.isfinite(w).all()
  tree = stacked(k, seed=3)
  got = run(agg.fedasl(), tree, mask, losses=full)
  for name in tree:
    np.testing.assert_allclose(got[name], np.tensordot(w, tree[name], axes=1), atol=1e-5)


@pytest.mark.parametrize("aggregator", [agg.coordinate_median(), agg.trimmed_mean(), agg.krum(1),
                                        agg.fedasl()])
def test_no_aggregated_slot_keeps_the_global_model(aggregator):
  tree = stacked(5, seed=0)
  params = jax.tree.map(jnp.asarray, tree)
  glob = jax.tree.map(lambda a: jnp.full(a.shape[1:], 7.0), tree)
  inputs = AggregateInputs(jnp.zeros(5, bool), jnp.ones(5), jnp.zeros(5))
  new, _ = aggregator.apply((), glob, params, inputs)
  assert all(bool((a == 7.0).all()) for a in jax.tree.leaves(new))


@pytest.mark.parametrize("k", [1, 2, 3, 4, 7, 10, 33])
def test_the_slot_sort_equals_jnp_sort_bit_for_bit(k):
  # The robust aggregators sort the K slots with a compare-exchange network on CPU (33 slots:
  # jnp.sort itself); it must give jnp.sort's values in its order, NaNs last, zeros of either
  # sign and subnormals kept where its stable sort keeps them.
  rng = np.random.default_rng(k)
  special = np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1.0, -1.0, 5e-45, -5e-45,
                      1e-38, -1.18e-38], np.float32)
  x = rng.normal(size=(k, 40, 3)).astype(np.float32)
  pick = rng.random(x.shape) < 0.35
  x[pick] = rng.choice(special, size=pick.sum())
  got = jax.jit(agg.sort_slots)(jnp.asarray(x))
  want = jax.jit(lambda a: jnp.sort(a, axis=0))(jnp.asarray(x))
  np.testing.assert_array_equal(np.asarray(got).view(np.uint32), np.asarray(want).view(np.uint32))
