r"""Computed against useful training rows, and what micro-batches buy back.

  python -m benchmarks.padding                  # both tables (a few minutes on 2 cores)
  python -m benchmarks.padding --quick          # smoke run
  python -m benchmarks.padding --jobs=runs/main # the rows of finished jobs only

Rows: the main job (`experiments.filfl`'s defaults) and the grid of `benchmarks.grid` (16 runs,
50 rounds, K = 10 of 100 digits clients, B = 16) are run, then their rows counted (`job_rows`).
Timing: one cohort of 10 clients' local training (`local_train`, jitted, one client a chunk),
whole batches against micro-batches (`LocalHParams.micro_batch`), at B = 16 and 64, for the MLP
on the digits and the LEAF CNN on Fashion-MNIST (3,000 clients, when its files are installed);
medians of interleaved repetitions.

How the rows are counted: `benchmarks/padding_rows.py`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import flags

from benchmarks.common import launch, markdown_table, write_results
from benchmarks.padding_rows import job_rows

FLAGS = flags.FLAGS
flags.DEFINE_list("jobs", [], "Finished job folders to count the rows of (instead of running).")
flags.DEFINE_integer("reps", 5, "Interleaved repetitions of each timing (median).")


def _run_job(module: str, out: str, args: list[str]) -> str:
  subprocess.run([sys.executable, "-m", module, f"--out_dir={out}", "--overwrite", *args],
                 check=True, capture_output=True)
  return out


def micro_batch_seconds(model_name: str, dataset: str, num_clients: int, batch_size: int,
                        micro: int | None, cohorts: int, reps: int) -> float:
  """Median seconds of `cohorts` calls of one cohort's jitted local training."""
  # pylint: disable=import-outside-toplevel
  import jax
  import jax.numpy as jnp
  import optax

  import fedjax_sel as fs
  from fedjax_sel import keys as keylib
  from fedjax_sel.data.federated import device_pool
  data = fs.build_dataset(fs.DatasetSpec(dataset, num_clients=num_clients), seed=0)
  model = fs.build_model(model_name, data.feature_shape, data.num_classes)
  params, pool = model.init(jax.random.PRNGKey(0)), device_pool(data.train)
  hp = fs.LocalHParams(batch_size=batch_size, chunk_size=1, micro_batch=micro)
  rng = np.random.default_rng(0)
  ids = [jnp.asarray(rng.choice(num_clients, 10, replace=False), jnp.int32)
         for _ in range(cohorts)]

  @jax.jit
  def train(p, clients):
    keys = keylib.client_keys(keylib.round_key(0, 0, keylib.TRAIN), clients)
    return fs.local_train(model, lambda lr: optax.sgd(lr), hp, p, pool, clients,
                          jnp.ones(10, bool), keys, jnp.float32(0.1), int(data.train.max_count))

  jax.block_until_ready(train(params, ids[0]))
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    for clients in ids:
      jax.block_until_ready(train(params, clients))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def main(argv: list[str]) -> None:
  del argv
  quick = FLAGS.quick
  folders = FLAGS.jobs
  if not folders:
    tmp = tempfile.mkdtemp()
    rounds = "3" if quick else "50"
    folders = [_run_job("experiments.filfl", os.path.join(tmp, "main"),
                        ["--rounds=3"] if quick else []),
               _run_job("experiments.run", os.path.join(tmp, "grid"),
                        ["--model=mlp", "--num_clients=100", "--num_available=100",
                         "--clients_per_round=10", f"--rounds={rounds}", f"--eval_every={rounds}",
                         "--batch_size=16", "--local_epochs=1",
                         "--sweep=lr:0.05,0.1,0.2,0.4", "--seeds=0,1,2,3"])]
  rows = [{"job": os.path.basename(f), **r} for f in folders for r in job_rows(f)]
  table = markdown_table(rows, [(k, k.replace("_", " ")) for k in rows[0]])
  cases = [("mlp", "digits", 100, 16, (None, 8, 4)), ("mlp", "digits", 100, 64, (None, 16, 8))]
  if os.path.isdir("/usr/share/datasets/fashion-mnist") and not quick:
    cases += [("leaf_cnn", "fashion_mnist", 3000, 16, (None, 8)),
              ("leaf_cnn", "fashion_mnist", 3000, 64, (None, 16))]
  reps, cohorts = (1, 2) if quick else (FLAGS.reps, 10)
  timing = []
  for model, dataset, n, b, micros in cases:
    seconds = {m: micro_batch_seconds(model, dataset, n, b, m, cohorts, reps) for m in micros}
    timing += [{"model": model, "data": f"{dataset} ({n} clients)", "B": b,
                "micro batch": m or "whole", "s per cohort": seconds[m] / cohorts,
                "x whole batches": seconds[None] / seconds[m]} for m in micros]
  table += "\n\nLocal training of a cohort of 10 clients (one a chunk), medians:\n\n"
  table += markdown_table(timing, [(k, k) for k in timing[0]])
  write_results("padding", rows + timing, table)


if __name__ == "__main__":
  launch(main)
