"""The asynchronous mode (`engine/asynchronous.py`, `async_schedule.py`, `parts/asynchronous.py`):
against a heap-based event simulation of FedBuff's and FedAsync's servers
(`references/async_events.py`) with drops, ties, discarded stale updates and fast clients
arriving inside one buffer; FedBuff's steady-state staleness and speed under uniform selection;
batched == sequential, resumed == uninterrupted, and its refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjax_sel as fs
from fedjax_sel.client.local_training import local_train, samples_per_client
from fedjax_sel.client.system import SystemProfile, client_times
from fedjax_sel.engine import async_schedule, checks
from fedjax_sel.host import checkpoint
from fedjax_sel.host.compilation import CompileLog
from tests.references import async_events

N, AVAILABLE = 20, 14


def stepping(n):
  """Dispatches the candidate first in the order (7 id + 5 calls) mod N, calls counted in its
  state: deterministic, and moves with every dispatch."""

  def select(state, key, inputs, mask):
    del key
    score = jnp.mod(7 * jnp.arange(n) + 5 * state, n).astype(jnp.float32)
    return fs.top_k_mask(-score, mask, inputs.k), state + 1

  return fs.Selector(init=lambda n, p: jnp.zeros((), jnp.int32), select=select,
                     spec={"name": "stepping"})


def choose_like(n):
  calls = [0]

  def choose(t, j, candidates):
    del t, j
    score = np.mod(7 * np.arange(n) + 5 * calls[0], n).astype(np.float64)
    calls[0] += 1
    return int(np.argmin(np.where(candidates, score, np.inf)))
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
                      selector or stepping(N), fs.fedavg(), k, seed=0,
                      system_profile=prof if prof is not None else profile(True),
                      asynchrony=spec, **kw)


def reference(sim, steps, spec):
  """The heap-based reference (`references/async_events.py`) on the engine's clients: the
  library's per-client training, the clock's durations, the availability model."""
  cfg, arrays, run = sim.config, sim.arrays, sim.run_values
  leaves, treedef = jax.tree.flatten(sim.init().params)

  def train(t, client, occurrence, w):
    params = jax.tree.unflatten(treedef, [jnp.asarray(x, jnp.float32) for x in w])
    key = fs.keys.client_keys(fs.keys.round_key(run.seed, t, fs.keys.TRAIN),
                              jnp.array([client], jnp.int32))
    if occurrence:
      key = jax.random.fold_in(key[0], occurrence)[None]
    res = local_train(cfg.model, cfg.optimizer, cfg.local, params, arrays.train,
                      jnp.array([client], jnp.int32), jnp.ones(1, bool), key, run.lr,
                      cfg.max_count)
    return [np.asarray(x[0], np.float64) for x in jax.tree.leaves(res.params)]

  samples = samples_per_client(arrays.train.counts, cfg.local)
  durations = np.asarray(client_times(cfg.clock, samples, 0.0, 0.0, jnp.full(N, 2.0)))
  return async_events.simulate(
      params=[np.asarray(x) for x in leaves], steps=steps, k=cfg.k,
      concurrency=spec.concurrency, rule=spec.rule, kind=spec.staleness, a=spec.a, b=spec.b,
      alpha=spec.alpha, window_s=spec.window_s, max_staleness=spec.max_staleness,
      available=lambda r: np.asarray(cfg.availability.sample(run.seed, jnp.int32(r))),
      choose=choose_like(N), train=train, duration=lambda c: durations[c],
      num_examples=np.asarray(arrays.counts[0]))


CASES = {  # name -> (spec, K, tied durations)
    "fedbuff_ties_drops": (fs.fedbuff(7, staleness="polynomial", window_s=0.03), 3, True),
    "fedbuff_fast_clients": (fs.fedbuff(8, window_s=0.5), 3, False),
    "fedbuff_max_staleness": (fs.fedbuff(9, window_s=0.5, max_staleness=1), 2, False),
    "fedasync": (fs.fedasync(5, staleness="hinge", a=2.0, b=1.0, alpha=0.5, window_s=0.05), 1,
                 False),
}


# Ties and drops, and the staleness bound, run with the slow tests (the default suite keeps fast
# clients inside one buffer and FedAsync; ties alone are checked below).
SLOW_CASES = ("fedbuff_ties_drops", "fedbuff_max_staleness")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_CASES
                                  else n for n in sorted(CASES)])
def test_matches_the_heap_based_reference(data, name):
  """Step by step: the same dispatched clients, arrivals in the same order, the same staleness,
  drops and discarded stale updates, the same simulated time; after 20 steps the same model."""
  spec, k, tied = CASES[name]
  sim = simulator(data, spec, k, prof=profile(tied))
  steps = 20
  want, w_ref = reference(sim, steps, spec)
  state = sim.init()
  fast = 0
  for t in range(steps):
    state, m = sim.step(state)
    arrivals = [int(c) for c in np.asarray(m["arrivals"]) if c >= 0]
    assert arrivals == want[t]["arrivals"], t
    assert np.flatnonzero(np.asarray(m["selected"])).tolist() == sorted(set(
        want[t]["dispatched"])), t
    assert int(m["num_trained"]) == len(want[t]["dispatched"]), t
    assert (int(m["dropped"]), int(m["stale_dropped"])) == (want[t]["dropped"],
                                                            want[t]["stale_dropped"]), t
    assert float(m["sim_time_s"]) == pytest.approx(want[t]["now"], rel=1e-6), t
    assert int(m["staleness_max"]) == max(want[t]["staleness"]), t
    assert float(m["staleness_mean"]) == pytest.approx(np.mean(want[t]["staleness"])), t
    fast += len(set(want[t]["dispatched"]) & set(arrivals))
  for got, ref in zip(jax.tree.leaves(state.params), w_ref):
    np.testing.assert_allclose(np.asarray(got), ref, rtol=2e-5, atol=2e-6)
  # The cases are the ones they claim.
  if name == "fedbuff_ties_drops":
    assert sum(r["dropped"] for r in want) > 0
    assert max(max(r["staleness"]) for r in want) > 0
  if name == "fedbuff_fast_clients":
    assert fast > 0  # Clients dispatched and arrived inside one buffer.
  if name == "fedbuff_max_staleness":
    assert sum(r["stale_dropped"] for r in want) > 0


def test_tied_finish_times_occur_and_break_by_client_id(data):
  sim = simulator(data, fs.fedbuff(7, window_s=0.03), 3)
  fl = sim.step(sim.init())[0].inflight
  finish = np.asarray(fl.finish)[np.asarray(fl.active)]
  assert len(np.unique(finish)) < len(finish)


@pytest.mark.slow
@pytest.mark.parametrize("c,k", [(20, 10), (12, 3)])
def test_uniform_selection_has_fedbuffs_staleness_and_speed(data, c, k):
  """Every client available, uniform selection, 500 steps: mean staleness within 5% of FedBuff's
  steady state (C - 1) / K, and the time per step within 2% of the reference's schedule given the
  same uniform draws (the random selector's, by its keys: round t's SELECT key, folded with the
  refill mark and the call's index after the first)."""
  n = N
  prof = fs.lognormal_profiles(n, seed=2)
  avail = fs.uniform_availability(n, n)
  sim = simulator(data, fs.fedbuff(c, staleness="constant"), k, selector=fs.random_selector(),
                  prof=prof, avail=avail)
  steps = 500
  state, m = sim.steps(sim.init(), steps)
  staleness = np.asarray(m["staleness_mean"])[50:]  # Past the start-up transient.
  assert np.mean(staleness) == pytest.approx((c - 1) / k, rel=0.05)
  cfg = sim.config
  durations = np.asarray(client_times(cfg.clock, samples_per_client(sim.arrays.train.counts,
                                                                    cfg.local),
                                      0.0, 0.0, jnp.full(n, 2.0)))

  def uniform(t, j, candidates):
    key = fs.keys.round_key(0, t, fs.keys.SELECT)
    if j:
      key = jax.random.fold_in(jax.random.fold_in(key, 1), j)
    u = np.asarray(jax.random.uniform(key, (n,)))
    return int(np.argmax(np.where(candidates, u, -np.inf)))

  want, _ = async_events.simulate(
      params=[np.zeros(1)], steps=steps, k=k, concurrency=c, rule="fedbuff", kind="constant",
      a=0.5, b=4.0, alpha=0.6, window_s=1.0, max_staleness=None,
      available=lambda r: np.ones(n, bool),
      choose=uniform,
      train=lambda t, client, occurrence, w: w, duration=lambda client: durations[client],
      num_examples=np.ones(n))
  got_rate = float(np.asarray(m["sim_time_s"])[-1]) / steps
  assert got_rate == pytest.approx(want[-1]["now"] / steps, rel=0.02)


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
                                       ({"window_s": 0.0}, "window_s must be"),
                                       ({"max_staleness": -1}, "max_staleness must be")])
