"""Compile once, run many: batched runs equal sequential ones, programs are shared, the persistent
cache is hit from a second process, a diverging run stops alone, batched jobs resume."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import numpy as np
import optax
import pytest

import fedjax_sel as fs
from fedjax_sel.engine.evaluation import evaluation_key
from fedjax_sel.host.compilation import CompileLog
from fedjax_sel.host.runner import NonFiniteError, OneRun
from fedjax_sel.models import per_example_loss
from fedjax_sel.parts.filters import filfl as filtering
from fedjax_sel.parts.rules import fedalign, fedsrc
from fedjax_sel.parts.selectors import uacs
from tests.conftest import ragged_dataset
from tests.hang_guard import HANG_GUARD_S

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = ([23, 5, 40, 8, 17, 9, 31, 12, 3, 28], [14, 30, 6, 22, 9, 41, 7, 18, 25, 11],
         [19, 8, 33, 15, 4, 27, 12, 36, 10, 21])


def _datasets():
  """Three runs' datasets of different sizes (and so different padded shapes), with public sets."""
  out = []
  for seed, sizes in enumerate(SIZES):
    data = ragged_dataset(sizes, seed=seed)
    rng = np.random.default_rng(seed)
    out.append(data._replace(public_x=rng.normal(size=(12, 6)).astype(np.float32),
                             public_y=rng.integers(0, 4, 12).astype(np.int32)))
  return out


def _sims(method, datasets, values):
  """One built run (`RunSpec`) per (dataset, run value) of `method`, padded to one capacity."""
  cap = fs.Capacity.of(datasets)
  sims = []
  for seed, (data, value) in enumerate(zip(datasets, values)):
    model = fs.build_model("mlp", data.feature_shape, data.num_classes, hidden=(8,))
    kw, selector, lr, local = {}, fs.random_selector(), 0.1, fs.LocalHParams(batch_size=4)
    if method == "fedavg":
      lr, local = value, local._replace(prox_mu=value)  # FedProx mu 0 beside mu > 0 runs.
    elif method == "filfl_dgf":
      pub = lambda p, x, y, model=model: per_example_loss(model, p, x, y).mean()
      kw["filter"] = filtering.filfl_filter(pub, filtering.FilterConfig("dgf", period=2))
    elif method == "fedalign":
      priority = np.zeros(10, bool)
      priority[seed:seed + 4] = True
      kw["participation"] = fedalign.fedalign_rule(priority, rounds=4, eps0=value,
                                                   warmup_fraction=0.25)
      kw["eval_mask"] = priority
    elif method == "uacs_entropy":
      selector = uacs.entropy_selector(eps=value)
    elif method == "fedsrc":
      kw["participation"] = fedsrc.fedsrc_rule(fedsrc.FedSRCConfig(target=value, beta=value / 2,
                                                                   decision_stat="loss"))
    sims.append(fs.build_run(model, data, lambda lr: optax.sgd(lr), local,
                             fs.uniform_availability(10, 6, period=3), selector,
                             fs.fedavg(), 3, seed, lr_schedule=fs.constant_lr(lr), capacity=cap,
                             **kw))
  return sims


METHODS = {"fedavg": (0.05, 0.1, 0.0), "filfl_dgf": (0, 0, 0), "fedalign": (0.0, 0.2, 5.0),
           "uacs_entropy": (0.0, 0.5, 1.0), "fedsrc": (0.3, 0.7, 1.0)}
COUNTS = ("num_available", "num_filtered", "num_selected", "num_trained", "num_aggregated",
          "filter_round", "gradients_computed")


@pytest.mark.parametrize("method", sorted(METHODS))
def test_batched_runs_equal_the_same_runs_one_by_one(method):
  """Runs that differ in seed, data, learning rate, FedProx mu, eps_0, eps or FedSRC's target
  and beta: one batched program, vmapped over the 3 runs (and for FedAvg and FilFL also looping
  over them one at a time) gives each run's selections, counts and costs exactly and its losses
  and accuracies within 1e-5 relative of the same runs one by one."""
  datasets = _datasets()
  one_by_one = [fs.run(sim, 4, progress=None) for sim in _sims(method, datasets, METHODS[method])]
  for runs_chunk in (3, 1) if method in ("fedavg", "filfl_dgf") else (3,):
    batch = fs.RunBatch(_sims(method, datasets, METHODS[method]), runs_chunk=runs_chunk)
    batched = fs.run_batch(batch, 4, progress=None)
    for want_run, got_run in zip(one_by_one, batched):
      for want, got in zip(want_run, got_run):
        where = (method, runs_chunk, want["round"])
        for key in ("selected", "trained_clients", "aggregated_clients", "filtered_in", *COUNTS):
          assert want.get(key) == got.get(key), (*where, key)
        for key in ("cost", "cumulative_cost"):
          assert want[key] == pytest.approx(got[key], rel=1e-6), (*where, key)
        for key in ("local_train_loss", "test_loss", "test_accuracy", "train_loss"):
          assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), (*where, key)


