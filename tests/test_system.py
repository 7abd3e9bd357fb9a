"""The simulated clock: per-client times and round durations against a hand count."""

import numpy as np
import optax
import pytest

import fedjax_sel as fs
from fedjax_sel.client import system
from fedjax_sel.parts.rules.fedsrc import FedSRCConfig, fedsrc_rule
from tests.conftest import ragged_dataset

SPEED = np.array([10.0, 20.0, 40.0, 80.0], np.float32)
BANDWIDTH = np.array([1e3, 2e3, 4e3, 8e3], np.float32)


def _sim(**kw):
  data = ragged_dataset([20, 12, 9, 15])
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  sim = fs.Simulator(model, data, lambda lr: optax.sgd(lr),
                     fs.LocalHParams(batch_size=4, num_epochs=2), fs.uniform_availability(4, 4),
                     kw.pop("selector", fs.random_selector()), fs.fedavg(), 2, 0,
                     system_profile=system.SystemProfile(SPEED, BANDWIDTH), **kw)
  return sim, data


def test_round_time_is_the_slowest_clients_hand_count():
  """Logistic regression on 6 features and 4 classes: 28 float32 weights, 112 bytes. A client
  trains 2 epochs of its m_k examples, downloads and uploads the model once."""
  sim, data = _sim()
  state, metrics = sim.step(sim.init())
  m = np.asarray(data.train.counts)
  chosen = np.flatnonzero(np.asarray(metrics["trained_clients"]))
  assert sim.config.clock.model_bytes == 112.0
  times = 2 * m[chosen] / SPEED[chosen] + 2 * 112.0 / BANDWIDTH[chosen]
  assert float(metrics["round_time_s"]) == pytest.approx(times.max(), rel=1e-6)
  assert float(metrics["cumulative_cost"]["sim_time_s"]) == pytest.approx(times.max(), rel=1e-6)
  _, second = sim.step(state)
  assert float(second["cumulative_cost"]["sim_time_s"]) == pytest.approx(
      times.max() + float(second["round_time_s"]), rel=1e-6)


def test_clients_that_only_evaluate_are_timed_too():
  """FedSRC's selected clients evaluate their loss at w_t (a third of a step per sample) before
  deciding: an abstainer still downloads and evaluates, and is timed."""
  rule = fedsrc_rule(FedSRCConfig(decision_stat="loss"))
  sim, data = _sim(participation=rule)
  _, metrics = sim.step(sim.init())
  m = np.asarray(data.train.counts)
  selected = np.flatnonzero(np.asarray(metrics["selected"]))
  trained = np.asarray(metrics["trained_clients"])
  times = [(2 * m[k] * trained[k] + m[k] / 3) / SPEED[k]
           + (1 + trained[k]) * 112.0 / BANDWIDTH[k] for k in selected]
  assert float(metrics["round_time_s"]) == pytest.approx(max(times), rel=1e-5)


def test_deadline_drops_the_stragglers_and_caps_the_round():
  sim, data = _sim()
  _, free = sim.step(sim.init())
  m = np.asarray(data.train.counts)
  chosen = np.flatnonzero(np.asarray(free["trained_clients"]))
  times = 2 * m[chosen] / SPEED[chosen] + 2 * 112.0 / BANDWIDTH[chosen]
  deadline = float(times.min() + times.max()) / 2
  timed, _ = _sim(deadline_s=deadline)
  _, metrics = timed.step(timed.init())
  assert int(metrics["stragglers"]) == 1 and int(metrics["num_aggregated"]) == 1
  assert float(metrics["round_time_s"]) == pytest.approx(deadline)
  fast = chosen[np.argmin(times)]
  assert np.flatnonzero(np.asarray(metrics["aggregated_clients"])).tolist() == [fast]


def test_profiles_are_drawn_read_and_checked(tmp_path):
  a, b = system.lognormal_profiles(50, seed=3), system.lognormal_profiles(50, seed=3)
  assert (a.speed == b.speed).all() and (a.bandwidth == b.bandwidth).all()
  path = tmp_path / "p.csv"
  path.write_text("client,speed,bandwidth\n1,5,100\n0,2.5,50\n", encoding="utf-8")
  read = system.read_profiles(str(path), 2)
  assert read.speed.tolist() == [2.5, 5.0] and read.bandwidth.tolist() == [50.0, 100.0]
  for text, needle in (("client,speed,bandwidth\n0,1,1\n", r"no row for clients \[1\]"),
                       ("client,speed,bandwidth\n0,1,1\n0,1,1\n", "line 3: client 0"),
                       ("client,speed,bandwidth\n0,1,1\n1,-1,1\n", "client 1's speed"),
                       ("client,speed,bandwidth\n0,nan,1\n1,1,1\n",
                        "line 2: client 0's speed nan and bandwidth 1.0 must be finite"),
                       ("client,speed\n0,1\n", "header"),
                       ("client,speed,bandwidth\n0,x,1\n", "line 2")):
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=needle) as info:
      system.read_profiles(str(path), 2)
    assert str(path) in str(info.value)


def test_deadline_without_a_profile_is_refused():
  data = ragged_dataset([20, 12, 9, 15])
  with pytest.raises(ValueError, match="deadline_s needs a system_profile"):
    fs.Simulator(fs.build_model("logreg", data.feature_shape, data.num_classes), data,
                 lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=4),
                 fs.uniform_availability(4, 4), fs.random_selector(), fs.fedavg(), 2, 0,
                 deadline_s=1.0)
