"""What a round reads and carries: the run's state, its data, its run values and its cost counters.

A round is a pure function `(config, EngineState, DataArrays, RunValues) -> (EngineState, metrics)`
(`round.py`): the state is what a run carries from round to round (checkpoint it to resume), the
data arrays and run values are arguments of the compiled round, never constants inside it, so that
runs of one program share it and a leading runs axis can batch them (`runs.py`).

Example:
  >>> costs = Costs.zeros()
  >>> float(costs.uploads), len(Costs._fields)
  (0.0, 7)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

from fedjax_sel.data.federated import ClientPool
from fedjax_sel.parts.types import ClientState


class Costs(NamedTuple):
  """Cumulative cost counters (docs/workflow.md, "Outputs", lists them in the metrics).

  Attributes:
    client_eval_samples: samples evaluated by clients (forward passes for selection / rules).
    client_grad_samples: samples whose loss gradient clients computed for selection (a forward and
      a backward pass each: gradient norms, DivFL proxies).
    train_samples: training samples processed by clients.
    uploads: models uploaded to the server.
    downloads: models downloaded by clients.
    server_public_samples: samples of the public set evaluated by the server (filtering).
    sim_time_s: simulated seconds (`system.py`; 0 without a clock).
  """

  client_eval_samples: jax.Array
  client_grad_samples: jax.Array
  train_samples: jax.Array
  uploads: jax.Array
  downloads: jax.Array
  server_public_samples: jax.Array
  sim_time_s: jax.Array

  @staticmethod
  def zeros() -> Costs:
    return jax.device_put(Costs(*(np.zeros((), np.float32) for _ in Costs._fields)))


class EngineState(NamedTuple):
  """Everything a run carries from round to round (a pytree: checkpoint it to resume)."""

  round: jax.Array
  params: Any
  clients: ClientState
  filter_state: Any
  selector_state: Any
  participation_state: Any
  aggregator_state: Any
  filtered: jax.Array
  prev_available: jax.Array
  costs: Costs
  server_state: Any = ()
  inflight: Any = ()


class DataArrays(NamedTuple):
  """The data a compiled round reads, passed as arguments (never captured as constants).

  Attributes:
    train, val, test: the clients' pools (device arrays; a job's runs pad them to one capacity).
    public_x, public_y: the server's public set.
    label_hist: `[N, C]` training label histogram per client.
    counts: `[3, N]` every client's train / validation / test example counts.
    eval_mask: `[N]` bool, the clients of the `clean_*` evaluation metrics.
  """

  train: ClientPool
  val: ClientPool
  test: ClientPool
  public_x: jax.Array
  public_y: jax.Array
  label_hist: jax.Array
  counts: jax.Array
  eval_mask: jax.Array


class RunValues(NamedTuple):
  """What distinguishes one run of a program from another: scalars a runs axis batches.

  Attributes:
    seed: int32; every key derives from (seed, round, purpose, client id).
    lr: float32 base client learning rate (the config's `lr_factor(t)` multiplies it).
    prox_mu: float32 FedProx coefficient (used when the config's `proximal` is on).
    settings: float32 values of the parts' settings a batch sweeps, by `"part.setting"`
      (`sweeps.py`); empty for a run alone, whose parts hold their settings as constants.
  """

  seed: jax.Array
  lr: jax.Array
  prox_mu: jax.Array
  settings: dict = {}


def to_host(tree) -> Any:
  """Device pytree -> numpy / Python scalars (for JSON)."""
  return jax.tree.map(lambda a: np.asarray(a).item() if np.ndim(a) == 0 else np.asarray(a), tree)
