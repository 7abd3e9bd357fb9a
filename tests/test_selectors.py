"""Selectors against hand-computed cases and reference loops; invariants on random masks."""

import inspect
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_sel as fs
from fedjax_sel import registry
from fedjax_sel.parts.selectors.baselines import (divfl, facility_location_greedy, power_of_choice,
                                                  weighted_sample_without_replacement)
from fedjax_sel.parts.types import ClientState, RoundInputs, RoundOutcome


def inputs_for(n, k, loss=None, batch_loss=None, counts=None, last_loss=None, grad=None,
               round_idx=0):
  clients = ClientState.create(n)
  if last_loss is not None:
    clients = clients._replace(last_loss=jnp.asarray(last_loss, jnp.float32))
  stats = {}
  if loss is not None:
    stats["loss"] = jnp.asarray(loss, jnp.float32)
  if batch_loss is not None:
    stats["batch_loss"] = jnp.asarray(batch_loss, jnp.float32)
  gradients = None
  if grad is not None:
    gradients = lambda ids: {"w": jnp.asarray(grad, jnp.float32)[ids]}
  counts = jnp.ones(n, jnp.int32) * 10 if counts is None else jnp.asarray(counts)
  return RoundInputs(jnp.int32(round_idx), {"w": jnp.zeros(2)}, jnp.ones(n, bool), stats, clients,
                     counts, jnp.zeros((n, 2)), gradients, k=k)


def test_power_of_choice_hand_cases():
  loss = [0.5, 2.0, 1.0, 3.0, 0.1, 2.5]
  mask = jnp.array([True, True, True, False, True, True])
  # d = all clients in the mask: the K highest losses of the mask, whatever the draw.
  chosen, _ = power_of_choice(d=6, variant="pow").select((), jax.random.PRNGKey(0),
                                                        inputs_for(6, 2, loss=loss), mask)
  assert np.flatnonzero(chosen).tolist() == [1, 5]
  chosen, _ = power_of_choice(d=6, variant="cpow").select(
      (), jax.random.PRNGKey(0), inputs_for(6, 2, batch_loss=[9, 0, 0, 0, 8, 0]), mask)
  assert np.flatnonzero(chosen).tolist() == [0, 4]
  # rpow: never-seen clients have +inf stale loss and come first; ties to the lower index.
  chosen, _ = power_of_choice(d=6, variant="rpow").select(
      (), jax.random.PRNGKey(0), inputs_for(6, 3, last_loss=[1.0, np.inf, 5.0, 0, np.inf, 2.0]),
      mask)
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
  sel = divfl()
  state = sel.init(4, {"w": jnp.zeros(2)})
  chosen, state = sel.select(state, None, inputs_for(4, 2, grad=grad), jnp.ones(4, bool))
  assert np.flatnonzero(chosen).tolist() == [1, 2]
  outcome = RoundOutcome(jnp.array([0, 3]), jnp.array([True, False]), jnp.array([True, False]),
                         jnp.zeros(2), None, None)
  # The filling round's rows already are the gradients at w_t: observing recomputes none.
  state = sel.observe(state, inputs_for(4, 2, grad=grad), outcome)
  assert int(sel.costs(state).gradients_computed) == 4
  # Next round the gradients have moved, but only client 0 trained: the others keep stale rows,
  # and only the K = 2 slots' gradients are computed.
  moved = np.array([[100.0, 0], [-50, 0], [-50, 0], [-50, 0]])
  chosen, state = sel.select(state, None, inputs_for(4, 2, grad=moved, round_idx=1),
                             jnp.ones(4, bool))
  assert np.flatnonzero(chosen).tolist() == [1, 2]  # Selected on the stale table.
  state = sel.observe(state, inputs_for(4, 2, grad=moved, round_idx=1), outcome)
  np.testing.assert_allclose(np.asarray(state.table), [[100, 0], [1, 0], [10, 0], [11, 0]])
  assert int(sel.costs(state).gradients_computed) == 2


SELECTORS = {
    "random": fs.random_selector,
    "pow": lambda: power_of_choice(variant="pow"),
    "cpow": lambda: power_of_choice(d=27, variant="cpow"),
    "rpow": lambda: power_of_choice(variant="rpow"),
    "divfl": divfl,
}


@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_selector_invariants(name):
  n = 20
  rng = np.random.default_rng(1)
  every_k = inputs_for(n, None, loss=rng.random(n), batch_loss=rng.random(n),
                       last_loss=np.where(rng.random(n) < 0.5, np.inf, rng.random(n)),
                       counts=rng.integers(1, 50, n), grad=rng.normal(size=(n, 2)))
  sel = SELECTORS[name]()  # One selector for every K: it reads K from its inputs.
  for k in (1, 4, 9):
    inp = every_k._replace(k=k)
    select = jax.jit(lambda s, key, m, inp=inp: sel.select(s, key, inp, m))
    state = sel.init(n, {"w": jnp.zeros(2)})
    for trial in range(6):
      key = jax.random.PRNGKey(trial)
      mask = jax.random.bernoulli(jax.random.fold_in(key, 7), 0.1 + 0.15 * trial, (n,))
      chosen, _ = select(state, key, mask)
      assert chosen.dtype == bool and chosen.shape == (n,)
      assert bool(jnp.all(chosen <= mask))
      assert int(chosen.sum()) == min(k, int(mask.sum()))


