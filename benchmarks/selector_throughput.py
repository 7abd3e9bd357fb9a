r"""Selector throughput: one jitted `select()` on client-state arrays of N clients.

  python -m benchmarks.selector_throughput           # N up to 1e6, DivFL n up to 3000
  python -m benchmarks.selector_throughput --quick   # smoke run

Random, power-of-choice (pow / cpow / rpow, d = 2K) and top-k (the highest-score rule UACS-style
selectors use) on N in {1e3, 1e4, 1e5, 1e6} with K = 100 and half the clients in the mask; DivFL's
greedy facility location on a ground set of n in {100, 1000, 3000} clients with D-dimensional
proxies.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from absl import app, flags

import fedjax_sel as fs
from benchmarks.common import markdown_table, median_time, write_results
from fedjax_sel.parts.selectors.baselines import divfl, power_of_choice, top_k_mask
from fedjax_sel.parts.types import ClientState, RoundInputs, Selector

FLAGS = flags.FLAGS
flags.DEFINE_integer("k", 100, "K.")
flags.DEFINE_integer("proxy_dim", 1000, "DivFL proxy dimension D.")
flags.DEFINE_integer("reps", 5, "Timed repetitions (median).")


def top_k_selector(k):
  return Selector(init=lambda n, p: (),
                  select=lambda s, key, inputs, mask: (
                      top_k_mask(inputs.stats["entropy"], mask, k), s),
                  needs=("entropy",))


def inputs(n, key, dim=None):
  u = lambda i, shape=(n,): jax.random.uniform(jax.random.fold_in(key, i), shape)
  stats = {"loss": u(1), "batch_loss": u(2), "entropy": u(3)}
  if dim:
    stats["grad"] = {"g": u(4, (n, dim))}
  clients = ClientState.create(n)._replace(last_loss=u(5))
  counts = (u(6) * 100).astype(jnp.int32) + 1
  return RoundInputs(jnp.int32(0), {"g": jnp.zeros(dim or 1)}, jnp.ones(n, bool), stats, clients,
                     counts, jnp.zeros((n, 1)))


def with_gradients(inp):
  """`inp` whose on-demand gradients are rows of its `grad` stat (as the engine's would be)."""
  if "grad" not in inp.stats:
    return inp
  return inp._replace(gradients=lambda ids: jax.tree.map(lambda g: g[ids], inp.stats["grad"]))


def time_selector(sel, n, dim=None, mask_fraction=0.5):
  key = jax.random.PRNGKey(0)
  inp = inputs(n, key, dim)
  mask = jax.random.bernoulli(jax.random.fold_in(key, 9), mask_fraction, (n,))
  state = sel.init(n, inp.params)
  fn = jax.jit(lambda s, k, i, m: sel.select(s, k, with_gradients(i), m))
  return median_time(lambda: fn(state, key, inp, mask)[0], FLAGS.reps)


def main(argv):
  del argv
  ns = [1000, 10000] if FLAGS.quick else [1000, 10000, 100000, 1000000]
  k = min(FLAGS.k, 10) if FLAGS.quick else FLAGS.k
  selectors = {"random": fs.random_selector(k), "pow": power_of_choice(k, variant="pow"),
               "cpow": power_of_choice(k, variant="cpow"),
               "rpow": power_of_choice(k, variant="rpow"),
               "top-k (entropy)": top_k_selector(k)}
  rows = []
  for n in ns:
    for name, sel in selectors.items():
      t = time_selector(sel, n)
      rows.append({"selector": name, "N": n, "K": k, "ms": 1e3 * t, "selections_per_s": 1 / t})
      print(rows[-1], flush=True)
  div_rows = []
  for n in ([50, 100] if FLAGS.quick else [100, 1000, 3000]):
    t = time_selector(divfl(k), n, FLAGS.proxy_dim, mask_fraction=1.0)  # Ground set: all n.
    div_rows.append({"selector": "divfl", "n": n, "K": k, "D": FLAGS.proxy_dim, "ms": 1e3 * t,
                     "selections_per_s": 1 / t})
    print(div_rows[-1], flush=True)
  table = markdown_table(rows, [("selector", "selector"), ("N", "N"), ("K", "K"), ("ms", "ms"),
                                ("selections_per_s", "selections/s")])
  table += "\n\nDivFL (greedy facility location, stale proxy table)\n\n" + markdown_table(
      div_rows, [("n", "n"), ("K", "K"), ("D", "D"), ("ms", "ms"),
                 ("selections_per_s", "selections/s")])
  write_results("selector_throughput", rows, table,
                {"divfl": div_rows})


if __name__ == "__main__":
  app.run(main)
