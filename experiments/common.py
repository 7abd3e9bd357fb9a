"""Flags shared by the launchers, and their translation into library objects.

Every flag is checked before any compute: a bad value stops the launcher with a message naming the
flag and the accepted values.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import re
import socket
import sys
import time
from typing import Callable, NamedTuple

import numpy as np
import optax
from absl import app, flags

import fedjax_sel as fs
from experiments import config, flag_binding
from fedjax_sel import folder_lock, registry
from fedjax_sel.checkpoint import CheckpointError, WriteError
from fedjax_sel.data import sources
from fedjax_sel.data.corruption import KINDS as CORRUPTION_KINDS
from fedjax_sel.data.corruption import corrupt_clients, corruption_kinds
from fedjax_sel.models import CONV_MODELS, resolve_conv_impl
from fedjax_sel.runner import NonFiniteError

FLAGS = flags.FLAGS

# The flags of the job config's fields (experiments/config.py: one place for each flag's help,
# type, accepted values and default) and of the server optimizers' settings.
for _section in config.SECTIONS:
  flag_binding.define_section(_section)
flag_binding.define_job()
flag_binding.define_parts(("server_optimizer",))


def seeds() -> list[int]:
  """The --seeds, checked (flag_binding.seeds)."""
  return list(flag_binding.seeds())


# Flags that do not change a run's results: left out of its checkpoint fingerprint.
NOT_RESULTS = {"out_dir", "resume", "overwrite", "plot", "tensorboard", "figure_format", "last_k",
               "rounds",
               "seeds", "eval_every", "batch_runs", "sweep", "checkpoint_every", "chunk_size", "store",
               "coordinator_address", "num_processes", "process_id", "distributed_auto",
               "distributed_timeout"}


def settings() -> dict:
  """The launcher's flags that determine a run's results (stored in its checkpoints)."""
  out = {}
  for module, module_flags in FLAGS.flags_by_module_dict().items():
    if not module.startswith(("experiments", "__main__")):  # Not absl's, jax's or tfds' own.
      continue
    for flag in module_flags:
      if flag.name not in NOT_RESULTS:
        out[flag.name] = flag.value
  if out.get("model") in CONV_MODELS and out.get("conv_impl") == "auto":
    out["conv_impl"] = resolve_conv_impl("auto")  # What it stood for: lowerings round differently.
  return out


def engine_options(datasets=()) -> dict:
  """The engine flags as `Simulator` arguments; with the job's `datasets`, the capacity that pads
  every run to one shape, so the job's runs share one compiled round."""
  options = {"nonfinite": FLAGS.nonfinite, "store": FLAGS.store,
             "server_optimizer": server_optimizer(), "system_profile": system_profile(),
             "deadline_s": FLAGS.deadline_s or None}
  if datasets:
    options["capacity"] = fs.Capacity.of(list(datasets))
  return options


# Flags --sweep may vary: continuous settings that are run values or part state, so that the
# runs of a sweep share one compiled round. Launchers add their own.
SWEEPABLE = ["lr", "prox_mu"]


def sweep_values() -> list[float | None]:
  """The values of --sweep (checked like the flag itself), or [None] without a sweep."""
  if FLAGS.sweep is None:
    return [None]
  name, _, values = FLAGS.sweep.partition(":")
  if name not in SWEEPABLE or not values:
    raise app.UsageError(f"--sweep must be NAME:V1,V2,... with NAME among {SWEEPABLE}, got "
                         f"{FLAGS.sweep!r}")
  try:
    parsed = [float(v) for v in values.split(",")]
  except ValueError as e:
    raise app.UsageError(f"--sweep values must be numbers, got {values!r}") from e
  if len(set(parsed)) != len(parsed):
    raise app.UsageError(f"--sweep values must be distinct, got {values!r}")
  old = FLAGS[name].value
  try:
    for v in parsed:
      try:
        FLAGS[name].value = v
        FLAGS.validate_all_flags()
      except flags.IllegalFlagValueError as e:
        raise app.UsageError(f"--sweep={FLAGS.sweep}: {v} is not a valid --{name} ({e})") from e
      if not math.isfinite(v):
        raise app.UsageError(f"--sweep={FLAGS.sweep}: values must be finite, got {v}")
  finally:
    FLAGS[name].value = old
  return parsed


def sweep_tag(value: float | None) -> str:
  """"NAME=V" of a --sweep value ("" for None): the folder and label suffix of its runs."""
  return "" if value is None else f"{FLAGS.sweep.partition(':')[0]}={value:g}"


