"""Flags, timing, machine description and result files shared by the benchmark scripts."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import jax
from absl import app, flags

from fedjax_sel.host.compilation import use_persistent_cache

flags.DEFINE_bool("quick", False, "Smoke run: a tiny grid in seconds (no table for publishing).")
flags.DEFINE_string("out", "benchmarks/results", "Folder of the JSON / markdown results.")


def launch(main: Callable[[list[str]], object]) -> None:
  """Runs a benchmark's `main` under absl with JAX's persistent compilation cache on, as the
  launchers' entry path turns it on (`fedjax_sel.use_persistent_cache`)."""
  use_persistent_cache()
  app.run(main)


def python_with(module: str, python: str | None, default: str) -> str | None:
  """The interpreter for a peer: `python` if given, else `default` (a peer's own virtual
  environment) when it exists, else this one; None when that interpreter cannot import `module`."""
  python = python or (default if os.path.exists(default) else sys.executable)
  ok = subprocess.run([python, "-c", f"import {module}"], capture_output=True, check=False)
  return python if ok.returncode == 0 else None


def machine() -> dict:
  return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
          "cpus": os.cpu_count(), "jax": jax.__version__, "backend": jax.default_backend(),
          "devices": [str(d) for d in jax.devices()]}


def median_time(fn: Callable[[], object], reps: int, warmup: int = 1) -> float:
  """Median wall time of `fn()` (its outputs blocked on) over `reps` runs after `warmup` runs."""
  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def median_step_time(runner, state, reps: int) -> float:
  """Median wall time of `runner.step` (a `Simulator` or `RunBatch`) over `reps` rounds, the
  state carried from round to round, after one compiled warm-up round from `state`."""
  state, metrics = runner.step(state)
  jax.block_until_ready(metrics)
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    state, metrics = runner.step(state)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def peak_gflops() -> float:
  """The machine's float32 GEMM rate in GFLOP/s (a jitted 2048 x 2048 x 2048 product, median of
  5)."""
  a = jax.random.uniform(jax.random.PRNGKey(0), (2048, 2048))
  matmul = jax.jit(lambda m: m @ m)
  return 2 * 2048**3 / median_time(lambda: matmul(a), 5) / 1e9


def markdown_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
  """Rows as a markdown table; `columns` = (key, header); floats get 3 significant digits."""
  fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else ("-" if v is None else str(v))
  lines = ["| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(fmt(r.get(k)) for k, _ in columns) + " |" for r in rows]
  return "\n".join(lines)


def write_results(name: str, rows: list[dict], table: str, extra: dict | None = None):
  """Writes `<--out>/<name>.json` (rows + machine) and `<--out>/<name>.md` (the table); `name`
  gets a `_quick` suffix in `--quick` mode so smoke runs never overwrite published results."""
  out = flags.FLAGS.out
  name += "_quick" if flags.FLAGS.quick else ""
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, f"{name}.json"), "w", encoding="utf-8") as f:
    json.dump({"machine": machine(), "rows": rows, **(extra or {})}, f, indent=1)
  with open(os.path.join(out, f"{name}.md"), "w", encoding="utf-8") as f:
    f.write(table + "\n")
  print(table)
  print(f"results: {os.path.join(out, name)}.json / .md")