def test_a_batch_uploads_each_runs_data_once():
  """Building a run uploads nothing (a `RunSpec` holds host data only); a RunBatch places its
  runs' data on the device once, stacked, padded as each run's own placement pads them."""
  from fedjax_sel.engine.placement import padded_arrays  # pylint: disable=import-outside-toplevel
  specs = _sims("fedavg", _datasets(), METHODS["fedavg"])
  assert not any(isinstance(leaf, jax.Array) for spec in specs for leaf in jax.tree.leaves(
      (spec.data.train.x, spec.data.train.y)))
  batch = fs.RunBatch(specs)
  for i, spec in enumerate(specs):
    host = padded_arrays(spec)
    got = np.asarray(batch.arrays.train.x[i])
    assert got.shape == host.train.x.shape
    np.testing.assert_array_equal(got, np.asarray(host.train.x, np.float32))


def test_a_second_seed_compiles_no_new_round():
  a, b = _datasets()[:2]
  cap = fs.Capacity.of([a, b])
  make = lambda data, seed: fs.Simulator(
      fs.build_model("mlp", data.feature_shape, 4, hidden=(8,)), data, lambda lr: optax.sgd(lr),
      fs.LocalHParams(batch_size=4), fs.uniform_availability(10, 6), fs.random_selector(),
      fs.fedavg(), 3, seed, lr_schedule=fs.step_decay_lr(0.1 * (seed + 1), 0.5, 2), capacity=cap)
  fs.run(make(a, 0), 2, progress=None)
  with CompileLog() as log:
    records = fs.run(make(b, 1), 2, progress=None)
  assert log.count("step") == 0 and log.count("evaluate") == 0 and log.count("init") == 0, (
      log.by_name)
  assert records[0]["lr"] == pytest.approx(0.2)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_round_in_three_programs_equals_the_round_in_one(method):
  """The round as three programs (plan, training, finish: `stages=True`) gives every record of
  the one-program round bit for bit, for one run and for a batch of runs."""
  datasets = _datasets()
  strip = lambda runs: [[{k: v for k, v in r.items() if k != "wall_s"} for r in run]
                        for run in runs]
  specs = _sims(method, datasets, METHODS[method])
  for stages in (False, True):
    one = strip([fs.run_batch(OneRun(specs[0], stages=stages), 4, progress=None)[0]])
    batch = strip(fs.run_batch(fs.RunBatch(specs, stages=stages), 4, progress=None))
    if not stages:
      want = (one, batch)
  assert (one, batch) == want


def test_building_a_batch_compiles_no_operation_on_its_own():
  """Building FilFL's runs, their initial states and their batch (or a run alone, uploaded)
  compiles only whole programs
  (the model's initializer, the schedule's round-0 rate): no operation run eagerly compiles on its
  own, as each would be a compilation of a cold process and a cache load of a warm one (43 of the
  main job's compilations were)."""
  from fedjax_sel.engine import checks, programs  # pylint: disable=import-outside-toplevel
  jax.clear_caches()
  programs.program.cache_clear()
  checks._at_round_zero.cache_clear()  # pylint: disable=protected-access
  with CompileLog() as log:
    specs = _sims("filfl_dgf", _datasets(), METHODS["filfl_dgf"])
    batch = fs.RunBatch(specs)
    states = batch.init()
    jax.block_until_ready(OneRun(specs[0]).placement.arrays)  # A run alone, uploaded.
  # The initializer compiled, or loaded from the executable store when an earlier test stored it.
  assert set(log.by_name) | set(log.loaded_by_name) == {"jit(init_params)", "jit(<lambda>)"}, (
      log.by_name, log.loaded_by_name)
  assert log.by_name["jit(<lambda>)"] == 1, log.by_name  # One schedule: one round-0 rate.
  assert states.filter_state.tolist() == [False] * 3  # DGF's mode, one per run.