def eager_divfl(k):
  """SPEC section 5 as first built: the engine computes every client's gradient every round (the
  `grad` stat); the table is filled from them at round 0 and refreshed for the trained clients."""
  def flat(grads):
    return jnp.concatenate([g.reshape(g.shape[0], -1) for g in jax.tree.leaves(grads)], axis=1)

  def select(state, key, inputs, mask):
    table = jnp.where(state["filled"], state["table"], flat(inputs.stats["grad"]))
    return facility_location_greedy(table, mask, k), {"table": table, "filled": jnp.ones((), bool)}

  def observe(state, inputs, outcome):
    rows = jnp.where(outcome.trained[:, None], flat(inputs.stats["grad"])[outcome.slots],
                     state["table"][outcome.slots])
    return {**state, "table": state["table"].at[outcome.slots].set(rows)}

  def init(n, params):
    dim = sum(int(np.size(a)) for a in jax.tree.leaves(params))
    return {"table": jnp.zeros((n, dim)), "filled": jnp.zeros((), bool)}

  return fs.Selector(init, select, needs=("grad",), observe=observe)


def test_divfl_same_selections_with_fewer_gradients(small_data):
  """A seeded run selects the same clients and ends at the same model as the eager version, while
  the engine computes N gradients on the first round and K per round after, not N every round."""
  from tests.test_engine import make_sim  # pylint: disable=import-outside-toplevel
  rounds, n, k = 5, small_data.num_clients, 3
  runs = {}
  for name, sel in (("eager", eager_divfl(k)), ("lazy", divfl())):
    sim = make_sim(small_data, seed=2, k=k, n=8, selector=sel)
    state, recs = sim.init(), []
    for _ in range(rounds):
      state, metrics = sim.step(state)
      recs.append(metrics)
    runs[name] = (state, recs)
  (eager, eager_recs), (lazy, lazy_recs) = runs["eager"], runs["lazy"]
  for a, b in zip(eager_recs, lazy_recs):
    assert np.asarray(a["selected"]).tolist() == np.asarray(b["selected"]).tolist()
  np.testing.assert_allclose(np.asarray(eager.selector_state["table"]),
                             np.asarray(lazy.selector_state.table), rtol=1e-6, atol=1e-7)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), eager.params,
               lazy.params)
  assert [int(r["gradients_computed"]) for r in eager_recs] == [n] * rounds
  assert [int(r["gradients_computed"]) for r in lazy_recs] == [n] + [k] * (rounds - 1)
  # Clients' cost: everyone's samples once, then the trained clients' (the eager version charged
  # every available client every round).
  counts = np.asarray(small_data.train.counts)
  want = counts.sum() + sum(counts[np.asarray(r["trained_clients"])].sum() for r in lazy_recs[1:])
  assert float(lazy_recs[-1]["cumulative_cost"]["client_grad_samples"]) == float(want)


def test_no_selector_factory_takes_k():
  """K has one owner, the engine (`inputs.k`): no registered selector's factory, nor any public
  factory of a module that registers one, takes it; none checks it."""
  names = registry.names("selector")
  assert {"random", "poc", "oort", "entropy", "ocs"} <= set(names)
  for name in names:
    entry = registry.lookup("selector", name)
    module = inspect.getmodule(entry.factory)
    factories = [entry.factory] + [
        f for _, f in inspect.getmembers(module, inspect.isfunction)
        if f.__module__ == module.__name__ and inspect.signature(f).return_annotation
        in ("Selector", fs.Selector)]
    for factory in factories:
      taken = set(inspect.signature(factory).parameters) & {"k", "m", "clients_per_round"}
      assert not taken, (name, factory.__qualname__, taken)
  root = pathlib.Path(fs.__file__).parent / "parts" / "selectors"
  assert not [p.name for p in root.glob("*.py") if "k < 1" in p.read_text(encoding="utf-8")]


def test_one_selector_chooses_the_k_of_its_inputs():
  sel = power_of_choice()
  inp = inputs_for(10, None, loss=np.arange(10.0))
  state = sel.init(10, None)
  for k in (2, 5):
    chosen, _ = sel.select(state, jax.random.PRNGKey(0), inp._replace(k=k), jnp.ones(10, bool))
    assert int(chosen.sum()) == k
