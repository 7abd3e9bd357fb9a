"""Batches of runs advanced at once, each on a thread of its own: the second core of a CPU.

On a CPU a batch's rounds keep about one core busy (a small model's operations are too small for
XLA:CPU to split over threads), and JAX releases Python's lock while a program runs, so a second
batch on another thread fills the other core. Each batch runs the programs it would run alone:
the records are the same bit for bit. The launchers advance a job's methods this way, or a lone
method's runs cut into equal batches (`--concurrent_batches`); `run_batches` does it from the
library (a 16-run grid as two `RunBatch`es of 8: its rounds 1.6-1.7 s -> 0.85 s on 2 cores).

Example:
  >>> import threading
  >>> done = []
  >>> on_threads([1, 2, 3], done.append, workers=2, stop=threading.Event())
  >>> sorted(done)
  [1, 2, 3]
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable, Iterable, Sequence

import jax


def default_workers() -> int:
  """2 in a single-device CPU process with two or more cores (one batch a core), else 1 (an
  accelerator runs one batch's programs on all its cores)."""
  one_cpu = (jax.default_backend() == "cpu" and jax.device_count() == 1
             and jax.process_count() == 1)
  return 2 if one_cpu and (os.cpu_count() or 1) >= 2 else 1


def on_threads(items: Iterable, fn: Callable, workers: int, stop: threading.Event) -> None:
  """`fn(item)` for each of `items`, `workers` at a time on threads of their own, started in order
  as threads free up. The first failure (an error, a `SystemExit`) sets `stop`, which the batches
  running beside it read before their next round (`run_batch(stop=...)`), and is raised here once
  they ended; no item starts after it. A Ctrl-C here sets it too and is raised."""
  waiting = collections.deque(items)
  lock, failures = threading.Lock(), []

  def work():
    while not stop.is_set():
      with lock:
        if not waiting:
          return
        item = waiting.popleft()
      try:
        fn(item)
      except BaseException as e:  # pylint: disable=broad-except  # Raised on the waiting thread.
        with lock:
          failures.append(e)
        stop.set()
        return

  threads = [threading.Thread(target=work, daemon=True, name=f"batches-{k}")
             for k in range(min(workers, len(waiting)))]
  for t in threads:
    t.start()
  try:
    for t in threads:
      t.join()
  except KeyboardInterrupt:
    stop.set()
    for t in threads:
      t.join()
    raise
  if failures:
    raise failures[0]


def run_batches(batches: Sequence, rounds: int, out_dirs: Sequence[list[str] | None] | None = None,
                *, workers: int | None = None, labels: Sequence[str] | None = None,
                **kwargs) -> list[list[list[dict]]]:
  """`run_batch` of each of `batches` (`RunBatch`es or `OneRun`s), `workers` at a time on threads
  of their own (default `default_workers()`); returns each batch's runs' records, in order.

  Args:
    batches: the batches.
    rounds: as in `run_batch`.
    out_dirs: per batch, its runs' folders (or None: in memory only).
    workers: batches advanced at once, >= 1 (None: `default_workers()`).
    labels: per batch, its progress lines' label.
    **kwargs: `run_batch`'s other keywords, the same for every batch (not `stop`: a failing
      batch stops the others before their next round, and its error is raised).

  Example:
    >>> import optax, fedjax_sel as fs
    >>> data = fs.build_dataset(fs.DatasetSpec("digits", num_clients=10), seed=0)
    >>> model = fs.build_model("logreg", data.feature_shape, data.num_classes)
    >>> specs = [fs.build_run(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(16),
    ...                       fs.uniform_availability(10, 6), fs.random_selector(), fs.fedavg(),
    ...                       3, seed, lr_schedule=fs.constant_lr(lr))
    ...          for lr in (0.05, 0.1) for seed in (0, 1)]
    >>> halves = [fs.RunBatch(specs[:2]), fs.RunBatch(specs[2:])]
    >>> records = fs.run_batches(halves, rounds=2, progress=None)
    >>> second = records[1]
    >>> len(records), len(second), len(second[0])  # Batches, a batch's runs, a run's rounds.
    (2, 2, 2)
  """
  from fedjax_sel.host.runner import run_batch  # pylint: disable=import-outside-toplevel
  if workers is not None and not (isinstance(workers, int) and workers >= 1):
    raise ValueError(f"workers must be an int >= 1 (or None: {default_workers()} here), got "
                     f"{workers!r}")
  out_dirs = [None] * len(batches) if out_dirs is None else list(out_dirs)
  labels = [""] * len(batches) if labels is None else list(labels)
  if not len(out_dirs) == len(labels) == len(batches):
    raise ValueError(f"out_dirs and labels must give one entry per batch ({len(batches)}), got "
                     f"{len(out_dirs)} and {len(labels)}")
  results: list = [None] * len(batches)
  stop = threading.Event()

  def advance(i: int) -> None:
    results[i] = run_batch(batches[i], rounds, out_dirs[i], label=labels[i], stop=stop, **kwargs)

  on_threads(range(len(batches)), advance, default_workers() if workers is None else workers,
             stop)
  return results