@contextlib.contextmanager
def swept(value: float | None):
  """Inside, the --sweep flag holds `value` (nothing changes for None); a part that refuses the
  value (a ValueError while the runs are built, before any compute) stops the launcher naming it."""
  if value is None:
    yield
    return
  name = FLAGS.sweep.partition(":")[0]
  old = FLAGS[name].value
  FLAGS[name].value = value
  try:
    yield
  except ValueError as e:
    raise app.UsageError(f"--sweep={FLAGS.sweep}: --{sweep_tag(value)} is refused: {e}") from e
  finally:
    FLAGS[name].value = old


class Run(NamedTuple):
  """One run of a job: its simulator, folder under --out_dir, progress label, optional per-round
  `extra(state, record) -> dict`, and the settings of its fingerprint (the flags as they were
  when it was built, a swept value included)."""

  sim: fs.Simulator
  path: tuple[str, ...]
  label: str
  extra: Callable | None = None
  settings: dict | None = None

  @property
  def folder(self) -> str:
    """`<out_dir>/<path...>`: where the run's metrics and checkpoint go."""
    return os.path.join(FLAGS.out_dir, *self.path)


def swept_suffix() -> str:
  """" NAME=V" of the value `swept` holds now ("" without --sweep): the label suffix of its runs."""
  value = None if FLAGS.sweep is None else FLAGS[FLAGS.sweep.partition(":")[0]].value
  return f" {sweep_tag(value)}" if value is not None else ""


def make_run(sim: fs.Simulator, path: tuple[str, ...], label: str, extra=None) -> Run:
  """A `Run` whose folder and label carry the swept value set by `swept` (if any)."""
  tag = swept_suffix().strip()
  if tag:
    path = (*path[:-1], tag, path[-1])
    label = f"{label.rstrip()} {tag} "
  return Run(sim, path, label, extra, settings())


def by_sweep(records: list, num_seeds: int) -> list[tuple[str, list]]:
  """Splits a method's runs (built value by value, seed by seed) into (label suffix, runs of
  its seeds) per swept value."""
  return [(f" {sweep_tag(v)}" if v is not None else "", records[i * num_seeds:(i + 1) * num_seeds])
          for i, v in enumerate(sweep_values())]


def run_all(runs: list[Run]) -> list[list[dict]]:
  """Runs a method's runs for --rounds: with --batch_runs (default) and the device store as one
  `RunBatch` (one compiled call per round for all of them), else one by one; each run keeps its
  own folder, metrics, checkpoint and resume. A diverged run, a refused resume or a foreign
  checkpoint exit with the message (status 1), after the other runs of a batch finished."""
  record_runs(runs)
  done = len(_JOBS[os.path.abspath(FLAGS.out_dir)]) - len(runs)
  seeds_text = ", ".join(str(r.sim.seed) for r in runs)
  method = re.sub(r"\s+s\d+(?=\s|$)", "", runs[0].label).strip()
  print(f"-- runs {done + 1}-{done + len(runs)} of the job: {method}, seeds {seeds_text}",
        flush=True)
  batched = FLAGS.batch_runs and len(runs) > 1 and not any(r.sim.on_host for r in runs)
  if not batched:
    return [run_sim(r.sim, *r.path, label=r.label, extra=r.extra, run_settings=r.settings)
            for r in runs]
  label = os.path.commonprefix([r.label for r in runs]).rsplit(" ", 1)[0].strip()
  label = f"{label} ({len(runs)} runs) " if label else f"({len(runs)} runs) "
  folders = [r.folder for r in runs]
  try:
    with trackers(folders) as on_records:
      batch = fs.RunBatch([r.sim for r in runs])
      return fs.run_batch(batch, FLAGS.rounds, folders,
                          eval_every=FLAGS.eval_every, checkpoint_every=FLAGS.checkpoint_every,
                          resume=FLAGS.resume, overwrite=FLAGS.overwrite, label=label,
                          settings=[r.settings or settings() for r in runs],
                          extras=[r.extra for r in runs], on_records=on_records)
  except (NonFiniteError, CheckpointError, FileExistsError, WriteError) as e:
    sys.exit(f"error: {label.strip()}: {failure(e)}")


@contextlib.contextmanager
def trackers(folders: list[str]):
  """With --tensorboard, one `tracking.TensorBoardWriter` per run folder (process 0 only): yields
  their `write` callbacks (or None), closes them after."""
  if not FLAGS.tensorboard or not writer():
    yield None
    return
  from fedjax_sel.tracking import TensorBoardWriter  # pylint: disable=import-outside-toplevel
  try:
    writers = [TensorBoardWriter(folder) for folder in folders]
  except ImportError as e:
    raise app.UsageError(f"--tensorboard: {e}") from e
  try:
    yield [w.write for w in writers]
  finally:
    for w in writers:
      w.close()


