r"""Greedy filtering time: our one-jit DGF / RGF beside the limit and beside a host loop.

  python -m benchmarks.filter_throughput           # full table
  python -m benchmarks.filter_throughput --quick   # smoke run

For n client models and a public set of m examples:
  dgf, rgf:     `greedy_filter` (one jitted `lax.scan`, the two candidates of a step batched).
  limit:        (2n + 1) x the time of one jitted public-set forward pass of one model.
  host_loop:    Algorithm 1 as the reference code runs it: a Python loop, candidate averages from
                running sums, one jitted forward call per candidate and a host decision per client.
  opt:          exhaustive OPT over 2^n - 1 subsets (n <= 16, MLP).
Beside them, DGF's FLOP rate (XLA's count of one forward pass) and the rate 10x the host loop would
need, against the machine's peak (a 2048^3 float32 GEMM).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from absl import flags

import fedjax_sel as fs
from benchmarks.common import launch, markdown_table, median_time, peak_gflops, write_results
from fedjax_sel.client.compiled_cost import flops
from fedjax_sel.models import per_example_loss
from fedjax_sel.parts.filters import filfl as filtering

FLAGS = flags.FLAGS
flags.DEFINE_integer("cnn_max_nm", 60000, "Largest n*m timed for the LEAF CNN (its CPU time grows "
                     "as n*m: n=100, m=2000 takes minutes per variant on 2 cores).")
flags.DEFINE_integer("reps", 1, "Timed repetitions (median).")


def setup(name, n, m, seed=0):
  model = fs.build_model(name, (28, 28, 1), 62 if name == "leaf_cnn" else 10)
  key = jax.random.PRNGKey(seed)
  base = model.init(key)
  clients = jax.tree.map(lambda a: a[None] + 0.05 * jax.random.normal(key, (n, *a.shape)), base)
  x = jax.random.uniform(jax.random.fold_in(key, 1), (m, 28, 28, 1))
  y = jax.random.randint(jax.random.fold_in(key, 2), (m,), 0, model.num_classes)
  loss_fn = lambda p: jnp.mean(per_example_loss(model, p, x, y))
  return loss_fn, clients, base


def host_loop(loss_fn, clients, base, n):
  """Reference-code style DGF: one jitted forward per candidate, decisions on the host."""
  loss = jax.jit(loss_fn)
  add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))
  sub = jax.jit(lambda a, b: jax.tree.map(jnp.subtract, a, b))
  scale = jax.jit(lambda a, s: jax.tree.map(lambda v: v * s, a))
  rows = [jax.tree.map(lambda a, i=i: a[i], clients) for i in range(n)]

  # Compile every jitted piece (one shape each) before timing.
  jax.block_until_ready((loss(scale(add(base, rows[0]), 0.5)), sub(base, rows[0])))

  def run():
    r_empty = 10.0 - float(loss(base))
    y_sum = jax.tree.map(lambda a: a.sum(0), clients)
    x_sum = jax.tree.map(jnp.zeros_like, base)
    nx, ny = 0, n
    r_x, r_y = r_empty, 10.0 - float(loss(scale(y_sum, 1.0 / n)))
    kept = []
    for u in range(n):
      xs, ys = add(x_sum, rows[u]), sub(y_sum, rows[u])
      r_xu = 10.0 - float(loss(scale(xs, 1.0 / (nx + 1))))
      r_yu = 10.0 - float(loss(scale(ys, 1.0 / (ny - 1)))) if ny > 1 else r_empty
      if r_xu - r_x > r_yu - r_y:
        x_sum, nx, r_x = xs, nx + 1, r_xu
        kept.append(u)
      else:
        y_sum, ny, r_y = ys, ny - 1, r_yu
    return kept
  return run


def main(argv):
  del argv
  if FLAGS.quick:
    configs = [("mlp", 10, 100)]
    opt_ns = [6]
  else:
    configs = [("mlp", n, m) for m in (500, 2000) for n in (10, 30, 100, 300)]
    configs += [("leaf_cnn", n, m) for m in (500, 2000) for n in (10, 30, 100, 300)
                if n * m <= FLAGS.cnn_max_nm]
    opt_ns = [8, 12, 16]
  peak = peak_gflops()
  rows = []
  for name, n, m in configs:
    loss_fn, clients, base = setup(name, n, m)
    valid = jnp.ones(n, bool)
    row = {"model": name, "n": n, "m": m}
    # Sub-second configurations are noisy: repeat them (the LEAF CNN's large ones take minutes).
    reps = max(FLAGS.reps, 5 if name == "mlp" else (3 if n * m <= 15000 else 1))
    key = jax.random.PRNGKey(0)
    for mode in ("dgf", "rgf"):
      # Compiled ahead of time, so a long configuration runs once per repetition only.
      fn = jax.jit(lambda c, v, p, k, mode=mode: filtering.greedy_filter(
          loss_fn, c, v, p, k, mode=mode)).lower(clients, valid, base, key).compile()
      row[mode + "_s"] = median_time(lambda fn=fn: fn(clients, valid, base, key), reps, warmup=0)
    single = jax.jit(loss_fn)
    row["forward_s"] = median_time(lambda: single(base), 3)
    row["limit_s"] = (2 * n + 1) * row["forward_s"]
    row["host_loop_s"] = median_time(host_loop(loss_fn, clients, base, n), reps, warmup=0)
    row["dgf_vs_limit"] = row["dgf_s"] / row["limit_s"]
    row["host_vs_dgf"] = row["host_loop_s"] / row["dgf_s"]
    # FLOP rates: DGF's, and what 10x the host loop would need (compare with the machine's peak).
    forward_flops = flops(single.lower(base).compile())
    row["dgf_gflops"] = (2 * n + 1) * forward_flops / row["dgf_s"] / 1e9
    row["gflops_10x_host"] = 10 * (2 * n + 1) * forward_flops / row["host_loop_s"] / 1e9
    print(row, flush=True)
    rows.append(row)
  opt_rows = []
  for n in opt_ns:
    loss_fn, clients, _ = setup("mlp", n, 500)
    fn = jax.jit(lambda c: filtering.opt_filter(loss_fn, c, n).value)
    t = median_time(lambda: fn(clients), 1)
    opt_rows.append({"n": n, "subsets": 2**n - 1, "opt_s": t, "subsets_per_s": (2**n - 1) / t})
    print(opt_rows[-1], flush=True)
  table = markdown_table(rows, [
      ("model", "model"), ("n", "n"), ("m", "m"), ("dgf_s", "DGF s"), ("rgf_s", "RGF s"),
      ("limit_s", "(2n+1) forwards s"), ("host_loop_s", "host loop s"),
      ("dgf_vs_limit", "DGF / limit"), ("host_vs_dgf", "host loop / DGF"),
      ("dgf_gflops", "DGF GFLOP/s"), ("gflops_10x_host", "GFLOP/s for 10x host loop")])
  table += f"\n\nPeak float32 GEMM rate of this machine: {peak:.0f} GFLOP/s."
  table += "\n\nOPT (MLP, m = 500)\n\n" + markdown_table(opt_rows, [
      ("n", "n"), ("subsets", "subsets"), ("opt_s", "s"), ("subsets_per_s", "subsets/s")])
  write_results("filter_throughput", rows, table, {"opt": opt_rows, "peak_gflops": peak})


if __name__ == "__main__":
  launch(main)
