r"""Formulations of R runs x C clients of small-model local training on CPU: which one makes the
runs cheaper together than apart?

  python -m benchmarks.runs_axis_cpu            # the table in docs/performance.md (~1 min)
  python -m benchmarks.runs_axis_cpu --quick    # smoke run

One SGD step of the grid's MLP (64 -> 200 -> 200 -> 10, B = 16) for every client of R runs x C
clients, each client with weights of its own, written five ways and timed in one compiled call
each (medians of interleaved repetitions):
- `runs looped, clients vmapped`: the engine's CPU layout (`lax.map` over runs, `vmap` over a
  chunk of clients);
- `runs and clients vmapped`: one `vmap` over R x C (batched dots of R x C small products);
- `clients looped, runs vmapped`: the other nesting;
- `runs x clients looped`: no vmap at all;
- `one shared GEMM (ceiling)`: the same FLOPs with one set of weights for all R x C x B rows (not
  a formulation of separate runs: the GEMM rate a fold of runs into the batch could at most reach).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from benchmarks.common import launch, markdown_table, median_time, peak_gflops, write_results

FLAGS = flags.FLAGS
flags.DEFINE_integer("reps", 30, "Timed calls per formulation (median).")

DIMS, BATCH = (64, 200, 200, 10), 16


def init(key, n: int):
  keys = jax.random.split(key, len(DIMS) - 1)
  return [(jax.random.normal(k, (n, a, b)) / np.sqrt(a), jnp.zeros((n, b)))
          for k, a, b in zip(keys, DIMS, DIMS[1:])]


def loss(params, x, y):
  for i, (w, b) in enumerate(params):
    x = x @ w + b
    if i < len(params) - 1:
      x = jax.nn.relu(x)
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(x), y[:, None], axis=1))


def sgd_step(params, x, y):
  grads = jax.grad(loss)(params, x, y)
  return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def step_flops(rows: int) -> float:
  return 6.0 * rows * sum(a * b for a, b in zip(DIMS, DIMS[1:]))


def formulations(r: int, c: int):
  """name -> f(params [R*C, ...], x [R*C, B, 64], y [R*C, B]) -> new params."""
  split = lambda t, a, b: jax.tree.map(lambda v: v.reshape(a, b, *v.shape[1:]), t)
  merge = lambda t: jax.tree.map(lambda v: v.reshape(-1, *v.shape[2:]), t)
  vstep = jax.vmap(sgd_step)

  def runs_looped(p, x, y):
    return merge(jax.lax.map(lambda a: vstep(*a), split((p, x, y), r, c)))

  def clients_looped(p, x, y):
    swap = lambda t: jax.tree.map(lambda v: jnp.swapaxes(v, 0, 1), t)
    out = jax.lax.map(lambda a: vstep(*a), swap(split((p, x, y), r, c)))
    return merge(swap(out))

  def all_looped(p, x, y):
    return jax.lax.map(lambda a: sgd_step(*a), (p, x, y))

  def shared(p, x, y):
    one = jax.tree.map(lambda v: v[0], p)
    return sgd_step(one, x.reshape(-1, DIMS[0]), y.reshape(-1))

  return {"runs looped, clients vmapped": runs_looped, "runs and clients vmapped": vstep,
          "clients looped, runs vmapped": clients_looped, "runs x clients looped": all_looped,
          "one shared GEMM (ceiling)": shared}


def main(argv):
  del argv
  cases = [(4, 4)] if FLAGS.quick else [(1, 4), (4, 4), (16, 4), (16, 10)]
  reps = 3 if FLAGS.quick else FLAGS.reps
  rows = []
  for r, c in cases:
    n = r * c
    key = jax.random.PRNGKey(0)
    params = init(key, n)
    x = jax.random.normal(key, (n, BATCH, DIMS[0]))
    y = jax.random.randint(key, (n, BATCH), 0, DIMS[-1])
    fns = {name: jax.jit(fn) for name, fn in formulations(r, c).items()}
    for fn in fns.values():
      jax.block_until_ready(fn(params, x, y))
    times = {name: [] for name in fns}
    for _ in range(reps):  # Interleaved: each repetition times every formulation once.
      for name, fn in fns.items():
        times[name].append(median_time(functools.partial(fn, params, x, y), 1, warmup=0))
    base = float(np.median(times["runs looped, clients vmapped"]))
    for name, ts in times.items():
      t = float(np.median(ts))
      rows.append({"runs": r, "clients": c, "formulation": name, "us": t * 1e6,
                   "gflops": step_flops(n * BATCH) / t / 1e9, "vs_engine": base / t})
  peak = peak_gflops()
  table = (f"One SGD step of the MLP {DIMS} (B = {BATCH}) for R runs x C clients with weights of "
           f"their own; one compiled call per formulation, medians of {reps} interleaved calls; "
           f"this machine's GEMM peak {peak:.0f} GFLOP/s\n\n")
  table += markdown_table(rows, [("runs", "R"), ("clients", "C"), ("formulation", "formulation"),
                                 ("us", "us per step"), ("gflops", "GFLOP/s"),
                                 ("vs_engine", "speed-up vs the engine's layout")])
  write_results("runs_axis_cpu", rows, table, {"peak_gflops": peak})


if __name__ == "__main__":
  launch(main)
