"""The `Simulator`: one run, built and placed, with `init`, `step`, `steps` and `evaluate`.

It is a facade: `run_spec.build_run` checks the arguments and builds the run's `RunSpec` (the
round's description, data and run values), `placement.place` puts the data where they live, and
the compiled programs (`programs.py`) are shared by every run of an equal config: a second seed
of a job compiles nothing. Several runs advance together with `runs.RunBatch` (of `RunSpec`s);
the host loop (`host/runner.py`) takes either.

Examples:
  >>> import optax
  >>> from fedjax_sel import (DatasetSpec, build_dataset, build_model, fedavg, random_selector,
  ...                         uniform_availability)
  >>> data = build_dataset(DatasetSpec("digits", num_clients=20), seed=0)
  >>> model = build_model("logreg", data.feature_shape, data.num_classes)
  >>> sim = Simulator(model, data, lambda lr: optax.sgd(lr), LocalHParams(batch_size=10),
  ...                 uniform_availability(20, 10), random_selector(), fedavg(), 5, seed=0)
  >>> state, metrics = sim.step(sim.init())
  >>> int(state.round), int(metrics["num_trained"])
  (1, 5)
"""

from __future__ import annotations

from fedjax_sel.client.local_training import LocalHParams
from fedjax_sel.engine.description import RoundConfig
from fedjax_sel.engine.placement import place
from fedjax_sel.engine.run_spec import RunSpec, build_run
from fedjax_sel.engine.state import DataArrays, EngineState, RunValues

__all__ = ["LocalHParams", "Simulator"]


class Simulator:
  """A federated simulation with pluggable availability, filter, selector, rule and aggregator: a
  small facade over `build_run` (its arguments, checked and built once into `spec`) and the
  run's placement (`placement.place`).

  Args:
    *args: the run's arguments, those of `run_spec.build_run` (model, data, client optimizer,
      local training, the parts, K, seed, and the optional filter, participation rule,
      learning-rate schedule, stores, server optimizer, clock and asynchronous mode).
    **kwargs: the same, by name.

  Attributes:
    spec: the run's `RunSpec`, which `RunBatch` and the host loop take.
    placement: where its data live (`placement.place`).
  """

  def __init__(self, *args, **kwargs):
    self.spec: RunSpec = build_run(*args, **kwargs)
    self.placement = place(self.spec)

  @property
  def config(self) -> RoundConfig:
    """The round's description."""
    return self.spec.config

  @property
  def run_values(self) -> RunValues:
    return self.spec.run_values

  @property
  def arrays(self) -> DataArrays:
    """The run's data as the compiled programs read them (on the device, uploaded on first use;
    the host placement's are the shapes of a round's rows)."""
    return self.placement.arrays

  def init(self) -> EngineState:
    """The state before round 0."""
    return self.spec.initial_state()

  def step(self, state: EngineState) -> tuple[EngineState, dict]:
    """Runs one round (one compiled call; in host mode, after this round's rows reach the
    device)."""
    return self.placement.step(state)

  def steps(self, state: EngineState, num_rounds: int) -> tuple[EngineState, dict]:
    """Runs `num_rounds` rounds in one compiled call (a `lax.scan` over rounds); the metrics come
    back stacked with a leading `[num_rounds]` axis. Use it when nothing needs the host between
    rounds: for small models it removes the per-round dispatch."""
    return self.placement.steps(state, num_rounds)

  def evaluate(self, params) -> dict:
    """Global model metrics: pooled test and train loss/accuracy, and on the public set."""
    return self.placement.evaluate(params)
