"""Unbiased client sampling (`parts/selectors/sampling.py`): MD sampling's draws and the
unbiasedness of every reweighted sampler's aggregate."""

import jax
import jax.numpy as jnp
import numpy as np

import fedjax_sel as fs
from fedjax_sel.parts.aggregators import sampled_update
from fedjax_sel.parts.selectors import sampling


def inputs_for(counts, k, **stats):
  n = len(counts)
  return fs.RoundInputs(jnp.int32(0), None, jnp.ones(n, bool), fs.parts.types.Stats(stats),
                        fs.ClientState.create(n), jnp.asarray(counts), None, k=k)


def test_md_draw_frequencies_follow_data_shares():
  """Over many rounds each client's mean draws per round is K m_k / sum m (within 4 standard
  errors); clients outside the mask or without data are never drawn."""
  counts = np.array([10, 0, 30, 60, 100])
  mask = jnp.array([True, True, True, True, False])
  sel = fs.md_selector()
  inp = inputs_for(counts, 4)
  draws = jax.vmap(lambda key: sel.select(sel.init(5, None), key, inp, mask)[1].weights * 4)(
      jax.random.split(jax.random.PRNGKey(0), 4000))
  draws = np.asarray(draws)
  want = 4 * np.array([0.1, 0.0, 0.3, 0.6, 0.0])
  se = draws.std(axis=0) / np.sqrt(len(draws)) + 1e-9
  assert np.all(np.abs(draws.mean(axis=0) - want) <= 4 * se + 1e-6)
  assert np.all(draws.sum(axis=1) == 4) and np.all(draws[:, [1, 4]] == 0)


def test_md_repeated_client_trains_once_and_counts_twice():
  """One client holding all the data is drawn K times: the mask holds it once, its weight is 1."""
  sel = fs.md_selector()
  chosen, state = sel.select(sel.init(3, None), jax.random.PRNGKey(1),
                             inputs_for([0, 5, 0], 3), jnp.ones(3, bool))
  assert chosen.tolist() == [False, True, False]
  assert state.weights.tolist() == [0.0, 1.0, 0.0]


def assert_unbiased(selector, inputs, mask, draws=4000, dim=3, seed=0):
  """The mean of `sampled_update(0, updates, chosen, weights)` over `draws` selections equals
  full participation's `sum_k p_k updates_k` (p_k by data size inside the mask) within 4.5
  standard errors in every coordinate."""
  n = mask.shape[0]
  updates = jax.random.normal(jax.random.PRNGKey(seed + 99), (n, dim))
  state = selector.init(n, None)

  def one(key):
    chosen, new = selector.select(state, key, inputs, mask)
    return sampled_update(jnp.zeros(dim), updates, chosen, selector.sampling_weights(new))

  got = np.asarray(jax.vmap(one)(jax.random.split(jax.random.PRNGKey(seed), draws)))
  want = np.asarray(sampling.data_shares(inputs.num_examples, mask) @ updates)
  se = got.std(axis=0) / np.sqrt(draws)
  assert np.all(np.abs(got.mean(axis=0) - want) <= 4.5 * se + 1e-6), (got.mean(0), want, se)


def test_md_is_unbiased():
  counts = np.array([5, 40, 12, 0, 80, 3, 20, 9])
  mask = jnp.array([True, True, True, True, True, False, True, True])
  assert_unbiased(fs.md_selector(), inputs_for(counts, 3), mask)


def test_robust_aggregators_ignore_sampling_weights():
  """A median aggregates the chosen clients as a set; FedAvg applies the weights."""
  stack = jnp.array([[1.0], [3.0], [8.0]])
  inp = fs.AggregateInputs(jnp.ones(3, bool), jnp.ones(3), jnp.zeros(3),
                           jnp.array([0.5, 0.25, 0.0]))
  median, _ = fs.coordinate_median().apply((), jnp.zeros(1), stack, inp)
  mean, _ = fs.fedavg().apply((), jnp.zeros(1), stack, inp)
  assert median.tolist() == [3.0] and mean.tolist() == [1.25]
  assert fs.fedavg().applies_sampling_weights and not fs.krum().applies_sampling_weights