def failure(error: Exception) -> str:
  """An error's message for the command line: a refused resume names the flags that changed."""
  changed = getattr(error, "changed", ())
  if not changed:
    return str(error)
  flag = lambda key: f"--{key}" if key in FLAGS else FINGERPRINT_FLAGS.get(key, key)
  return ("--resume refused: the run was started with other settings (checkpoint -> now): "
          + "; ".join(f"{flag(k)}: {a!r} -> {b!r}" for k, a, b in changed)
          + ". Rerun with the flags it was started with, or start afresh with --overwrite")


# Fingerprint entries that are not flags, by the flags that set them.
FINGERPRINT_FLAGS = {"seed": "--seeds", "lr_base": "--lr", "prox_mu_value": "--prox_mu",
                     "data": "the data (--dataset and its flags)",
                     "param_shapes": "the model's shapes (--model and its flags)",
                     "library": "the fedjax_sel version", "parts": "the method's parts",
                     "local": "local training (--batch_size, --local_epochs)",
                     "lr_schedule": "the learning-rate schedule (--lr, --lr_decay)",
                     "availability_draws": "availability (--availability and its flags)"}


def check_out_dir() -> None:
  """--out_dir must be a writable folder; one holding a run needs --resume or --overwrite."""
  out = FLAGS.out_dir
  if os.path.exists(out) and not os.path.isdir(out):
    raise app.UsageError(f"--out_dir={out} is a file, not a folder")
  parent = out if os.path.isdir(out) else os.path.dirname(os.path.abspath(out))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise app.UsageError(f"--out_dir={out}: {parent} is a file, not a folder")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise app.UsageError(f"--out_dir={out}: {parent} is not writable")
  if os.path.isdir(out) and not (FLAGS.resume or FLAGS.overwrite):
    for root, _, files in os.walk(out):
      if "metrics.jsonl" in files:
        raise app.UsageError(f"--out_dir={out} holds a previous run ({root}/metrics.jsonl): pass "
                             "--resume to continue it or --overwrite to replace it")


def server_optimizer():
  """The --server_opt flags as a `ServerOptimizer` (None for none); bad values name the flag."""
  name = FLAGS.server_opt
  if name == "none":
    return None
  try:
    settings = flag_binding.part_settings("server_optimizer", name)
    return registry.build("server_optimizer", name, settings, registry.BuildContext(
        k=FLAGS.clients_per_round, rounds=FLAGS.rounds))
  except ValueError as e:
    raise flag_binding.part_error("server_optimizer", name, e) from e


def system_profile():
  """The --system_profile flags as a `system.SystemProfile` (None for none), errors naming the
  flag or file."""
  from fedjax_sel import system  # pylint: disable=import-outside-toplevel
  try:
    if FLAGS.system_profile == "none":
      if FLAGS.deadline_s:
        raise ValueError("--deadline_s needs --system_profile (the clients' speeds)")
      return None
    if FLAGS.system_profile == "lognormal":
      return system.lognormal_profiles(FLAGS.num_clients, 0, FLAGS.speed_median,
                                       FLAGS.speed_sigma, FLAGS.bandwidth_median,
                                       FLAGS.bandwidth_sigma)
    if not os.path.isfile(FLAGS.system_profile):
      raise ValueError(f"{FLAGS.system_profile}: no such file (accepted: none, lognormal or a "
                       "CSV file client,speed,bandwidth)")
    return system.read_profiles(FLAGS.system_profile, FLAGS.num_clients)
  except ValueError as e:
    raise app.UsageError(f"--system_profile={FLAGS.system_profile}: {e}") from e


def figure_path(name: str) -> str:
  """`<out_dir>/<name>.<--figure_format>`."""
  return os.path.join(FLAGS.out_dir, f"{name}.{FLAGS.figure_format}")


def setup_title(detail: str = "", with_k: bool = True) -> str:
  """A figure's title: the data, model, N, K (`with_k`) and rounds, and a launcher's `detail`."""
  k = f", K = {FLAGS.clients_per_round}" if with_k else ""
  parts_ = [f"{FLAGS.dataset}, N = {FLAGS.num_clients}{k}", f"{FLAGS.model}",
            f"{FLAGS.rounds} rounds"]
  return ", ".join(parts_ + ([detail] if detail else []))


