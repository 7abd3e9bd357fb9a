r"""Selector throughput: every registered selector's own work per round on client-state arrays of
N clients, and a whole engine round with the statistics it needs.

  python -m benchmarks.selector_throughput           # N up to 1e6 (about 10 minutes on 2 cores)
  python -m benchmarks.selector_throughput --quick   # smoke run (four selectors, small N)

Selection step (table 1): each selector built by its registered name with its defaults, K = --k,
half the clients in the mask, the statistics it declares given as arrays (gradients of the
D = --dim parameters of a logistic regression where it reads them; update norms and the next
round's availability as arrays); `select` then `observe` (with K trained clients' models), one
jitted call, median of --reps, on round 17 (past FedCor's warm-up, neither a refit nor a TiFL
update round). FedCor is timed on a greedy round (its GP fit, O(N^3) per step,
runs on one round in `interval` and is timed separately at N <= --fit_max_n). A selector whose
state or work grows faster than N is run up to the N where it fits (its row says why not past
it): DivFL and clustered sampling by similarity hold an [N, D] table, clustered sampling by
similarity and FedCor an [N, N] matrix (Ward's agglomeration is O(N^3)).

Round (table 2): one `Simulator.step` (median over --round_reps after a compiled warm-up) with
each selector on SYNTH(1, 1) of N in --round_ns clients, logistic regression, K = 10 of N / 2
available, FedAvg, the clock on: the selector's statistics computed as the engine computes them
(every available client's loss for power of choice, gradients for DivFL, a cohort's training for
OCS, ...).
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import flags

import fedjax_sel as fs
from benchmarks.common import launch, markdown_table, median_step_time, median_time, write_results
from fedjax_sel import registry
from fedjax_sel.client.system import lognormal_profiles
from fedjax_sel.parts.types import ClientState, RoundInputs, RoundOutcome, Stats

FLAGS = flags.FLAGS
flags.DEFINE_integer("k", 100, "K of the selection step.")
flags.DEFINE_integer("dim", 1000, "Model parameters D (the gradients and local models).")
flags.DEFINE_integer("reps", 5, "Timed repetitions of the selection step (median).")
flags.DEFINE_list("ns", ["1000", "10000", "100000", "1000000"], "Population sizes N.")
flags.DEFINE_integer("fit_max_n", 1000, "Largest N of FedCor's GP fit row.")
flags.DEFINE_list("round_ns", ["1000", "10000"], "Population sizes of the round table.")
flags.DEFINE_integer("round_reps", 3, "Timed rounds (median).")

# What grows faster than N, and the largest N run here (memory ~ 2 GB of float32).
LIMITS = {"divfl": (10000, "an [N, D] gradient table and [N, N] distances"),
          "clustered_similarity": (1000, "an [N, N] dissimilarity and O(N^3) Ward merges (5 s "
                                         "a round at N = 1000)"),
          "fedcor": (10000, "its GP fit's [N, N] covariance (the greedy rounds are O(N (D + K)))"),
          "fedcs": (100000, "a greedy of O((N / 10)^2) over the asked tenth"),
          "delta": (100000, "every client's gradient, [N, D], in its full variant")}


# The round table's limits (its first rounds: DivFL fills its table from N gradients).
ROUND_LIMITS = {"clustered_similarity": LIMITS["clustered_similarity"],
                "divfl": (1000, "N gradients and an [N, N] facility location on its first round"),
                "fedcor": (1000, "refused at build: with N / 2 available its GP fit after the "
                                 "warm-up factors an [N, N] matrix per live history row (hours)")}


def model():
  return fs.build_model("logreg", (FLAGS.dim // 10 - 1,), 10)


def context(n: int, k: int, rounds: int = 100) -> registry.BuildContext:
  counts = np.random.default_rng(0).integers(5, 100, n)
  data = SimpleNamespace(train=SimpleNamespace(counts=counts), num_clients=n)
  return registry.BuildContext(k=k, rounds=rounds, seed=0, num_clients=n, num_available=n,
                               data=data, model=model(), profile=lognormal_profiles(n),
                               local_epochs=1)


def build(name: str, ctx: registry.BuildContext):
  entry = registry.lookup("selector", name)
  return registry.build("selector", name, entry.settings(), ctx)


def step_inputs(n, k, params, key, round_idx):
  u = lambda i, shape=(n,): jax.random.uniform(jax.random.fold_in(key, i), shape)
  grads = jax.tree.map(lambda p: u(4, (n, *p.shape)), params)
  stats = Stats(loss=u(1), batch_loss=u(2), entropy=u(3), accuracy=u(7), grad_norm=u(8),
                grad=grads)
  counts = (u(6) * 100).astype(jnp.int32) + 1
  return RoundInputs(jnp.int32(round_idx), params, jnp.ones(n, bool), stats,
                     ClientState.create(n)._replace(last_loss=u(5)), counts,
                     jnp.zeros((n, 1)),
                     gradients=lambda ids: jax.tree.map(lambda g: g[ids], grads),
                     available_at=lambda r: u(9) < 0.5,
                     update_norms=lambda mask: (jnp.where(mask, u(10), 0.0),
                                                jnp.where(mask, 50.0, 0.0)),
                     k=k)


def time_step(sel, n, k, round_idx=17):
  key = jax.random.PRNGKey(0)
  params = model().init(key)
  mask = jax.random.bernoulli(jax.random.fold_in(key, 11), 0.5, (n,))
  state = sel.init(n, params)

  def round_work(state, key):
    inputs = step_inputs(n, k, params, key, round_idx)
    chosen, state = sel.select(state, key, inputs, mask)
    slots = jnp.nonzero(chosen, size=k, fill_value=0)[0]
    local = jax.tree.map(lambda p: p[None] + 0.01 * jax.random.normal(key, (k, *p.shape)), params)
    outcome = RoundOutcome(slots, jnp.arange(k) < jnp.sum(chosen), jnp.arange(k) < jnp.sum(chosen),
                           jnp.ones(k), local, params, jnp.ones(k),
                           jax.random.uniform(key, (n,)))
    return chosen, sel.observe(state, inputs, outcome)

  fn = jax.jit(round_work)
  jax.block_until_ready(fn(state, key))  # Compiles.
  start = time.perf_counter()
  jax.block_until_ready(fn(state, key))
  once = time.perf_counter() - start
  # A selector taking seconds a round is timed once more, not --reps times.
  return median_time(lambda: fn(state, key), FLAGS.reps if once < 1.0 else 1, warmup=0)


def fedcor_fit_time(n, k):
  """One FedCor select that fits the GP after the warm-up (1000 Adam steps)."""
  from fedjax_sel.parts.selectors import fedcor  # pylint: disable=import-outside-toplevel
  sel = fedcor.fedcor_selector(0, fedcor.FedCorConfig(warmup=0))
  key = jax.random.PRNGKey(0)
  state = sel.init(n, None)._replace(pending=jnp.asarray(True), prev_observed=jnp.ones(n, bool))
  fn = jax.jit(lambda s: sel.select(s, key, step_inputs(n, k, model().init(key), key, 1),
                                    jnp.ones(n, bool)))
  return median_time(lambda: fn(state), 1)


def round_time(name, n, k=10):
  spec = fs.DatasetSpec("synth", num_clients=n, synth_max_samples=20)
  data = fs.build_dataset(spec, seed=0)
  mdl = fs.build_model("logreg", data.feature_shape, data.num_classes)
  profile = lognormal_profiles(n)
  ctx = registry.BuildContext(k=k, rounds=100, seed=0, num_clients=n, num_available=n // 2,
                              data=data, model=mdl, profile=profile, local_epochs=1)
  avail = (fs.diurnal_availability(n, 24) if name == "refl"
           else fs.uniform_availability(n, n // 2))
  sim = fs.Simulator(mdl, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=10), avail,
                     build(name, ctx), fs.fedavg(), k, 0, system_profile=profile)
  return median_step_time(sim, sim.init(), FLAGS.round_reps)  # After round 0 fills its state.


def main(argv):
  del argv
  ns = [200] if FLAGS.quick else [int(n) for n in FLAGS.ns]
  k = min(FLAGS.k, 10) if FLAGS.quick else FLAGS.k
  # The smoke run: a uniform, a utility-ranked, a bandit and a learned-covariance selector.
  names = ("random", "oort", "exp3", "fedcor") if FLAGS.quick else registry.names("selector")
  rows = []
  for n in ns:
    for name in names:
      limit, why = LIMITS.get(name, (None, None))
      if limit is not None and n > limit:
        rows.append({"selector": name, "N": n, "K": k, "ms": None, "selections_per_s": None,
                     "note": f"not run past N = {limit}: {why}"})
        continue
      t = time_step(build(name, context(n, k)), n, k)
      rows.append({"selector": name, "N": n, "K": k, "ms": 1e3 * t, "selections_per_s": 1 / t,
                   "note": ""})
      print(rows[-1], flush=True)
  fits = []
  for n in [100] if FLAGS.quick else [100, FLAGS.fit_max_n]:
    t = fedcor_fit_time(n, k)
    fits.append({"N": n, "steps": 1000, "s": t})
    print(fits[-1], flush=True)
  rounds = []
  for n in [100] if FLAGS.quick else [int(n) for n in FLAGS.round_ns]:
    for name in ("random", "ocs") if FLAGS.quick else names:
      limit, why = ROUND_LIMITS.get(name, (None, None))
      if limit is not None and n > limit:
        rounds.append({"selector": name, "N": n, "K": 10, "round_ms": None,
                       "note": f"not run past N = {limit}: {why}"})
        continue
      t = round_time(name, n)
      rounds.append({"selector": name, "N": n, "K": 10, "round_ms": 1e3 * t, "note": ""})
      print(rounds[-1], flush=True)
  table = markdown_table(rows, [("selector", "selector"), ("N", "N"), ("K", "K"), ("ms", "ms"),
                                ("selections_per_s", "selections/s"), ("note", "note")])
  table += ("\n\nFedCor's GP fit (1000 Adam steps, once after the warm-up)\n\n"
            + markdown_table(fits, [("N", "N"), ("steps", "steps"), ("s", "seconds")]))
  table += ("\n\nOne engine round (SYNTH(1, 1), logistic regression, K = 10 of N / 2 available, "
            "the clock on)\n\n" + markdown_table(rounds, [("selector", "selector"), ("N", "N"),
                                                          ("K", "K"), ("round_ms", "round ms"),
                                                          ("note", "note")]))
  write_results("selector_throughput", rows, table, {"fedcor_fit": fits, "rounds": rounds})


if __name__ == "__main__":
  launch(main)