def test_rounds_that_train_alike_share_one_compiled_training(tmp_path, monkeypatch):
  """Three rounds (two selectors, two weightings of FedAvg) on one model and local training, in
  stages from an empty store: one training program for all three, and a plan and a finish each;
  one evaluation (it reads only the model and how to evaluate).
  (An aggregator that is not linear, such as the median, trains apart: its clients' models are
  kept, not folded into the aggregate as they train.)"""
  from fedjax_sel.engine import executables, programs  # pylint: disable=import-outside-toplevel
  programs.program.cache_clear()
  jax.clear_caches()
  monkeypatch.setattr(executables, "folder", lambda: str(tmp_path))
  data = _datasets()[0]
  model = fs.build_model("mlp", data.feature_shape, data.num_classes, hidden=(8,))
  parts = [(fs.random_selector(), fs.fedavg()), (fs.power_of_choice(d=8), fs.fedavg()),
           (fs.random_selector(), fs.fedavg(weighting="uniform"))]
  specs = [fs.build_run(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=4),
                        fs.uniform_availability(10, 6), sel, agg, 3, 0) for sel, agg in parts]
  with CompileLog() as log:
    for spec in specs:
      fs.run_batch(OneRun(spec, stages=True), 2, progress=None)
  assert (log.count("train_stage"), log.count("plan_stage"), log.count("finish_stage")) == (
      1, 3, 3), log.by_name
  assert log.count("evaluate") == 1, log.by_name  # One model evaluated alike: one evaluation.
  key = evaluation_key(specs[0].config)
  assert key == evaluation_key(specs[1].config)
  assert key != evaluation_key(specs[0].config._replace(eval_batch_size=7))


def test_a_preloaded_round_is_read_once_on_another_thread_and_runs_the_same(tmp_path):
  """`RunBatch.preload` reads the stored round and evaluation on another thread; their first
  calls then read nothing more from the store, and the records are those of the batch that
  compiled them (a job preloads the next method's batch while one runs). In a process of its
  own, so that XLA compiles (and the store files) the first batch's programs."""
  script = textwrap.dedent("""
      import sys, threading
      sys.path.insert(0, %r)
      import fedjax_sel as fs
      from fedjax_sel.engine import executables, programs
      from fedjax_sel.host.compilation import CompileLog, use_persistent_cache
      from tests.test_runs import METHODS, _datasets, _sims
      use_persistent_cache()
      specs = _sims("fedavg", _datasets()[:2], METHODS["fedavg"])
      strip = lambda runs: [[{k: v for k, v in r.items() if k != "wall_s"} for r in run]
                            for run in runs]
      want = strip(fs.run_batch(fs.RunBatch(specs), 3, progress=None))
      programs.program.cache_clear()  # As a new process: nothing read or compiled yet.
      reads, load = [], executables.load
      executables.load = lambda path: reads.append(path) or load(path)
      batch = fs.RunBatch(specs)
      states = batch.init()  # Reads the initializer.
      thread = threading.Thread(target=batch.preload, args=(states,))
      thread.start()
      thread.join()
      preloaded = len(reads)
      with CompileLog() as log:
        got = strip(fs.run_batch(batch, 3, progress=None))
      print("reads", preloaded, len(reads), "loaded", log.loaded, "compiled", log.count("step"),
            "same", got == want)
  """) % REPO
  out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                       env=dict(os.environ, FEDJAX_SEL_CACHE_DIR=str(tmp_path / "cache")),
                       check=True, timeout=HANG_GUARD_S).stdout
  # The initializer, then the round and the evaluation; at their calls nothing more.
  assert "reads 3 3 loaded 2 compiled 0 same True" in out, out[-2000:]


def test_a_second_process_loads_the_round_untraced_and_runs_it_the_same(tmp_path):
  """The first process compiles the round and stores it (`engine/executables.py`); the second
  loads it, neither tracing nor compiling it, and its round equals, bit for bit, one run with the
  caches off."""
  script = textwrap.dedent("""
      import sys, optax
      sys.path.insert(0, %r)
      from fedjax_sel.host.compilation import CompileLog, use_persistent_cache
      print("cache", use_persistent_cache())
      import fedjax_sel as fs
      data = fs.build_dataset(fs.DatasetSpec("digits", num_clients=12), seed=0)
      with CompileLog() as log:
        sim = fs.Simulator(fs.build_model("mlp", data.feature_shape, 10), data,
                           lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=16),
                           fs.uniform_availability(12, 6), fs.random_selector(), fs.fedavg(), 3, 0)
        state, metrics = sim.step(sim.init())
      print("loaded", log.loaded, "round compiles", log.count("step"))
      print("loss", repr(float(metrics["local_train_loss"])), "params", repr(float(sum(
          abs(leaf).sum() for leaf in __import__("jax").tree.leaves(state.params)))))
  """) % REPO
  run = lambda cache: subprocess.run(
      [sys.executable, "-c", script], env=dict(os.environ, FEDJAX_SEL_CACHE_DIR=cache),
      capture_output=True, text=True, check=True, timeout=HANG_GUARD_S).stdout
  outs = [run(str(tmp_path / "cache")) for _ in range(2)]
  assert f"cache {tmp_path / 'cache'}" in outs[0]
  counts = [out.split("loaded ")[1].split("\n")[0] for out in outs]
  assert counts[0].startswith("0 ") and not counts[0].endswith(" 0"), outs  # Compiled, stored.
  assert not counts[1].startswith("0 ") and counts[1].endswith(" 0"), outs  # Loaded, untraced.
  assert os.listdir(tmp_path / "cache" / "executables")
  results = [out.split("loss ")[1] for out in outs + [run("off")]]
  assert results[0] == results[1] == results[2], results


