"""What a job prints (`fedjax_sel/host/runner.py`, `experiments/launch/report.py`): the progress
lines of asynchronous steps, the estimate of the time left, and the summaries' columns."""

import dataclasses
import io

import optax

import fedjax_sel as fs
from experiments.launch import config, report
from fedjax_sel.host import runner

SYNC = {"round": 0, "local_train_loss": 0.5, "num_selected": 3, "num_trained": 3,
        "test_accuracy": 0.5, "test_loss": 1.0, "train_loss": 1.0, "clean_train_loss": 0.25,
        "wall_s": 1.0, "cumulative_cost": {"train_samples": 10, "uploads": 3}}
ASYNC = dict(SYNC, staleness_mean=1.5, staleness_max=3)


def test_an_asynchronous_steps_line_shows_its_staleness():
  assert "staleness mean 1.50 max 3" in runner.progress_line("", 0, 2, ASYNC)
  assert "staleness" not in runner.progress_line("", 0, 2, SYNC)
  line = runner.batch_progress_line("", 0, 2, [[ASYNC], [dict(ASYNC, staleness_max=5)]], {})
  assert "staleness mean 1.50 [1.50-1.50]" in line and "staleness max 4.0 [3.0-5.0]" in line


def test_asynchronous_summaries_count_server_steps():
  table = fs.summary_table([("a", [ASYNC])])
  assert "best test acc (server steps)" in table and "server steps nobody trained" in table
  assert "rounds" not in table
  assert "best test acc (rounds trained)" in fs.summary_table([("s", [SYNC])])
  cfg = config.JobConfig()
  asynchronous = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, mode="async"))
  table = report.method_table(asynchronous, {"a": [[ASYNC]]})
  assert "evaluated server steps | server steps to" in table and " rounds" not in table
  assert "evaluated rounds | rounds to" in report.method_table(cfg, {"s": [[SYNC]]})


def test_the_summary_states_over_which_clients_its_train_losses_are():
  table = fs.summary_table([("s", [SYNC])], clean="uncorrupted clients")
  assert ("| final train loss (all clients) | final train loss (uncorrupted clients) |" in table
          and "| 1.0000 | 0.2500 |" in table)
  assert "uncorrupted" not in fs.summary_table([("s", [SYNC])])


def test_the_time_left_is_estimated_from_rounds_that_compile_nothing():
  """Round 1 compiles the step and round 2 the evaluation (--eval_every=2): 100 s each here,
  then 1 s a round; no estimate until round 3, then 1 s a round."""
  pace, shown = runner.Pace(), []
  for t, wall in enumerate([100.0, 200.0, 201.0, 202.0]):
    pace = pace.after(wall, evaluated=t % 2 == 1)
    shown.append(runner.progress_line("", t, 10, dict(SYNC, wall_s=wall), pace))
  assert "left" not in shown[0] and "left" not in shown[1]
  assert shown[2].endswith("201.0s (~7s left)") and shown[3].endswith("202.0s (~6s left)")


def test_the_first_estimate_of_a_job_comes_after_its_compiling_rounds(small_data):
  """A real run with --eval_every=2: the lines of rounds 1 and 2 (which compile) give no
  estimate, the next ones do."""
  model = fs.build_model("logreg", small_data.feature_shape, small_data.num_classes)
  sim = fs.Simulator(model, small_data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=4),
                     fs.uniform_availability(small_data.num_clients, 6), fs.random_selector(),
                     fs.fedavg(), 3, 0, lr_schedule=fs.constant_lr(0.1))
  out = io.StringIO()
  fs.run(sim, rounds=4, eval_every=2, progress=out)
  lines = out.getvalue().splitlines()
  assert ["left" in line for line in lines] == [False, False, True, False], lines
