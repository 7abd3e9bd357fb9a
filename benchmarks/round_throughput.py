r"""Training throughput of one FedAvg round with K clients, beside what users run today.

  python -m benchmarks.round_throughput            # full table (minutes)
  python -m benchmarks.round_throughput --quick    # smoke run (seconds)

Variants, all in one process and one run, on the same synthetic data (S samples per client, batch
B, one local epoch), reported in training samples/s:
  vectorized:    our `local_train` (vmap over stacked clients, chunk size picked by
                 `auto_chunk_size` as the `Simulator` picks it) with FedAvg folded in chunk
                 by chunk, one jitted call (what `Simulator` runs for a linear aggregator).
  jax_loop:      a Python loop over clients calling one jitted SGD step per batch (fedjax-style).
  torch_loop:    the same loop in PyTorch on CPU (Flower / pfl / FedML style); skipped without
                 torch.
  central_B:     one model trained on all K*S samples with batch B (the per-client-batch limit).
  central_KB:    one model trained with the fused batch K*B (the fused-batch limit).
Beside them, the FLOP rate of our round (XLA's count of a client step's FLOPs) and the rate a 20x
speed-up over the JAX loop would need, against the machine's peak (a 2048^3 float32 GEMM).
Extra rows: chunk size (all models) and conv lowering (patches vs lax, LEAF CNN) at K = 100 (with
XLA's planned memory), and several rounds per compiled call (`Simulator.steps`) against one call
per round.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import flags

import fedjax_sel as fs
from benchmarks.common import launch, markdown_table, median_time, peak_gflops, write_results
from benchmarks.peer_worker import SHAPES, make_data, torch_fedavg, torch_net
from fedjax_sel.client.compiled_cost import planned_bytes
from fedjax_sel.client.local_training import auto_chunk_size, default_memory_budget, step_cost
from fedjax_sel.data.federated import ClientPool, device_pool
from fedjax_sel.models import masked_mean_loss

FLAGS = flags.FLAGS
flags.DEFINE_integer("samples_per_client", 64, "S.")
flags.DEFINE_integer("batch_size", 32, "B.")
flags.DEFINE_integer("reps", 3, "Timed repetitions (median).")

LR = 0.05


def grid(quick: bool):
  if quick:
    return [("logreg", 4), ("mlp", 4)]
  return [("logreg", 10), ("logreg", 100), ("logreg", 1000), ("mlp", 10), ("mlp", 100),
          ("mlp", 1000), ("leaf_cnn", 10), ("leaf_cnn", 100)]


def make_pool(k, s, shape, classes, seed=0):
  x, y = make_data(shape, classes, k, s, seed)  # The arrays every framework of peers.py trains.
  return ClientPool(x, y, np.repeat(np.arange(k, dtype=np.int32), s),
                    (np.arange(k) * s).astype(np.int32), np.full(k, s, np.int32))


def vectorized(model, params, pool, k, b, chunk):
  """Our round with `chunk` clients per vmapped chunk; returns the runner and XLA's planned GiB."""
  hp = fs.LocalHParams(batch_size=b, num_epochs=1, chunk_size=chunk)
  clients = jnp.arange(k, dtype=jnp.int32)
  keys = fs.keys.client_keys(jax.random.PRNGKey(0), clients)
  weights = fs.fedavg("examples").linear_weights(jnp.ones(k, bool), jnp.asarray(pool.counts))
  dp = device_pool(pool)

  @jax.jit
  def round_fn(p, dp):  # FedAvg streamed out of local training, as the Simulator runs it.
    return fs.local_train(model, lambda lr: optax.sgd(lr), hp, p, dp, clients, jnp.ones(k, bool),
                          keys, jnp.float32(LR), pool.max_count, combine=weights).params
  return lambda: round_fn(params, dp), planned_bytes(round_fn.lower(params, dp).compile()) / 2**30


def sgd_step_fn(model):
  @jax.jit
  def step(p, x, y):
    g = jax.grad(lambda q: masked_mean_loss(model, q, x, y, jnp.ones(y.shape[0])))(p)
    return jax.tree.map(lambda a, gi: a - LR * gi, p, g)
  return step


