r"""Round time and peak memory versus the population size N and the clients per round K, for the
on-device and off-device stores.

  python -m benchmarks.population_scaling            # N = 10^3 .. 10^6 (about 15 minutes)
  python -m benchmarks.population_scaling --sweep=k  # K = 10 .. 1000 at N = 10^5 (about 5 minutes)
  python -m benchmarks.population_scaling --quick    # smoke run (half a minute)

Data: SYNTH(1, 1) populations written once to memory-mapped stores (`data.store.synth_store`,
capped at --samples_per_client examples per client, 90/10 train/test) under --store_root. Model:
logistic regression (60 -> 10), one local epoch, B = 10, K = --k clients per round, FedAvg.
Configurations, each in its own process so that its peak memory is its own:
  random:  random selection among n = --num_available available clients (fixed as N grows);
  entropy: UACS-FL's entropy top-K among all N clients (every client's stats every round).
for store=device (all data on the device) and store=host (random: the round's n available
clients' rows on the device, prefetched a round ahead; entropy: every client's entropy streamed
through the device in chunks of 4096 clients, then only the K chosen clients' rows). Reported:
median round time over --rounds rounds after a compiled warm-up round, the process's peak
resident memory, and the client data held on the device (all of it, or the compacted rows: two
rounds' worth for random, one stats chunk and the chosen rows for entropy).
`--sweep=k` varies K over --ks at N = --k_sweep_n with n = --k_sweep_available available clients
(random) and writes `population_scaling_k`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
from absl import app, flags

from benchmarks.common import launch, markdown_table, write_results

FLAGS = flags.FLAGS
flags.DEFINE_list("ns", ["1000", "10000", "100000", "1000000"], "Population sizes N.")
flags.DEFINE_integer("k", 10, "K, clients trained per round.")
flags.DEFINE_integer("num_available", 100, "n, clients available per round (random selection).")
flags.DEFINE_integer("entropy_max_n", 1000000, "Largest N of the all-client-statistics rows.")
flags.DEFINE_integer("samples_per_client", 20, "Cap on each client's examples.")
flags.DEFINE_integer("rounds", 5, "Timed rounds (median).")
flags.DEFINE_string("store_root", "/tmp/fedjax_sel_stores", "Where the SYNTH stores are cached.")
flags.DEFINE_enum("sweep", "n", ["n", "k"], "Vary the population size N (at K = --k) or the "
                  "clients per round K (over --ks, at N = --k_sweep_n).")
flags.DEFINE_list("ks", ["10", "100", "1000"], "Clients per round K of the K sweep.")
flags.DEFINE_integer("k_sweep_n", 100000, "Population size N of the K sweep.")
flags.DEFINE_integer("k_sweep_available", 1000, "n, clients available per round in the K sweep "
                     "(random selection); must be at least the largest K.")
flags.DEFINE_string("child", None, "Internal: run one configuration (JSON) and print its row.")


def store_path(n: int) -> str:
  return os.path.join(FLAGS.store_root, f"synth_n{n}_s{FLAGS.samples_per_client}")


def peak_rss_mb() -> float:
  """This process's peak resident memory (VmHWM: unlike ru_maxrss, not inherited across exec
  from the parent that generated the stores)."""
  with open("/proc/self/status", encoding="utf-8") as f:
    for line in f:
      if line.startswith("VmHWM:"):
        return int(line.split()[1]) / 1024
  return float("nan")


def run_one(config: dict) -> dict:
  """One configuration, in this process: build the simulator, time rounds, measure memory."""
  import jax  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel

  import fedjax_sel as fs  # pylint: disable=import-outside-toplevel
  from fedjax_sel.data import store  # pylint: disable=import-outside-toplevel
  from fedjax_sel.engine.capacity import data_bytes  # pylint: disable=import-outside-toplevel
  from fedjax_sel.parts.selectors import uacs  # pylint: disable=import-outside-toplevel

  n = config["N"]
  data = store.open_store(store_path(n))
  available = n if config["selector"] == "entropy" else min(config["n"], n)
  selector = uacs.entropy_selector() if config["selector"] == "entropy" else fs.random_selector()
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  start = time.perf_counter()
  sim = fs.Simulator(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=10),
                     fs.uniform_availability(n, available, period=1), selector, fs.fedavg(),
                     config["K"], 0, store=config["store"], host_rows=config["host_rows"])
  state = sim.init()
  state, _ = sim.step(state)  # Compiles.
  jax.block_until_ready(state)
  setup = time.perf_counter() - start
  times = []
  for _ in range(config["rounds"]):
    t0 = time.perf_counter()
    state, _ = sim.step(state)
    jax.block_until_ready(state)
    times.append(time.perf_counter() - t0)
  host_rows = getattr(sim.placement, "host_rows", None)
  if sim.spec.on_host:  # pylint: disable=protected-access
    placement = sim.placement
    row_bytes = lambda p: int(np.prod(p.x.shape[1:])) * p.x.dtype.itemsize + 8
    rows = {s: 2 * placement._capacity[s] for s in ("train", "val", "test")}
    if host_rows == "chosen":
      rows = {s: placement._capacity[s] + placement._stream_capacity[s] for s in rows}
    device_bytes = sum(rows[s] * row_bytes(getattr(data, s)) for s in rows)
  else:
    device_bytes = data_bytes(data)
  return {**config, "n": available, "host_rows": host_rows,
          "round_ms": 1e3 * float(np.median(times)), "setup_s": setup, "peak_rss_mb": peak_rss_mb(),
          "device_data_mb": device_bytes / 2**20, "data_mb": data_bytes(data) / 2**20}


def main(argv):
  del argv
  from fedjax_sel.data import store  # pylint: disable=import-outside-toplevel
  if FLAGS.child:
    print("ROW " + json.dumps(run_one(json.loads(FLAGS.child))), flush=True)
    return
  rounds = 1 if FLAGS.quick else FLAGS.rounds
  if FLAGS.sweep == "k":
    ns = [500] if FLAGS.quick else [FLAGS.k_sweep_n]
    ks = [5, 50] if FLAGS.quick else [int(v) for v in FLAGS.ks]
    available = min(FLAGS.k_sweep_available, ns[0])
    if max(ks) > available:
      raise app.UsageError(f"--ks: every K must be at most the {available} available clients "
                           "(--k_sweep_available, --k_sweep_n)")
  else:
    ns = [500] if FLAGS.quick else [int(v) for v in FLAGS.ns]
    ks, available = [FLAGS.k], FLAGS.num_available
  for n in ns:
    if not os.path.exists(os.path.join(store_path(n), store.STORE_FILE)):
      t0 = time.perf_counter()
      store.synth_store(store_path(n), n, max_samples=FLAGS.samples_per_client, block=5000)
      print(f"wrote {store_path(n)} in {time.perf_counter() - t0:.1f}s", flush=True)
  configs = [{"N": n, "K": k, "n": available, "selector": sel, "store": where,
              "rounds": rounds, "host_rows": "chosen" if sel == "entropy" else "available"}
             for sel in ("random", "entropy") for where in ("device", "host") for n in ns
             for k in ks if sel == "random" or n <= FLAGS.entropy_max_n]
  rows = []
  for config in configs:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.population_scaling",
                           f"--child={json.dumps(config)}", f"--store_root={FLAGS.store_root}",
                           f"--samples_per_client={FLAGS.samples_per_client}"],
                          capture_output=True, text=True, check=False)
    found = [line[4:] for line in proc.stdout.splitlines() if line.startswith("ROW ")]
    if not found:
      raise RuntimeError(f"configuration {config} failed:\n{proc.stdout}{proc.stderr}")
    rows.append(json.loads(found[0]))
    print(rows[-1], flush=True)
  table = markdown_table(rows, [("selector", "selection"), ("store", "store"),
                                ("host_rows", "rows sent"), ("N", "N"),
                                ("n", "n available"), ("K", "K"), ("round_ms", "round ms"),
                                ("setup_s", "setup + compile s"), ("peak_rss_mb", "peak RSS MiB"),
                                ("device_data_mb", "client data on device MiB"),
                                ("data_mb", "all client data MiB")])
  print(table)
  write_results("population_scaling" + ("_k" if FLAGS.sweep == "k" else ""), rows, table)


if __name__ == "__main__":
  launch(main)
