r"""Time to result: where a short job's wall time goes, and what compiling once buys.

  python -m benchmarks.time_to_result            # full tables (about 10 minutes on 2 cores)
  python -m benchmarks.time_to_result --quick    # smoke run

Three tables, each job in fresh processes:
- jobs: each launcher's default job (the main job and FedSRC's also with `--fast_compile`) and
  the library example, with a cold persistent compilation
  cache (a fresh `FEDJAX_SEL_CACHE_DIR`) and warm (the same job again in a new process): wall time
  split into import, data, set-up, compile and rounds (`benchmarks.timed_launch`), the round
  programs compiled (JAX's compile events) against methods x seeds, and the cache hits.
- seeds: the generic launcher's FedAvg, 10 rounds, with 1 and 6 seeds (cold cache): how a job's
  time grows with its seeds now that they share one batched program.
- runs_axis: FedAvg K = 10 on digits (logistic regression, MLP; the LEAF CNN on digits padded to
  28 x 28), R = 1, 4, 16 runs in one compiled program (`RunBatch`) against R runs one after
  another sharing one compiled program, each calling `step` and `evaluate` every round as the
  launchers do; rounds per second after compilation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import optax
from absl import app, flags

from benchmarks.common import markdown_table, write_results

FLAGS = flags.FLAGS
flags.DEFINE_integer("rounds", 30, "Rounds of the runs-axis measurement (a tenth for the CNN).")
flags.DEFINE_list("tables", ["jobs", "seeds", "runs_axis"], "Tables to measure.")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = {  # name: (launcher, flags, runs of the default job: methods x groups x seeds)
    "filfl (main job)": ("experiments.filfl", [], 9),
    "fedalign": ("experiments.fedalign", [], 9),
    "uacs": ("experiments.uacs", [], 60),
    "fedsrc": ("experiments.fedsrc", [], 42),
    "run (FedAvg)": ("experiments.run", [], 1),
    # The same jobs compiled with XLA:CPU's legacy loop emitters (opt-in: the last float bits
    # may differ from the default compilation's; docs/engine.md).
    "filfl --fast_compile": ("experiments.filfl", ["--fast_compile"], 9),
    "fedsrc --fast_compile": ("experiments.fedsrc", ["--fast_compile"], 42),
}
QUICK_JOBS = {"filfl (main job)": ("experiments.filfl", ["--rounds=2"], 9),
              "run (FedAvg)": ("experiments.run", ["--rounds=2", "--seeds=0,1"], 2)}

LIBRARY_EXAMPLE = r"""
import json, sys, time
start = time.perf_counter()
import optax
import fedjax_sel as fs
from fedjax_sel.host.compilation import CompileLog, use_persistent_cache
use_persistent_cache()
log = CompileLog().__enter__()
t = {"import_s": time.perf_counter() - start}
mark = time.perf_counter()
data = fs.build_dataset(fs.DatasetSpec("digits", num_clients=50, partition="dirichlet",
                                       alpha=0.5), seed=0)
t["data_s"] = time.perf_counter() - mark
mark, c0 = time.perf_counter(), sum(log.snapshot().seconds.values())
model = fs.build_model("mlp", data.feature_shape, data.num_classes)
sim = fs.Simulator(model, data, optimizer=lambda lr: optax.sgd(lr),
                   local=fs.LocalHParams(batch_size=16, num_epochs=2),
                   availability=fs.uniform_availability(50, 25, period=5),
                   selector=fs.random_selector(), aggregator=fs.fedavg("examples"),
                   clients_per_round=10, seed=0, lr_schedule=fs.constant_lr(0.1))
