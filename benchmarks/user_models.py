r"""A user's own CNN beside the library's: does a model written as the model guide says train as
fast as the library's own?

  python -m benchmarks.user_models            # the table in docs/performance.md (a few minutes)
  python -m benchmarks.user_models --quick    # smoke run

One FedAvg round (K clients of S synthetic 32 x 32 x 3 images each, batch B, one local epoch: the
setup of pfl-research's CIFAR-10 benchmark, with its cohort scaled by --clients) for six models,
each in the same process and on the same data:
- `cifar_cnn (library)`: `build_model("cifar_cnn", ...)`.
- `cifar_cnn (user)`: the same architecture written by a user in flax with `models.PatchConv` and
  `models.max_pool_2x2` at their defaults: the guide's recipe.
- `simple_cnn (user)`: pfl-research's `simple_cnn` (conv 3x3 32, conv 3x3 64, pool, dropout 0.25,
  dense 128, dropout 0.5) written the same way, dropout on.
- `cifar_cnn (nn.Conv)` and `simple_cnn (nn.Conv)`: the same written with flax's `nn.Conv` and
  `nn.max_pool`, what a flax user writes without the guide; `from_flax` moves them onto the
  library's lowering (`models.fast_ops`).
- `simple_cnn (nn.Conv, conv_impl=lax)`: the same, run as written (XLA's convolution and
  `reduce_window`): what the lowering saves.

Each model compiles and runs a round first; then the timed rounds are interleaved (one round of
each model, again and again). Samples/s are medians over --reps rounds; the FLOP rate divides
each model's training FLOPs per example (XLA's count for one example's forward and backward pass
through the `nn.Conv` form) by the time per example, so models of different sizes compare by how
well they use the machine.
"""

from __future__ import annotations

import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import flags

import fedjax_sel as fs
from benchmarks.common import launch, markdown_table, peak_gflops, write_results
from benchmarks.user_cnns import SimpleCNN, UserCifarCNN, flax_pool
from fedjax_sel import models
from fedjax_sel.data.federated import split_clients

FLAGS = flags.FLAGS
flags.DEFINE_integer("clients", 10, "K, clients a round (pfl's benchmark: 50).")
flags.DEFINE_integer("samples", 50, "S, images a client.")
flags.DEFINE_integer("batch_size", 10, "B.")
flags.DEFINE_integer("reps", 7, "Timed rounds of each model (median).")


SHAPE, CLASSES = (32, 32, 3), 10


def variants() -> dict:
  """name -> (model, the same architecture as written, with XLA's convolution, for its FLOPs)."""
  wrap = lambda module, name, stochastic=False, conv_impl="auto": models.from_flax(
      module, SHAPE, CLASSES, name, stochastic=stochastic, conv_impl=conv_impl)
  plain_cifar = wrap(UserCifarCNN(CLASSES, nn.Conv, flax_pool), "cifar_cnn_nn", conv_impl="lax")
  plain_simple = wrap(SimpleCNN(CLASSES, nn.Conv, flax_pool), "simple_cnn_nn", True, "lax")
  return {
      "cifar_cnn (library)": (fs.build_model("cifar_cnn", SHAPE, CLASSES), plain_cifar),
      "cifar_cnn (user)": (wrap(UserCifarCNN(CLASSES), "user_cifar_cnn"), plain_cifar),
      "cifar_cnn (nn.Conv)": (wrap(UserCifarCNN(CLASSES, nn.Conv, flax_pool), "cifar_cnn_nn"),
                              plain_cifar),
      "simple_cnn (user)": (wrap(SimpleCNN(CLASSES), "simple_cnn", True), plain_simple),
      "simple_cnn (nn.Conv)": (wrap(SimpleCNN(CLASSES, nn.Conv, flax_pool), "simple_cnn_nn",
                                    True), plain_simple),
      "simple_cnn (nn.Conv, conv_impl=lax)": (plain_simple, plain_simple),
  }


def train_flops(model: fs.Model) -> float:
  """XLA's FLOP count of one example's forward and backward pass."""
  params = model.init(jax.random.PRNGKey(0))
  x, y = jnp.zeros((1, *SHAPE)), jnp.zeros((1,), jnp.int32)
  loss = lambda p: jnp.mean(models.train_losses(model, p, x, y, jnp.ones(1),
                                                jax.random.PRNGKey(1))[0])
  cost = jax.jit(jax.grad(loss)).lower(params).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return float(cost["flops"])


def dataset(clients: int, samples: int) -> fs.FederatedDataset:
  rng = np.random.default_rng(0)
  xs = [rng.standard_normal((samples, *SHAPE)).astype(np.float32) for _ in range(clients)]
  ys = [rng.integers(0, CLASSES, samples).astype(np.int32) for _ in range(clients)]
  return split_clients(xs, ys, num_classes=CLASSES, test_fraction=0.0, name="synthetic32")


def main(argv):
  del argv
  k = 2 if FLAGS.quick else FLAGS.clients
  samples = 10 if FLAGS.quick else FLAGS.samples
  reps = 1 if FLAGS.quick else FLAGS.reps
  data = dataset(k, samples)
  peak = peak_gflops()
  sims, states = {}, {}
  models_by_name = variants()
  for name, (model, _) in models_by_name.items():
    sims[name] = fs.Simulator(model, data, lambda lr: optax.sgd(lr),
                              fs.LocalHParams(batch_size=FLAGS.batch_size),
                              fs.uniform_availability(k, k), fs.random_selector(), fs.fedavg(), k,
                              seed=0)
    states[name], metrics = sims[name].step(sims[name].init())  # Compiles.
    jax.block_until_ready(metrics)
  times = {name: [] for name in sims}
  for _ in range(reps):  # Interleaved: a busy spell of the machine falls on every model alike.
    for name, sim in sims.items():
      start = time.perf_counter()
      states[name], metrics = sim.step(states[name])
      jax.block_until_ready(metrics)
      times[name].append(time.perf_counter() - start)
  rows = []
  for name, (_, plain) in models_by_name.items():
    per_s = k * samples / statistics.median(times[name])
    flops = train_flops(plain)
    rows.append({"model": name, "K": k, "samples_per_s": per_s, "mflop_per_example": flops / 1e6,
                 "gflop_s": flops * per_s / 1e9, "of_peak": flops * per_s / 1e9 / peak})
    print(rows[-1], flush=True)
  for r in rows:  # rows[0] is the library's CNN.
    r["vs_library_cifar_cnn_rate"] = r["gflop_s"] / rows[0]["gflop_s"]
  table = (f"conv impl: {models.resolve_conv_impl('auto')}; GEMM peak {peak:.0f} GFLOP/s; "
           f"S = {samples}, B = {FLAGS.batch_size}, one local epoch\n\n")
  table += markdown_table(rows, [("model", "model"), ("K", "K"), ("samples_per_s", "samples/s"),
                                 ("mflop_per_example", "MFLOP / example"),
                                 ("gflop_s", "GFLOP/s"), ("of_peak", "of GEMM peak"),
                                 ("vs_library_cifar_cnn_rate", "FLOP rate vs library CNN")])
  write_results("user_models", rows, table, {"peak_gflops": peak})


if __name__ == "__main__":
  launch(main)
