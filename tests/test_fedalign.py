"""FedALIGN: masks == Algorithm 1 transcription, limits eps = 0 / eps = inf, warm-up, costs."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjax_sel as fs
from fedjax_sel.parts.rules import fedalign
from fedjax_sel.parts.selectors.baselines import all_selector
from fedjax_sel.parts.types import ClientState, RoundInputs
from tests.conftest import ragged_dataset


def algorithm1(values, objective, eps, priority, chosen, warmup, metric):
  """Direct transcription of the paper's Algorithm 1, one client at a time (float32)."""
  f, e = np.float32(objective), np.float32(eps)
  train, agg = [], []
  for v, p, c in zip(values.astype(np.float32), priority, chosen):
    if not c:
      train.append(False), agg.append(False)
    elif p:
      train.append(True), agg.append(True)
    elif warmup:
      train.append(False), agg.append(False)
    elif metric == "loss":
      t = v <= np.float32(f + e)
      train.append(t), agg.append(t and v >= np.float32(f - e))
    else:
      t = v >= np.float32(f - e)
      train.append(t), agg.append(t and v <= np.float32(f + e))
  return np.array(train), np.array(agg)


def inputs_for(values, metric, t, counts):
  n = len(values)
  return RoundInputs(jnp.asarray(t), None, jnp.ones(n, bool), {metric: jnp.asarray(values)},
                     ClientState.create(n), jnp.asarray(counts), None)


@pytest.mark.parametrize("metric", fedalign.METRICS)
@pytest.mark.parametrize("seed", range(4))
def test_masks_equal_algorithm1_with_ties(metric, seed):
  rng = np.random.default_rng(seed)
  n, rounds = 30, 20
  priority = rng.random(n) < 0.3
  priority[0] = True
  priority[-1] = False
  chosen = rng.random(n) < 0.8
  chosen[0] = True
  counts = rng.integers(1, 50, n)
  values = rng.uniform(0, 2, n).astype(np.float32)
  eps0 = float(rng.uniform(0.05, 0.5))
  rule = fedalign.fedalign_rule(priority, rounds, eps0=eps0, schedule="inverse",
                                warmup_fraction=0.1, metric=metric)
  apply = jax.jit(rule.apply)
  for t in (0, 1, 2, 7):
    _, _, st = apply(rule.init(n, None), None, inputs_for(values, metric, t, counts),
                     jnp.asarray(chosen))
    obj, eps = np.float32(st.objective), np.float32(st.eps)
    w = np.where(priority & chosen, counts, 0)
    np.testing.assert_allclose(obj, np.sum(w * values) / w.sum(), rtol=1e-5)
    # Ties: non-priority clients exactly at F + eps and F - eps.
    tied = values.copy()
    others = np.flatnonzero(~priority)
    tied[others[0]] = np.float32(obj + eps)
    tied[others[1]] = np.float32(obj - eps)
    tied[others[2]] = obj
    for vals in (values, tied):
      train, agg, st2 = apply(rule.init(n, None), None, inputs_for(vals, metric, t, counts),
                              jnp.asarray(chosen))
      assert np.float32(st2.objective) == obj
      want_t, want_a = algorithm1(vals, obj, eps, priority, chosen, bool(st2.warmup), metric)
      np.testing.assert_array_equal(np.asarray(train), want_t)
      np.testing.assert_array_equal(np.asarray(agg), want_a)
      others = ~priority & chosen
      np.testing.assert_allclose(float(st2.closest_gap), np.abs(vals[others] - obj).min(),
                                 atol=1e-6)
  assert bool(st2.warmup) is False


def test_schedules_and_warmup_rounds():
  lin = fedalign.eps_schedule("linear", 0.2, rounds=21, warmup_fraction=0.0)
  np.testing.assert_allclose([float(lin(t)) for t in (0, 10, 20)], [0.2, 0.1, 0.0], atol=1e-7)
  inv = fedalign.eps_schedule("inverse", 0.4, rounds=10, warmup_fraction=0.2)
  np.testing.assert_allclose([float(inv(t)) for t in (2, 3, 5)], [0.4, 0.2, 0.1], rtol=1e-6)
  custom = fedalign.eps_schedule(lambda tp: 0.5 * 0.9 ** tp, 0.5, rounds=10, warmup_fraction=0.1)
  np.testing.assert_allclose(float(custom(3)), 0.5 * 0.81, rtol=1e-6)
  assert fedalign.warmup_rounds(100, 0.1) == 10