c1 = sum(log.snapshot().seconds.values())
t["setup_s"] = time.perf_counter() - mark - (c1 - c0)
mark = time.perf_counter()
records = fs.run(sim, rounds=ROUNDS, progress=None)
c2 = sum(log.snapshot().seconds.values())
t["rounds_s"] = time.perf_counter() - mark - (c2 - c1)
t["compile_s"] = c2
t["total_s"] = time.perf_counter() - start
t["other_s"] = t["total_s"] - sum(v for k, v in t.items() if k != "total_s")
t["round_compiles"] = log.by_name["jit(step)"]
t["compiles"], t["cache_hits"], t["status"] = log.compiles, log.cache_hits, 0
print(json.dumps(t))
"""


def launch(module: str, args: list[str], cache: str) -> dict:
  """One launcher job in a fresh process with the persistent cache at `cache`."""
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "timing.json")
    env = dict(os.environ, FEDJAX_SEL_CACHE_DIR=cache)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.timed_launch", out, module,
                           f"--out_dir={os.path.join(tmp, 'runs')}", *args], cwd=REPO, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
      raise RuntimeError(f"{module} {args} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    with open(out, encoding="utf-8") as f:
      return {**json.load(f), "wall_s": wall}


def library_example(cache: str, rounds: int) -> dict:
  env = dict(os.environ, FEDJAX_SEL_CACHE_DIR=cache)
  start = time.perf_counter()
  proc = subprocess.run([sys.executable, "-c", LIBRARY_EXAMPLE.replace("ROUNDS", str(rounds))],
                        cwd=REPO, env=env, capture_output=True, text=True, check=True)
  return {**json.loads(proc.stdout.strip().splitlines()[-1]),
          "wall_s": time.perf_counter() - start}


def jobs_table(quick: bool) -> list[dict]:
  rows = []
  jobs = QUICK_JOBS if quick else JOBS
  for name, (module, args, runs) in [*jobs.items(), ("library example", (None, [], 1))]:
    with tempfile.TemporaryDirectory() as cache:
      for temperature in ("cold", "warm"):
        if module is None:
          timing = library_example(cache, 2 if quick else 20)
        else:
          timing = launch(module, args, cache)
        rows.append({"job": name, "cache": temperature, "runs": runs, **timing})
        print(f"{name} ({temperature}): {timing['wall_s']:.1f} s, {timing['round_compiles']} "
              "round compiles", flush=True)
  return rows


def seeds_table(quick: bool) -> list[dict]:
  rows = []
  rounds = 2 if quick else 10
  for seeds in ("0", "0,1") if quick else ("0", "0,1,2,3,4,5"):
    with tempfile.TemporaryDirectory() as cache:
      for temperature in ("cold", "warm"):
        timing = launch("experiments.run", [f"--rounds={rounds}", f"--seeds={seeds}"], cache)
        rows.append({"seeds": len(seeds.split(",")), "cache": temperature, **timing})
  return rows


def runs_axis_table(quick: bool) -> list[dict]:
  """Rounds per second of R runs in one program against R runs one by one (one shared program)."""
  import jax  # pylint: disable=import-outside-toplevel

  import fedjax_sel as fs  # pylint: disable=import-outside-toplevel
  rows = []
  models = ("logreg", "mlp") if quick else ("logreg", "mlp", "leaf_cnn")
  counts = (1, 2) if quick else (1, 4, 16)
  for model_name in models:
    # The CNN evaluates 1,797 images per run every round: fewer rounds keep the table in minutes.
    rounds = 2 if quick else (max(FLAGS.rounds // 10, 2) if model_name == "leaf_cnn" else
                              FLAGS.rounds)
    for r in counts:
      datasets = [fs.build_dataset(fs.DatasetSpec("digits", num_clients=50), seed=s)
                  for s in range(r)]
      if model_name == "leaf_cnn":
        pad = lambda p: p._replace(x=np.pad(p.x.reshape(-1, 8, 8, 1),
                                            ((0, 0), (10, 10), (10, 10), (0, 0))))
        datasets = [d._replace(train=pad(d.train), val=pad(d.val), test=pad(d.test),
                               public_x=np.zeros((0, 28, 28, 1), np.float32)) for d in datasets]
      cap = fs.Capacity.of(datasets)
      sims = [fs.Simulator(fs.build_model(model_name, d.feature_shape, 10), d,
                           lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=16),
                           fs.uniform_availability(50, 25), fs.random_selector(), fs.fedavg(),
                           10, seed=s, capacity=cap) for s, d in enumerate(datasets)]
      batch = fs.RunBatch([sim.spec for sim in sims])

      def batched(num_rounds, states):
        for _ in range(num_rounds):
          states, metrics = batch.step(states)
          jax.block_until_ready((metrics, batch.evaluate(states.params)))

      def one_by_one(num_rounds, states):
        for sim, state in zip(sims, states):
          for _ in range(num_rounds):
            state, metrics = sim.step(state)
            jax.block_until_ready((metrics, sim.evaluate(state.params)))

      times = {}
      for name, fn, init in (("batched", batched, batch.init),
                             ("one_by_one", one_by_one, lambda: [s.init() for s in sims])):
        fn(1, init())  # Compile.
        states = jax.block_until_ready(init())
        start = time.perf_counter()  # The rounds alone: step and evaluate, as the launchers do.
        fn(rounds, states)
        times[name] = time.perf_counter() - start
      rows.append({"model": model_name, "R": r, "rounds": rounds, "runs_chunk": batch.runs_chunk,
                   "batched_rounds_per_s": r * rounds / times["batched"],
                   "one_by_one_rounds_per_s": r * rounds / times["one_by_one"],
                   "speedup": times["one_by_one"] / times["batched"]})
      print(rows[-1], flush=True)
  return rows


def main(argv):
  del argv
  quick = FLAGS.quick
  tables, rows = [], {}
  if "jobs" in FLAGS.tables:
    rows["jobs"] = jobs_table(quick)
    tables.append("Jobs (seconds; compile = XLA compilation and cache loads):\n\n" + markdown_table(
        rows["jobs"], [("job", "job"), ("cache", "cache"), ("wall_s", "wall"),
                       ("import_s", "import"), ("data_s", "data"), ("setup_s", "set-up"),
                       ("compile_s", "compile"), ("rounds_s", "rounds"), ("other_s", "other"),
                       ("round_compiles", "round compiles"), ("runs", "runs"),
                       ("cache_hits", "cache hits")]))
  if "seeds" in FLAGS.tables:
    rows["seeds"] = seeds_table(quick)
    tables.append("Seeds of one job (experiments.run, FedAvg):\n\n" + markdown_table(
        rows["seeds"], [("seeds", "seeds"), ("cache", "cache"), ("wall_s", "wall s"),
                        ("compile_s", "compile s"), ("rounds_s", "rounds s"),
                        ("round_compiles", "round compiles")]))
  if "runs_axis" in FLAGS.tables:
    rows["runs_axis"] = runs_axis_table(quick)
    tables.append("Runs axis (FedAvg, K = 10, digits; rounds/s over all runs):\n\n" +
                  markdown_table(rows["runs_axis"], [
                      ("model", "model"), ("R", "R"), ("runs_chunk", "runs per vmap"),
                      ("batched_rounds_per_s", "one program"),
                      ("one_by_one_rounds_per_s", "one by one"), ("speedup", "speed-up")]))
  flat = [{"table": name, **row} for name, table in rows.items() for row in table]
  write_results("time_to_result", flat, "\n\n".join(tables), {"tables": list(rows)})


if __name__ == "__main__":
  app.run(main)
