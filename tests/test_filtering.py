"""FilFL filtering against a direct, loop-based transcription of the paper's Algorithm 1."""

import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjax_sel as fs
from fedjax_sel import keys as keylib
from fedjax_sel.client.local_training import local_train
from fedjax_sel.engine import placement
from fedjax_sel.engine.description import program_key
from fedjax_sel.engine.round import round_step
from fedjax_sel.host.compilation import CompileLog
from fedjax_sel.parts.filters import filfl as filtering

DIM = 5


def make_problem(seed, n, scale=1.0):
  """n client models of a linear regressor and a public set; loss = mean squared error."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(40, DIM)).astype(np.float32)
  w_true = rng.normal(size=DIM).astype(np.float32)
  y = x @ w_true
  clients = {"w": jnp.asarray(w_true + scale * rng.normal(size=(n, DIM)).astype(np.float32)),
             "b": jnp.asarray(scale * rng.normal(size=(n,)).astype(np.float32))}
  global_params = {"w": jnp.zeros(DIM), "b": jnp.zeros(())}
  loss_fn = lambda p: jnp.mean((jnp.asarray(x) @ p["w"] + p["b"] - y) ** 2)
  return loss_fn, clients, global_params


def reference_algorithm1(loss_fn, clients, valid, global_params, key, mode, empty_value, const,
                         order):
  """Algorithm 1 written out: sets as Python lists, R by averaging the members' models."""
  n = len(valid)
  loss = jax.jit(loss_fn)
  clients = jax.tree.map(np.asarray, clients)  # Averages in numpy: no compile per subset size.

  def value(members):
    if not members:
      return const - float(loss(global_params)) if empty_value == "global" else 0.0
    avg = jax.tree.map(lambda a: np.mean(a[np.array(members)], axis=0, dtype=np.float32), clients)
    return const - float(loss(avg))

  order_key, coin_key = jax.random.split(key)
  rank = np.asarray(jax.random.uniform(order_key, (n,))) if order == "random" else np.arange(n) / n
  visit = [int(i) for i in np.argsort(np.where(valid, rank, 2.0), kind="stable")]
  x_set, y_set = [], [i for i in range(n) if valid[i]]
  for step, u in enumerate(visit):
    if not valid[u]:
      continue
    a = value(x_set + [u]) - value(x_set)
    b = value([v for v in y_set if v != u]) - value(y_set)
    if mode == "dgf":
      keep = a > b
    else:
      ap, bp = max(a, 0.0), max(b, 0.0)
      p = 1.0 if ap == 0 and bp == 0 else ap / (ap + bp)
      keep = float(jax.random.uniform(jax.random.fold_in(coin_key, step))) < p
    if keep:
      x_set.append(u)
    else:
      y_set.remove(u)
  assert sorted(x_set) == sorted(y_set)
  return sorted(x_set), value(x_set)


GREEDY = jax.jit(filtering.greedy_filter, static_argnames=("loss_fn", "mode", "empty_value",
                                                            "const", "order"))


@pytest.mark.parametrize("mode", ["dgf", "rgf"])
@pytest.mark.parametrize("empty_value,order", [
    pytest.param("global", "random", marks=pytest.mark.slow), ("zero", "index"),
    pytest.param("global", "index", marks=pytest.mark.slow)])
def test_jitted_greedy_equals_algorithm1(mode, empty_value, order):
  for case, n in enumerate([1, 2, 3, 7, 12, 30]):
    loss_fn, clients, g = make_problem(case, n, scale=0.5 + case * 0.3)
    valid = np.random.default_rng(case).random(n) < 0.85
    valid[0] = True
    key = jax.random.PRNGKey(case)
    out = GREEDY(loss_fn, clients, jnp.asarray(valid), g, key, mode=mode, empty_value=empty_value,
                 const=10.0, order=order)
    want, want_value = reference_algorithm1(loss_fn, clients, valid, g, key, mode, empty_value,
                                            10.0, order)
    assert np.flatnonzero(np.asarray(out.kept)).tolist() == want, (n, case)
    np.testing.assert_allclose(float(out.value), want_value, rtol=1e-5, atol=1e-5)
    assert float(out.num_evals) == 2 * valid.sum() + 1 + (empty_value == "global")