@pytest.mark.parametrize("call,match", [
    (lambda: fedalign.eps_schedule("linear", -0.1, 10, 0.1), "eps0"),
    (lambda: fedalign.eps_schedule("cosine", 0.1, 10, 0.1), "eps_schedule"),
    (lambda: fedalign.eps_schedule("linear", 0.1, 10, 1.0), "warmup_fraction"),
    (lambda: fedalign.fedalign_rule(np.zeros(4, bool), 10), "empty"),
    (lambda: fedalign.fedalign_rule(np.ones(4, bool), 10), "all 4 clients"),
    (lambda: fedalign.fedalign_rule(np.eye(4, dtype=bool)[0], 10, metric="f1"), "align_metric"),
    (lambda: fedalign.choose_priority(5, ids=[1, 7]), "out of range"),
    (lambda: fedalign.choose_priority(5, count=5), "num_priority"),
])
def test_bad_arguments_raise(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def test_choose_priority_by_classes_and_seed():
  hist = np.array([[3, 0], [0, 2], [1, 1]])
  assert fedalign.choose_priority(3, classes=[0], label_hist=hist).tolist() == [True, False, True]
  a = fedalign.choose_priority(10, count=3, seed=1)
  assert a.sum() == 3 and (a == fedalign.choose_priority(10, count=3, seed=1)).all()


# --- Engine runs -----------------------------------------------------------------------------
PRIORITY = np.isin(np.arange(10), [1, 4])  # Clients with high losses: others often train.


def simulate(rule, rounds=4, seed=0):
  data = ragged_dataset([23, 5, 40, 8, 17, 9, 31, 12, 6, 28])
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  n = data.num_clients
  sim = fs.Simulator(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=4),
                     fs.uniform_availability(n, n), all_selector(), fs.fedavg(), n, seed,
                     participation=rule, lr_schedule=fs.constant_lr(0.1))
  state = sim.init()
  states, metrics = [], []
  for _ in range(rounds):
    state, m = sim.step(state)
    states.append(state.params)
    metrics.append(jax.device_get(m))
  return data, states, metrics


def test_eps_zero_gives_the_none_run_and_huge_eps_the_all_run():
  rounds = 4
  _, none_models, _ = simulate(fedalign.priority_only(PRIORITY), rounds)
  _, all_models, _ = simulate(fs.everyone(), rounds)
  _, zero, zero_m = simulate(fedalign.fedalign_rule(PRIORITY, rounds, eps0=0.0, schedule="constant",
                                                    warmup_fraction=0.0), rounds)
  _, wide, wide_m = simulate(fedalign.fedalign_rule(PRIORITY, rounds, eps0=1e6, schedule="constant",
                                                    warmup_fraction=0.0), rounds)
  for t in range(rounds):
    chex.assert_trees_all_close(zero[t], none_models[t], atol=1e-6)
    chex.assert_trees_all_close(wide[t], all_models[t], atol=1e-6)
    assert zero_m[t]["aggregated_clients"].tolist() == PRIORITY.tolist()
    assert wide_m[t]["aggregated_clients"].all()
  # Some non-priority clients did train under eps = 0 (loss below F) without being aggregated.
  assert sum(int(m["rule"]["others_trained"]) for m in zero_m) > 0


def test_warmup_aggregates_priority_only_and_costs_match_hand_counts():
  rounds = 10
  rule = fedalign.fedalign_rule(PRIORITY, rounds, eps0=0.3, warmup_fraction=0.2)
  data, _, metrics = simulate(rule, rounds)
  counts = np.asarray(data.train.counts)
  for t, m in enumerate(metrics):
    trained, aggregated = m["trained_clients"], m["aggregated_clients"]
    if t < 2:
      assert bool(m["rule"]["warmup"]) and trained.tolist() == PRIORITY.tolist()
    assert (aggregated <= trained).all() and (trained[PRIORITY]).all()
    c = m["cost"]
    # Hand counts: every client evaluates its loss; trained ones (refused or not) train and upload.
    assert c["uploads"] == trained.sum()
    assert c["train_samples"] == counts[trained].sum()  # One local epoch.
    assert c["client_eval_samples"] == counts.sum()
    assert c["downloads"] == len(counts)
    assert int(m["rule"]["others_trained"]) == trained[~PRIORITY].sum()
    assert int(m["rule"]["others_aggregated"]) == aggregated[~PRIORITY].sum()


@pytest.mark.parametrize("tfds_name,model_name", [
    ("emnist/balanced", "mlp"), pytest.param("cifar10", "cifar_cnn", marks=pytest.mark.slow)])
def test_paper_data_through_tfds_mock_data(tfds_name, model_name):
  """The EMNIST and CIFAR-10 setups of the paper (uni-class shards) run end to end on TFDS mock
  data."""
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=240):
    data = fs.build_dataset(fs.DatasetSpec("tfds", num_clients=12, partition="uni_class",
                                           tfds_name=tfds_name), seed=0)
  assert all(len(set(np.flatnonzero(h).tolist())) <= 1 for h in data.label_hist)
  priority = fedalign.choose_priority(12, count=2, seed=0)
  model = fs.build_model(model_name, data.feature_shape, data.num_classes, hidden=(16,))
  sim = fs.Simulator(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=8),
                     fs.uniform_availability(12, 12), all_selector(), fs.fedavg(), 12, 0,
                     participation=fedalign.fedalign_rule(priority, 2, warmup_fraction=0.0),
                     lr_schedule=fs.constant_lr(0.01), eval_mask=priority)
  recs = fs.run(sim, 2, progress=None)
  assert np.isfinite(recs[-1]["clean_test_loss"]) and recs[-1]["trained_clients"]