def jax_loop(model, params, pool, k, s, b):
  step = sgd_step_fn(model)
  add = jax.jit(lambda acc, p, w: jax.tree.map(lambda a, q: a + w * q, acc, p))
  x, y = jnp.asarray(pool.x), jnp.asarray(pool.y)
  batches = [[(x[c * s + i:c * s + i + b], y[c * s + i:c * s + i + b]) for i in range(0, s, b)]
             for c in range(k)]

  def run():
    acc = jax.tree.map(jnp.zeros_like, params)
    for c in range(k):
      p = params
      for xb, yb in batches[c]:
        p = step(p, xb, yb)
      acc = add(acc, p, 1.0 / k)
    return acc
  return run


def central(model, params, pool, batch):
  step = sgd_step_fn(model)
  x, y = jnp.asarray(pool.x), jnp.asarray(pool.y)
  batches = [(x[i:i + batch], y[i:i + batch]) for i in range(0, x.shape[0], batch)]

  def run():
    p = params
    for xb, yb in batches:
      p = step(p, xb, yb)
    return p
  return run


def torch_loop(name, pool, k, s, b):
  """Returns a runner (the peers' PyTorch loop on these arrays), or None without torch."""
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  return torch_fedavg(torch_net(name, 16), torch.from_numpy(np.ascontiguousarray(
      pool.x.transpose(0, 3, 1, 2))), torch.from_numpy(pool.y.astype(np.int64)), k, s, b)


def chunk_ablation(s: int, b: int, reps: int) -> list[dict]:
  """K = 100 rounds at several chunk sizes, and the LEAF CNN with `lax.conv` instead of patches."""
  k, entries = 100, []
  for name, impl, chunks in (("logreg", "-", (1, 2, 4, 10, 100)), ("mlp", "-", (1, 2, 4, 10, 100)),
                             ("leaf_cnn", "patches", (1, 2, 4, 10, 25, 100)),
                             ("leaf_cnn", "lax", (4,))):
    shape, classes = SHAPES[name]
    pool = make_pool(k, s, shape, classes)
    model = fs.build_model(name, shape, classes, conv_impl="patches" if impl == "-" else impl)
    params = model.init(jax.random.PRNGKey(0))
    for chunk in chunks:
      run, gib = vectorized(model, params, pool, k, b, chunk)
      # lax.conv under vmap is ~10x slower (minutes per round): one timed run is enough.
      entry = {"model": name, "conv_impl": impl, "chunk": chunk,
               "samples_per_s": k * s / median_time(run, 1 if impl == "lax" else reps),
               "xla_gb": gib}
      print(entry, flush=True)
      entries.append(entry)
  return entries


def scan_rounds_rows(quick: bool) -> list[dict]:
  """Rounds per compiled call: `sim.steps(R)` against R calls of `sim.step`."""
  rows = []
  data = fs.build_dataset(fs.DatasetSpec("digits", num_clients=50, partition="iid"), seed=0)
  rounds = 5 if quick else 20
  for name in ("logreg", "mlp"):
    model = fs.build_model(name, data.feature_shape, data.num_classes)
    sim = fs.Simulator(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=16),
                       fs.uniform_availability(50, 20), fs.random_selector(), fs.fedavg(), 10, 0)
    state = sim.init()

    def per_round():
      s = state
      for _ in range(rounds):
        s, _ = sim.step(s)
      return s
    t_loop = median_time(per_round, 1 if quick else FLAGS.reps)
    t_scan = median_time(lambda: sim.steps(state, rounds), 1 if quick else FLAGS.reps)
    rows.append({"model": name, "rounds": rounds, "per_round_call_ms": 1e3 * t_loop / rounds,
                 "scanned_ms": 1e3 * t_scan / rounds, "gain": t_loop / t_scan})
  return rows


