"""FedScale's device traces (`data/fedscale_traces.py`), on pickles written here in FedScale's
format: the capacity file as the clock's profile (FedScale's round times), the behaviour trace as
availability (FedScale's own check), malformed and unsafe pickles refused, and a run of
`experiments.run` on both."""

import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from fedjax_sel.client.system import Clock, client_times, fedscale_profile
from fedjax_sel.data import fedscale_traces as traces

from tests.hang_guard import HANG_GUARD_S

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def dump(path, value):
  with open(path, "wb") as f:
    pickle.dump(value, f)
  return str(path)


def capacity(n=8):
  return {k + 1: {"computation": 10.0 + 7 * k, "communication": 2000.0 + 900 * k}
          for k in range(n)}


def behaviour(n=8):
  return {k + 1: {"duration": 5, "model": "phone", "finish_time": 100 + 10 * k,
                  "active": [k, 40 + k], "inactive": [k + 20, 70 + k]} for k in range(n)}


def fedscale_is_active(trace, times):
  """FedScale's ClientMetadata.is_active, transcribed (its cursor moves one session a call)."""
  index, out = 0, []
  for cur_time in times:
    norm = cur_time % trace["finish_time"]
    if norm > trace["inactive"][index]:
      index += 1
    index %= len(trace["active"])
    out.append(trace["active"][index] <= norm <= trace["inactive"][index])
  return out


def test_capacity_becomes_a_profile_that_times_rounds_as_fedscale(tmp_path):
  path = dump(tmp_path / "client_device_capacity", capacity())
  profile = fedscale_profile(path, 5, seed=0)
  devices = list(capacity().values())
  picked = traces.assign(8, 5, 0)
  samples, model_bytes = 600.0, 2.5e5
  for k in range(5):
    comp, kbps = devices[picked[k]]["computation"], devices[picked[k]]["communication"]
    # FedScale: 3 x samples x ms / 1000 of compute, (up + down) model kbit (bytes / 1024 x 8)
    # over kbit/s.
    fedscale = 3 * samples * comp / 1000 + 2 * (model_bytes / 1024 * 8) / kbps
    train, transfers = np.zeros(5), np.zeros(5)
    train[k], transfers[k] = samples, 2
    ours = client_times(Clock(profile, model_bytes), train, np.zeros(5), np.zeros(5), transfers)
    assert float(ours[k]) == pytest.approx(fedscale, rel=1e-5)
  assert len(set(picked.tolist())) == 5  # Without replacement while the trace is larger.
  assert traces.assign(3, 5, 0).max() < 3  # With replacement past its size.
  np.testing.assert_array_equal(fedscale_profile(path, 5, seed=0).speed, profile.speed)


def test_behaviour_trace_matches_fedscales_check_on_its_unit_test(tmp_path):
  trace = {"active": [1, 3, 6, 9], "inactive": [1, 4, 7, 10], "finish_time": 10}
  path = dump(tmp_path / "client_behave_trace", {1: trace})
  table = traces.availability_table(path, 1, round_s=1.0, rounds=16)
  times = [2, 6, 8, 9, 10, 15]
  assert table[times, 0].tolist() == fedscale_is_active(trace, times) == [False, True, False,
                                                                          True, False, False]


def test_behaviour_trace_agrees_with_fedscale_over_every_round_in_order(tmp_path):
  """Times asked in order within a trace's first cycle (past it FedScale's cursor, moved one
  session a call, can lag behind the wrap: the module docstring says what we chose)."""
  path = dump(tmp_path / "client_behave_trace", behaviour())
  table = traces.availability_table(path, 8, round_s=3.0, seed=1)
  users = list(behaviour().values())
  for k, entry in enumerate(traces.assign(8, 8, 1)):
    times = np.arange(table.shape[0]) * 3.0
    first = times < users[entry]["finish_time"]
    assert table[first, k].tolist() == fedscale_is_active(users[entry], times[first]), k
    assert table[:, k].any() and not table[:, k].all()


class Thing:
  pass


@pytest.mark.parametrize("value,needle", [
    ({1: {"computation": np.float64(3.0), "communication": 1.0}}, "holds a numpy"),
    ({1: Thing()}, "holds a tests.test_fedscale_traces.Thing object"),
    ({1: {"computation": 3.0}}, "device 1: expected a dict with"),
    ({1: {"computation": -3.0, "communication": 5.0}}, "must be numbers > 0"),
    ([1, 2], "expected a non-empty dict"),
])
def test_bad_capacity_files_are_refused_naming_file_and_problem(tmp_path, value, needle):
  path = dump(tmp_path / "cap", value)
  with pytest.raises(ValueError, match=needle) as e:
    traces.read_capacity(path)
  assert path in str(e.value)


@pytest.mark.parametrize("entry,needle", [
    ({"active": [1, 5], "inactive": [2], "finish_time": 9}, "lists of as many numbers"),
    ({"active": [3], "inactive": [2], "finish_time": 9}, "0 <= active <= inactive"),
    ({"active": [1], "inactive": [2], "finish_time": 0}, "finish_time must be a number > 0"),
    ({"active": [1], "inactive": [2]}, "expected a dict with"),
])
def test_bad_behaviour_traces_are_refused(tmp_path, entry, needle):
  path = dump(tmp_path / "beh", {7: entry})
  with pytest.raises(ValueError, match=f"client 7: .*{needle}"):
    traces.read_behaviour(path)


def test_a_file_that_is_not_a_pickle_is_refused(tmp_path):
  path = tmp_path / "cap"
  path.write_bytes(b"not a pickle at all")
  with pytest.raises(ValueError, match="not a readable pickle"):
    traces.read_capacity(str(path))


def test_run_times_and_schedules_clients_by_the_traces(tmp_path):
  cap = dump(tmp_path / "client_device_capacity", capacity(40))
  beh = dump(tmp_path / "client_behave_trace", behaviour(40))
  out = tmp_path / "run"
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.run", f"--system_profile=fedscale:{cap}",
       "--availability=trace", f"--avail_trace=fedscale:{beh}", "--avail_trace_round_s=10",
       "--num_clients=20", "--clients_per_round=3", "--rounds=3", "--model=logreg",
       "--seeds=0", f"--out_dir={out}"], cwd=REPO, capture_output=True, text=True,
      timeout=HANG_GUARD_S)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  recs = [json.loads(line) for line in open(out / "seed0" / "metrics.jsonl", encoding="utf-8")]
  table = traces.availability_table(beh, 20, 10.0)
  for r in recs:
    trained = r["trained_clients"]  # Client ids.
    assert trained and table[r["round"] % len(table), trained].all()  # Online in the trace.
    assert r["round_time_s"] > 0


def test_a_table_too_large_to_build_is_refused_with_its_size_before_it_is_built(tmp_path):
  """FedScale's traces cycle over up to weeks: at rounds of a millisecond the [rounds, N] table
  would need terabytes; it is refused naming the file, the size and the flag to change."""
  trace = {"active": [1.0], "inactive": [5.0], "finish_time": 2.0e9}
  path = dump(tmp_path / "client_behave_trace", {1: trace})
  with pytest.raises(ValueError, match=r"client_behave_trace: the availability table of rounds "
                                       r"of 0.001 s is 2000000000000 rounds x 100 clients.*GiB to "
                                       r"build.*--avail_trace_round_s"):
    traces.availability_table(path, 100, round_s=1e-3)
