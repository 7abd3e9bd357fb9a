"""Oort's selection rules against a plain transcription of FedScale's training selector
(SymbioticLab/FedScale @7ec441c2, thirdparty/oort/oort.py: getTopK, pacer), of the Oort
repository's (SymbioticLab/Oort @05a3aa16, oort/oort.py: getTopK), our `paper` variant, and of
PyramidFL's fork (liecn/PyramidFL @dd1d143a, oort/oort.py: getTopK), our `pyramidfl`."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjax_sel as fs
from fedjax_sel.client.system import lognormal_profiles
from fedjax_sel.parts.selectors import oort
from fedjax_sel.parts.types import ClientState, RoundInputs


def transcription(cfg, k, arms, history, exploration, exploration_min, threshold, last_exploit,
                  reported, feasible, sizes, cur):
  """getTopK up to its random draws, line by line over Python dicts and lists: FedScale's
  (`cfg.variant == "fedscale"`) or the Oort repository's. `arms[c]`: {"reward", "duration",
  "time_stamp", "count"} (reward of an unexplored client: its size, as both register it); rounds
  counted as ours (`cur = t + 1`, the time stamp + 1). Where both index past the scores (they
  raise), the cut-off is 0."""
  fedscale = cfg.variant == "fedscale"
  util_clients = [c for c in last_exploit if c in reported]
  history = history + [sum(arms[c]["reward"] for c in util_clients) / (1e-4 + len(util_clients))]
  step = cfg.pacer_step
  if cur >= 2 * step and cur % step == 0:
    last, current = sum(history[-2 * step:-step]), sum(history[-step:])
    if abs(current - last) <= last * 0.1:
      threshold = min(100.0, threshold + cfg.pacer_delta)
    elif abs(current - last) >= last * 5:
      threshold = max(cfg.pacer_delta, threshold - cfg.pacer_delta)
  if threshold < 100.0:
    durations = sorted(a["duration"] for a in arms.values())
    preferred = durations[min(int(len(durations) * threshold / 100.0), len(durations) - 1)]
  else:
    preferred = math.inf
  ordered = [c for c in arms if c in feasible]
  rewards = sorted(arms[c]["reward"] for c in ordered if arms[c]["reward"] > 0)
  clip = rewards[min(int(len(rewards) * cfg.clip_bound), len(rewards) - 1)]
  low, high = min(rewards) * 0.999, max(rewards)
  spread = max(high - low, 1e-4)
  scores = {}
  for c in ordered:
    if arms[c]["count"] > 0:
      sc = (min(arms[c]["reward"], clip) - low) / spread + math.sqrt(
          0.1 * math.log(cur) / (arms[c]["time_stamp"] + 1))
      if arms[c]["duration"] > preferred:
        sc *= (preferred / max(1e-4, arms[c]["duration"])) ** cfg.round_penalty
      scores[c] = abs(sc) if fedscale else sc  # FedScale l.311: abs(sc).
  exploration = max(exploration * cfg.exploration_decay, exploration_min)
  if fedscale:  # l.316-319: explorationLen = int(K * exploration); exploitLen = K - that.
    exploit_len = min(k - int(k * exploration), len(scores))
  elif cfg.variant == "pyramidfl":  # PyramidFL's oort/oort.py l.317.
    exploit_len = max(min(int(k * (1.0 - exploration)), len(scores) - 1), 0)
  else:
    exploit_len = min(int(k * (1.0 - exploration)), len(scores))
  ranked = sorted(scores, key=scores.get, reverse=True)
  cut = scores[ranked[exploit_len]] * cfg.cut_off_util if exploit_len < len(ranked) else 0.0
  candidates = []
  for c in ranked:
    # FedScale l.330: "we want at least 10 times of clients for augmentation".
    if scores[c] < cut and (not fedscale or len(candidates) > 10.0 * exploit_len):
      break
    candidates.append(c)
  unexplored = [c for c in ordered if arms[c]["count"] == 0]
  weights = {}
  for c in unexplored:
    weights[c] = sizes[c]
    if arms[c]["duration"] > preferred:
      weights[c] *= (preferred / max(1e-4, arms[c]["duration"])) ** cfg.round_penalty
  explore_len = min(len(unexplored), k - exploit_len)
  pool = sorted(weights, key=weights.get, reverse=True)[:min(int(cfg.sample_window * explore_len),
                                                             len(weights))]
  # The Oort repository stops exploring for good once no client is unexplored, PyramidFL once no
  # feasible one is (l.346); FedScale stays at its floor.
  if cfg.variant == "paper" and not any(a["count"] == 0 for a in arms.values()):
    exploration = 0.0
  if cfg.variant == "pyramidfl" and not unexplored:
    exploration = 0.0
  return dict(scores=scores, preferred=preferred, exploit_len=exploit_len,
              candidates=sorted(candidates), explore_len=explore_len, pool=sorted(pool),
              weights={c: weights[c] for c in pool}, threshold=threshold, exploration=exploration)


N = 16
SIZES = np.array([30, 12, 55, 8, 41, 23, 17, 60, 35, 9, 27, 44, 15, 50, 21, 38])


def fixed_state(cfg, seed, explored_share=0.6, history_len=None):
  rng = np.random.default_rng(seed)
  count = (rng.random(N) < explored_share).astype(np.int32) * rng.integers(1, 4, N)
  reward = np.where(count > 0, rng.uniform(0.0, 80.0, N), 0.0).astype(np.float32)
  reward[rng.integers(N)] = 0.0 if count.any() else reward[0]  # An explored client at 0 reward.
  state = {"reward": reward, "duration": rng.uniform(1.0, 20.0, N).astype(np.float32),
           "time_stamp": np.where(count > 0, rng.integers(0, 30, N), 0).astype(np.int32),
           "count": count, "exploration": np.float32(rng.uniform(0.3, 0.9)),
           "exploration_min": np.float32(0.3), "round_threshold": np.float32(30.0),
           "history": rng.uniform(0.0, 50.0, 2 * cfg.pacer_step).astype(np.float32),
           "last_exploit": rng.random(N) < 0.4, "reported": rng.random(N) < 0.7,
           "preferred": np.float32(np.inf)}
  return oort.OortState(**{key: jnp.asarray(v) for key, v in state.items()})


@pytest.mark.parametrize("variant", oort.VARIANTS)
@pytest.mark.parametrize("seed,cur,flat,explored", [
    (0, 7, False, 0.6), (1, 40, False, 0.6), (2, 40, True, 0.6), (3, 60, False, 0.6),
    (4, 3, False, 0.6), (5, 9, False, 0.25), (6, 12, False, 1.0)])
def test_plan_equals_the_transcription_on_fixed_inputs(seed, cur, flat, explored, variant):
  cfg = oort.OortConfig(variant=variant)
  state = fixed_state(cfg, seed, explored_share=explored)
  if flat:  # A flat utility history: the pacer relaxes the threshold.
    state = state._replace(history=jnp.full_like(state.history, 10.0),
                           last_exploit=jnp.zeros(N, bool))
  feasible = np.random.default_rng(seed + 100).random(N) < 0.8
  k = 6
  inputs = RoundInputs(jnp.int32(cur - 1), None, jnp.asarray(feasible), {}, ClientState.create(N),
                       jnp.asarray(SIZES), None)
  got = oort.plan(cfg, k, state, inputs, jnp.asarray(feasible))
  s = type(state)(*(np.asarray(v) for v in state))
  arms = {c: {"reward": float(s.reward[c]) if s.count[c] > 0 else float(SIZES[c]),
              "duration": float(s.duration[c]), "time_stamp": int(s.time_stamp[c]),
              "count": int(s.count[c])} for c in range(N)}
  want = transcription(cfg, k, arms, list(s.history),
                       float(s.exploration), float(s.exploration_min),
                       float(s.round_threshold), set(np.flatnonzero(s.last_exploit)),
                       set(np.flatnonzero(s.reported)), set(np.flatnonzero(feasible)),
                       SIZES, cur)
  assert float(got.state.round_threshold) == want["threshold"]
  if flat:
    assert want["threshold"] == 35.0
  assert float(got.state.exploration) == pytest.approx(want["exploration"])
  assert float(got.preferred) == pytest.approx(want["preferred"])
  assert int(got.exploit_len) == want["exploit_len"]
  for c, sc in want["scores"].items():
    assert float(got.scores[c]) == pytest.approx(sc, rel=1e-5, abs=1e-6), c
  assert np.flatnonzero(np.asarray(got.candidates)).tolist() == want["candidates"]
  assert int(got.explore_len) == want["explore_len"]
  assert np.flatnonzero(np.asarray(got.explore_pool)).tolist() == want["pool"]
  for c, w in want["weights"].items():
    assert float(got.explore_weight[c]) == pytest.approx(w, rel=1e-5)


def test_draws_follow_the_scores_and_fill_k():
  """One exploited client drawn among the candidates lands on each with probability proportional
  to its score; every selection holds K feasible clients."""
  cfg = oort.OortConfig(exploration_factor=0.3 / 0.98 * 1.0, exploration_min=0.3, variant="paper")
  sel = oort.oort_selector(config=cfg)
  state = sel.init(N, None)
  state = state._replace(count=jnp.ones(N, jnp.int32),
               reward=jnp.asarray(np.linspace(1.0, 16.0, N), jnp.float32))
  feasible = jnp.asarray(np.arange(N) < 8)
  inputs = RoundInputs(jnp.int32(4), None, feasible, {}, ClientState.create(N),
                       jnp.asarray(SIZES), None, k=2)
  p = oort.plan(cfg, 2, state, inputs, feasible)
  assert int(p.exploit_len) == 1  # int(2 * 0.7).
  draw = jax.jit(jax.vmap(lambda key: sel.select(state, key, inputs, feasible)))
  chosen, new = draw(jax.random.split(jax.random.PRNGKey(0), 3000))
  assert (np.asarray(chosen).sum(axis=1) == 2).all()
  assert not np.asarray(chosen & ~feasible).any()
  hits = np.asarray(new.last_exploit).sum(axis=0)
  share = np.asarray(jnp.where(p.candidates, p.scores, 0.0))
  np.testing.assert_allclose(hits / 3000, share / share.sum(), atol=0.03)


def test_oort_runs_in_the_engine_with_the_clock():
  data = fs.build_dataset(fs.DatasetSpec("digits", num_clients=20), seed=0)
  profile = lognormal_profiles(20)
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  expected = np.asarray(data.train.counts) / profile.speed
  sim = fs.Simulator(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=16),
                     fs.uniform_availability(20, 20), oort.oort_selector(expected),
                     fs.fedavg(), 5, 0, system_profile=profile)
  state = sim.init()
  for _ in range(6):
    state, metrics = sim.step(state)
    assert int(metrics["num_selected"]) == 5
  sel = state.selector_state
  trained = np.asarray(sel.count) > 0
  assert trained.sum() >= 5 and (np.asarray(sel.reward)[trained] > 0).all()
  assert float(metrics["selector"]["exploration"]) < 0.9


def test_bad_oort_settings_are_refused():
  with pytest.raises(ValueError, match=r"cut_off_util must be in"):
    oort.oort_selector(config=oort.OortConfig(cut_off_util=2.0))
  with pytest.raises(ValueError, match="durations"):
    oort.oort_selector(durations=[1.0, -1.0])