def test_ties_and_empty_result():
  # Identical, integer-valued clients: after the first is kept every later step is an exact tie
  # (a = b = 0): DGF rejects ties, RGF keeps with probability 1.
  x = jnp.ones((4, DIM))
  loss_fn = lambda p: jnp.mean((x @ p["w"] - 3.0) ** 2)
  clients = {"w": jnp.tile(jnp.array([1.0, 0.0, 0.0, 0.0, 0.0]), (6, 1))}
  g = {"w": jnp.zeros(DIM)}
  valid = jnp.ones(6, bool)
  for mode, expected in (("dgf", 1), ("rgf", 6)):
    out = GREEDY(loss_fn, clients, valid, g, jax.random.PRNGKey(0), mode=mode,
                 empty_value="global", const=10.0, order="index")
    want, _ = reference_algorithm1(loss_fn, clients, np.ones(6, bool), g, jax.random.PRNGKey(0),
                                   mode, "global", 10.0, "index")
    assert int(out.kept.sum()) == expected == len(want)
  # Every client worse than the global model: nothing is kept.
  bad = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(5, DIM)) * 50 + 40)}
  good_global = {"w": jnp.array([3.0, 0, 0, 0, 0])}
  out = GREEDY(loss_fn, bad, jnp.ones(5, bool), good_global, jax.random.PRNGKey(1), mode="dgf",
               empty_value="global", const=10.0, order="random")
  assert int(out.kept.sum()) == 0
  assert reference_algorithm1(loss_fn, bad, np.ones(5, bool), good_global, jax.random.PRNGKey(1),
                              "dgf", "global", 10.0, "random")[0] == []


def brute_force(loss_fn, clients, n, const):
  best, best_set = -np.inf, None
  for size in range(1, n + 1):
    for combo in itertools.combinations(range(n), size):
      avg = jax.tree.map(lambda a: jnp.mean(a[np.array(combo)], axis=0), clients)
      v = const - float(loss_fn(avg))
      if v > best + 1e-6:
        best, best_set = v, list(combo)
  return best, best_set


def test_opt_equals_brute_force_and_bounds_greedy():
  ratios = []
  for case, n in enumerate([1, 3, 5, 8, 12]):
    loss_fn, clients, g = make_problem(10 + case, n, scale=1.5)
    opt = filtering.opt_filter(loss_fn, clients, n, const=10.0, chunk_size=64)
    want, want_set = brute_force(loss_fn, clients, n, 10.0) if n <= 8 else (None, None)
    if want is not None:
      np.testing.assert_allclose(float(opt.value), want, rtol=1e-5)
      assert np.flatnonzero(np.asarray(opt.kept)).tolist() == want_set
    for mode in ("dgf", "rgf"):
      out = GREEDY(loss_fn, clients, jnp.ones(n, bool), g, jax.random.PRNGKey(case), mode=mode,
                   empty_value="global", const=10.0, order="random")
      assert float(out.value) <= float(opt.value) + 1e-5
      ratios.append(float(out.value) / float(opt.value))
  print(f"approximation ratios R(greedy)/R(OPT), n <= 12: min {min(ratios):.4f}, "
        f"mean {np.mean(ratios):.4f}")
  assert min(ratios) > 0.5


def test_subset_masks_order():
  assert filtering.subset_masks(3).astype(int).tolist() == [
      [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 1, 1]]


def test_submodularity_check_matches_direct_computation():
  loss_fn, clients, _ = make_problem(3, 6)
  valid = jnp.ones(6, bool)
  key = jax.random.PRNGKey(4)
  gammas = (0.0, 0.5, 1.0, 2.0)
  got = filtering.submodularity_check(loss_fn, clients, valid, key, gammas, samples=8)
  value = lambda s: 10.0 - float(loss_fn(jax.tree.map(lambda a: jnp.mean(a[np.array(s)], 0),
                                                      clients)))
  hits, counted = np.zeros(len(gammas)), 0
  for k in jax.random.split(key, 8):
    side = np.asarray(jax.random.randint(k, (6,), 0, 3))
    a, b = list(np.flatnonzero(side == 0)), list(np.flatnonzero(side == 1))
    if not a or not b:
      continue
    counted += 1
    lhs = sum(value(a + [e]) - value(a) for e in b)
    rhs = value(a + b) - value(a)
    hits += np.array([lhs >= gm * rhs - 1e-6 * abs(rhs) for gm in gammas])
  np.testing.assert_allclose(np.asarray(got), hits / max(counted, 1), atol=1e-6)


