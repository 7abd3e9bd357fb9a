r"""Asynchronous server steps per second beside synchronous rounds of the same work.

  python -m benchmarks.async_throughput            # N in 1e3, 1e4 (a few minutes on 2 cores)
  python -m benchmarks.async_throughput --quick    # smoke run

Each row times, on SYNTH(1, 1) with N clients (half available), logistic regression or the
2-layer MLP, random selection, the log-normal clock and K = 10: one synchronous round (K clients
trained and aggregated), and one FedBuff server step with C = 2K in flight (its events in
FedBuff's order, each arrival refilling its slot with one selector call, and the K clients it
dispatched trained: the same training work in steady state) and C = 10K. Median of --reps steps
after a compiled warm-up; a runs column repeats the step with --runs seeds as a runs axis
(`RunBatch`).
"""

from __future__ import annotations


import optax
from absl import flags

import fedjax_sel as fs
from benchmarks.common import launch, markdown_table, median_step_time, write_results

FLAGS = flags.FLAGS
flags.DEFINE_list("ns", ["1000", "10000"], "Population sizes N.")
flags.DEFINE_list("models", ["logreg", "mlp"], "Models.")
flags.DEFINE_integer("reps", 20, "Timed steps (median).")
flags.DEFINE_integer("runs", 4, "Seeds of the runs-axis column.")

K = 10


def simulators(n: int, model_name: str, concurrency: int | None, seeds=(0,)):
  data = fs.build_dataset(fs.DatasetSpec("synth", num_clients=n, synth_max_samples=50), seed=0)
  model = fs.build_model(model_name, data.feature_shape, data.num_classes)
  profile = fs.lognormal_profiles(n)
  spec = None if concurrency is None else fs.fedbuff(concurrency)
  return [fs.Simulator(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=10),
                       fs.uniform_availability(n, n // 2), fs.random_selector(), fs.fedavg(), K,
                       seed=s, system_profile=profile, asynchrony=spec) for s in seeds]


def main(argv):
  del argv
  ns = [200] if FLAGS.quick else [int(n) for n in FLAGS.ns]
  models = ["logreg"] if FLAGS.quick else FLAGS.models
  reps = 3 if FLAGS.quick else FLAGS.reps
  rows = []
  for model_name in models:
    for n in ns:
      for label, c in (("sync round", None), ("FedBuff step, C = 2K", 2 * K),
                       ("FedBuff step, C = 10K", 10 * K)):
        if c is not None and c > n // 2:
          continue
        sim = simulators(n, model_name, c)[0]
        t = median_step_time(sim, sim.init(), reps)
        batch = fs.RunBatch([s.spec for s in simulators(n, model_name, c,
                                                         seeds=range(FLAGS.runs))])
        t_runs = median_step_time(batch, batch.init(), reps)
        rows.append({"model": model_name, "N": n, "what": label, "ms": 1e3 * t,
                     "per_s": 1 / t, "runs": FLAGS.runs, "runs_ms": 1e3 * t_runs,
                     "run_steps_per_s": FLAGS.runs / t_runs})
        print(rows[-1], flush=True)
  table = markdown_table(rows, [("model", "model"), ("N", "N"), ("what", "step"), ("ms", "ms"),
                                ("per_s", "steps/s"), ("runs", "runs"),
                                ("runs_ms", "ms, runs batched"),
                                ("run_steps_per_s", "run-steps/s, batched")])
  write_results("async_throughput", rows, table)


if __name__ == "__main__":
  launch(main)
