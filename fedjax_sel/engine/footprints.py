"""The parts' own time and memory, estimated when a run is built, before round 0.

A part whose work grows faster than N (FedCor's Gaussian process, clustered sampling's Ward
clustering, DivFL's distances) declares its `Footprint` at the run's `Scale`; `check_footprints`
times it at the device's rates (`RATES`) and weighs its memory against the device's, with no
compiling: it warns when the part's costliest round would take over `WARN_S`, and refuses, naming
the part, N, the estimates and a cheaper way, a part that would take more than `MEMORY_SHARE` of the
device's memory (an out-of-memory error later) or more than `REFUSE_S` a round.

Example:
  >>> from fedjax_sel.parts.types import Footprint
  >>> seconds(Footprint(flops=1e11, traffic=5e9), "cpu")
  3.0
"""

from __future__ import annotations

import warnings

import jax
import numpy as np

from fedjax_sel.engine.checks import device_memory_bytes, model_shapes
from fedjax_sel.models.bundle import Model
from fedjax_sel.parts.types import Footprint, Scale, part_name

# (FLOP/s, bytes/s) a footprint is timed at. CPU: measured on this project's 2-core AMD EPYC
# machine (jax 0.10, best of three): FedCor's fit steps ran at 62-138 GFLOP/s by their declared
# counts (N = 1000-3000; 66 from the 8.4 s a step at N = 5000), clustered sampling's Gram
# matrix at 94 GFLOP/s, Ward's merges moved 6.2-6.9 GB/s (N = 1000, and the 12 min at
# N = 5000). The rates below are below every one of these, so that estimates err long (by 1.3-3x
# here; other jobs sharing the cores slowed a step up to 4x); a larger CPU is faster.
# Accelerators: assumed, not measured (no accelerator was lent): a tenth of an H100's float32
# peak and a third of its memory bandwidth, what XLA's factorizations and small fused loops reach.
RATES = {"cpu": (5e10, 5e9), "other": (5e12, 1e12)}
# A part's own arrays may take this share of the device's memory; the rest holds the clients' data
# (`capacity.DEVICE_DATA_SHARE`), local training's chunks, the models and, on CPU, the process.
MEMORY_SHARE = 0.5
WARN_S = 60.0  # A costliest round estimated longer warns, with the estimate.
REFUSE_S = 12 * 3600.0  # One longer is refused: a run has tens to thousands of rounds.


def seconds(footprint: Footprint, platform: str) -> float:
  """The footprint's round in seconds at the platform's `RATES` (compute, then memory passes)."""
  flops, bandwidth = RATES["cpu" if platform == "cpu" else "other"]
  return footprint.flops / flops + footprint.traffic / bandwidth


def scale_of(model: Model, num_clients: int, num_available: int, k: int) -> Scale:
  """The run's `Scale`, the model's parameters counted from their shapes (nothing allocated)."""
  shapes = model_shapes(model)
  size = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(shapes))
  return Scale(int(num_clients), int(num_available), int(k), size)


def _duration(s: float) -> str:
  if s < 120:
    return f"{s:.0f} s"
  return f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.3g} h"


def check_footprints(parts: dict, scale: Scale, memory: int | None = None,
                     platform: str | None = None) -> None:
  """Each part's declared footprint at `scale` (`{kind: part}`, None parts skipped), estimated.

  Raises:
    ValueError: naming the part, N, its memory and time estimates and what to do, when its
      memory exceeds `MEMORY_SHARE` of the device's (default `checks.device_memory_bytes()`) or
      its costliest round `REFUSE_S`.

  Warns: with the estimates, when its costliest round takes over `WARN_S`.
  """
  platform = jax.devices()[0].platform if platform is None else platform
  memory = device_memory_bytes() if memory is None else memory
  flops, bandwidth = RATES["cpu" if platform == "cpu" else "other"]
  for kind, part in parts.items():
    if part is None:
      continue
    footprint = part.footprint(scale)
    time_s = seconds(footprint, platform)
    estimate = (f"the {kind} {part_name(part)!r} at N = {scale.num_clients} clients takes about "
                f"{_duration(time_s)} in its costliest round ({footprint.step}) and "
                f"{footprint.memory / 2**30:.1f} GiB of memory, estimated before round 0 at "
                f"{flops / 1e9:.0f} GFLOP/s and {bandwidth / 1e9:.0f} GB/s (footprints.RATES, "
                f"{platform})")
    over = []
    if footprint.memory > MEMORY_SHARE * memory:
      over.append(f"more than {MEMORY_SHARE:.0%} of the device's {memory / 2**30:.1f} GiB")
    if time_s > REFUSE_S:
      over.append(f"more than {REFUSE_S / 3600:.0f} h a round")
    cheaper = f", or {footprint.cheaper}" if footprint.cheaper else ""
    if over:
      raise ValueError(f"{estimate}: {' and '.join(over)}; run it with fewer clients{cheaper}")
    if time_s > WARN_S:
      warnings.warn(f"{estimate}; to go faster, run fewer clients{cheaper}", stacklevel=4)
