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
    model: the model bundle.
    data: the federated dataset.
    optimizer: learning rate -> optax client optimizer.
    local: static local-training settings (its `prox_mu` is this run's FedProx mu).
    availability: S_t sampler.
    selector: picks A_t from the filtered-in set.
    aggregator: combines the trained models.
    clients_per_round: K, the number of training slots.
    seed: run seed; every key derives from (seed, round, purpose, client id).
    filter: optional filter of the available set (FilFL).
    participation: optional client-side rule (FedALIGN, FedSRC); default: everyone selected trains.
    lr_schedule: client learning rate per round: an `LrSchedule` (`constant_lr`, `step_decay_lr`;
      its base is a run value, so runs differing in it share a program) or any callable
      round -> learning rate; default `constant_lr(0.1)`.
    eval_batch_size: batch of the vectorized evaluations.
    init_params: optional initial global model (default: `model.init` from the seed).
    eval_mask: optional `[N]` bool; `evaluate` then also reports `clean_{train,test}_loss` /
      `clean_{train,test}_accuracy` over these clients' training and test data (e.g. the
      non-corrupted ones, or FedALIGN's priority clients).
    nonfinite: "stop" (default: a non-finite model or loss reaches the metrics, and `run` stops
      there) or "exclude" (a client whose local model or loss is not finite is left out of the
      aggregate and of FilFL's candidates, and counted in the `nonfinite_clients` metric: what a
      real server does with a diverged upload).
    store: where the clients' data live: "device" (all of it, the fast default when it fits),
      "host" (host memory or a memory-mapped store, `data/store.py`), or "auto" (host when the
      data exceed `placement.DEVICE_DATA_SHARE` of the device's memory). Evaluation then streams
      the population through the device in chunks.
    host_rows: with store="host", which rows reach the device each round: "available" (the
      round's available clients', prepared on a background thread while the previous round
      runs; per-client stats and gradients exist for them only, which is all that masked
      selection and the rules read; DivFL's first-round table covers only them), "chosen" (stats
      streamed over all N clients in chunks, the round's choice planned from them, then only the
      chosen clients' rows; a selector that reads client data beyond its stats, like DivFL, is
      refused when it chooses unplanned clients), or "auto" ("available" when two rounds of
      available rows fit the device's share, else "chosen").
    capacity: the `Capacity` (rows per split, largest client) the device arrays are padded to;
      default this dataset's own. Runs of a job padded to one capacity share one program
      (`runs.RunBatch` and the launchers do this).
    server_optimizer: optional `server_optimizers.ServerOptimizer` (FedAvgM, FedAdam, FedYogi,
      FedAdagrad, or any optax transform): the aggregate becomes a pseudo-gradient the server
      steps with; None (default) takes the aggregate as the new global model.
    system_profile: optional `system.SystemProfile` (per-client speed and bandwidth): each round
      is then timed (`round_time_s`, cumulative `sim_time_s`, `system.py`).
    deadline_s: with a profile, the server waits at most this many seconds per round; clients
      that trained but finish later are stragglers, left out of the aggregate.
    asynchrony: optional `AsyncSpec` (`fedbuff`, `fedasync`): the asynchronous mode
      (`engine/asynchronous.py`), where `step` is one server step, `clients_per_round` the buffer
      size K and `asynchrony.concurrency` the clients training at once; it needs a
      `system_profile`, no deadline, filter or participation rule, and the device store.
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