def check_corruption() -> tuple[str, ...]:
  """The --corrupt_kinds, checked."""
  kinds = tuple(FLAGS.corrupt_kinds)
  bad = [k for k in kinds if k not in CORRUPTION_KINDS]
  if bad or not kinds:
    raise app.UsageError(f"--corrupt_kinds must list values among {CORRUPTION_KINDS}, got "
                         f"{FLAGS.corrupt_kinds}")
  return kinds


def refuse_corruption(launcher: str) -> None:
  """For launchers with their own notion of noisy clients: --corrupt_* cannot apply (a value other
  than the default is refused; the default, as a job's flags.txt holds it, is no corruption)."""
  for flag in ("corrupt_fraction", "corrupt_kinds"):
    if FLAGS[flag].value != FLAGS[flag].default:
      raise app.UsageError(f"--{flag} does not apply to {launcher}, which builds its own clients "
                           "(see its --help); use experiments.run, filfl or fedsrc")


def corrupt(data, seed: int):
  """(data with --corrupt_fraction of the clients corrupted, `[N]` bool bad mask, `[N]` kinds)."""
  kinds = check_corruption()
  bad_data, bad = corrupt_clients(data, FLAGS.corrupt_fraction, kinds, seed=seed + 100)
  return bad_data, bad, corruption_kinds(data.num_clients, FLAGS.corrupt_fraction, kinds,
                                         seed=seed + 100)


def check_common() -> None:
  """The checks every launcher makes before loading data, then --out_dir locked for this job."""
  check_finite()
  seeds()
  sweep_values()
  check_counts()
  server_optimizer()
  system_profile()
  if availability().num_available < FLAGS.clients_per_round:
    raise app.UsageError(f"--availability={FLAGS.availability} makes at most "
                         f"{availability().num_available} clients available at once, fewer than "
                         f"--clients_per_round={FLAGS.clients_per_round}; raise --avail_capacity "
                         "or lower K")
  check_out_dir()
  claim_out_dir()


def claim_out_dir() -> None:
  """Locks --out_dir for this job and writes its provenance (process 0)."""
  if writer():
    try:
      folder_lock.hold(FLAGS.out_dir)
    except folder_lock.FolderInUse as e:
      raise app.UsageError(f"--out_dir: {e}") from e
    write_provenance()


FLAGS_FILE = "flags.txt"
RUN_INFO_FILE = "run_info.json"
JOB_FILE = "job.json"
NOT_REPLAYED = {"resume", "overwrite"}  # A replay decides these itself.
_JOBS: dict[str, list[dict]] = {}  # --out_dir -> the runs recorded in its manifest.


def launcher_name() -> str:
  """The launcher's module (experiments.filfl, ...) or script name."""
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  return spec.name if spec is not None else os.path.basename(sys.argv[0])


def launcher_module(module: str) -> bool:
  """Whether absl's `module` key is a launcher's or experiments' module: under `python -m`, the
  running launcher's own flags are registered under its file path."""
  main_file = getattr(sys.modules.get("__main__"), "__file__", None)
  return (module.startswith(("experiments", "__main__"))
          or (main_file is not None and os.path.abspath(module) == os.path.abspath(main_file)))


def flag_lines() -> list[str]:
  """The launcher's flags as `--name=value` lines (absl's flagfile format), the flags of JAX,
  absl and TFDS left out."""
  lines = []
  skip = NOT_REPLAYED | flag_binding.unused_setting_flags()
  for module, module_flags in FLAGS.flags_by_module_dict().items():
    if not launcher_module(module):
      continue
    for flag in module_flags:
      text = flag.serialize()
      if flag.name not in skip and text:
        lines.append(text)
  return sorted(set(lines))


def write_text(path: str, text: str) -> None:
  """Writes `text` to `path` atomically (a temporary file renamed over it)."""
  tmp = path + ".tmp"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(tmp, path)
  except OSError:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_provenance() -> None:
  """`<out_dir>/flags.txt`, a flagfile that replays the job (`--flagfile=<out_dir>/flags.txt`,
  a later `--out_dir` overriding), and `<out_dir>/run_info.json`: the command line, the time, the
  library, JAX and device versions, the host."""
  import jax  # pylint: disable=import-outside-toplevel
  import flax  # pylint: disable=import-outside-toplevel
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  write_text(os.path.join(FLAGS.out_dir, FLAGS_FILE), "\n".join(flag_lines()) + "\n")
  info = {"launcher": launcher_name(), "command": [sys.executable, *sys.argv],
          "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
          "host": socket.gethostname(),
          "versions": {"fedjax_sel": fs.__version__, "jax": jax.__version__,
                       "jaxlib": getattr(jax.lib, "__version__", None) or jax.__version__,
                       "flax": flax.__version__, "optax": optax.__version__,
                       "numpy": np.__version__, "python": sys.version.split()[0]},
          "devices": [f"{d.platform}:{d.device_kind}" for d in jax.devices()],
          "processes": jax.process_count()}
  write_text(os.path.join(FLAGS.out_dir, RUN_INFO_FILE), json.dumps(info, indent=1) + "\n")