def test_a_diverging_run_stops_alone(tmp_path):
  """The largest learning rate of a batch diverges: its record of that round is written and
  nothing after; the others run to the end; the error names it."""
  datasets = _datasets()
  sims = _sims("fedavg", datasets, (0.05, 0.1, 0.0))
  config = sims[2].config
  sims[2] = fs.build_run(config.model, datasets[2], config.optimizer,
                         fs.LocalHParams(batch_size=4), config.availability,
                         fs.random_selector(), fs.fedavg(), 3, 2,
                         lr_schedule=fs.constant_lr(1e9), capacity=sims[0].capacity)
  dirs = [str(tmp_path / f"run{i}") for i in range(3)]
  with pytest.raises(NonFiniteError, match="run 2: round") as err:
    fs.run_batch(fs.RunBatch(sims), 5, dirs, progress=None)
  records = err.value.records
  assert [len(r) for r in records[:2]] == [5, 5]
  assert 1 <= len(records[2]) < 5
  written = (tmp_path / "run2" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
  assert len(written) == len(records[2])
  assert np.isfinite(records[0][-1]["test_loss"]) and np.isfinite(records[1][-1]["test_loss"])


def _strip(records):
  return [{k: v for k, v in r.items() if k != "wall_s"} for r in records]


def test_batched_job_resumes_from_one_round_after_a_torn_save(tmp_path):
  """A kill between two runs' checkpoint writes leaves run 0 at round 4 and run 1 at round 2 (its
  previous checkpoint kept), with a torn metrics line: resuming continues both from round 2 and
  ends where an uninterrupted batch ends."""
  datasets = _datasets()[:2]
  make = lambda: fs.RunBatch(_sims("uacs_entropy", datasets, (0.0, 0.5)))
  whole = fs.run_batch(make(), 6, [str(tmp_path / "whole" / f"r{i}") for i in range(2)],
                       progress=None)
  dirs = [str(tmp_path / "cut" / f"r{i}") for i in range(2)]
  fs.run_batch(make(), 4, dirs, checkpoint_every=2, progress=None)
  ckpt = os.path.join(dirs[1], "checkpoint.msgpack")
  shutil.move(ckpt + ".prev", ckpt)  # Run 1's round-4 save never happened.
  with open(os.path.join(dirs[1], "metrics.jsonl"), "a", encoding="utf-8") as f:
    f.write('{"round": 4, "torn')
  resumed = fs.run_batch(make(), 6, dirs, resume=True, progress=None)
  assert [_strip(r) for r in resumed] == [_strip(r) for r in whole]
  for d, want in zip(dirs, whole):
    lines = [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"), encoding="utf-8")]
    assert _strip(lines) == _strip(want)


def test_runs_that_do_not_share_a_program_are_refused_naming_what_differs():
  datasets = _datasets()[:2]
  sims = _sims("fedavg", datasets, (0.1, 0.1))
  config = sims[1].config
  other = fs.build_run(config.model, datasets[1], config.optimizer, config.local,
                       config.availability, fs.power_of_choice(), fs.fedavg(), 3, 1,
                       capacity=sims[0].capacity)
  with pytest.raises(ValueError, match="run 1 does not share run 0's program: .*selector"):
    fs.RunBatch([sims[0], other])
  uneven = _sims("fedavg", [datasets[0]], (0.1,)) + _sims("fedavg", [datasets[1]], (0.1,))
  with pytest.raises(ValueError, match="Capacity"):
    fs.RunBatch(uneven)


def test_a_batched_filtering_round_costs_what_its_runs_cost_one_by_one():
  """FilFL's filtering branch (every available client trains) runs once per batch round, not for
  every run every round: the batched round's XLA FLOP count is at most the runs' one by one."""
  import jax  # pylint: disable=import-outside-toplevel

  from fedjax_sel.client.compiled_cost import flops  # pylint: disable=import-outside-toplevel
  from fedjax_sel.engine import programs  # pylint: disable=import-outside-toplevel
  from fedjax_sel.engine.runs import _batched_step  # pylint: disable=import-outside-toplevel
  sims = _sims("filfl_dgf", _datasets(), (0, 0, 0))
  batch = fs.RunBatch(sims, runs_chunk=3)
  from fedjax_sel.engine.description import keyed  # pylint: disable=import-outside-toplevel
  from fedjax_sel.engine.placement import place  # pylint: disable=import-outside-toplevel
  one = jax.jit(programs.step, static_argnums=0).lower(
      keyed(sims[0].config), sims[0].initial_state(), place(sims[0]).arrays,
      sims[0].run_values).compile()
  batched = jax.jit(_batched_step, static_argnums=0).lower(
      batch.keyed, batch.init(), batch.arrays, batch.run_values).compile()
  assert flops(batched) <= 1.05 * 3 * flops(one), (flops(batched), flops(one))


@pytest.mark.slow  # Two processes; `pytest -m slow`.
def test_runs_sharded_over_four_devices_equal_one_device(tmp_path):
  """With 4 host devices the 4 runs of a batch shard over a `runs` mesh axis; every run's
  selections equal, and its losses match, the single-device batch."""
  script = textwrap.dedent("""
      import json, sys
      sys.path.insert(0, %r)
      import jax, fedjax_sel as fs
      from tests.test_runs import _datasets, _sims
      datasets = _datasets() + _datasets()[:1]
      batch = fs.RunBatch(_sims("uacs_entropy", datasets, (0.0, 0.3, 0.6, 1.0)), runs_chunk=4)
      recs = fs.run_batch(batch, 3, progress=None)
      sharding = str(batch.arrays.train.x.sharding)
      print(json.dumps({"devices": jax.device_count(), "sharding": sharding,
                        "runs": [[(r["selected"], r["test_loss"]) for r in run] for run in recs]}))
  """) % REPO
  outs = []
  for count in (4, 1):
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={count}")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
  assert outs[0]["devices"] == 4 and "runs" in outs[0]["sharding"]
  for run4, run1 in zip(outs[0]["runs"], outs[1]["runs"]):
    for (sel4, loss4), (sel1, loss1) in zip(run4, run1):
      assert sel4 == sel1
      assert loss4 == pytest.approx(loss1, rel=1e-5)


def test_a_set_stop_event_ends_the_batch_before_its_next_round_keeping_its_rounds(tmp_path):
  """`run_batch(stop=...)`: a batch on another thread is stopped by the thread that waits for it
  (a failing method beside it, Ctrl-C) as Ctrl-C stops it: before its next round, the finished
  rounds written."""
  import threading  # pylint: disable=import-outside-toplevel
  specs = _sims("fedavg", _datasets(), METHODS["fedavg"])
  stop = threading.Event()
  folders = [str(tmp_path / f"run{i}") for i in range(len(specs))]
  on_records = [None] * (len(specs) - 1) + [lambda record: stop.set()]  # After round 1.
  with pytest.raises(KeyboardInterrupt):
    fs.run_batch(fs.RunBatch(specs), 4, folders, progress=None, on_records=on_records, stop=stop)
  for folder in folders:
    with open(os.path.join(folder, "metrics.jsonl"), encoding="utf-8") as f:
      assert [json.loads(line)["round"] for line in f] == [0]


def test_batches_run_side_by_side_give_the_records_of_each_alone():
  """`fs.run_batches`: two batches on two threads, each with the records `run_batch` gives it."""
  specs = _sims("fedavg", _datasets(), METHODS["fedavg"])
  make = lambda: [fs.RunBatch(specs[:2]), OneRun(specs[2])]
  alone = [fs.run_batch(b, 3, progress=None) for b in make()]
  together = fs.run_batches(make(), 3, workers=2, progress=None)
  strip = lambda runs: [[{k: v for k, v in r.items() if k != "wall_s"} for r in recs]
                        for recs in runs]
  assert [strip(b) for b in together] == [strip(b) for b in alone]
  with pytest.raises(ValueError, match="one entry per batch"):
    fs.run_batches(make(), 3, out_dirs=[None], progress=None)
  for workers in (0, -1, 1.5):  # None is the default; 0 would run nothing.
    with pytest.raises(ValueError, match=f"workers must be an int >= 1 .*got {workers}"):
      fs.run_batches(make(), 3, workers=workers, progress=None)