def test_greedy_compiles_once_across_calls():
  loss_fn, clients, g = make_problem(0, 9)
  fn = jax.jit(lambda c, v, p, k: filtering.greedy_filter(loss_fn, c, v, p, k, mode="dgf"))
  for i in range(4):
    c = jax.tree.map(lambda a: a + i, clients)
    fn(c, jnp.arange(9) % (i + 2) > 0, g, jax.random.PRNGKey(i))
  assert fn._cache_size() == 1


def test_the_mode_as_a_traced_flag_gives_each_modes_algorithm1():
  # The engine's filter passes DGF or RGF as data (its state): both through one compiled program.
  fn = jax.jit(lambda c, v, p, k, flag, loss_fn: filtering.greedy_filter(
      loss_fn, c, v, p, k, randomized=flag), static_argnums=5)
  for case, n in enumerate([3, 12]):
    loss_fn, clients, g = make_problem(case, n, scale=0.8)
    valid = np.arange(n) % 4 != 1
    key = jax.random.PRNGKey(case + 5)
    for mode in ("dgf", "rgf"):
      out = fn(clients, jnp.asarray(valid), g, key, jnp.asarray(mode == "rgf"), loss_fn)
      want, _ = reference_algorithm1(loss_fn, clients, valid, g, key, mode, "zero", 10.0,
                                     "random")
      assert np.flatnonzero(np.asarray(out.kept)).tolist() == want, (mode, n)
  assert fn._cache_size() == 2  # One per problem's shapes, not per mode.


def test_dgf_and_rgf_rounds_are_one_program():
  """The two modes' rounds lower to the same module, and their configs have one program key:
  the engine's jit cache then serves the second mode without tracing it."""
  data = _data_with_public()
  texts, keys = [], []
  for mode in ("dgf", "rgf"):
    spec = _filfl_sim(data, mode).spec
    step = jax.jit(lambda s, a, r, config=spec.config: round_step(config, s, a, r))
    texts.append(step.lower(spec.initial_state(), placement.place(spec).arrays,
                            spec.run_values).as_text())
    keys.append(program_key(spec.config))
  assert texts[0] == texts[1]
  assert keys[0] == keys[1]


def _filfl_sim(data, mode="dgf", period=2, model=None):
  model = model or fs.build_model("mlp", data.feature_shape, data.num_classes, hidden=(16,))
  pub = lambda p, x, y: jnp.mean(fs.models.per_example_loss(model, p, x, y))
  filt = filtering.filfl_filter(pub, filtering.FilterConfig(mode, period=period))
  return fs.Simulator(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=4),
                      fs.uniform_availability(data.num_clients, 6, period=3),
                      fs.random_selector(), fs.fedavg("uniform"), 3, 0, filter=filt,
                      lr_schedule=fs.constant_lr(0.1))


def _data_with_public():
  from tests.conftest import ragged_dataset  # pylint: disable=import-outside-toplevel
  d = ragged_dataset([23, 5, 40, 6, 17, 9, 31, 12, 8, 28])
  rng = np.random.default_rng(9)
  return d._replace(public_x=rng.normal(size=(30, 6)).astype(np.float32),
                    public_y=rng.integers(0, 4, 30).astype(np.int32))


