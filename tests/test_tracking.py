"""The trackers (`fedjax_sel/host/tracking.py`): their step is the rounds trained, as on the
figures, and W&B adds nothing to the run's output."""

import os
import subprocess
import sys

import pytest

from fedjax_sel.host import tracking
from tests.hang_guard import HANG_GUARD_S
from tests.test_launchers import read_tensorboard_scalars, read_wandb_run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDS = [{"round": t, "test_accuracy": 0.1 * (t + 1)} for t in range(3)]


def test_a_records_step_is_the_rounds_trained():
  assert [tracking.step(r) for r in RECORDS] == [1, 2, 3]


def test_tensorboard_steps_are_the_rounds_trained(tmp_path):
  pytest.importorskip("tensorboardX", reason="the tensorboard extra")
  writer = tracking.TensorBoardWriter(str(tmp_path))
  for record in RECORDS:
    writer.write(record)
  writer.close()
  events = read_tensorboard_scalars(tmp_path / tracking.EVENTS_FOLDER)
  assert events["test_accuracy"] == {1: pytest.approx(0.1), 2: pytest.approx(0.2),
                                     3: pytest.approx(0.3)}


WANDB_RUN = """
import sys
from fedjax_sel.host import tracking
print("before")
writer = tracking.WandbWriter(sys.argv[1], "r", {"seed": 0})
for record in RECORDS:
  writer.write(record)
writer.close()
print("after")
""".replace("RECORDS", repr(RECORDS))


def test_wandb_prints_nothing_and_steps_as_tensorboard(tmp_path):
  """W&B's banner and its end-of-run summary (a sparkline per scalar) stay out of the run's
  output; its steps are the rounds trained."""
  pytest.importorskip("wandb", reason="the wandb extra")
  proc = subprocess.run([sys.executable, "-c", WANDB_RUN, str(tmp_path)], cwd=REPO,
                        capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
  assert proc.returncode == 0, proc.stderr
  assert (proc.stdout, proc.stderr) == ("before\nafter\n", ""), proc.stdout + proc.stderr
  _, _, history = read_wandb_run(tmp_path)
  assert history["test_accuracy"] == {1: pytest.approx(0.1), 2: pytest.approx(0.2),
                                      3: pytest.approx(0.3)}