def record_runs(runs) -> None:
  """Adds `runs` to `<out_dir>/job.json`, the job's manifest: per run its launcher, label, seed,
  swept value and folder (relative to --out_dir)."""
  job = _JOBS.setdefault(os.path.abspath(FLAGS.out_dir), [])
  for r in runs:
    tag = next((p for p in r.path if "=" in p), None)
    job.append({"launcher": launcher_name(), "label": r.label.strip(), "seed": r.sim.seed,
                "sweep": tag, "folder": os.path.join(*r.path)})
  if writer():
    os.makedirs(FLAGS.out_dir, exist_ok=True)
    write_text(os.path.join(FLAGS.out_dir, JOB_FILE),
                      json.dumps({"runs": job}, indent=1) + "\n")


def cli(main):
  """`main` for `app.run`: a UsageError prints its message and where to find help (absl would
  print the help of every flag first), exit status 1; a file that cannot be written (a full disk)
  prints one line naming it, exit status 1."""
  def wrapped(argv):
    from fedjax_sel.compilation import use_persistent_cache  # pylint: disable=import-outside-toplevel
    use_persistent_cache()  # $FEDJAX_SEL_CACHE_DIR moves it; =off disables it.
    # JAX logs every accelerator backend it looks for and does not find (libtpu on a CPU host).
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    try:
      return main(argv)
    except app.UsageError as e:
      sys.stderr.write(f"error: {e}\nRun with --help for the flags.\n")
      sys.exit(1)
    except OSError as e:
      if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
        raise
      where = f"cannot write {e.filename}: " if e.filename else ""
      sys.exit(f"error: {where}{e.strerror or e}")
  return wrapped


def writer() -> bool:
  """Whether this process writes files (process 0 of a multi-host run, or the only one)."""
  import jax  # pylint: disable=import-outside-toplevel
  return jax.process_index() == 0


def init_distributed() -> None:
  """Joins a multi-host run (before any JAX computation) when the flags ask for one; a process
  that cannot join within --distributed_timeout seconds stops with what to check."""
  import jax  # pylint: disable=import-outside-toplevel
  many = FLAGS.num_processes > 1 or FLAGS.coordinator_address is not None
  if not (many or FLAGS.distributed_auto):
    return
  kwargs = {"initialization_timeout": FLAGS.distributed_timeout}
  if not FLAGS.distributed_auto:
    if FLAGS.coordinator_address is None or FLAGS.num_processes < 2:
      raise app.UsageError("a multi-host run needs --coordinator_address=host:port and "
                           f"--num_processes >= 2, got {FLAGS.coordinator_address!r} and "
                           f"{FLAGS.num_processes}")
    if FLAGS.process_id >= FLAGS.num_processes:
      raise app.UsageError(f"--process_id must be in 0..{FLAGS.num_processes - 1} "
                           f"(--num_processes), got {FLAGS.process_id}")
    kwargs.update(coordinator_address=FLAGS.coordinator_address,
                  num_processes=FLAGS.num_processes, process_id=FLAGS.process_id)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes' collectives.
  if not FLAGS.distributed_auto:
    _wait_for_coordinator()
  try:
    jax.distributed.initialize(**kwargs)
  except Exception as e:  # pylint: disable=broad-except
    raise app.UsageError(
        f"could not join the multi-host run at --coordinator_address="
        f"{FLAGS.coordinator_address} within --distributed_timeout={FLAGS.distributed_timeout}s "
        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); check that process 0 "
        "is reachable there and that every process has the same --num_processes and its own "
        "--process_id") from e
  if jax.process_index() != 0:  # Process 0 prints the progress and tables.
    sys.stdout = open(os.devnull, "w", encoding="utf-8")  # pylint: disable=consider-using-with


