"""Per-round scalars for TensorBoard, written as the rounds finish.

`TensorBoardWriter(folder)` writes a run's records with `tensorboardX` (a well-kept writer that
needs no TensorFlow; `pip install -e '.[tensorboard]'`): every number of a record becomes a scalar
at step `round`, nested dicts by their path (`cost/train_samples`, `rule/alpha`), so the curves
equal the run's `metrics.jsonl`. Pass its `write` as `fs.run(..., on_record=writer.write)`; the
launchers do with `--tensorboard` (event files under each run's folder,
`tensorboard --logdir=<out_dir>`).

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
