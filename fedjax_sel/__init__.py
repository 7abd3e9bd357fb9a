"""fedjax_sel: a JAX-vectorized simulator for federated client filtering, selection and
self-regulation.

The flat namespace below is the public API; modules hold one concern each:
`data` (pools, partitioners, sources), `models`, `local_training`, `compiled_cost` (XLA's memory
and FLOP counts), `evaluation`, `components` (the pure part types), `availability`, `selectors`,
`aggregators`, `server_optimizers` (FedAvgM, FedAdam, FedYogi, FedAdagrad), `oort` (Oort's
selector), `system` (client speeds and the simulated clock), `round` (the round as pure stages),
`placement` (where the clients' data live), `programs` (the compiled programs, shared by signature),
`runs` (runs as a batch axis), `engine` (the `Simulator` shell), `compilation` (the persistent
cache), `checkpoint`, `runner`.
"""

__version__ = "0.3.0"  # Before the imports: the runner writes it into checkpoint fingerprints.

from fedjax_sel.aggregators import fedavg, weighted_mean
from fedjax_sel.availability import Availability, uniform_availability
from fedjax_sel.components import (AggregateInputs, Aggregator, ClientState, Filter, Participation,
                                   RoundInputs, RoundOutcome, Selector, everyone)
from fedjax_sel.data.builders import DATASETS, DatasetSpec, build_dataset
from fedjax_sel.data.federated import ClientPool, FederatedDataset
from fedjax_sel.engine import (Costs, EngineState, LrSchedule, Simulator, constant_lr,
                               step_decay_lr)
from fedjax_sel.evaluation import ClientMetrics, client_gradients, client_metrics
from fedjax_sel.local_training import LocalHParams, LocalResult, local_train, steps_per_client
from fedjax_sel.models import MODELS, Model, build_model
from fedjax_sel.placement import Capacity
from fedjax_sel.runner import run, run_batch, summary_table
from fedjax_sel.runs import RunBatch
from fedjax_sel.oort import OortConfig, oort_selector
from fedjax_sel.selectors import random_selector, top_k_mask
from fedjax_sel.server_optimizers import (ServerOptimizer, fedadagrad, fedadam, fedavgm, fedyogi,
                                          server_sgd)

__all__ = [
    "fedavg", "weighted_mean", "Availability", "uniform_availability", "AggregateInputs",
    "Aggregator", "ClientState", "Filter", "Participation", "RoundInputs", "RoundOutcome",
    "Selector", "everyone", "DATASETS", "DatasetSpec", "build_dataset", "ClientPool",
    "FederatedDataset", "Costs", "EngineState", "LrSchedule", "Simulator", "constant_lr",
    "step_decay_lr", "ClientMetrics", "client_gradients", "client_metrics", "LocalHParams",
    "LocalResult", "local_train", "steps_per_client", "MODELS", "Model", "build_model", "Capacity",
    "run", "run_batch", "summary_table", "RunBatch", "OortConfig", "oort_selector",
    "random_selector", "top_k_mask", "ServerOptimizer", "fedadagrad", "fedadam", "fedavgm",
    "fedyogi", "server_sgd",
]
