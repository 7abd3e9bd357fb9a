"""What a job prints (`fedjax_sel/host/runner.py`, `experiments/launch/report.py`): the progress
lines of asynchronous steps and the summaries' columns."""

import dataclasses

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
