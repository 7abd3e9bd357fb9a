r"""Runs a launcher and writes where its wall time went (used by `benchmarks.time_to_result`).

  python -m benchmarks.timed_launch OUT.json experiments.filfl --out_dir=... [launcher flags]

Splits the process's wall time into: import (the launcher module and the library), data (the
launchers' `build.load_data`), set-up (building `Simulator`s and `RunBatch`es, compilation
excluded), compile (XLA compilation and persistent-cache loads, from JAX's monitoring events,
wherever they happen), rounds (running the rounds, compilation excluded) and other (what is left:
flag parsing, summaries, figures). Where threads overlap them (`--concurrent_batches`), the
compiling counts first, then the rounds, set-up and data, each where none before it runs. Also
counts the rounds trained (`rounds_trained`), the round programs compiled (a round's one
program, or its plan, training and finish) and loaded, and the persistent cache hits.

A SIGTERM or SIGINT stops the launcher as an interrupt does (`cli.interrupt_on_sigterm`: its
finished rounds kept, exit status 130) and OUT.json is still written, with the rounds this
process trained; a signal that comes while it is written is ignored.
"""

from __future__ import annotations

import importlib
import json
import signal
import sys
import time

START = time.perf_counter()


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
  """`spans` as sorted disjoint intervals covering the same times."""
  out = []
  for start, end in sorted(spans):
    if out and start <= out[-1][1]:
      out[-1] = (out[-1][0], max(out[-1][1], end))
    else:
      out.append((start, end))
  return out


def _length(spans: list[tuple[float, float]]) -> float:
  return sum(end - start for start, end in spans)


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
  """The time two lists of disjoint intervals share."""
  return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def main():
  out, module_name, *argv = sys.argv[1:]
  from fedjax_sel.host.compilation import CompileLog  # pylint: disable=import-outside-toplevel
  log = CompileLog().__enter__()
  calls = {"data": [], "set-up": [], "rounds": []}  # Each call's (start, end).
  module = importlib.import_module(module_name)
  import fedjax_sel as fs  # pylint: disable=import-outside-toplevel
  from experiments.bench_worker import CountedSteps  # pylint: disable=import-outside-toplevel
  from experiments.launch import build, cli  # pylint: disable=import-outside-toplevel
  imported = time.perf_counter() - START

  def timed(owner, name, phase):
    fn = getattr(owner, name)

    def wrapper(*args, **kwargs):
      start = time.perf_counter()
      try:
        return fn(*args, **kwargs)
      finally:
        calls[phase].append((start, time.perf_counter()))
    setattr(owner, name, wrapper)

  batches = []
  run_batch = fs.run_batch
  def counted(batch, *args, **kwargs):
    counter = CountedSteps(batch)
    batches.append(counter)
    return run_batch(counter, *args, **kwargs)
  fs.run_batch = counted  # The launchers' one round loop (`job.py` calls `fs.run_batch`).
  timed(build, "load_data", "data")
  timed(fs, "Simulator", "set-up")
  timed(fs, "RunBatch", "set-up")
  timed(fs, "run", "rounds")
  timed(fs, "run_batch", "rounds")
  from absl import app  # pylint: disable=import-outside-toplevel
  status = 0
  cli.interrupt_on_sigterm()
  try:
    app.run(cli.guarded(module.main), argv=[module_name, *argv])
  except SystemExit as e:
    status = e.code or 0
  except KeyboardInterrupt:  # A second one while the first was handled (Ctrl-C, then SIGTERM).
    status = 130
  for signum in (signal.SIGTERM, signal.SIGINT):  # The timing is written whatever comes now.
    signal.signal(signum, signal.SIG_IGN)
  total = time.perf_counter() - START
  log.snapshot()
  from fedjax_sel.engine.programs import ROUND_PROGRAMS  # pylint: disable=import-outside-toplevel
  rounds = ROUND_PROGRAMS
  # Threads may compile and run rounds at once (`--concurrent_batches`): each phase is the time
  # some call of it was running and no compilation or phase before it in this order was.
  taken, phases = _merged(log.spans), {}
  compile_s = _length(taken)
  for key, phase in (("rounds_s", "rounds"), ("setup_s", "set-up"), ("data_s", "data")):
    own = _merged(calls[phase])
    phases[key] = _length(own) - _overlap(own, taken)
    taken = _merged(taken + own)
  phases = {key: phases[key] for key in ("data_s", "setup_s", "rounds_s")}
  result = {
      "status": status, "total_s": total, "import_s": imported, **phases, "compile_s": compile_s,
      "other_s": total - imported - compile_s - sum(phases.values()),
      "rounds_trained": sum(b.steps for b in batches),
      "round_compiles": sum(log.by_name[name] for name in rounds),
      "round_loads": sum(log.loaded_by_name[name] for name in rounds),
      "compiles": log.compiles, "cache_hits": log.cache_hits}
  with open(out, "w", encoding="utf-8") as f:
    json.dump(result, f)
  cli.exit_now(status)  # As the launcher ends when it is the process (`cli.launch`).


if __name__ == "__main__":
  main()
