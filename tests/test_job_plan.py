"""How a launcher's job plans its methods' rounds: which run as three programs to share a
compiled training (`experiments/launch/job.py`)."""

import types

import optax

import fedjax_sel as fs
from experiments.launch.job import shared_training
from fedjax_sel.parts.filters import filfl as filtering
from fedjax_sel.models import per_example_loss


DATA = fs.build_dataset(fs.DatasetSpec("digits", num_clients=10, public_fraction=0.05), seed=0)


def _method(selector, **kw):
  data = DATA
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  spec = fs.build_run(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=16),
                      fs.uniform_availability(10, 6), selector, fs.fedavg(), 3, 0, **kw)
  return [types.SimpleNamespace(spec=spec)]


def test_methods_that_train_alike_share_their_training_and_a_method_alone_keeps_one_program():
  model = fs.build_model("logreg", DATA.feature_shape, DATA.num_classes)
  public = lambda p, x, y: per_example_loss(model, p, x, y).mean()
  dgf = filtering.filfl_filter(public, filtering.FilterConfig("dgf", period=2))
  methods = [_method(fs.random_selector()), _method(fs.power_of_choice(d=8)),
             _method(fs.random_selector(), filter=dgf)]  # Trains n slots, not K: alone.
  assert shared_training(methods) == [True, True, False]
  assert shared_training(methods[:1] * 2) == [False, False]  # One round program: one method.


def test_dgf_and_rgf_are_one_round_program_not_stages():
  """FilFL's two modes differ in their state and names only: one program key, so the job runs
  both on one round program instead of three stages that share their training."""
  model = fs.build_model("logreg", DATA.feature_shape, DATA.num_classes)
  public = lambda p, x, y: per_example_loss(model, p, x, y).mean()
  modes = [_method(fs.random_selector(), filter=filtering.filfl_filter(
      public, filtering.FilterConfig(mode, period=2))) for mode in ("dgf", "rgf")]
  assert shared_training(modes) == [False, False]


def _records(folder):
  import json  # pylint: disable=import-outside-toplevel
  lines = (folder / "seed0" / "metrics.jsonl").read_text().splitlines()
  return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in lines]


def test_stages_flag_compiles_the_round_as_three_programs_with_the_same_records(tmp_path):
  """`--stages=three` and `--stages=one` give the same records (the launcher's choice of
  programs never changes a result)."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel

  from tests.hang_guard import HANG_GUARD_S  # pylint: disable=import-outside-toplevel
  out = {}
  for stages in ("one", "three"):
    folder = tmp_path / stages
    subprocess.run([sys.executable, "-m", "experiments.run", f"--out_dir={folder}",
                    "--model=logreg", "--num_clients=10", "--num_available=6",
                    "--clients_per_round=3", "--rounds=3", "--seeds=0", f"--stages={stages}",
                    "--selector=poc"], check=True, capture_output=True, timeout=HANG_GUARD_S)
    out[stages] = _records(folder)
  assert out["one"] == out["three"] and len(out["one"]) == 3


def test_stages_with_the_asynchronous_mode_is_refused_naming_the_flags(tmp_path):
  """The asynchronous mode keeps its round in one program: --stages=three would do nothing."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel

  from tests.hang_guard import HANG_GUARD_S  # pylint: disable=import-outside-toplevel
  proc = subprocess.run([sys.executable, "-m", "experiments.run", f"--out_dir={tmp_path}",
                         "--mode=async", "--system_profile=lognormal", "--stages=three"],
                        capture_output=True, text=True, timeout=HANG_GUARD_S)
  assert proc.returncode != 0
  assert "--stages=three has no effect with --mode=async" in proc.stderr, proc.stderr


