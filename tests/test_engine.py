"""The round engine: determinism, multi-device equality, components, evaluation, costs."""

import json
import os
import subprocess
import sys
import textwrap

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjax_sel as fs
from fedjax_sel.engine import programs
from fedjax_sel.engine.stats import batch_loss
from fedjax_sel.models import example_metrics
from fedjax_sel.parts.types import AggregateInputs
from tests.conftest import batch_norm_mlp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_sim(data, seed=0, k=3, n=6, model=None, aggregator=None, selector=None, **kw):
  model = model or fs.build_model("mlp", data.feature_shape, data.num_classes, hidden=(16,))
  return fs.Simulator(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=4),
                      fs.uniform_availability(data.num_clients, n, period=2),
                      selector or fs.random_selector(), aggregator or fs.fedavg(), k, seed,
                      lr_schedule=fs.constant_lr(0.1), **kw)


def test_same_seed_gives_identical_metrics(small_data):
  a = fs.run(make_sim(small_data, seed=3), 4, progress=None)
  b = fs.run(make_sim(small_data, seed=3), 4, progress=None)
  c = fs.run(make_sim(small_data, seed=4), 4, progress=None)
  strip = lambda recs: [{k: v for k, v in r.items() if k != "wall_s"} for r in recs]
  assert strip(a) == strip(b)
  assert strip(a) != strip(c)


@pytest.mark.parametrize("batch_norm,streamed,sampler", [
    (False, True, "random"), (True, True, "random"), (True, False, "random"),
    (False, True, "md"), (False, False, "md")])
def test_round_matches_hand_composed_round(small_data, batch_norm, streamed, sampler):
  """One engine round == availability, selection, per-client training and FedAvg done by hand.
  With BatchNorm, each client's statistics follow its own batches and the global statistics are
  the m_k-weighted mean of the clients', the same weights as the weights' (streamed out of local
  training, or averaged from the stacked models). After MD sampling the aggregate is the global
  model moved by each drawn client's update times its draws / K."""
  aggregator = fs.fedavg() if streamed else fs.fedavg()._replace(linear_weights=None)
  selector = fs.md_selector() if sampler == "md" else None
  sim = make_sim(small_data, seed=1, model=batch_norm_mlp() if batch_norm else None,
                 aggregator=aggregator, selector=selector)
  assert sim.config.stream == streamed
  state = sim.init()
  new_state, metrics = sim.step(state)
  avail = sim.config.availability.sample(1, 0)
  inputs = fs.RoundInputs(jnp.int32(0), None, avail, {}, None,
                          jnp.asarray(small_data.train.counts), None, k=3)
  selector = sim.config.selector
  chosen, sel_state = selector.select(selector.init(small_data.num_clients, None),
                                      fs.keys.round_key(1, 0, fs.keys.SELECT), inputs, avail)
  ids = np.flatnonzero(np.asarray(chosen))
  keys = fs.keys.client_keys(fs.keys.round_key(1, 0, fs.keys.TRAIN), jnp.asarray(ids, jnp.int32))
  from tests.test_local_training import reference_client  # pylint: disable=import-outside-toplevel
  models, weights = [], []
  for slot, k in enumerate(ids):
    x, y = small_data.train.client(int(k))
    p, _, _ = reference_client(sim.config.model, optax.sgd(0.1), sim.config.local, state.params,
                               x, y, keys[slot], small_data.train.max_count)
    models.append(p)
    weights.append(len(y))
  if sampler == "md":
    c = np.asarray(sel_state.weights)[ids]
    assert c.sum() == pytest.approx(1.0) and np.all(c * 3 == np.round(c * 3))
    want = jax.tree.map(lambda g, *ps: g + sum(ci * (pi - g) for ci, pi in zip(c, ps)),
                        state.params, *models)
  else:
    w = np.array(weights, np.float32) / sum(weights)
    want = jax.tree.map(lambda *ps: sum(wi * pi for wi, pi in zip(w, ps)), *models)
  chex.assert_trees_all_close(new_state.params, want, atol=2e-5)
  assert int(metrics["num_trained"]) == len(ids) <= 3
  assert float(metrics["cost"]["train_samples"]) == sum(weights)
  assert float(metrics["cost"]["uploads"]) == len(ids)