def main(argv):
  del argv
  s, b = FLAGS.samples_per_client, FLAGS.batch_size
  reps = 1 if FLAGS.quick else FLAGS.reps
  peak = peak_gflops()
  rows = []
  for name, k in grid(FLAGS.quick):
    shape, classes = SHAPES[name]
    model = fs.build_model(name, shape, classes)
    params = model.init(jax.random.PRNGKey(0))
    pool = make_pool(k, s, shape, classes)
    n = k * s
    row = {"model": name, "K": k}
    # The step's cost picks the chunk size as the `Simulator` does, and gives the FLOP rates below.
    cost = step_cost(model, lambda lr: optax.sgd(lr), fs.LocalHParams(b), params, shape)
    row["chunk"] = auto_chunk_size(cost, default_memory_budget(), k)
    run, row["xla_gb"] = vectorized(model, params, pool, k, b, row["chunk"])
    row["vectorized"] = n / median_time(run, reps)
    # The loops are timed on up to 100 clients (throughput is per client).
    loop_clients = min(k, 100)
    loop_pool = make_pool(loop_clients, s, shape, classes)
    row["jax_loop"] = loop_clients * s / median_time(jax_loop(model, params, loop_pool,
                                                              loop_clients, s, b), reps)
    t = torch_loop(name, loop_pool, loop_clients, s, b)
    row["torch_loop"] = None if t is None else loop_clients * s / median_time(t, reps)
    row["central_B"] = n / median_time(central(model, params, pool, b), reps)
    row["central_KB"] = n / median_time(central(model, params, pool, k * b), reps)
    row["vs_jax_loop"] = row["vectorized"] / row["jax_loop"]
    row["vs_torch_loop"] = None if t is None else row["vectorized"] / row["torch_loop"]
    row["vs_central_B"] = row["vectorized"] / row["central_B"]
    row["vs_central_KB"] = row["vectorized"] / row["central_KB"]
    flops_per_sample = cost.flops / b
    row["gflops"] = row["vectorized"] * flops_per_sample / 1e9
    row["gflops_20x_loop"] = 20 * row["jax_loop"] * flops_per_sample / 1e9
    print(row, flush=True)
    rows.append(row)
  ablation = [] if FLAGS.quick else chunk_ablation(s, b, reps)
  scan_rows = scan_rounds_rows(FLAGS.quick)
  table = markdown_table(rows, [
      ("model", "model"), ("K", "K"), ("chunk", "chunk"), ("vectorized", "ours (samples/s)"),
      ("jax_loop", "JAX per-client loop"), ("torch_loop", "PyTorch per-client loop"),
      ("central_B", "central, batch B"), ("central_KB", "central, batch K*B"),
      ("vs_jax_loop", "ours / JAX loop"), ("vs_torch_loop", "ours / torch loop"),
      ("vs_central_B", "ours / central B"), ("vs_central_KB", "ours / central K*B"),
      ("gflops", "ours GFLOP/s"), ("gflops_20x_loop", "GFLOP/s for 20x JAX loop"),
      ("xla_gb", "XLA planned GiB")])
  table += f"\n\nPeak float32 GEMM rate of this machine: {peak:.0f} GFLOP/s."
  if ablation:
    table += "\n\nK = 100: client chunk size and convolution lowering\n\n" + markdown_table(
        ablation, [("model", "model"), ("conv_impl", "conv"), ("chunk", "chunk"),
                   ("samples_per_s", "samples/s"), ("xla_gb", "XLA planned memory (GiB)")])
  table += "\n\nSeveral rounds per compiled call (digits, K = 10)\n\n" + markdown_table(
      scan_rows, [("model", "model"), ("rounds", "rounds"), ("per_round_call_ms", "ms/round, one "
                                                                                  "call each"),
                  ("scanned_ms", "ms/round, lax.scan"), ("gain", "gain")])
  write_results("round_throughput", rows, table,
                {"chunk_ablation": ablation, "scan_rounds": scan_rows, "peak_gflops": peak,
                 "samples_per_client": s, "batch_size": b})


if __name__ == "__main__":
  launch(main)