def _wait_for_coordinator() -> None:
  """A rendezvous before `jax.distributed.initialize`, on the port after the coordinator's: process
  0 waits for every other process to check in, and each of them for process 0's go-ahead, so a
  process left alone stops with a message naming who is missing (JAX's coordinator, once started,
  aborts the process natively when peers never join, which Python cannot catch)."""
  address, timeout, count = FLAGS.coordinator_address, FLAGS.distributed_timeout, FLAGS.num_processes
  host, _, port = address.rpartition(":")
  try:
    meeting = (host, int(port) + 1)
  except ValueError as e:
    raise app.UsageError(f"--coordinator_address must be host:port, got {address!r}") from e
  deadline = time.monotonic() + timeout
  if FLAGS.process_id == 0:
    sys.stderr.write(f"process 0 of {count}: waiting up to {timeout}s at {host}:{meeting[1]} for "
                     "the other processes to check in\n")
    _gather_peers(meeting, count, deadline)
    return
  while True:
    try:
      with socket.create_connection(meeting, timeout=1) as conn:
        conn.sendall(f"{FLAGS.process_id}\n".encode())
        conn.settimeout(max(deadline - time.monotonic(), 1.0))
        if conn.recv(2) == b"go":
          return
    except OSError as e:
      if time.monotonic() > deadline:
        raise app.UsageError(f"could not join the multi-host run: process 0 did not answer at "
                             f"--coordinator_address={address} (rendezvous port {meeting[1]}) "
                             f"after --distributed_timeout={timeout}s ({e}); start process 0 "
                             "there first") from e
      time.sleep(0.5)


def _gather_peers(meeting: tuple[str, int], count: int, deadline: float) -> None:
  """Process 0's side of the rendezvous: every process id 1..count-1 checks in before the
  deadline, then each is told to go on; else a UsageError naming the missing ids."""
  peers: dict[int, socket.socket] = {}
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      server.bind(("", meeting[1]))
    except OSError as e:
      raise app.UsageError(f"--coordinator_address: cannot listen on port {meeting[1]} (the "
                           f"coordinator's port + 1, the processes' rendezvous): {e}") from e
    server.listen(count)
    try:
      while len(peers) < count - 1:
        server.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
          conn, _ = server.accept()
        except socket.timeout:
          missing = sorted(set(range(1, count)) - set(peers))
          raise app.UsageError(
              f"fewer processes joined than --num_processes={count}: process ids {missing} did "
              f"not check in within --distributed_timeout={FLAGS.distributed_timeout}s; start "
              "them with the same --coordinator_address and --num_processes") from None
        conn.settimeout(5)
        try:
          peer = int(conn.recv(16).decode().strip())
        except (OSError, ValueError):
          conn.close()
          continue
        if not 0 < peer < count or peer in peers:
          conn.close()
          raise app.UsageError(f"a process checked in as --process_id={peer}: each of 1.."
                               f"{count - 1} must be given once (process 0 is this one)")
        peers[peer] = conn
      for conn in peers.values():
        conn.sendall(b"go")
    finally:
      for conn in peers.values():
        conn.close()


def check_counts() -> None:
  """K <= n <= N, checked after presets are applied (a parse-time validator would see the
  launcher's defaults instead of the preset's values)."""
  k, n, total = FLAGS.clients_per_round, FLAGS.num_available, FLAGS.num_clients
  if FLAGS.availability != "uniform":  # --num_available is the uniform model's alone.
    n = 0
  if not k <= (n or total) <= total:
    raise app.UsageError(f"need --clients_per_round <= --num_available <= --num_clients, got "
                         f"{k}, {n}, {total}")


def dataset_spec(**overrides) -> fs.DatasetSpec:
  """The `DatasetSpec` of the data flags, with launcher-specific fields in `overrides`."""
  spec = fs.DatasetSpec(
      name=FLAGS.dataset, num_clients=FLAGS.num_clients, partition=FLAGS.partition,
      alpha=FLAGS.dirichlet_alpha, classes_per_client=FLAGS.classes_per_client,
      dominant_fraction=FLAGS.dominant_fraction, val_fraction=FLAGS.val_fraction,
      test_fraction=FLAGS.test_fraction, public_fraction=FLAGS.public_fraction,
      data_dir=FLAGS.data_dir, leaf_files=tuple(FLAGS.leaf_files), tfds_name=FLAGS.tfds_name,
      synth_alpha=FLAGS.synth_alpha, synth_beta=FLAGS.synth_beta, max_examples=FLAGS.max_examples)
  return spec._replace(**overrides)


