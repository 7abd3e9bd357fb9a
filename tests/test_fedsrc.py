"""FedSRC: RHI and masks == numpy transcriptions (both modes), alpha control, +inf == FedAvg,
savings and exclusion counts == hand counts."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjax_sel as fs
from fedjax_sel.parts.rules import fedsrc
from fedjax_sel.parts.types import ClientState, RoundInputs, RoundOutcome
from tests.conftest import ragged_dataset


def np_rhi(hist, kappa):
  out = []
  for h in hist:
    c = (h > 0).sum()
    hi = 1 - (c - 1) / (len(h) - 1)
    if c <= 1:
      ne = 1.0
    else:
      p = h[h > 0] / h.sum()
      ne = -(p * np.log(p)).sum() / np.log(c)
    out.append(kappa * hi + (1 - kappa) * (1 - ne))
  return np.array(out)


def random_hist(rng, n, c):
  hist = rng.integers(0, 20, (n, c)) * (rng.random((n, c)) < 0.5)
  hist[0] = 0
  hist[0, 2] = 9  # One class.
  hist[1] = 5  # Uniform over all classes.
  hist[hist.sum(1) == 0, 0] = 1
  return hist


def test_rhi_equals_formula():
  rng = np.random.default_rng(0)
  hist = random_hist(rng, 40, 6)
  got = np.asarray(fedsrc.heterogeneity_index(jnp.asarray(hist), 0.7))
  np.testing.assert_allclose(got, np_rhi(hist, 0.7), rtol=1e-5, atol=1e-6)
  assert abs(got[0] - 0.7) < 1e-6 and abs(got[1]) < 1e-6  # One class: kappa (NE = 1); uniform: 0.
  np.testing.assert_allclose(fedsrc.heterogeneity_index(hist, 0.7), got, rtol=1e-5, atol=1e-6)


def np_rule(mode, cfg, losses, reported, test, chosen, hist, alpha):
  """Direct transcription of SPEC section 4 for one gated round."""
  L = losses[reported].astype(np.float64)
  med = np.median(L)
  rhi = np_rhi(hist, cfg.kappa)
  if mode == "paper":
    sigma = np.sqrt(np.mean((L - med) ** 2))
    thr = (med + alpha * sigma) * (1 - cfg.beta * rhi)
  else:
    std = np.std(L, ddof=1)
    thr = max(med + cfg.ref_beta * std, cfg.cut) - rhi * std
  train = chosen & (test <= thr)
  agg = train & (train.sum() >= 2)
  return train, agg


def round_inputs(stat, values, hist, t=1, skips=None):
  n = len(values)
  clients = ClientState.create(n)
  if skips is not None:
    clients = clients._replace(consecutive_skips=jnp.asarray(skips, jnp.int32))
  return RoundInputs(jnp.asarray(t), None, jnp.ones(n, bool), {stat: jnp.asarray(values)}, clients,
                     jnp.ones(n), jnp.asarray(hist))


def outcome(losses, reported):
  k = len(losses)
  return RoundOutcome(jnp.arange(k), jnp.asarray(reported), jnp.asarray(reported),
                      jnp.asarray(losses, jnp.float32), None, None)


@pytest.mark.parametrize("mode", fedsrc.MODES)
@pytest.mark.parametrize("seed", range(4))
def test_masks_equal_numpy_transcription(mode, seed):
  rng = np.random.default_rng(seed)
  n, c = 30, 5
  cfg = fedsrc.FedSRCConfig(mode=mode, beta=0.5, alpha0=float(rng.uniform(0, 2)),
                            reinclude_prob=0.0, ref_beta=0.8, cut=0.3 if seed % 2 else 0.0)
  rule = fedsrc.fedsrc_rule(cfg)
  hist = random_hist(rng, n, c)
  chosen = rng.random(n) < 0.7
  # Round 0: everyone sampled trains; then the clients report their training losses.
  train0, _, state = rule.apply(rule.init(n, None), jax.random.PRNGKey(0),
                                round_inputs("test_loss", rng.random(n), hist, t=0),
                                jnp.asarray(chosen))
  np.testing.assert_array_equal(np.asarray(train0), chosen)
  losses = rng.uniform(0.2, 2.0, n).astype(np.float32)
  state = rule.observe(state, None, outcome(losses, chosen))
  test = rng.uniform(0.2, 2.0, n).astype(np.float32)
  chosen1 = rng.random(n) < 0.7
  train, agg, state = jax.jit(rule.apply)(state, jax.random.PRNGKey(1),
                                          round_inputs("test_loss", test, hist),
                                          jnp.asarray(chosen1))
  want_t, want_a = np_rule(mode, cfg, losses, chosen, test, chosen1, hist, cfg.alpha0)
  np.testing.assert_array_equal(np.asarray(train), want_t)
  np.testing.assert_array_equal(np.asarray(agg), want_a)
  # Alpha's integral step after a gated round (paper mode only).
  rate = want_t.sum() / chosen1.sum()
  state = rule.observe(state, None, outcome(np.where(want_t, losses, 0.0), want_t))
  want_alpha = (np.clip(cfg.alpha0 + cfg.alpha_gain * (cfg.target - rate), 0, cfg.alpha_max)
                if mode == "paper" else cfg.alpha0)
  np.testing.assert_allclose(float(state.alpha), want_alpha, rtol=1e-5)
  np.testing.assert_allclose(float(state.rate), rate, rtol=1e-6)


def test_reinclusion_and_fewer_than_two_participants():
  n = 6
  hist = np.eye(n, dtype=np.int32)[:, :3] + 1
  rule = fedsrc.fedsrc_rule(fedsrc.FedSRCConfig(reinclude_prob=0.0, reinclude_after=2))
  state = rule.observe(rule.init(n, None), None, outcome(np.ones(n, np.float32), np.ones(n, bool)))
  high = np.full(n, 10.0, np.float32)  # Everybody above the threshold...
  skips = np.array([0, 1, 2, 3, 0, 0])  # ...but clients 2 and 3 abstained twice in a row already.
  train, agg, st = rule.apply(state, jax.random.PRNGKey(0), round_inputs("test_loss", high, hist,
                                                                          skips=skips),
                              jnp.ones(n, bool))
  assert np.flatnonzero(np.asarray(train)).tolist() == [2, 3]
  assert np.asarray(agg).sum() == 2
  # One participant: nothing aggregated (the global model is kept) and the threshold stays.
  skips = np.array([0, 0, 5, 0, 0, 0])
  train, agg, st = rule.apply(state, jax.random.PRNGKey(0), round_inputs("test_loss", high, hist,
                                                                          skips=skips),
                              jnp.ones(n, bool))
  assert np.asarray(train).sum() == 1 and not np.asarray(agg).any()
  after = rule.observe(st, None, outcome(np.where(np.asarray(train), 50.0, 0.0), np.asarray(train)))
  assert float(after.median) == float(state.median)
  assert float(after.spread) == float(state.spread)
  # q = 1: every abstainer takes part anyway.
  rule = fedsrc.fedsrc_rule(fedsrc.FedSRCConfig(reinclude_prob=1.0))
  train, _, _ = rule.apply(state, jax.random.PRNGKey(0), round_inputs("test_loss", high, hist),
                           jnp.ones(n, bool))
  assert np.asarray(train).all()


def test_alpha_holds_the_participation_target_on_average():
  rng = np.random.default_rng(0)
  n, target = 40, 0.7
  rule = fedsrc.fedsrc_rule(fedsrc.FedSRCConfig(target=target, beta=0.0, reinclude_prob=0.0))
  hist = np.ones((n, 4), np.int32)
  apply, observe = jax.jit(rule.apply), jax.jit(rule.observe)
  state = rule.init(n, None)
  rates = []
  for t in range(300):
    test = rng.lognormal(0, 0.5, n).astype(np.float32)
    train, _, state = apply(state, jax.random.PRNGKey(t),
                            round_inputs("test_loss", test, hist, t=t), jnp.ones(n, bool))
    train = np.asarray(train)
    state = observe(state, None, outcome(np.where(train, rng.lognormal(0, 0.5, n), 0.0), train))
    if t > 0:
      rates.append(train.mean())
  assert abs(np.mean(rates[50:]) - target) < 0.02, np.mean(rates[50:])


@pytest.mark.parametrize("kw,match", [
    (dict(beta=0.95), "beta"), (dict(target=0.0), "target"), (dict(target=1.5), "target"),
    (dict(reinclude_prob=-0.1), "reinclude_prob"), (dict(mode="ref"), "mode must be one of"),
    (dict(decision_stat="val"), "decision_stat"), (dict(kappa=2.0), "kappa"),
    (dict(alpha0=float("nan")), "alpha0")])
def test_bad_config_raises(kw, match):
  with pytest.raises(ValueError, match=match):
    fedsrc.fedsrc_rule(fedsrc.FedSRCConfig(**kw))


def simulate(rule, rounds=4):
  data = ragged_dataset([23, 15, 40, 8, 17, 9, 31, 12, 6, 28])
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  sim = fs.Simulator(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=4),
                     fs.uniform_availability(10, 8, period=1), fs.random_selector(), fs.fedavg(),
                     6, 0, participation=rule, lr_schedule=fs.constant_lr(0.1))
  state = sim.init()
  metrics = []
  for _ in range(rounds):
    state, m = sim.step(state)
    metrics.append(jax.device_get(m))
  return data, state.params, metrics


def test_infinite_threshold_gives_exactly_the_fedavg_run():
  rule = fedsrc.fedsrc_rule(fedsrc.FedSRCConfig(mode="reference", cut=float("inf"),
                                                reinclude_prob=0.0))
  chex.assert_trees_all_equal(simulate(rule)[1], simulate(None)[1])


def test_only_the_sampled_clients_pay_for_deciding():
  data, _, metrics = simulate(fedsrc.fedsrc_rule(), rounds=3)
  test_counts, train_counts = np.asarray(data.test.counts), np.asarray(data.train.counts)
  for m in metrics:
    sel, trained = m["selected"], m["trained_clients"]
    assert sel.sum() == 6 and (trained <= sel).all()
    assert m["cost"]["client_eval_samples"] == test_counts[sel].sum()
    assert m["cost"]["downloads"] == 6 and m["cost"]["uploads"] == trained.sum()
    assert m["cost"]["train_samples"] == train_counts[trained].sum()


def test_savings_and_exclusions_match_hand_counts():
  records = [
      {"selected": [0, 1, 2], "trained_clients": [0, 1, 2], "rule": {"gated": False}},
      {"selected": [1, 2, 3], "trained_clients": [2], "rule": {"gated": True}},
      {"selected": [0, 3], "trained_clients": [0, 3], "rule": {"gated": True}},
  ]
  train_per = np.array([10.0, 20.0, 30.0, 40.0])
  eval_per = np.array([3.0, 3.0, 6.0, 6.0])
  s = fedsrc.savings(records, train_per, eval_per)
  np.testing.assert_array_equal(s.abstained, [0, 2, 0])
  np.testing.assert_array_equal(s.train_samples_saved, [0, 60, 0])
  np.testing.assert_array_equal(s.eval_samples, [0, 15, 9])
  np.testing.assert_allclose(s.net_samples_saved, [0, 55, -3])
  np.testing.assert_array_equal(s.uploads_saved, [0, 2, 0])
  np.testing.assert_array_equal(s.train_samples, [60, 30, 50])
  assert s.totals()["net_samples_saved"] == pytest.approx(52)
  ex = fedsrc.exclusions(records, np.array(["good", "flip", "good", "noise"]))
  np.testing.assert_array_equal(ex["good_excluded"], [0, 0, 0])
  np.testing.assert_array_equal(ex["flip_excluded"], [0, 1, 0])
  np.testing.assert_array_equal(ex["noise_excluded"], [0, 1, 0])
  np.testing.assert_array_equal(ex["good_sampled"], [2, 1, 1])


@pytest.mark.slow  # Covered by faster tests in the default suite; `pytest -m slow`.
def test_fedsrc_with_robust_aggregators_on_leaf_and_tfds_data(tmp_path):
  """FedSRC with Krum on a LEAF FEMNIST fixture (FEMNIST MLP 784-64-10 shape) and with the trimmed
  mean on TFDS mock MNIST in the non-IID split (MNIST MLP 784-200-100-10)."""
  import json  # pylint: disable=import-outside-toplevel

  from fedjax_sel.data.corruption import corrupt_clients  # pylint: disable=import-outside-toplevel
  from fedjax_sel.parts.aggregators import krum, trimmed_mean  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  users = [f"u{i}" for i in range(12)]
  blob = {"users": users, "num_samples": [10] * 12,
          "user_data": {u: {"x": rng.random((10, 784)).round(3).tolist(),
                            "y": rng.integers(0, 62, 10).tolist()} for u in users}}
  with open(tmp_path / "femnist.json", "w", encoding="utf-8") as f:
    json.dump(blob, f)
  leaf = fs.build_dataset(fs.DatasetSpec("leaf", num_clients=0,
                                         leaf_files=(str(tmp_path / "femnist.json"),)), seed=0)
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=600):
    mnist = fs.build_dataset(fs.DatasetSpec("tfds", num_clients=10, partition="dominant",
                                            tfds_name="mnist"), seed=0)
  for data, hidden, aggregator in ((leaf, (64,), krum(1)), (mnist, (200, 100), trimmed_mean())):
    data, bad = corrupt_clients(data, 0.3, seed=1)
    n = data.num_clients
    model = fs.build_model("mlp", data.feature_shape, data.num_classes, hidden=hidden)
    sim = fs.Simulator(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=5),
                       fs.uniform_availability(n, n), fs.random_selector(), aggregator, 8, 0,
                       participation=fedsrc.fedsrc_rule(), lr_schedule=fs.constant_lr(0.05),
                       eval_mask=~bad)
    recs = fs.run(sim, 3, progress=None)
    assert len(recs[0]["trained_clients"]) == 8 and recs[1]["rule"]["gated"]
    assert np.isfinite(recs[-1]["test_loss"])


def test_reported_decision_loss_sets_the_next_threshold():
  n = 7
  rng = np.random.default_rng(3)
  hist = np.ones((n, 3), np.int32)
  rule = fedsrc.fedsrc_rule(fedsrc.FedSRCConfig(reported_loss="decision", reinclude_prob=0.0))
  checked = rng.uniform(1, 3, n).astype(np.float32)
  train, _, state = rule.apply(rule.init(n, None), jax.random.PRNGKey(0),
                               round_inputs("test_loss", checked, hist, t=0), jnp.ones(n, bool))
  reported = np.asarray(train) & (np.arange(n) % 2 == 0)
  state = rule.observe(state, None, outcome(np.full(n, 0.01, np.float32), reported))
  med = np.median(checked[reported])
  np.testing.assert_allclose(float(state.median), med, rtol=1e-6)
  np.testing.assert_allclose(float(state.spread),
                             np.sqrt(np.mean((checked[reported] - med) ** 2)), rtol=1e-5)
  with pytest.raises(ValueError, match="reported_loss"):
    fedsrc.fedsrc_rule(fedsrc.FedSRCConfig(reported_loss="last"))
