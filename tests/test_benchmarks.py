"""Smoke test: the benchmark scripts run in --quick mode and write well-formed results.

Benchmarks measure speed; nothing here asserts a time.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.hang_guard import HANG_GUARD_S

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("script,keys,extra", [
    pytest.param("round_throughput", {"model", "K", "vectorized", "jax_loop", "central_B",
                                      "central_KB", "vs_jax_loop"}, "scan_rounds",
                 marks=pytest.mark.slow),
    pytest.param("filter_throughput", {"model", "n", "m", "dgf_s", "rgf_s", "limit_s",
                                       "host_loop_s"}, "opt", marks=pytest.mark.slow),
    ("selector_throughput", {"selector", "N", "K", "ms", "selections_per_s"}, "rounds"),
    pytest.param("async_throughput", {"model", "N", "what", "ms", "per_s", "runs_ms"}, "machine",
                 marks=pytest.mark.slow),
    pytest.param("population_scaling", {"selector", "store", "N", "round_ms", "peak_rss_mb",
                                        "device_data_mb"}, "machine", marks=pytest.mark.slow),
    pytest.param("population_scaling --sweep=k", {"selector", "store", "K", "round_ms"}, "machine",
                 marks=pytest.mark.slow),
    pytest.param("time_to_result", {"table"}, "tables", marks=pytest.mark.slow),
    pytest.param("grid", {"contender", "wall_s", "compile_s", "rounds_s", "vs_best_peer"},
                 "arithmetic_limit_s", marks=pytest.mark.slow),
    pytest.param("user_models", {"model", "samples_per_s", "gflop_s", "vs_library_cifar_cnn_rate"},
                 "peak_gflops", marks=pytest.mark.slow),
    pytest.param("peers", {"model", "K", "ours"}, "time_split", marks=pytest.mark.slow),
    pytest.param("runs_axis_cpu", {"runs", "clients", "formulation", "us", "vs_engine"},
                 "peak_gflops", marks=pytest.mark.slow),
])
def test_benchmark_quick_mode(tmp_path, script, keys, extra):
  script, *args = script.split()
  proc = subprocess.run([sys.executable, "-m", f"benchmarks.{script}", "--quick", *args,
                         f"--out={tmp_path}"], cwd=REPO, capture_output=True, text=True,
                        timeout=HANG_GUARD_S)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  script += "_k" if args else ""
  with open(tmp_path / f"{script}_quick.json", encoding="utf-8") as f:
    result = json.load(f)
  assert result["rows"] and all(keys <= set(r) for r in result["rows"])
  assert result[extra] and "machine" in result
  table = (tmp_path / f"{script}_quick.md").read_text(encoding="utf-8")
  rows = [line for line in table.splitlines() if line.startswith("| ")]
  assert len(rows) >= 2 and table.splitlines()[-1].startswith("| ")


@pytest.mark.parametrize("name,written", [
    *((name, "library") for name in ("logreg", "mlp", "leaf_cnn", "cifar_cnn", "resnet18",
                                     "simple_cnn")),
    *((name, "flax") for name in ("leaf_cnn", "cifar_cnn", "simple_cnn"))])
def test_peer_models_are_ours_in_pytorch(name, written):
  """The peers train the same network: the PyTorch twin has our parameter count, layer by layer
  in total (runs where torch is installed, e.g. with the `peers` extra), for the library's models
  and those written with flax's nn.Conv."""
  pytest.importorskip("torch")
  import jax  # pylint: disable=import-outside-toplevel

  from benchmarks import peer_worker  # pylint: disable=import-outside-toplevel
  ours = peer_worker.our_model(name, 16, written=written).init(jax.random.PRNGKey(0))
  theirs = peer_worker.torch_net(name, 16)
  assert sum(p.numel() for p in theirs.parameters()) == sum(
      x.size for x in jax.tree.leaves(ours))


RUNS_AXIS_CHECK = """
import jax, numpy as np
from benchmarks import runs_axis_cpu as bench

key = jax.random.PRNGKey(1)
params = bench.init(key, 6)
x = jax.random.normal(key, (6, bench.BATCH, bench.DIMS[0]))
y = jax.random.randint(key, (6, bench.BATCH), 0, bench.DIMS[-1])
loop = [bench.sgd_step(jax.tree.map(lambda v, i=i: v[i], params), x[i], y[i]) for i in range(6)]
for name, fn in bench.formulations(3, 2).items():
  if "shared" in name:
    continue
  got = jax.jit(fn)(params, x, y)
  for i in range(6):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(loop[i])):
      np.testing.assert_allclose(a[i], b, rtol=1e-5, atol=1e-6, err_msg=name)
print("same")
"""


@pytest.mark.slow
def test_the_runs_axis_formulations_compute_one_step_each():
  """Every formulation of `runs_axis_cpu` but the shared-weights ceiling gives each client the
  step a plain loop over the clients gives it (in a process of its own: the benchmark's flags
  would clash with the launchers' in this one)."""
  proc = subprocess.run([sys.executable, "-c", RUNS_AXIS_CHECK], cwd=REPO, capture_output=True,
                        text=True, timeout=HANG_GUARD_S)
  assert proc.returncode == 0 and "same" in proc.stdout, proc.stdout + proc.stderr