def test_spec_refusals(kw, needle):
  with pytest.raises(ValueError, match=needle):
    fs.async_spec(4, **kw)


@pytest.mark.parametrize("window_s", [1e-12, 1e-30])
def test_a_window_too_small_for_the_clock_is_refused_before_round_0(data, window_s):
  # Before: the index floor(T / window_s) overflowed int32, every update was dropped, exit 0.
  sim = simulator(data, fs.fedbuff(7, window_s=window_s), 3, prof=profile(False))
  with CompileLog() as log, pytest.raises(ValueError, match=r"window_s \(--avail_window_s\) ="
                                          r" [0-9e.-]+ s is too small for 5 server steps"):
    fs.run(sim, 5, progress=None)
  assert log.count("step") == 0  # No round compiled.
  records = fs.run(simulator(data, fs.fedbuff(7, window_s=1e-3), 3, prof=profile(False)), 5,
                   progress=None)
  assert sum(r["num_aggregated"] for r in records) == 15  # K = 3 updates per step.


def test_the_availability_index_holds_at_its_bound_instead_of_wrapping():
  spec = fs.fedbuff(4, window_s=1e-12)
  assert int(async_schedule.window(spec, 1e6)) == checks.MAX_WINDOWS
  assert int(async_schedule.window(spec, 0.0)) == 0
