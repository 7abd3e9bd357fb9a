"""Availability models: pure functions of (seed, round), each matching its definition."""

import json

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjax_sel as fs
from fedjax_sel.parts import availability as av
from tests.conftest import ragged_dataset


def draws(model, seed, rounds):
  return np.stack([np.asarray(model.sample(seed, jnp.int32(t))) for t in range(rounds)])


MODELS = {
    "uniform": lambda: av.uniform_availability(30, 10, period=3),
    "probability": lambda: av.probability_availability(np.linspace(0, 1, 30), capacity=25),
    "diurnal": lambda: av.diurnal_availability(30, day_rounds=8, capacity=20),
    "trace": lambda: av.trace_availability(np.random.default_rng(0).random((7, 30)) < 0.4),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_is_a_pure_function_of_seed_and_round(name):
  a, b = draws(MODELS[name](), 3, 12), draws(MODELS[name](), 3, 12)
  assert (a == b).all()  # Same (seed, round): same clients, in a new model object too.
  shuffled = [np.asarray(MODELS[name]().sample(3, jnp.int32(t))) for t in (11, 0, 5)]
  assert all((s == a[t]).all() for s, t in zip(shuffled, (11, 0, 5)))  # Any order.
  assert (a.sum(axis=1) <= MODELS[name]().num_available).all()
  if name != "trace":
    assert not (draws(MODELS[name](), 4, 12) == a).all()


def test_probability_model_matches_each_clients_probability():
  p = np.array([0.0, 1.0, 0.25, 0.5, 0.9])
  freq = draws(av.probability_availability(p), 0, 800).mean(axis=0)
  np.testing.assert_allclose(freq, p, atol=0.06)
  assert freq[0] == 0.0 and freq[1] == 1.0


def test_probability_model_keeps_at_most_its_capacity():
  got = draws(av.probability_availability(np.ones(10), capacity=4), 0, 20)
  assert (got.sum(axis=1) == 4).all() and got.any(axis=0).all()  # A different 4 each round.


def test_diurnal_model_follows_the_day_cycle():
  model = av.diurnal_availability(400, day_rounds=8, mean=0.5, amplitude=0.3)
  phase = np.random.default_rng([0, 17]).random(400).astype(np.float32)
  got = draws(model, 1, 64)
  for t in (0, 3):
    want = np.asarray(av.diurnal_probability(np.arange(t, 64, 8)[:, None], 8, 0.5, 0.3, phase))
    assert abs(got[t::8].mean() - want.mean()) < 0.03  # Population share at this hour.
    per_client = got[t::8].mean(axis=0)
    assert np.corrcoef(per_client, want[0])[0, 1] > 0.5  # Who is awake follows the phases.


def test_trace_reads_csv_and_json_alike_and_cycles(tmp_path):
  csv_path = tmp_path / "t.csv"
  csv_path.write_text("client,start,end\n0,0,2\n2,1,3\n1,2,3\n", encoding="utf-8")
  json_path = tmp_path / "t.json"
  json_path.write_text(json.dumps({"available": {"0": [[0, 2]], "2": [[1, 3]], "1": [[2, 3]]}}),
                       encoding="utf-8")
  want = np.array([[1, 0, 0], [1, 0, 1], [0, 1, 1]], bool)
  for path in (csv_path, json_path):
    table = av.read_trace(str(path), 3)
    assert (table == want).all()
    assert (draws(av.trace_availability(table), 0, 6) == np.concatenate([want, want])).all()


BAD_TRACES = [  # (file name, content, needle)
    ("unknown.csv", "client,start,end\n0,0,2\n7,0,2\n", "line 3: client 7 is not one of the 3"),
    ("empty_interval.csv", "client,start,end\n0,4,4\n", "line 2: interval [4, 4)"),
    ("negative.csv", "client,start,end\n0,-1,2\n", "0 <= start < end"),
    ("fraction.csv", "client,start,end\n0,0,2.5\n", "2.5' is not an integer"),
    ("header.csv", "id,from,to\n0,0,2\n", "header client,start,end"),
    ("short_row.csv", "client,start,end\n0,0\n", "line 2: expected client,start,end"),
    ("nobody.csv", "client,start,end\n", "covers no round"),
    ("broken.json", "{\"available\": ", "Expecting value"),
    ("shape.json", "{\"available\": [1, 2]}", "expected {\"available\""),
    ("pair.json", "{\"available\": {\"0\": [[1, 2, 3]]}}", "not a [start, end] pair"),
    ("unknown.json", "{\"available\": {\"5\": [[0, 2]]}}", "client 5 is not one of"),
    ("trace.txt", "0 0 2\n", ".csv or .json"),
]


@pytest.mark.parametrize("name,content,needle", BAD_TRACES, ids=[c[0] for c in BAD_TRACES])
def test_malformed_trace_is_refused_naming_the_file(tmp_path, name, content, needle):
  path = tmp_path / name
  path.write_text(content, encoding="utf-8")
  with pytest.raises(ValueError) as info:
    av.read_trace(str(path), 3)
  assert str(path) in str(info.value) and needle in str(info.value), info.value


def test_missing_trace_file_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="nothing.csv"):
    av.load_trace_availability(str(tmp_path / "nothing.csv"), 3)


def test_round_with_fewer_than_k_available_trains_those_and_says_so():
  data = ragged_dataset([20, 12, 9, 15, 30, 11])
  table = np.zeros((2, 6), bool)
  table[0, [0, 2, 4]] = True
  table[1, [3]] = True  # One client for K = 2.
  sim = fs.Simulator(fs.build_model("logreg", data.feature_shape, data.num_classes), data,
                     lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=4),
                     av.trace_availability(table), fs.random_selector(), fs.fedavg(), 2, 0)
  state, m0 = sim.step(sim.init())
  _, m1 = sim.step(state)
  assert int(m0["num_trained"]) == 2 and not bool(m0["fewer_than_k_available"])
  assert int(m1["num_available"]) == 1 and int(m1["num_trained"]) == 1
  assert bool(m1["fewer_than_k_available"])
  assert np.flatnonzero(np.asarray(m1["trained_clients"])).tolist() == [3]


@pytest.mark.parametrize("call,needle", [
    (lambda: av.probability_availability([0.5, 1.5]), "in \\[0, 1\\]"),
    (lambda: av.probability_availability([0.5, np.nan]), "in \\[0, 1\\]"),
    (lambda: av.probability_availability([0.5, 0.5], capacity=3), "avail_capacity"),
    (lambda: av.diurnal_availability(5, day_rounds=0), "diurnal_period"),
    (lambda: av.diurnal_availability(5, amplitude=2.0), "diurnal_amplitude"),
    (lambda: av.trace_availability(np.zeros((0, 3), bool)), "\\[rounds, N\\]"),
])
def test_bad_availability_settings_are_refused(call, needle):
  with pytest.raises(ValueError, match=needle):
    call()