def test_four_devices_equal_one(tmp_path):
  script = textwrap.dedent(f"""
      import json, sys, jax, optax, numpy as np
      sys.path.insert(0, {REPO!r})
      import fedjax_sel as fs
      from tests.conftest import batch_norm_mlp, ragged_dataset
      data = ragged_dataset([23, 5, 40, 1, 17, 9, 31, 12, 3, 28])
      model = fs.build_model("mlp", data.feature_shape, data.num_classes, hidden=(16,))
      sim = fs.Simulator(model, data, lambda lr: optax.sgd(lr, 0.9),
                         fs.LocalHParams(4, 2, prox_mu=0.1), fs.uniform_availability(10, 8, 2),
                         fs.random_selector(), fs.fedavg(), 5, 0)
      state = sim.init()
      for _ in range(3):
        state, m = sim.step(state)
      flat = np.concatenate([np.ravel(a) for a in jax.tree.leaves(state.params)])
      print(json.dumps({{"devices": jax.device_count(), "params": flat.tolist()}}))
  """)
  outs = []
  for count in (1, 4):
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={count}",
               JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         check=True, cwd=REPO)
    outs.append(json.loads(out.stdout.strip().splitlines()[-1]))
  assert [o["devices"] for o in outs] == [1, 4]
  np.testing.assert_allclose(outs[0]["params"], outs[1]["params"], rtol=1e-4, atol=1e-5)


def test_random_selector_invariants():
  sel = fs.random_selector()
  for trial in range(20):
    key = jax.random.PRNGKey(trial)
    mask = jax.random.bernoulli(jax.random.fold_in(key, 1), 0.3, (15,))
    chosen, _ = sel.select((), key, fs.RoundInputs.create(jnp.ones(15), k=4), mask)
    assert bool(jnp.all(chosen <= mask))
    assert int(chosen.sum()) == min(4, int(mask.sum()))


def test_top_k_mask_ties_go_to_lower_index():
  chosen = fs.top_k_mask(jnp.array([1.0, 2.0, 2.0, 2.0, 0.0]), jnp.ones(5, bool), 2)
  assert chosen.tolist() == [False, True, True, False, False]


def test_fedavg_weightings_match_hand_computation():
  params = jnp.array([[1.0], [3.0], [10.0]])
  inputs = AggregateInputs(jnp.array([True, True, False]), jnp.array([1, 3, 5]), jnp.zeros(3))
  uniform, _ = fs.fedavg("uniform").apply((), jnp.zeros(1), params, inputs)
  weighted, _ = fs.fedavg("examples").apply((), jnp.zeros(1), params, inputs)
  assert uniform.tolist() == [2.0] and weighted.tolist() == [2.5]
  none, _ = fs.fedavg().apply((), jnp.array([7.0]), params,
                              inputs._replace(mask=jnp.zeros(3, bool)))
  assert none.tolist() == [7.0]


def test_availability_is_pure_and_periodic():
  av = fs.uniform_availability(30, 7, period=3)
  masks = [np.asarray(av.sample(5, t)) for t in range(7)]
  assert all(m.sum() == 7 for m in masks)
  assert (masks[0] == masks[2]).all() and not (masks[2] == masks[3]).all()
  assert (np.asarray(av.sample(5, 4)) == masks[4]).all()
  warm = fs.uniform_availability(30, 7, period=3, redraw_first_period=True)
  assert not (np.asarray(warm.sample(5, 0)) == np.asarray(warm.sample(5, 1))).all()


def test_client_metrics_and_gradients_match_per_client_loop(small_data):
  model = fs.build_model("mlp", small_data.feature_shape, small_data.num_classes, hidden=(8,))
  params = model.init(jax.random.PRNGKey(0))
  pool = fs.data.device_pool(small_data.train)
  m = jax.jit(lambda p: fs.client_metrics(model, p, pool, batch_size=7))(params)
  grads = fs.client_gradients(model, params, pool, jnp.arange(10), batch_size=4, chunk_size=3)
  norms = fs.client_gradients(model, params, pool, jnp.arange(10), batch_size=4, chunk_size=3,
                              norm_only=True)
  metrics_fn = jax.jit(lambda x, y: example_metrics(model, params, x, y))
  grad_fn = jax.jit(jax.grad(lambda p, x, y: jnp.mean(fs.models.per_example_loss(model, p, x, y))))
  for k in range(10):
    x, y = small_data.train.client(k)
    em = metrics_fn(jnp.asarray(x), jnp.asarray(y))
    np.testing.assert_allclose(m.loss[k], em.loss.mean(), rtol=1e-5)
    np.testing.assert_allclose(m.accuracy[k], em.correct.mean(), rtol=1e-5)
    np.testing.assert_allclose(m.entropy[k], em.entropy.mean(), rtol=1e-5)
    g = grad_fn(params, jnp.asarray(x), jnp.asarray(y))
    chex.assert_trees_all_close(jax.tree.map(lambda a: a[k], grads), g, atol=1e-5)
    np.testing.assert_allclose(norms[k], optax.tree.norm(g), rtol=1e-4)


