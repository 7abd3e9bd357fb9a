"""Multi-host runs on JAX's distributed runtime, on this CPU machine: 2 processes (localhost
coordinator, gloo collectives) of 2 fake devices each give the same per-round metrics and final
model as one process with 4 devices and one with 1 device, for FedAvg and for FilFL rounds.

Tolerance: relative 1e-5 (absolute 1e-6). With several devices the clients axis of local training
is sharded and FedAvg's weighted sum is reduced across devices, so float32 sums are added in
another order (rounding differences of ~1e-7 per round); selections, counts and filtered-in sets
must be identical.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from flax import serialization

from fedjax_sel.host import checkpoint
from tests.test_launchers import REPO
from tests.hang_guard import HANG_GUARD_S

COMMON = ["--rounds=3", "--num_clients=12", "--num_available=8", "--clients_per_round=4",
          "--seeds=0", "--checkpoint_every=1", "--hidden=16"]
LAUNCHERS = {"run": ("experiments.run", "seed0", []),
             "filfl": ("experiments.filfl", "dgf/seed0", ["--filters=dgf", "--filter_period=2"])}


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def launch(module, args, devices, extra=()):
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
             JAX_PLATFORMS="cpu")
  return subprocess.Popen([sys.executable, "-m", module, *args, *extra], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def outputs(folder):
  with open(os.path.join(folder, "metrics.jsonl"), encoding="utf-8") as f:
    records = [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in f]
  with open(os.path.join(folder, "checkpoint.msgpack"), "rb") as f:
    blob = f.read()
  leaves = serialization.msgpack_restore(blob[len(checkpoint.MAGIC) + 65:])["leaves"]
  return records, [np.asarray(leaves[str(i)]) for i in range(len(leaves))]


def assert_close(a, b, path="record"):
  if isinstance(a, dict):
    assert set(a) == set(b), path
    for k in a:
      assert_close(a[k], b[k], f"{path}.{k}")
  elif isinstance(a, float) or isinstance(b, float):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=path)
  else:
    assert a == b, path


@pytest.mark.slow  # Four launcher processes per launcher: `pytest -m slow`.
@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_two_processes_equal_one_process_of_four_devices_and_of_one(tmp_path, name):
  module, sub, extra = LAUNCHERS[name]
  port = free_port()
  jobs = {
      "one_device": [launch(module, COMMON + extra + [f"--out_dir={tmp_path}/one"], 1)],
      "four_devices": [launch(module, COMMON + extra + [f"--out_dir={tmp_path}/four"], 4)],
      "two_processes": [
          launch(module, COMMON + extra + [f"--out_dir={tmp_path}/two", f"--process_id={i}",
                                           f"--coordinator_address=localhost:{port}",
                                           "--num_processes=2"], 2) for i in (0, 1)],
  }
  for label, procs in jobs.items():
    for proc in procs:
      out = proc.communicate(timeout=HANG_GUARD_S)[0]
      assert proc.returncode == 0, f"{label}:\n{out}"
  one, four, two = (outputs(os.path.join(tmp_path, d, sub)) for d in ("one", "four", "two"))
  for other in (four, two):
    assert len(other[0]) == len(one[0]) == 3
    for a, b in zip(one[0], other[0]):
      assert_close(a, b)
    for a, b in zip(one[1], other[1]):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # Files are written once: process 1 printed no table.
  assert not os.path.exists(os.path.join(tmp_path, "two", "summary.md.tmp"))


def two_processes(module, args, folder):
  """Runs a launcher as 2 processes of 2 devices each; returns their exit codes and outputs."""
  port = free_port()
  procs = [launch(module, args + [f"--out_dir={folder}", f"--process_id={i}",
                                  f"--coordinator_address=localhost:{port}",
                                  "--num_processes=2"], 2) for i in (0, 1)]
  outs = [proc.communicate(timeout=HANG_GUARD_S)[0] for proc in procs]
  return [proc.returncode for proc in procs], outs


@pytest.mark.slow  # Five launcher processes: `pytest -m slow`.
def test_two_process_run_resumes_like_an_uninterrupted_one(tmp_path):
  """2 processes stop after round 2 and resume to round 3 from process 0's checkpoint (both read
  it); the result equals one uninterrupted single-device run. Resuming with a changed flag is
  refused by every process."""
  module, sub, extra = LAUNCHERS["filfl"]
  base = [a for a in COMMON if not a.startswith("--rounds")] + extra
  one = launch(module, base + ["--rounds=3", f"--out_dir={tmp_path}/one"], 1)
  assert one.wait(timeout=HANG_GUARD_S) == 0, one.communicate()[0]
  codes, outs = two_processes(module, base + ["--rounds=2"], tmp_path / "two")
  assert codes == [0, 0], outs
  codes, outs = two_processes(module, base + ["--rounds=3", "--resume"], tmp_path / "two")
  assert codes == [0, 0] and "resum" in outs[0].lower(), outs
  first, resumed = (outputs(os.path.join(tmp_path, d, sub)) for d in ("one", "two"))
  assert len(resumed[0]) == 3
  for a, b in zip(first[0], resumed[0]):
    assert_close(a, b)
  for a, b in zip(first[1], resumed[1]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  changed = base + ["--rounds=4", "--resume", "--lr=0.5"]
  codes, outs = two_processes(module, changed, tmp_path / "two")
  assert all(code != 0 for code in codes), outs
  assert "lr" in outs[0] and "--help" not in outs[0], outs[0]


@pytest.mark.parametrize("args,needle", [
    (["--coordinator_address=localhost:{port}", "--num_processes=2", "--process_id=1",
      "--distributed_timeout=5"], "could not join"),
    (["--coordinator_address=localhost:{port}", "--num_processes=2", "--process_id=2"],
     "--process_id"),
    (["--num_processes=2"], "--coordinator_address"),
    (["--coordinator_address=localhost:{port}", "--num_processes=3", "--process_id=0",
      "--distributed_timeout=3"], "process ids [1, 2] did not check in"),
])
def test_unreachable_coordinator_or_bad_counts_fail_in_bounded_time(tmp_path, args, needle):
  """Each ends with one error line (status 1), process 0 left alone included: the rendezvous
  before JAX's coordinator starts means no native abort and no stack dump."""
  args = [a.replace("{port}", str(free_port())) for a in args]
  proc = launch("experiments.run", COMMON + [f"--out_dir={tmp_path}"] + args, 1)
  out = proc.communicate(timeout=HANG_GUARD_S)[0]
  assert proc.returncode == 1 and needle in out, out
  assert "Traceback" not in out and "Check failed" not in out and "*** " not in out, out
