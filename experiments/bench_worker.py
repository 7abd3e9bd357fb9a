r"""The selection benchmark's worker: runs a list of `experiments.run` jobs in this one process.

  python -m experiments.bench_worker PLAN.json

`experiments.bench` starts one worker per scenario. PLAN.json is a list of jobs, each
`{"label": ..., "folder": ..., "flags": [...], "timing": ...}`: the name it is announced by
("== label"), the job's `experiments.run` flags (its `--out_dir` and, for a job already started,
`--resume` among them), the folder whose `bench.log` takes its output, and the file its timing
goes to. The jobs run one after another through
`experiments.run`'s own entry (`cli.guarded(run.main)`, the command line parsed again for each),
so they share this process's imports, loaded libraries and compiled programs, and JAX's
persistent compilation cache. Each job's rounds run as three programs (`--stages=three`, unless
its flags say otherwise or run the asynchronous mode): a training compiled for one selector
serves every later selector of the scenario that trains alike, which then compiles only its plan
and finish stages. Each job's timing (wall, compile and round seconds, rounds trained, round
programs compiled or loaded, its exit status) is written as `benchmarks.timed_launch` writes a
process's. A SIGTERM or Ctrl-C stops the job running as it stops a launcher (its finished rounds
kept, its timing written, exit status 130) and no later job starts.

XLA:CPU maps each compiled program's code into the process, and a process that keeps hundreds of
programs passes Linux's `vm.max_map_count` (65,530) and dies; after a job that leaves more than
`MAX_MAPS` mappings, the worker drops the engine's programs and JAX's caches (`release_programs`).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import time

from absl import flags

import fedjax_sel as fs
from experiments.launch import cli
from fedjax_sel.engine import programs
from fedjax_sel.engine.programs import ROUND_PROGRAMS
from fedjax_sel.host.compilation import CompileLog

MAX_MAPS = 30_000  # Mappings after which the programs are dropped (Linux allows 65,530).


def _launcher():
  """`experiments.run`, imported when the first job runs: importing it defines its flags, which a
  process (a test importing this module for its helpers) may define only once."""
  from experiments import run  # pylint: disable=import-outside-toplevel
  return run


def memory_maps() -> int:
  """The memory mappings of this process (0 where /proc is not Linux's)."""
  try:
    with open("/proc/self/maps", "rb") as f:
      return sum(1 for _ in f)
  except OSError:
    return 0


def release_programs(limit: int = MAX_MAPS) -> bool:
  """Drops the engine's compiled programs and JAX's caches when the process holds more than
  `limit` memory mappings, which unmaps their code; returns whether it did."""
  if memory_maps() <= limit:
    return False
  import jax  # pylint: disable=import-outside-toplevel
  programs.program.cache_clear()
  jax.clear_caches()
  gc.collect()
  return True


class CountedSteps:
  """A batch of runs (a `RunBatch` or `OneRun`) whose finished `step` calls are counted: the
  rounds a job (or, in `benchmarks.timed_launch`, a process) trained, whether it ended or was
  interrupted."""

  def __init__(self, batch):
    self.batch, self.steps = batch, 0

  def __getattr__(self, name):
    return getattr(self.batch, name)

  def step(self, states):
    out = self.batch.step(states)
    self.steps += 1
    return out


class Timer:
  """Times the launchers' round loop (`fs.run_batch`, which `experiments.run` calls): its seconds
  with the compilations in them, and the rounds stepped."""

  def __init__(self, log: CompileLog):
    self.log, self.rounds_s, self.compile_in_rounds_s, self.batches = log, 0.0, 0.0, []
    self.run_batch = fs.run_batch

  def __call__(self, batch, *args, **kwargs):
    self.batches.append(CountedSteps(batch))
    compiled = sum(self.log.snapshot().seconds.values())
    start = time.perf_counter()
    try:
      return self.run_batch(self.batches[-1], *args, **kwargs)
    finally:
      self.rounds_s += time.perf_counter() - start
      self.compile_in_rounds_s += sum(self.log.snapshot().seconds.values()) - compiled


@contextlib.contextmanager
def output_to(path: str):
  """This process's standard output and error (its file descriptors: what the launcher, the
  library's progress and XLA print) appended to `path` inside the `with` block."""
  for stream in (sys.stdout, sys.stderr):
    stream.flush()
  saved = [os.dup(1), os.dup(2)]
  with open(path, "ab") as out:
    os.dup2(out.fileno(), 1)
    os.dup2(out.fileno(), 2)
    try:
      yield
    finally:
      for stream in (sys.stdout, sys.stderr):
        stream.flush()
      for fd, old in zip((1, 2), saved):
        os.dup2(old, fd)
        os.close(old)


def run_job(flags_: list[str], log_path: str) -> dict:
  """One `experiments.run` job with `flags_`, its output appended to `log_path`; returns its
  timing (`status` is its exit status: 0, 1 for an error it reported, 130 if interrupted)."""
  launcher = _launcher()  # Its flags defined before the job's are parsed.
  start = time.perf_counter()
  with CompileLog() as log, output_to(log_path):
    timer = Timer(log)
    fs.run_batch = timer
    status = 0
    try:
      flags.FLAGS.unparse_flags()
      try:
        # Three programs a round, except where the round is one (the asynchronous mode).
        stages = [] if "--mode=async" in flags_ else ["--stages=three"]
        flags.FLAGS(["experiments.run", *stages, *flags_])
      except flags.Error as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from e
      cli.guarded(launcher.main)(["experiments.run"])
    except SystemExit as e:
      status = e.code if isinstance(e.code, int) else 1
    except KeyboardInterrupt:  # A second interrupt while the first was handled.
      status = 130
    finally:
      fs.run_batch = timer.run_batch
  compile_s = sum(log.seconds.values())
  return {"status": status, "total_s": time.perf_counter() - start, "compile_s": compile_s,
          "rounds_s": timer.rounds_s - timer.compile_in_rounds_s,
          "rounds_trained": sum(b.steps for b in timer.batches),
          "round_compiles": sum(log.by_name[name] for name in ROUND_PROGRAMS),
          "round_loads": sum(log.loaded_by_name[name] for name in ROUND_PROGRAMS),
          "compiles": log.compiles, "cache_hits": log.cache_hits}


def main(argv: list[str]) -> int:
  """Runs the plan's jobs in order; stops at the first that fails or is interrupted and returns
  its exit status (0 when every job ended well)."""
  (plan_path,) = argv
  with open(plan_path, encoding="utf-8") as f:
    plan = json.load(f)
  cli.interrupt_on_sigterm()
  try:
    for job in plan:
      print(f"== {job['label']}", flush=True)
      timing = run_job(job["flags"], os.path.join(job["folder"], "bench.log"))
      with open(job["timing"], "w", encoding="utf-8") as f:
        json.dump(timing, f)
      if timing["status"]:
        return timing["status"]
      release_programs()
  except KeyboardInterrupt:  # Between two jobs: the finished ones are written.
    return 130
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