@pytest.mark.slow  # Covered by faster tests in the default suite; `pytest -m slow`.
def test_resume_continues_the_same_run(tmp_path, small_data):
  full = fs.run(make_sim(small_data), 6, str(tmp_path / "full"), checkpoint_every=3, progress=None)
  fs.run(make_sim(small_data), 3, str(tmp_path / "part"), checkpoint_every=3, progress=None)
  resumed = fs.run(make_sim(small_data), 6, str(tmp_path / "part"), checkpoint_every=3,
                   resume=True, progress=None)
  strip = lambda r: {k: v for k, v in r.items() if k != "wall_s"}
  assert [strip(r) for r in resumed] == [strip(r) for r in full]  # The whole history.
  with open(tmp_path / "part" / "metrics.jsonl", encoding="utf-8") as f:
    assert [json.loads(line)["round"] for line in f] == list(range(6))


def test_bad_arguments_fail_before_compute(small_data):
  with pytest.raises(ValueError, match="clients_per_round"):
    make_sim(small_data, k=7, n=6)
  with pytest.raises(ValueError, match="num_available"):
    fs.uniform_availability(5, 6)


def test_scanned_rounds_equal_single_rounds(small_data):
  sim = make_sim(small_data, seed=2)
  state = sim.init()
  singles = []
  for _ in range(3):
    state, m = sim.step(state)
    singles.append(m)
  scanned_state, stacked = sim.steps(sim.init(), 3)
  chex.assert_trees_all_close(scanned_state.params, state.params, atol=1e-6)
  np.testing.assert_allclose(stacked["local_train_loss"],
                             [float(m["local_train_loss"]) for m in singles], rtol=1e-5)


def test_no_host_device_transfer_inside_a_round(small_data):
  sim = make_sim(small_data)
  state, _ = sim.step(sim.init())  # Compile and place everything first.
  with jax.transfer_guard("disallow"):
    for _ in range(2):
      state, metrics = sim.step(state)
  jax.block_until_ready(state)


def test_streamed_linear_aggregate_equals_stacked_aggregate(small_data):
  """FedAvg folded chunk by chunk out of local training == averaging the K stacked models."""
  model = fs.build_model("mlp", small_data.feature_shape, small_data.num_classes, hidden=(16,))

  def sim(aggregator):
    return fs.Simulator(model, small_data, lambda lr: optax.sgd(lr),
                        fs.LocalHParams(4, chunk_size=2), fs.uniform_availability(10, 8, 2),
                        fs.random_selector(), aggregator, 5, 0)
  streamed, stacked = sim(fs.fedavg("examples")), sim(fs.fedavg("examples")._replace(
      linear_weights=None))
  assert streamed.config.stream and not stacked.config.stream
  a, b = streamed.init(), stacked.init()
  for _ in range(3):
    a, ma = streamed.step(a)
    b, mb = stacked.step(b)
    np.testing.assert_allclose(float(ma["local_train_loss"]), float(mb["local_train_loss"]),
                               rtol=1e-5)
  chex.assert_trees_all_close(a.params, b.params, atol=1e-5)


def test_batch_loss_stat_matches_per_client_loop(small_data):
  sim = make_sim(small_data)
  params = sim.init().params
  got = np.asarray(jax.jit(lambda p, a: batch_loss(sim.config, p, a.train, 4, sim.spec.seed,
                                                    jnp.arange(10)))(params, sim.arrays))
  loss = jax.jit(lambda x, y: fs.models.per_example_loss(sim.config.model, params, x, y))
  key = fs.keys.round_key(sim.spec.seed, 4, fs.keys.STATS)
  for k in range(small_data.num_clients):
    x, y = small_data.train.client(k)
    u = np.asarray(jax.random.uniform(jax.random.fold_in(key, k), (sim.config.local.batch_size,)))
    idx = np.minimum((u * len(y)).astype(int), len(y) - 1)
    np.testing.assert_allclose(got[k], float(np.mean(loss(x[idx], y[idx]))), rtol=1e-5)


def test_a_run_with_dropout_repeats_and_resumes_bit_for_bit(tmp_path):
  """Dropout's keys derive from (seed, round, client, step): the same run twice gives the same
  records, and a run stopped after two rounds and resumed gives the uninterrupted run's."""
  from tests.conftest import dropout_mlp, ragged_dataset  # pylint: disable=import-outside-toplevel
  data = ragged_dataset([23, 5, 40, 8, 17, 9, 31, 12, 3, 28])

  def sim():
    return fs.Simulator(dropout_mlp(), data, lambda lr: optax.sgd(lr),
                        fs.LocalHParams(batch_size=4), fs.uniform_availability(10, 6),
                        fs.random_selector(), fs.fedavg(), 3, seed=0)

  strip = lambda recs: [{k: v for k, v in r.items() if k != "wall_s"} for r in recs]
  whole = strip(fs.run(sim(), 4, str(tmp_path / "a"), progress=None))
  assert whole == strip(fs.run(sim(), 4, str(tmp_path / "b"), progress=None))
  fs.run(sim(), 2, str(tmp_path / "c"), checkpoint_every=1, progress=None)
  assert strip(fs.run(sim(), 4, str(tmp_path / "c"), resume=True, progress=None)) == whole


