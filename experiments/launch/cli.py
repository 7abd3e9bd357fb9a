"""The one entry path of every launcher: `python -m experiments.<launcher>` runs `launch(main)`.

A launcher with a job config declares its flags (`BINDING = flag_binding.define(DEFAULTS, ...)`)
and writes `resolve(cfg, given)` and `execute(job)`; `launcher_main` makes its `main`:

  main = cli.launcher_main(BINDING, resolve, execute)
  if __name__ == "__main__":
    cli.launch(main, BINDING)

`launch` prints the short, grouped `--help`, turns JAX's persistent compilation cache on,
turns a usage error, a full disk or an interrupt (Ctrl-C, or a SIGTERM: `interrupt_on_sigterm`)
into one line and an exit status (`guarded`), and ends a launcher run as `python -m` without the
interpreter's teardown (`exit_now`).
"""

from __future__ import annotations

import atexit
import errno
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from absl import app, flags

from experiments.launch import distributed, flag_binding
from experiments.launch import config as cfglib
from experiments.launch.job import Job
from fedjax_sel.host.compilation import use_persistent_cache

HELP = ("--help", "-h", "-?", "--helpshort")


def launch(main: Callable[[list[str]], None],
           binding: flag_binding.Binding | None = None) -> None:
  """Runs a launcher's `main` with absl (`app.run(guarded(main))`); with the launcher's
  `binding`, `--help` (or `-h`) prints its short, grouped help and exits 0. A launcher that is the
  process (`python -m experiments.<launcher>`) ends with `exit_now`; one run from other code
  (`runpy`, tests) raises its `SystemExit` as before."""
  if binding is not None and any(a in HELP for a in sys.argv[1:]):
    print(binding.short_help(sys.modules["__main__"].__doc__ or ""))
    sys.exit(0)
  interrupt_on_sigterm()
  try:
    app.run(guarded(main))
  except SystemExit as e:
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    if spec is not None and spec.name.startswith("experiments."):
      exit_now(e.code)
    raise


def exit_now(code) -> NoReturn:
  """Ends the process with the status `sys.exit(code)` gives, after what an exit runs first (the
  other threads that are not daemons joined, the `atexit` functions, the streams flushed), but
  without the interpreter tearing down every module and object: 0.2-0.3 s of every launcher's
  wall time once JAX, flax and optax are loaded, measured on a 2-core CPU. Files are written and
  closed by then (the launchers write with `with`); what a finalizer of a leftover object would
  do is not done."""
  if code is None:
    status = 0
  elif isinstance(code, int):
    status = code
  else:  # As sys.exit: a message is printed and the status is 1.
    sys.stderr.write(f"{code}\n")
    status = 1
  for thread in threading.enumerate():
    if thread is not threading.main_thread() and not thread.daemon:
      thread.join()
  atexit._run_exitfuncs()  # pylint: disable=protected-access  # logging's flush among them.
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)


def interrupt_on_sigterm() -> None:
  """From now on a SIGTERM (`kill PID`, a scheduler's stop, the benchmark stopping its job)
  interrupts this process as Ctrl-C does: a KeyboardInterrupt, which `guarded` turns into its
  "interrupted" line and exit status 130 after the finished rounds are kept (Python's default is
  to end at once, leaving no word and no timing)."""
  signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum, frame) -> None:
  del signum, frame
  raise KeyboardInterrupt


def launcher_main(binding: flag_binding.Binding, resolve: flag_binding.Resolve,
                  execute: Callable[[Job], None]) -> Callable[[list[str]], None]:
  """A launcher's `main(argv)`: its job from the command line (`binding.job_config(resolve)`),
  the multi-host join, then `execute(job)` and `job.finish()` (exit 1 if a run stopped)."""
  def main(argv):
    leftover = list(argv[1:])
    if leftover:  # `--seeds 0 1 2` reads --seeds=0 and leaves "1", "2" here: never drop them.
      raise app.UsageError(f"unexpected arguments {leftover}: a flag takes its value after '=' "
                           "and a list's values separated by commas, e.g. --seeds=0,1,2")
    cfg: cfglib.JobConfig = binding.job_config(resolve)
    distributed.join(cfg.distributed)
    job = Job(cfg, binding.flag_lines(cfg))
    execute(job)
    job.finish()
  return main


def define_finite_float(name: str, default: float, help_text: str,
                        above: float | None = None) -> None:
  """A float flag of a launcher without a job config (its own absl flag) that refuses nan and the
  infinities, and values not above `above` when given, when the command line is parsed, naming
  the flag (a job config's floats are checked with the config, `flag_binding.check_values`)."""
  flags.DEFINE_float(name, default, help_text)
  bound = "" if above is None else f" above {above:g}"
  flags.register_validator(
      name, lambda v: v is None or (math.isfinite(v) and (above is None or v > above)),
      message=f"must be a finite number{bound}")


def guarded(main: Callable[[list[str]], None]) -> Callable[[list[str]], None]:
  """`main` for `app.run`, JAX's persistent compilation cache turned on first
  (`fedjax_sel.use_persistent_cache`; importing the library turns nothing on). A UsageError
  prints its message and where to find help (absl would print the help of every flag first),
  exit status 1; a file that cannot be written (a full disk) or a path that is not what it must
  be (a missing parent folder, a folder where a file goes) prints one line naming it, exit
  status 1."""
  def wrapped(argv):
    cache = use_persistent_cache()  # $FEDJAX_SEL_CACHE_DIR moves it; =off disables it.
    # JAX logs every accelerator backend it looks for and does not find (libtpu on a CPU host).
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    try:
      return main(argv)
    except app.UsageError as e:
      sys.stderr.write(f"error: {e}\nRun with --help for the flags.\n")
      sys.exit(1)
    except KeyboardInterrupt:
      sys.stderr.write("\ninterrupted: every finished round is in its run's metrics.jsonl and "
                       "each run continues from its last checkpoint (every --checkpoint_every "
                       "rounds): run the same command, or --config=<out_dir>/config.json, with "
                       "--resume\n")
      sys.exit(130)
    except OSError as e:  # A full disk, or a path that is not what it must be: name the file.
      full = e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES)
      if not (full or e.filename):
        raise
      where = f"{'cannot write ' if full else ''}{e.filename}: " if e.filename else ""
      sys.exit(f"error: {where}{e.strerror or e}")
    except AssertionError as e:  # XLA's check of a loaded program (a foreign cache entry).
      if cache is None:
        raise
      sys.exit(f"error: a compiled program failed XLA's checks ({e or 'assertion'}); a program "
               f"loaded from the compilation cache at {cache} may be corrupted or another "
               "program's: delete that folder (it is rebuilt as jobs compile), or run with "
               "FEDJAX_SEL_CACHE_DIR=off. Finished rounds are kept: rerun with --resume")
  return wrapped