def load_data(seed: int, hint: str = "", **overrides) -> fs.FederatedDataset:
  """Builds the dataset, turning data errors into flag errors (before any training); `hint` is
  added to the message of missing data (e.g. how a preset's data are prepared)."""
  if FLAGS.store_dir is not None:
    return _open_store()
  check_common()
  spec = dataset_spec(**overrides)
  if spec.name == "fashion_mnist" and not os.path.isdir(spec.data_dir):
    raise app.UsageError(f"--data_dir={spec.data_dir} does not exist; install the Debian "
                                "package dataset-fashion-mnist or point --data_dir at IDX files")
  where = f"--dataset={spec.name} --num_clients={spec.num_clients}"
  if spec.name not in ("leaf", "synth"):
    where += f" --partition={spec.partition}"
  if spec.public_fraction:
    where += f" --public_fraction={spec.public_fraction} (the server's share)"
  try:
    data = fs.build_dataset(spec, seed)
  except FileNotFoundError as e:
    hint = "" if hint[-40:] in str(e) else hint  # The loader's message may say it already.
    raise app.UsageError(f"{where}: {e}. {hint}".strip()) from e
  except ValueError as e:
    raise app.UsageError(f"{where}: {e}") from e
  empty = int((data.train.counts == 0).sum())
  if empty:
    raise app.UsageError(f"{where}: {empty} clients get no training example; lower "
                         "--num_clients or --test_fraction / --val_fraction / --public_fraction")
  if FLAGS.test_fraction > 0 and data.test.counts.sum() == 0:
    raise app.UsageError(f"{where}: clients are too small for a test split at "
                                f"--test_fraction={FLAGS.test_fraction}; lower --num_clients")
  return data


def _open_store() -> fs.FederatedDataset:
  from fedjax_sel.data.store import open_store  # pylint: disable=import-outside-toplevel
  try:
    data = open_store(FLAGS.store_dir)
  except (FileNotFoundError, ValueError) as e:
    raise app.UsageError(f"--store_dir={FLAGS.store_dir}: {e}") from e
  if FLAGS["num_clients"].present and FLAGS.num_clients != data.num_clients:
    raise app.UsageError(f"--num_clients={FLAGS.num_clients} but --store_dir={FLAGS.store_dir} "
                         f"holds {data.num_clients} clients")
  FLAGS.num_clients = data.num_clients
  check_common()
  return data


def optimizer():
  """lr -> optax SGD with optional momentum and decoupled weight decay."""
  momentum = FLAGS.momentum or None
  wd = FLAGS.weight_decay

  def make(lr):
    sgd = optax.sgd(lr, momentum=momentum)
    return optax.chain(optax.add_decayed_weights(wd), sgd) if wd else sgd

  return make


def local_hparams() -> fs.LocalHParams:
  return fs.LocalHParams(batch_size=FLAGS.batch_size, num_epochs=FLAGS.local_epochs,
                         num_steps=FLAGS.local_steps, prox_mu=FLAGS.prox_mu,
                         chunk_size=FLAGS.chunk_size)


def lr_schedule():
  return fs.step_decay_lr(FLAGS.lr, FLAGS.lr_decay, FLAGS.lr_decay_every)


MODEL_INPUTS = {  # (feature shape, is character text) -> whether the model takes these inputs.
    "logreg": lambda shape, text: not text, "mlp": lambda shape, text: not text,
    "leaf_cnn": lambda shape, text: shape == (28, 28, 1),
    "cifar_cnn": lambda shape, text: len(shape) == 3 and min(shape[:2]) >= 12,
    "resnet18": lambda shape, text: len(shape) == 3, "char_lstm": lambda shape, text: text}


def model_for(data: fs.FederatedDataset) -> fs.Model:
  try:
    hidden = tuple(int(h) for h in FLAGS.hidden)
  except ValueError as e:
    raise app.UsageError(f"--hidden must be a comma-separated list of integers, got "
                         f"{FLAGS.hidden}") from e
  if not hidden or min(hidden) < 1:
    raise app.UsageError(f"--hidden widths must be >= 1, got {FLAGS.hidden}")
  # Character windows: 1-D rows of vocabulary indices labelled over the LEAF vocabulary.
  text = len(data.feature_shape) == 1 and data.num_classes == sources.VOCAB_SIZE
  if not MODEL_INPUTS[FLAGS.model](data.feature_shape, text):
    kind = "character windows" if text else f"features of shape {data.feature_shape}"
    raise app.UsageError(f"--model={FLAGS.model} does not fit --dataset={FLAGS.dataset} "
                         f"({kind}); accepted: " + ", ".join(
                             m for m, ok in MODEL_INPUTS.items() if ok(data.feature_shape, text)))
  if FLAGS.model in CONV_MODELS:
    try:
      resolve_conv_impl(FLAGS.conv_impl)
    except ValueError as e:
      raise app.UsageError(f"--conv_impl={FLAGS.conv_impl}: {e}") from e
  return fs.build_model(FLAGS.model, data.feature_shape, data.num_classes,
                        conv_impl=FLAGS.conv_impl, hidden=hidden, norm=FLAGS.norm,
                        width=FLAGS.resnet_width)