LIGHT_SHAPES = {"logreg": ((64,), 10), "mlp": ((64,), 10), "leaf_cnn": ((28, 28, 1), 62),
                "cifar_cnn": ((32, 32, 3), 10), "resnet18": ((32, 32, 3), 10),
                "char_lstm": ((80,), 80), "word_lstm": ((20,), 1000)}


def _at_level(fn, level, *args):
  return jax.jit(fn, compiler_options={"xla_backend_optimization_level": level})(*args)


@pytest.mark.parametrize("name", [n if n in ("mlp", "char_lstm") else
                                  pytest.param(n, marks=pytest.mark.slow) for n in LIGHT_SHAPES])
def test_a_light_initializer_gives_every_bit_of_the_default_level(name):
  # Initializers compile `light` (XLA:CPU's backend level 1, `programs.LIGHT_CPU_OPTIONS`): their
  # weights must be the default level 3's, bit for bit, or a run would start elsewhere than
  # before.
  shape, classes = LIGHT_SHAPES[name]
  model = fs.build_model(name, shape, classes)
  init = lambda seed: model.init(jax.random.PRNGKey(seed))
  for seed in (0, 7):
    chex.assert_trees_all_equal(_at_level(init, 1, seed), _at_level(init, 3, seed))


def test_light_fingerprint_draws_give_every_bit_of_the_default_level():
  from fedjax_sel.engine.signature import Keyed  # pylint: disable=import-outside-toplevel
  from fedjax_sel.host import runner  # pylint: disable=import-outside-toplevel
  for schedule, availability in (
      (fs.step_decay_lr(0.05, 0.998, 10), fs.probability_availability(np.linspace(0.2, 0.9, 6))),
      (fs.constant_lr(0.1), fs.uniform_availability(50, 25))):
    drawn = Keyed(("draws", id(schedule)), (schedule.factor, availability))
    draws = lambda lr, seed, drawn=drawn: runner._draws(drawn, lr, seed)  # pylint: disable=protected-access
    chex.assert_trees_all_equal(_at_level(draws, 1, np.float32(0.05), np.int32(3)),
                                _at_level(draws, 3, np.float32(0.05), np.int32(3)))


def test_a_light_program_runs_inside_another_trace_with_the_store_off(monkeypatch):
  # JAX refuses compiler options on a jit staged into another trace: a light (or fast) program
  # called by code under `jax.eval_shape`, where nothing is stored (the cache off, several
  # devices), becomes part of that trace, and at the top level it runs with its options.
  from fedjax_sel.engine import executables  # pylint: disable=import-outside-toplevel
  from fedjax_sel.engine.signature import Keyed  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv("XLA_FLAGS", "")
  monkeypatch.setattr(executables, "folder", lambda: None)
  programs.program.cache_clear()
  try:
    double = programs.program(lambda cfg, x: x * cfg.value, light=True)
    assert double.name.endswith("+light")
    two = Keyed(("two",), 2.0)
    assert jax.eval_shape(lambda: double(two, np.float32(3.0))).shape == ()
    assert float(double(two, np.float32(3.0))) == 6.0
  finally:
    programs.program.cache_clear()


def test_programs_are_light_unless_xla_flags_set_a_level(monkeypatch):
  for flags, light in (("", True), ("--xla_backend_optimization_level=0", False)):
    monkeypatch.setenv("XLA_FLAGS", flags)
    programs.program.cache_clear()
    try:
      assert programs.program(programs.init_params, light=True).name.endswith("+light") == light
      assert not programs.program(programs.step).name.endswith("+light")
    finally:
      programs.program.cache_clear()


def test_fast_compile_gives_the_default_compilations_rounds_to_float_rounding(tmp_path):
  # `use_fast_compile` changes how XLA:CPU emits the programs, not what they compute: a run's
  # records agree with the default compilation's to float rounding, and repeat bit for bit.
  from tests.test_reliability import make_sim  # pylint: disable=import-outside-toplevel

  def records(fast, folder):
    fs.use_fast_compile(fast)
    try:
      assert programs.program(programs.step).name.endswith("+fast") == fast
      return fs.run(make_sim(seed=3), 4, str(tmp_path / folder), progress=None)
    finally:
      fs.use_fast_compile(False)

  default, fast, again = records(False, "a"), records(True, "b"), records(True, "c")
  strip = lambda rs: [{k: v for k, v in r.items() if k not in ("wall_s", "round_time_s")}
                      for r in rs]
  assert strip(fast) == strip(again)
  for want, got in zip(strip(default), strip(fast)):
    assert jax.tree.structure(want) == jax.tree.structure(got)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
      np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
