"""Per-round scalars for TensorBoard and Weights & Biases, written as the rounds finish.

`TensorBoardWriter(folder)` writes a run's records with `tensorboardX` (a well-kept writer that
needs no TensorFlow; `pip install -e '.[tensorboard]'`): every number of a record becomes a scalar
at step `round`, nested dicts by their path (`cost/train_samples`, `rule/alpha`), so the curves
equal the run's `metrics.jsonl`. Pass its `write` as `fs.run(..., on_record=writer.write)`; the
launchers do with `--tensorboard` (event files under each run's folder,
`tensorboard --logdir=<out_dir>`).

`WandbWriter(folder, name, config)` logs the same scalars to a Weights & Biases run
(`pip install -e '.[wandb]'`), its files under the run's folder; offline by default (nothing leaves
the machine; `wandb sync <folder>/wandb/offline-run-*` uploads it later), `mode="online"` to
stream. The launchers do with `--wandb` (`--wandb_project`, `--wandb_mode`), one W&B run per run of
the job, its config the run's settings.

Examples:
  >>> scalars({"round": 3, "test_accuracy": 0.9, "cost": {"uploads": 10.0}, "selected": [1, 2]})
  {'test_accuracy': 0.9, 'cost/uploads': 10.0}
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
      self._writer.add_scalar(name, value, global_step=int(record["round"]))
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
    self._run = wandb.init(project=project, name=name, config=config, dir=folder, mode=mode,
                           reinit="create_new")
    self.path = self._run.dir

  def write(self, record: dict) -> None:
    self._run.log(scalars(record), step=int(record["round"]))

  def close(self) -> None:
    self._run.finish()
