"""The asynchronous mode (`engine/asynchronous.py`, `parts/asynchronous.py`): against a plain
event-driven reference (`references/async_events.py`) with drops and tied finish times, against
synchronous FedAvg when C = K, batched == sequential, resumed == uninterrupted, and its refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjax_sel as fs
from fedjax_sel.client.system import SystemProfile, client_times
from fedjax_sel.engine.training import train_slots
from fedjax_sel.host import checkpoint
from tests.references import async_events

N, AVAILABLE = 20, 14


def round_robin(k):
  """The K candidates first in the order id - t K (mod N): deterministic, moves every step."""

  def select(state, key, inputs, mask):
    del key
    score = jnp.mod(jnp.arange(N) - inputs.round * k, N)
    return fs.top_k_mask(-score.astype(jnp.float32), mask, k), state

  return fs.Selector(init=lambda n, p: (), select=select, spec={"name": "round_robin"})


def choose_like(k):
  def choose(t, candidates):
    score = np.mod(np.arange(N) - t * k, N).astype(np.float64)
    order = np.argsort(np.where(candidates, score, np.inf), kind="stable")[:k]
    out = np.zeros(N, bool)
    out[order] = True
    return out & candidates
  return choose


@pytest.fixture(scope="module")
def data():
  return fs.build_dataset(fs.DatasetSpec("digits", num_clients=N), seed=0)


def profile(tied: bool) -> SystemProfile:
  """Tied: compute takes no time and three bandwidth tiers, so a tier's clients dispatched
  together finish together; else log-normal speeds and bandwidths."""
  if tied:
    return SystemProfile(np.full(N, 1e12, np.float32),
                         np.array([1e5, 2e5, 4e5] * 7, np.float32)[:N])
  return fs.lognormal_profiles(N, seed=3, speed_median=2000.0, bandwidth_median=1e5)


def simulator(data, spec, k, selector=None, prof=None, avail=None, **kw):
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  return fs.Simulator(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=10),
                      avail or fs.uniform_availability(N, AVAILABLE, period=1),
                      selector or round_robin(k), fs.fedavg(), k, seed=0,
                      system_profile=prof if prof is not None else profile(True),
                      asynchrony=spec, **kw)


def reference(sim, steps, spec):
  cfg, arrays, run = sim.config, sim.arrays, sim.run_values
  leaves, treedef = jax.tree.flatten(sim.init().params)

  def train(t, client, w):
    params = jax.tree.unflatten(treedef, [jnp.asarray(x, jnp.float32) for x in w])
    mask = jnp.zeros(N, bool).at[client].set(True)
    _, _, res = train_slots(cfg, params, arrays, run, mask, 1, jnp.int32(t), run.lr)
    return [np.asarray(x[0], np.float64) for x in jax.tree.leaves(res.params)], float(
        res.samples[0])

  times = jax.jit(lambda train, transfers: client_times(cfg.clock, train, 0.0, 0.0, transfers))

  def duration(client, samples):
    """The clock's time for one client (the engine's formula as XLA rounds it)."""
    one = np.zeros(N, np.float32)
    one[client] = 1.0
    return np.asarray(times(one * samples, 2.0 * one))[client]

  return async_events.simulate(
      params=[np.asarray(x) for x in leaves], steps=steps, k=cfg.k,
      concurrency=spec.concurrency, rule=spec.rule, kind=spec.staleness, a=spec.a, b=spec.b,
      alpha=spec.alpha, window_s=spec.window_s, seed=0,
      available=lambda r: np.asarray(cfg.availability.sample(run.seed, jnp.int32(r))),
      choose=choose_like(cfg.k), train=train, duration=duration,
      num_examples=np.asarray(arrays.counts[0]))


@pytest.mark.parametrize("spec,k,tied", [
    (fs.fedbuff(7, staleness="polynomial", window_s=0.03), 3, True),
    (fs.fedasync(5, staleness="hinge", a=2.0, b=1.0, alpha=0.5, window_s=0.05), 1, False),
])
def test_matches_the_event_driven_reference(data, spec, k, tied):
  sim = simulator(data, spec, k, prof=profile(tied))
  steps = 12
  want, w_ref = reference(sim, steps, spec)
  state = sim.init()
  for t in range(steps):
    state, m = sim.step(state)
    got = {"arrived": np.flatnonzero(np.asarray(m["aggregated_clients"])).tolist(),
           "dropped": int(m["dropped"])}
    fl = state.inflight
    assert got == {"arrived": want[t]["arrived"], "dropped": want[t]["dropped"]}, t
    assert float(m["sim_time_s"]) == pytest.approx(want[t]["now"], rel=1e-6), t
    staleness = want[t]["staleness"]
    if staleness:
      assert int(m["staleness_max"]) == max(staleness)
      assert float(m["staleness_mean"]) == pytest.approx(np.mean(staleness))
    assert int(np.sum(fl.active)) + int(m["num_aggregated"]) + int(m["dropped"]) == int(
        m["concurrency"])
  for got, ref in zip(jax.tree.leaves(state.params), w_ref):
    np.testing.assert_allclose(np.asarray(got), ref, rtol=2e-5, atol=2e-6)
  # The case is the one it claims: some steps dropped clients, some were stale, some tied.
  assert sum(r["dropped"] for r in want) > 0
  assert max(max(r["staleness"], default=0) for r in want) > 0


def test_tied_finish_times_occur_and_break_by_client_id(data):
  sim = simulator(data, fs.fedbuff(7, window_s=0.03), 3)
  fl = sim.step(sim.init())[0].inflight
  finish = np.asarray(fl.finish)[np.asarray(fl.active)]
  assert len(np.unique(finish)) < len(finish)


def test_c_equal_k_without_staleness_is_synchronous_fedavg(data):
  k = 4
  avail = fs.uniform_availability(N, N)
  prof = fs.lognormal_profiles(N, seed=1)
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  sync = fs.Simulator(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=10),
                      avail, fs.random_selector(), fs.fedavg(), k, seed=0, system_profile=prof)
  asyn = simulator(data, fs.fedbuff(k, staleness="constant"), k, selector=fs.random_selector(),
                   prof=prof, avail=avail)
  s_state, a_state = sync.init(), asyn.init()
  for t in range(4):
    s_state, s_m = sync.step(s_state)
    a_state, a_m = asyn.step(a_state)
    np.testing.assert_array_equal(np.asarray(a_m["aggregated_clients"]),
                                  np.asarray(s_m["trained_clients"]))
    assert int(a_m["staleness_max"]) == 0 and int(a_m["num_aggregated"]) == k, t
    for a, s in zip(jax.tree.leaves(a_state.params), jax.tree.leaves(s_state.params)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(s), rtol=1e-5, atol=1e-6)


def test_batched_runs_equal_sequential_ones(data):
  """Two seeds vmapped in one program: the same in-flight clients, versions and arrivals as one
  by one, models within float rounding (as the synchronous runs axis, tests/test_runs.py)."""
  spec = fs.fedbuff(7, window_s=0.03)
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  sims = [fs.Simulator(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=10),
                       fs.uniform_availability(N, AVAILABLE, period=1), fs.random_selector(),
                       fs.fedavg(), 3, seed=s, system_profile=profile(False), asynchrony=spec)
          for s in (0, 1)]
  batch = fs.RunBatch([sim.spec for sim in sims])
  states = batch.init()
  for _ in range(4):
    states, _ = batch.step(states)
  for i, sim in enumerate(sims):
    state = sim.init()
    for _ in range(4):
      state, _ = sim.step(state)
    got = batch.run_slice(states, i)
    for name in ("client", "active", "version"):
      np.testing.assert_array_equal(getattr(got.inflight, name), getattr(state.inflight, name))
    np.testing.assert_array_equal(got.clients.participations, state.clients.participations)
    for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(state.params)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_resumed_in_flight_state_continues_bit_for_bit(data, tmp_path):
  sim = simulator(data, fs.fedbuff(7, window_s=0.03), 3, prof=profile(False))
  whole = sim.init()
  for _ in range(6):
    whole, _ = sim.step(whole)
  half = sim.init()
  for _ in range(3):
    half, _ = sim.step(half)
  path = str(tmp_path / "ckpt")
  checkpoint.save(path, half, {})
  resumed, _ = checkpoint.load(path, sim.init())
  for _ in range(3):
    resumed, _ = sim.step(resumed)
  for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(resumed)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("kw,needle", [
    ({"system_profile": None}, "needs a system_profile"),
    ({"deadline_s": 1.0}, "takes no deadline_s"),
    ({"asynchrony": fs.fedbuff(2)}, "concurrency must be in 3..14"),
    ({"asynchrony": fs.fedbuff(15)}, "concurrency must be in 3..14"),
])
def test_refusals_name_the_argument(data, kw, needle):
  args = {"system_profile": profile(False), "asynchrony": fs.fedbuff(7)}
  args.update(kw)
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  with pytest.raises(ValueError, match=needle):
    fs.Simulator(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=10),
                 fs.uniform_availability(N, AVAILABLE), fs.random_selector(), fs.fedavg(), 3,
                 seed=0, **args)


@pytest.mark.parametrize("kw,needle", [({"rule": "x"}, "rule must be one of"),
                                       ({"staleness": "x"}, "staleness must be one of"),
                                       ({"alpha": 0.0}, "alpha must be in"),
                                       ({"window_s": 0.0}, "window_s must be")])
def test_spec_refusals(kw, needle):
  with pytest.raises(ValueError, match=needle):
    fs.async_spec(4, **kw)
