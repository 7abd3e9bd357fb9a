r"""Runs a launcher and writes where its wall time went (used by `benchmarks.time_to_result`).

  python -m benchmarks.timed_launch OUT.json experiments.filfl --out_dir=... [launcher flags]

Splits the process's wall time into: import (the launcher module and the library), data (the
launchers' `build.load_data`), set-up (building `Simulator`s and `RunBatch`es, compilation
excluded), compile (XLA compilation and persistent-cache loads, from JAX's monitoring events,
wherever they happen), rounds (running the rounds, compilation excluded) and other (what is left:
flag parsing, summaries, figures). Also counts the rounds trained (`rounds_trained`), the round
programs compiled (a round's one program, or its plan, training and finish) and loaded, and the
persistent cache hits.

A SIGTERM or SIGINT stops the launcher as an interrupt does (`cli.interrupt_on_sigterm`: its
finished rounds kept, exit status 130) and OUT.json is still written, with the rounds this
process trained; a signal that comes while it is written is ignored.
"""

from __future__ import annotations

import importlib
import json
import signal
import sys
import threading
import time

START = time.perf_counter()


def main():
  out, module_name, *argv = sys.argv[1:]
  from fedjax_sel.host.compilation import CompileLog  # pylint: disable=import-outside-toplevel
  log = CompileLog().__enter__()
  spent = {"data": 0.0, "set-up": 0.0, "rounds": 0.0}
  compile_in = {"set-up": 0.0, "rounds": 0.0, "data": 0.0}
  module = importlib.import_module(module_name)
  import fedjax_sel as fs  # pylint: disable=import-outside-toplevel
  from experiments.bench_worker import CountedSteps  # pylint: disable=import-outside-toplevel
  from experiments.launch import build, cli  # pylint: disable=import-outside-toplevel
  imported = time.perf_counter() - START

  active = {phase: [0, 0.0, 0.0] for phase in spent}  # Calls running, since when, compiled then.
  lock = threading.Lock()

  def timed(owner, name, phase):
    """A phase's time is the union of its calls' intervals (methods' batches may run at once
    on threads: `--concurrent_batches`), compilation in it counted once."""
    fn = getattr(owner, name)

    def wrapper(*args, **kwargs):
      with lock:
        if active[phase][0] == 0:
          active[phase][1:] = time.perf_counter(), sum(log.snapshot().seconds.values())
        active[phase][0] += 1
      try:
        return fn(*args, **kwargs)
      finally:
        with lock:
          active[phase][0] -= 1
          if active[phase][0] == 0:
            spent[phase] += time.perf_counter() - active[phase][1]
            compile_in[phase] += sum(log.snapshot().seconds.values()) - active[phase][2]
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
  compile_s = sum(log.seconds.values())
  from fedjax_sel.engine.programs import ROUND_PROGRAMS  # pylint: disable=import-outside-toplevel
  rounds = ROUND_PROGRAMS
  phases = {f"{key}_s": spent[phase] - compile_in[phase]
            for key, phase in (("data", "data"), ("setup", "set-up"), ("rounds", "rounds"))}
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