@pytest.mark.parametrize("batch_norm", [False, True])
def test_filfl_round_matches_hand_composition(batch_norm):
  """Round 0: all available train, greedy filter, RS on S^f, uniform mean without retraining.
  With BatchNorm the candidate averages and the aggregate average the statistics too."""
  from tests.conftest import batch_norm_mlp  # pylint: disable=import-outside-toplevel
  data = _data_with_public()
  sim = _filfl_sim(data, model=batch_norm_mlp() if batch_norm else None)
  state = sim.init()
  new_state, metrics = sim.step(state)
  avail = sim.config.availability.sample(0, 0)
  slots = jnp.nonzero(avail, size=6)[0].astype(jnp.int32)
  keys = keylib.client_keys(keylib.round_key(0, 0, keylib.TRAIN), slots)
  res = local_train(sim.config.model, sim.config.optimizer, sim.config.local, state.params,
                    fs.data.device_pool(data.train), slots, jnp.ones(6, bool), keys,
                    jnp.float32(0.1), data.train.max_count)
  loss_fn = lambda p: jnp.mean(fs.models.per_example_loss(
      sim.config.model, p, jnp.asarray(data.public_x), jnp.asarray(data.public_y)))
  want, _ = reference_algorithm1(loss_fn, res.params, np.ones(6, bool), state.params,
                                 keylib.round_key(0, 0, keylib.FILTER), "dgf", "global", 10.0,
                                 "random")
  filtered = np.zeros(data.num_clients, bool)
  filtered[np.asarray(slots)[want]] = True
  assert np.asarray(metrics["filtered_in"]).tolist() == filtered.tolist()
  inputs = fs.RoundInputs.create(jnp.asarray(data.train.counts), k=3)
  chosen, _ = sim.config.selector.select((), keylib.round_key(0, 0, keylib.SELECT), inputs,
                                         jnp.asarray(filtered))
  picked = [i for i, c in enumerate(np.asarray(slots)) if chosen[c]]
  expected = jax.tree.map(lambda a: jnp.mean(a[np.array(picked)], axis=0), res.params)
  chex.assert_trees_all_close(new_state.params, expected, atol=1e-5)
  assert float(metrics["cost"]["train_samples"]) == float(jnp.sum(res.samples))
  assert float(metrics["cost"]["uploads"]) == 6


def test_filfl_round_without_filtering_trains_the_selected_clients():
  """Round 1 of a filter that trains every available client (period 2) is not a filtering round:
  the selected clients (0, 3 and 5 of the 10 available: client 0's slot must not be confused with
  the 7 untrained slots) train from w_1 and their uniform mean is w_2, as a plain loop computes
  it."""
  data = _data_with_public()
  n = data.num_clients
  keep_all = fs.Filter(init=lambda num, params: (),
                       apply=lambda s, key, inputs, mask, local: (mask, s, {}), period=2,
                       trains_available=True, spec={"name": "keep_all"})
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  chosen = jnp.zeros(n, bool).at[jnp.array([0, 3, 5])].set(True)
  fixed = fs.Selector(init=lambda num, p: (), select=lambda s, key, inputs, mask: (
      chosen & mask, s), spec={"name": "fixed"})
  sim = fs.Simulator(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=4),
                     fs.uniform_availability(n, n, period=100), fixed, fs.fedavg("uniform"), 3,
                     0, filter=keep_all, lr_schedule=fs.constant_lr(0.1))
  first, m0 = sim.step(sim.init())
  second, m1 = sim.step(first)
  assert bool(m0["filter_round"]) and not bool(m1["filter_round"])
  slots = jnp.array([0, 3, 5], jnp.int32)
  keys = keylib.client_keys(keylib.round_key(0, 1, keylib.TRAIN), slots)
  res = local_train(model, sim.config.optimizer, sim.config.local, first.params,
                    fs.data.device_pool(data.train), slots, jnp.ones(3, bool), keys,
                    jnp.float32(0.1), data.train.max_count)
  expected = jax.tree.map(lambda a: jnp.mean(a, axis=0), res.params)
  chex.assert_trees_all_close(second.params, expected, atol=1e-5)
  assert float(m1["cost"]["train_samples"]) == float(jnp.sum(res.samples))


def test_filfl_rounds_do_not_retrace_and_reuse_the_filtered_set():
  sim = _filfl_sim(_data_with_public(), period=2)
  state = sim.init()
  flags = []
  with CompileLog() as log:
    for _ in range(6):
      prev = state.filtered
      state, m = sim.step(state)
      flags.append(bool(m["filter_round"]))
      if not m["filter_round"]:
        assert (np.asarray(m["filtered_in"]) <= (np.asarray(prev))).all()
  # Rounds 0, 2, 4 by period; round 3 by the availability redraw (period 3).
  assert flags == [True, False, True, True, True, False]
  assert log.count("step") <= 1
