r"""Computed against useful training rows: what padded steps cost (`benchmarks.padding`).

Each round's training is laid out as the engine lays it out (`client/chunking.py`,
`client/local_training.py`): the round's slots (K, or n in FilFL's train-all mode) sorted by their
clients' local steps and cut into chunks of the run's resolved chunk size; a chunk runs every slot
for its largest client's steps, each step on a full batch of B rows. Useful rows are the trained
clients' examples times epochs (B per step with `--local_steps`). Every row costs one forward and
backward pass, so the ratio of rows is the ratio of computed to useful training FLOPs.

The cohorts come from the job's records (`trained_clients`); on a train-all filtering round every
available client trains (the availability model's draw, as the round makes it), and in a batch of
runs every run trains them when any run filters (`engine/selection.py`).

Example (one cohort, two slots of one chunk, B = 4: a 5-example client takes 2 steps, a 3-example
one is run for 2 too):
  >>> cohort_rows(np.array([5, 3]), 2, batch_size=4, num_epochs=1, chunk_size=2)
  (16, 8)
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import numpy as np


def cohort_rows(counts: np.ndarray, slots: int, batch_size: int, num_epochs: int = 1,
                chunk_size: int | None = None, num_steps: int | None = None) -> tuple[int, int]:
  """(computed rows, useful rows) of one round training clients holding `counts` examples in
  `slots` slots (the rest empty) in chunks of `chunk_size` (None: one chunk)."""
  counts = np.asarray(counts, np.int64)
  if num_steps is None:
    steps = num_epochs * -(-counts // batch_size)
    useful = int(num_epochs * counts.sum())
  else:
    steps = np.where(counts > 0, num_steps, 0)
    useful = int(batch_size * steps.sum())
  size = min(chunk_size or slots, slots)
  padded = np.zeros(-(-slots // size) * size, np.int64)
  padded[:len(steps)] = np.sort(steps)[::-1]
  computed = int(size * padded.reshape(-1, size).max(axis=1).sum() * batch_size)
  return computed, useful


def job_rows(folder: str) -> list[dict]:
  """Per method of the job in `folder`: computed and useful training rows over its runs
  (counted in a process of their own: it imports the job's launcher, whose flags a process
  defines once)."""
  code = ("import json, sys; from benchmarks.padding_rows import rows_here; "
          "print(json.dumps(rows_here(sys.argv[1])))")
  out = subprocess.run([sys.executable, "-c", code, folder], check=True, capture_output=True,
                       text=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def rows_here(folder: str) -> list[dict]:
  """`job_rows` in this process."""
  # pylint: disable=import-outside-toplevel
  from experiments.launch import build
  from experiments.launch import config as cfglib
  with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
    raw = json.load(f)
  launcher = importlib.import_module(raw["launcher"])
  options = launcher.DEFAULTS.options
  cfg = cfglib.from_dict(raw, options=None if options is None else type(options))
  out = []
  for method, points, run in cfg.runs():
    specs, records = [], []
    for seed in cfg.seeds:
      data = build.load_data(run, seed)
      specs.append(build.simulator(run, data, seed))
      where = [p for p in (method.key, cfglib.points_tag(points), f"seed{seed}") if p]
      with open(os.path.join(folder, *where, "metrics.jsonl"), encoding="utf-8") as f:
        records.append([json.loads(line) for line in f if line.strip()])
    config = specs[0].config
    local = config.local
    train_all = config.filter is not None and config.filter.trains_available
    slots = config.availability.num_available if train_all else config.k
    computed = useful = 0
    for t in range(min(len(r) for r in records)):
      filtering = train_all and any(r[t]["filter_round"] for r in records)
      for spec, r in zip(specs, records):
        ids = (np.flatnonzero(np.asarray(spec.config.availability.sample(spec.seed, t)))
               if filtering else r[t]["trained_clients"])
        c, u = cohort_rows(np.asarray(spec.data.train.counts)[ids], slots, local.batch_size,
                           local.num_epochs, local.chunk_size, local.num_steps)
        computed, useful = computed + c, useful + u
    label = " ".join(p for p in (method.label, cfglib.points_tag(points)) if p)
    out.append({"method": label or "run", "computed_rows": computed,
                "useful_rows": useful, "computed / useful": round(computed / useful, 3),
                "chunk_size": local.chunk_size, "batch_size": local.batch_size})
  return out