def availability(redraw_first_period: bool = False) -> fs.Availability:
  """The --availability model (flag errors as usage errors, naming the flag or file). The
  probabilities and phases describe the population, so they are drawn with a fixed seed: every
  run seed of a job sees the same population (and shares one compiled round)."""
  from fedjax_sel import availability as models  # pylint: disable=import-outside-toplevel
  n = FLAGS.num_clients
  capacity = FLAGS.avail_capacity or None
  try:
    if FLAGS.availability == "uniform":
      return fs.uniform_availability(n, FLAGS.num_available or n, FLAGS.avail_period,
                                     redraw_first_period=redraw_first_period)
    if FLAGS.availability == "probability":
      try:
        low, high = (float(v) for v in FLAGS.avail_prob_range)
      except ValueError as e:
        raise ValueError(f"--avail_prob_range must be two numbers low,high, got "
                         f"{FLAGS.avail_prob_range}") from e
      if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"--avail_prob_range must satisfy 0 <= low <= high <= 1, got {low}, "
                         f"{high}")
      probs = np.random.default_rng(0).uniform(low, high, n)
      return models.probability_availability(probs, capacity, FLAGS.avail_period)
    if FLAGS.availability == "diurnal":
      return models.diurnal_availability(n, FLAGS.diurnal_period, FLAGS.diurnal_mean,
                                         FLAGS.diurnal_amplitude, capacity)
    if FLAGS.avail_trace is None:
      raise ValueError("--availability=trace needs --avail_trace=FILE")
    return models.load_trace_availability(FLAGS.avail_trace, n, capacity)
  except (ValueError, FileNotFoundError) as e:
    raise app.UsageError(f"--availability={FLAGS.availability}: {e}") from e


def apply_preset(presets: dict[str, dict], name: str | None, flag: str = "preset") -> None:
  """Sets the flags of `presets[name]` that the command line did not set explicitly."""
  if name is None:
    return
  if name not in presets:
    raise app.UsageError(f"--{flag} must be one of {sorted(presets)}, got {name!r}")
  for key, value in presets[name].items():
    if not FLAGS[key].present:
      FLAGS[key].value = value


def preset_help(presets: dict[str, dict]) -> str:
  """One line per preset listing what it sets (for a flag's --help text)."""
  return "; ".join(f"{name}: " + ", ".join(f"--{k}={','.join(v) if isinstance(v, list) else v}"
                                          for k, v in values.items())
                   for name, values in presets.items())


def mean_std(values) -> str:
  """"mean +- sample std" over seeds (the value alone for one seed)."""
  values = np.asarray(values, float)
  if len(values) == 1:
    return f"{values[0]:.4f}"
  return f"{values.mean():.4f} +- {values.std(ddof=1):.4f}"


def check_finite() -> None:
  """Rejects NaN and infinite values of every float flag, naming the flag."""
  for name in FLAGS:
    flag = FLAGS[name]
    if flag.flag_type() == "float" and flag.value is not None and not math.isfinite(flag.value):
      raise app.UsageError(f"--{name} must be a finite number, got {flag.value}")


def run_sim(sim: fs.Simulator, *path: str, label: str, extra=None,
            run_settings: dict | None = None) -> list[dict]:
  """Runs `sim` for --rounds into `<out_dir>/<path...>` with the launchers' shared run flags; a
  diverged run, a refused resume or a foreign checkpoint exit with the message (status 1)."""
  folder = os.path.join(FLAGS.out_dir, *path)
  try:
    with trackers([folder]) as on_records:
      return fs.run(sim, FLAGS.rounds, folder,
                    eval_every=FLAGS.eval_every, checkpoint_every=FLAGS.checkpoint_every,
                    resume=FLAGS.resume, overwrite=FLAGS.overwrite, label=label, extra=extra,
                    settings=run_settings or settings(),
                    on_record=on_records[0] if on_records else None)
  except (NonFiniteError, CheckpointError, FileExistsError, WriteError) as e:
    sys.exit(f"error: {label.strip()}: {failure(e)}")
