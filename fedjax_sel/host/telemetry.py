"""Selection telemetry: who took part over a run, and how fairly (docs/workflow.md, 'Records').

Each evaluated round's record carries `participation`, from the clients' participation counts
(the rounds each trained and uploaded, kept in the run's state and checkpoint): Jain's fairness
index `(sum x)^2 / (N sum x^2)` (1 when every client took part equally often, 1/N when one did
all), the share of clients that never took part, and the most and fewest rounds a client took
part in. The last round's record also carries every client's count (`participations`).

Examples:
  >>> participation_summary(np.array([2, 2, 0, 0]))
  {'jain': 0.5, 'never': 0.5, 'max': 2, 'min': 0}
"""

from __future__ import annotations

import numpy as np


def jain_index(counts) -> float:
  """`(sum x)^2 / (N sum x^2)`; 1.0 when nobody took part (all equal)."""
  x = np.asarray(counts, np.float64)
  square = float(np.sum(x * x))
  return float(np.sum(x) ** 2 / (x.size * square)) if square > 0 else 1.0


def participation_summary(counts) -> dict:
  """Jain's index, the share never taking part, the most and fewest participations."""
  x = np.asarray(counts)
  return {"jain": round(jain_index(x), 6), "never": round(float(np.mean(x == 0)), 6),
          "max": int(x.max()), "min": int(x.min())}
