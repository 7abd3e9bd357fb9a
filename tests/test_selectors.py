"""Selectors against hand-computed cases and reference loops; invariants on random masks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_sel as fs
from fedjax_sel.components import ClientState, RoundInputs, RoundOutcome
from fedjax_sel.selectors import (divfl, facility_location_greedy, power_of_choice,
                                  weighted_sample_without_replacement)


def inputs_for(n, loss=None, batch_loss=None, counts=None, last_loss=None, grad=None):
  clients = ClientState.create(n)
  if last_loss is not None:
    clients = clients._replace(last_loss=jnp.asarray(last_loss, jnp.float32))
  stats = {}
  if loss is not None:
    stats["loss"] = jnp.asarray(loss, jnp.float32)
  if batch_loss is not None:
    stats["batch_loss"] = jnp.asarray(batch_loss, jnp.float32)
  if grad is not None:
    stats["grad"] = {"w": jnp.asarray(grad, jnp.float32)}
  counts = jnp.ones(n, jnp.int32) * 10 if counts is None else jnp.asarray(counts)
  return RoundInputs(jnp.int32(0), {"w": jnp.zeros(2)}, jnp.ones(n, bool), stats, clients, counts,
                     jnp.zeros((n, 2)))


def test_power_of_choice_hand_cases():
  loss = [0.5, 2.0, 1.0, 3.0, 0.1, 2.5]
  mask = jnp.array([True, True, True, False, True, True])
  # d = all clients in the mask: the K highest losses of the mask, whatever the draw.
  chosen, _ = power_of_choice(2, d=6, variant="pow").select((), jax.random.PRNGKey(0),
                                                           inputs_for(6, loss=loss), mask)
  assert np.flatnonzero(chosen).tolist() == [1, 5]
  chosen, _ = power_of_choice(2, d=6, variant="cpow").select(
      (), jax.random.PRNGKey(0), inputs_for(6, batch_loss=[9, 0, 0, 0, 8, 0]), mask)
  assert np.flatnonzero(chosen).tolist() == [0, 4]
  # rpow: never-seen clients have +inf stale loss and come first; ties to the lower index.
  chosen, _ = power_of_choice(3, d=6, variant="rpow").select(
      (), jax.random.PRNGKey(0), inputs_for(6, last_loss=[1.0, np.inf, 5.0, 0, np.inf, 2.0]), mask)
  assert np.flatnonzero(chosen).tolist() == [1, 2, 4]


def test_weighted_sampling_follows_data_fractions():
  weights = jnp.array([1.0, 2.0, 3.0, 4.0])
  keys = jax.random.split(jax.random.PRNGKey(0), 4000)
  picks = jax.vmap(lambda k: weighted_sample_without_replacement(k, weights, jnp.ones(4, bool), 1))(
      keys)
  freq = np.asarray(picks.sum(0)) / 4000
  np.testing.assert_allclose(freq, np.array([0.1, 0.2, 0.3, 0.4]), atol=0.025)


def reference_facility_location(proxies, ground, k):
  idx = [i for i in range(len(ground)) if ground[i]]
  dist = np.linalg.norm(proxies[:, None] - proxies[None], axis=-1)
  chosen = []
  for _ in range(min(k, len(idx))):
    best, best_cost = None, np.inf
    for i in idx:
      if i in chosen:
        continue
      cost = sum(min([dist[j, c] for c in chosen + [i]]) for j in idx)
      if cost < best_cost - 1e-9:
        best, best_cost = i, cost
    chosen.append(best)
  return sorted(chosen)


def test_facility_location_hand_case_and_reference():
  points = jnp.array([[0.0], [1.0], [10.0], [11.0]])
  assert np.flatnonzero(facility_location_greedy(points, jnp.ones(4, bool), 2)).tolist() == [1, 2]
  rng = np.random.default_rng(0)
  for trial in range(6):
    n, k = 12 + trial, 1 + trial
    proxies = rng.normal(size=(n, 4)).astype(np.float32)
    ground = rng.random(n) < 0.7
    got = facility_location_greedy(jnp.asarray(proxies), jnp.asarray(ground), k)
    assert np.flatnonzero(got).tolist() == reference_facility_location(proxies, ground, k)


def test_divfl_uses_stale_table():
  grad = np.array([[0.0, 0], [1, 0], [10, 0], [11, 0]])
  sel = divfl(2)
  state = sel.init(4, {"w": jnp.zeros(2)})
  chosen, state = sel.select(state, None, inputs_for(4, grad=grad), jnp.ones(4, bool))
  assert np.flatnonzero(chosen).tolist() == [1, 2]
  # Fresh gradients have moved, but only client 0 trained: the others keep their stale rows.
  moved = np.array([[100.0, 0], [-50, 0], [-50, 0], [-50, 0]])
  outcome = RoundOutcome(jnp.array([0, 3]), jnp.array([True, False]), jnp.array([True, False]),
                         jnp.zeros(2), None, None)
  state = sel.observe(state, inputs_for(4, grad=moved), outcome)
  np.testing.assert_allclose(np.asarray(state["table"]), [[100, 0], [1, 0], [10, 0], [11, 0]])


SELECTORS = {
    "random": lambda k: fs.random_selector(k),
    "pow": lambda k: power_of_choice(k, variant="pow"),
    "cpow": lambda k: power_of_choice(k, d=3 * k, variant="cpow"),
    "rpow": lambda k: power_of_choice(k, variant="rpow"),
    "divfl": lambda k: divfl(k),
}


@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_selector_invariants(name):
  n = 20
  rng = np.random.default_rng(1)
  inp = inputs_for(n, loss=rng.random(n), batch_loss=rng.random(n),
                   last_loss=np.where(rng.random(n) < 0.5, np.inf, rng.random(n)),
                   counts=rng.integers(1, 50, n), grad=rng.normal(size=(n, 2)))
  for k in (1, 4, 9):
    sel = SELECTORS[name](k)
    select = jax.jit(sel.select)
    state = sel.init(n, {"w": jnp.zeros(2)})
    for trial in range(6):
      key = jax.random.PRNGKey(trial)
      mask = jax.random.bernoulli(jax.random.fold_in(key, 7), 0.1 + 0.15 * trial, (n,))
      chosen, _ = select(state, key, inp, mask)
      assert chosen.dtype == bool and chosen.shape == (n,)
      assert bool(jnp.all(chosen <= mask))
      assert int(chosen.sum()) == min(k, int(mask.sum()))