def test_a_job_reads_each_next_methods_stored_programs_while_one_runs(tmp_path):
  """Methods run one after another (`--concurrent_batches=1`), the launchers plan the next
  method's batches before a method runs and read their stored programs on another thread
  (`job.preload`): FedAvg, DGF and RGF preload DGF's and RGF's."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  import textwrap  # pylint: disable=import-outside-toplevel

  from tests.hang_guard import HANG_GUARD_S  # pylint: disable=import-outside-toplevel
  script = textwrap.dedent(f"""
      import runpy, sys
      from experiments.launch import job
      seen, preload = [], job.preload
      job.preload = lambda batches: seen.append(len(batches)) or preload(batches)
      sys.argv = ["filfl", "--out_dir={tmp_path / 'job'}", "--rounds=2", "--seeds=0,1",
                  "--num_clients=12", "--num_available=6", "--clients_per_round=3",
                  "--concurrent_batches=1"]
      try:
        runpy.run_module("experiments.filfl", run_name="__main__")
      except SystemExit as e:
        assert not e.code, e.code
      print("preloaded", seen)
  """)
  out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                       text=True, timeout=HANG_GUARD_S).stdout
  # Before FedAvg runs: DGF's batch (1), then FedAvg's own after its first (0); before DGF runs:
  # RGF's (1). A plan made ahead is preloaded once: DGF's and RGF's are not preloaded again.
  assert "preloaded [1, 0, 1]" in out, out[-2000:]


def test_methods_run_at_once_give_the_records_and_manifest_of_one_after_another(tmp_path):
  """`--concurrent_batches=2` (the default on a 2-core CPU) advances FedAvg and DGF at once, then
  RGF: every run's records and job.json are those of the methods one after another."""
  import json  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel

  from tests.hang_guard import HANG_GUARD_S  # pylint: disable=import-outside-toplevel
  outputs = {}
  for workers in (1, 2):
    folder = tmp_path / str(workers)
    outputs[workers] = subprocess.run(
        [sys.executable, "-m", "experiments.filfl", f"--out_dir={folder}", "--rounds=3",
         "--seeds=0", "--num_clients=12", "--num_available=6", "--clients_per_round=3",
         "--filter_period=2", f"--concurrent_batches={workers}"],
        check=True, capture_output=True, text=True, timeout=HANG_GUARD_S).stdout
  assert "-- 2 methods at a time" in outputs[2] and "at a time" not in outputs[1]
  manifests = [json.loads((tmp_path / str(w) / "job.json").read_text()) for w in (1, 2)]
  assert manifests[0] == manifests[1]
  for run in manifests[0]["runs"]:
    one, two = (_records(tmp_path / str(w) / run["folder"].rsplit("/", 1)[0]) for w in (1, 2))
    assert one == two and len(one) == 3, run["folder"]


def test_a_failing_batch_stops_the_batches_beside_it_and_its_error_is_raised():
  """`side_by_side.on_threads`: the first failure is raised on the waiting thread after the batch
  running beside it stopped (before its next round, as `run_batch(stop=...)` does) and before a
  waiting one started."""
  import threading  # pylint: disable=import-outside-toplevel

  import pytest  # pylint: disable=import-outside-toplevel

  from fedjax_sel.host.side_by_side import on_threads  # pylint: disable=import-outside-toplevel
  from tests.hang_guard import HANG_GUARD_S  # pylint: disable=import-outside-toplevel
  beside, started, stop = threading.Event(), [], threading.Event()

  def advance(item):
    started.append(item)
    if item == "broken":
      assert beside.wait(HANG_GUARD_S)
      raise ValueError("a part broke")
    beside.set()
    assert stop.wait(HANG_GUARD_S)  # The runner ends its batch here, before the next round.
    raise KeyboardInterrupt

  with pytest.raises(ValueError, match="a part broke"):
    on_threads(["running", "broken", "waiting"], advance, 2, stop)
  assert sorted(started) == ["broken", "running"]


def test_a_lone_methods_runs_advance_in_equal_batches_at_once_with_the_same_records(tmp_path):
  """A job of one method (a sweep of 4 runs) with `--concurrent_batches=2` cuts its runs into
  two batches of two and advances them at once: the records of the one batch of 4."""
  import json  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel

  from experiments.launch.job import _parts  # pylint: disable=import-outside-toplevel
  from tests.hang_guard import HANG_GUARD_S  # pylint: disable=import-outside-toplevel
  assert _parts(list(range(16)), 2) == [list(range(8)), list(range(8, 16))]
  assert _parts([0, 1, 2], 2) == [[0, 1, 2]] and _parts([0, 1], 2) == [[0, 1]]  # Whole.
  outputs = {}
  for workers in (1, 2):
    outputs[workers] = subprocess.run(
        [sys.executable, "-m", "experiments.run", f"--out_dir={tmp_path / str(workers)}",
         "--model=logreg", "--num_clients=10", "--num_available=6", "--clients_per_round=3",
         "--rounds=3", "--seeds=0,1", "--sweep=lr:0.05,0.1", f"--concurrent_batches={workers}"],
        check=True, capture_output=True, text=True, timeout=HANG_GUARD_S).stdout
  assert "-- 2 batches at a time" in outputs[2] and "at a time" not in outputs[1]
  manifest = json.loads((tmp_path / "1" / "job.json").read_text())
  assert manifest == json.loads((tmp_path / "2" / "job.json").read_text())
  assert len(manifest["runs"]) == 4
  for run in manifest["runs"]:
    one, two = ((tmp_path / str(w) / run["folder"] / "metrics.jsonl").read_text().splitlines()
                for w in (1, 2))
    strip = lambda lines: [{k: v for k, v in json.loads(line).items() if k != "wall_s"}
                           for line in lines]
    assert strip(one) == strip(two) and len(one) == 3, run["folder"]
