"""Selection telemetry (`host/telemetry.py`, the records' `participation`, `participations` and
`client_test_accuracy`) against hand counts on a fixed run, and across a resume."""

import io

import numpy as np
import optax
import pytest

import fedjax_sel as fs
from fedjax_sel.host import telemetry


def test_jain_index_by_hand():
  assert telemetry.jain_index([3, 3, 3]) == 1.0
  assert telemetry.jain_index([4, 0, 0, 0]) == 0.25
  assert telemetry.jain_index([1, 2]) == pytest.approx(9 / 10)
  assert telemetry.jain_index([0, 0]) == 1.0
  assert telemetry.participation_summary([1, 0, 3, 0]) == {"jain": round(16 / 40, 6),
                                                           "never": 0.5, "max": 3, "min": 0}


def _sim(data, seed=0):
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  return fs.Simulator(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=4),
                      fs.uniform_availability(data.num_clients, 6), fs.random_selector(),
                      fs.fedavg(), 3, seed, lr_schedule=fs.constant_lr(0.1))


def test_records_count_participation_and_client_accuracy(small_data, tmp_path):
  sim = _sim(small_data)
  records = fs.run(sim, 5, str(tmp_path / "a"), eval_every=2, progress=None)
  counts = np.zeros(small_data.num_clients, int)
  for r in records:  # Each round's trained client ids.
    np.add.at(counts, np.asarray(r["trained_clients"], int), 1)
  last = records[-1]
  assert last["participations"] == counts.tolist()
  assert last["participation"] == telemetry.participation_summary(counts)
  assert [("participation" in r) for r in records] == [False, True, False, True, True]
  assert "participations" not in records[1]
  # The final model's accuracy on each client's test examples, by hand.
  state = sim.init()
  for _ in range(5):
    state, _ = sim.step(state)
  acc = []
  for k in range(small_data.num_clients):
    x, y = small_data.test.client(k)
    if len(y):
      acc.append(np.mean(np.argmax(np.asarray(sim.config.model.apply(state.params, x)), -1) == y))
  acc = np.array(acc)
  spread = last["client_test_accuracy"]
  assert spread["mean"] == pytest.approx(acc.mean(), abs=1e-6)
  assert spread["worst"] == pytest.approx(acc.min(), abs=1e-6)
  assert spread["p10"] == pytest.approx(np.percentile(acc, 10), abs=1e-6)
  assert spread["std"] == pytest.approx(acc.std(), abs=1e-6)


def test_participation_survives_resume(small_data, tmp_path):
  whole = fs.run(_sim(small_data), 6, str(tmp_path / "whole"), eval_every=2, progress=None)
  fs.run(_sim(small_data), 3, str(tmp_path / "part"), eval_every=2, checkpoint_every=1,
         progress=None)
  resumed = fs.run(_sim(small_data), 6, str(tmp_path / "part"), eval_every=2, resume=True,
                   progress=None)
  assert resumed[-1]["participations"] == whole[-1]["participations"]
  assert resumed[-1]["participation"] == whole[-1]["participation"]


def test_log_every_thins_the_progress_lines_not_the_records(small_data):
  """log_every=2 prints rounds 1 (the first), 2, 4 and 5 (the last) of five; every record is
  kept."""
  stream = io.StringIO()
  records = fs.run(_sim(small_data), 5, progress=stream, log_every=2)
  shown = [line.split("]")[0].split("[")[-1].strip() for line in stream.getvalue().splitlines()
           if "/5]" in line]
  assert shown == ["1/5", "2/5", "4/5", "5/5"] and len(records) == 5
  with pytest.raises(ValueError, match="log_every"):
    fs.run(_sim(small_data), 2, progress=None, log_every=0)
