"""Clustered sampling (`parts/selectors/clustered.py`) against its authors' code
(tests/references/clustered.py) on fixed inputs, and its unbiasedness."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.parts.selectors import clustered
from fedjax_sel.parts.types import ClientState, RoundInputs
from tests.references import clustered as authors
from tests.test_sampling import assert_unbiased


class _InOrder:
  """A generator whose shuffle keeps the order (the clients of a cluster by id)."""

  @staticmethod
  def shuffle(values):
    del values


def _weights(rng, n, m):
  """Distinct data shares, each at most 1/m (Algorithm 2's domain)."""
  while True:
    w = rng.random(n) + 0.2
    w = w / w.sum()
    if w.max() < 0.98 / m:
      return w


@pytest.mark.parametrize("seed", range(3))
def test_size_distributions_match_algorithm_1(seed):
  rng = np.random.default_rng(seed)
  for n, m in ((7, 3), (20, 5), (13, 13)):
    w = rng.random(n) + 0.05
    w = w / w.sum()
    want = authors.get_clusters_with_alg1(m, w, stop_when_full=True)
    got = clustered.size_distributions(jnp.asarray(w, jnp.float32), jnp.ones(n, bool), m)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


@pytest.mark.parametrize("metric,theirs", [("arccos", "cosine"), ("L1", "L1"), ("L2", "L2")])
def test_dissimilarity_matches_the_authors(metric, theirs):
  g = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
  g[2] = 0.0
  want = [[authors.get_similarity([a], [b], theirs) for b in g] for a in g]
  got = clustered.dissimilarity(jnp.asarray(g), metric)
  np.testing.assert_allclose(np.asarray(got), np.nan_to_num(want), rtol=1e-4, atol=2e-3)


@pytest.mark.parametrize("seed", range(4))
def test_similarity_distributions_match_algorithm_2(seed):
  """Ward on the rows of the dissimilarity matrix, the cut at 1/m, the kept clusters and the
  filling of the rest (clients of a cluster in id order on both sides) equal the authors'."""
  rng = np.random.default_rng(seed)
  n, m = 14, 4
  w = _weights(rng, n, m)
  # Three groups of similar updates, so that the clusters are not ties.
  centers = rng.normal(size=(3, 5))
  g = (centers[rng.integers(0, 3, n)] + 0.3 * rng.normal(size=(n, 5))).astype(np.float32)
  for metric, theirs in (("arccos", "cosine"), ("L2", "L2")):
    want = authors.similarity_distributions(g.astype(np.float64), w, m, theirs, rng=_InOrder())
    dissim = clustered.dissimilarity(jnp.asarray(g), metric)
    got = clustered.similarity_distributions(dissim, jnp.asarray(w, jnp.float32),
                                             jnp.ones(n, bool), m)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


def _inputs(counts, k):
  n = len(counts)
  return RoundInputs(jnp.int32(0), None, jnp.ones(n, bool), {}, ClientState.create(n),
                     jnp.asarray(counts), None, k=k)


def test_rows_are_distributions_with_the_right_column_mass():
  """Every row sums to 1 and client k's column to K p_k, over a mask."""
  rng = np.random.default_rng(5)
  n, k = 12, 3
  mask = jnp.asarray(rng.random(n) < 0.8)
  p = np.where(mask, rng.random(n) + 0.3, 0.0)
  p = jnp.asarray(p / p.sum(), jnp.float32)
  table = jnp.asarray(rng.normal(size=(n, 4)), jnp.float32)
  for rows in (clustered.size_distributions(p, mask, k),
               clustered.similarity_distributions(clustered.dissimilarity(table, "arccos"), p,
                                                  mask, k)):
    np.testing.assert_allclose(np.asarray(rows.sum(axis=1)), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.asarray(rows.sum(axis=0)), k * np.asarray(p), atol=1e-5)
    assert bool(jnp.all(rows[:, ~mask] == 0))


@pytest.mark.parametrize("algorithm", ["size", "similarity"])
def test_clustered_sampling_is_unbiased(algorithm):
  counts = np.array([5, 40, 12, 30, 25, 9, 20, 14, 33, 18])
  sel = clustered.clustered_selector(algorithm)
  table = jax.random.normal(jax.random.PRNGKey(3), (10, 4))
  init = sel.init
  sel = sel._replace(init=lambda n, params: init(n, params)._replace(
      table=table if algorithm == "similarity" else init(n, params).table))
  assert_unbiased(sel, _inputs(counts, 3), jnp.ones(10, bool).at[4].set(False))


def test_a_client_heavier_than_one_kth_falls_back_to_algorithm_1():
  sel = clustered.clustered_selector("similarity")
  state = sel.init(4, {"w": jnp.zeros(2)})
  chosen, state = sel.select(state, jax.random.PRNGKey(0), _inputs([50, 10, 10, 10], 3),
                             jnp.ones(4, bool))
  assert bool(state.fallback) and bool(chosen[0])
  assert float(state.weights.sum()) == pytest.approx(1.0)
