"""What a clock-aware selector expects each client to take in a round (FedCS, TiFL, REFL): its
compute seconds (its training samples over its speed) and its seconds to move the model once
(the model's bytes over its bandwidth), from the clients' system profile (`client/system.py`).

Examples:
  >>> import numpy as np
  >>> times = expected_times(np.array([100.0, 50.0]), np.array([1e6, 2e6]),
  ...                        np.array([200, 100]), epochs=1, model_bytes=1e6)
  >>> times.compute.tolist(), times.transfer.tolist()
  ([2.0, 2.0], [1.0, 0.5])
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedjax_sel import registry
from fedjax_sel.models.bundle import model_bytes, param_shapes


class ExpectedTimes(NamedTuple):
  """`[N]` seconds: `compute` (one round's local training) and `transfer` (one model copy)."""

  compute: np.ndarray
  transfer: np.ndarray

  @property
  def round(self) -> np.ndarray:
    """`[N]` a round alone: download, train, upload."""
    return self.compute + 2.0 * self.transfer


def expected_times(speed, bandwidth, num_examples, epochs: int,
                   model_bytes: float) -> ExpectedTimes:
  """Each client's expected compute and transfer seconds (E passes over its m_k examples)."""
  speed = np.asarray(speed, np.float64)
  bandwidth = np.asarray(bandwidth, np.float64)
  compute = np.asarray(num_examples, np.float64) * epochs / speed
  return ExpectedTimes(compute.astype(np.float32),
                       (model_bytes / bandwidth).astype(np.float32))


def context_times(context: registry.BuildContext, method: str) -> ExpectedTimes:
  """The run's expected times from its build context (profile, data, model), else ValueError
  naming `method` and what it lacks."""
  if context.profile is None:
    raise ValueError(f"{method} needs the clients' speeds: a system profile (the simulated "
                     "clock, --system_profile)")
  if context.data is None or context.model is None:
    raise ValueError(f"{method} needs the run's data and model to time its clients")
  size = model_bytes(param_shapes(context.model))
  return expected_times(context.profile.speed, context.profile.bandwidth,
                        context.data.train.counts, context.local_epochs, size)
