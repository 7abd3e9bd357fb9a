"""Per-round scalars for TensorBoard and Weights & Biases, written as the rounds finish.

`TensorBoardWriter(folder)` writes a run's records with `tensorboardX` (a well-kept writer that
needs no TensorFlow; `pip install -e '.[tensorboard]'`): every number of a record becomes a scalar
at step `round + 1`, the rounds trained (`step`: the x of the launchers' figures; a record's
`round` counts from 0), nested dicts by their path (`cost/train_samples`, `rule/alpha`), so the
curves equal the run's `metrics.jsonl` and its figures. Pass its `write` as
`fs.run(..., on_record=writer.write)`; the launchers do with `--tensorboard` (event files under
each run's folder, `tensorboard --logdir=<out_dir>`).

`WandbWriter(folder, name, config)` logs the same scalars at the same steps to a Weights & Biases
run (`pip install -e '.[wandb]'`), its files under the run's folder; offline by default (nothing
leaves the machine; `wandb sync <folder>/wandb/offline-run-*` uploads it later), `mode="online"`
to stream. W&B prints nothing (its banner and its summary of every scalar at the end are off) and
leaves the console alone, so the progress lines are the run's only output. The launchers do with
`--wandb` (`--wandb_project`, `--wandb_mode`), one W&B run per run of the job, its config the run's
settings.

Examples:
  >>> scalars({"round": 3, "test_accuracy": 0.9, "cost": {"uploads": 10.0}, "selected": [1, 2]})
  {'test_accuracy': 0.9, 'cost/uploads': 10.0}
  >>> step({"round": 0})
  1
"""

from __future__ import annotations

import math
import os

EVENTS_FOLDER = "tensorboard"


def scalars(record: dict, prefix: str = "") -> dict:
  """The finite numbers of `record` by their key path (the round, lists and booleans left out)."""
  out = {}
  for key, value in record.items():
    name = f"{prefix}{key}"
    if isinstance(value, dict):
      out.update(scalars(value, name + "/"))
    elif (isinstance(value, (int, float)) and not isinstance(value, bool) and key != "round"
          and math.isfinite(value)):
      out[name] = float(value)
  return out


def step(record: dict) -> int:
  """A record's step in TensorBoard and W&B: the rounds trained (`round + 1`; server steps in the
  asynchronous mode), as on the figures' x axis and in the progress line's `[t/T]`."""
  return int(record["round"]) + 1


class TensorBoardWriter:
  """Writes records of one run into `<folder>/tensorboard` (created)."""

  def __init__(self, folder: str):
    try:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise ImportError("TensorBoard output needs tensorboardX: pip install -e '.[tensorboard]'"
                        ) from e
    self.path = os.path.join(folder, EVENTS_FOLDER)
    self._writer = SummaryWriter(self.path)

  def write(self, record: dict) -> None:
    for name, value in scalars(record).items():
      self._writer.add_scalar(name, value, global_step=step(record))
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


class WandbWriter:
  """Logs records of one run to a Weights & Biases run whose files live under `folder`."""

  def __init__(self, folder: str, name: str, config: dict, project: str = "fedjax_sel",
               mode: str = "offline"):
    try:
      import wandb  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise ImportError("Weights & Biases output needs wandb: pip install -e '.[wandb]'") from e
    os.makedirs(folder, exist_ok=True)
    # silent: no banner, no sync hints, no end-of-run summary of every scalar (about 34 lines a
    # run); console="off": W&B neither wraps nor copies the run's stdout.
    self._run = wandb.init(project=project, name=name, config=config, dir=folder, mode=mode,
                           reinit="create_new",
                           settings=wandb.Settings(silent=True, console="off"))
    self.path = self._run.dir

  def write(self, record: dict) -> None:
    self._run.log(scalars(record), step=step(record))

  def close(self) -> None:
    self._run.finish()
