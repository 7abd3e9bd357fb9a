"""fedjax_sel: a JAX-vectorized simulator for federated client filtering, selection and
self-regulation.

The flat namespace below is the public API (every part factory included, as optax exports every
transform). The modules are grouped by layer; each layer imports only the layers before it in this
list:

- `version`, `registry` (every part by kind and name, with its settings) and `keys` (PRNG keys
  from seed, round and client id).
- `data/` (pools, partitioners, sources, stores) and `models/` (flax modules, the `Model` bundle).
- `parts/`: the round's parts, pure functions over client-state arrays: `types` (the part types,
  their costs), `availability`, `selectors/` (`baselines`: random, power of choice, DivFL, all,
  per group; `uacs`; `oort`), `filters/` (`filfl`), `rules/` (`fedalign`, `fedsrc`),
  `aggregators`, `server_optimizers`, `asynchronous` (FedBuff's and FedAsync's server rules).
- `client/`: what one client computes: `local_training`, `evaluation`, `chunking`,
  `compiled_cost` (XLA's memory and FLOP counts), `system` (speeds, bandwidths, the clock).
- `engine/`: build, then run. `description` (`RoundConfig`, the round's static description),
  `checks` and `run_spec` (`build_run`: a run's arguments checked and built into a `RunSpec`),
  `state` (what a round reads and carries); the round's stages, each a module returning
  NamedTuples: `stats`, `selection`, `training`, `cohort`, `costs`, `aggregation`, `metrics`,
  composed by `round` (and by `asynchronous`, the asynchronous mode's server step);
  `contracts`, `evaluation`; `signature`, `executables` and `programs` (the compiled programs,
  shared by signature); `capacity` and `placement` (where the clients' data live), `runs` (runs
  as a batch axis) and `simulator` (the `Simulator` facade).
- `host/`: the host side of a run: `runner` (the loop, records, resume), `checkpoint`,
  `folder_lock`, `tracking` (TensorBoard), `plotting`, `compilation` (the persistent cache).

Importing the package changes no JAX setting and writes nothing: JAX's persistent compilation
cache, which lets a second process load a program instead of compiling it, is turned on by the
launchers and benchmarks, and by a library user with
`fedjax_sel.use_persistent_cache()` before the first compilation.
"""

from fedjax_sel.client.evaluation import ClientMetrics, client_gradients, client_metrics
from fedjax_sel.client.local_training import (LocalHParams, LocalResult, local_train,
                                              steps_per_client)
from fedjax_sel.client.system import SystemProfile, lognormal_profiles
from fedjax_sel.data.builders import DATASETS, DatasetSpec, build_dataset
from fedjax_sel.data.federated import ClientPool, FederatedDataset
from fedjax_sel.data.flower import flower_dataset
from fedjax_sel.engine.capacity import Capacity
from fedjax_sel.engine.description import LrSchedule, RoundConfig, constant_lr, step_decay_lr
from fedjax_sel.engine.programs import use_fast_compile
from fedjax_sel.engine.run_spec import RunSpec, build_run
from fedjax_sel.engine.runs import RunBatch
from fedjax_sel.engine.sweeps import program_groups
from fedjax_sel.engine.simulator import Simulator
from fedjax_sel.engine.state import Costs, EngineState
from fedjax_sel.host.compilation import use_persistent_cache
from fedjax_sel.host.runner import run, run_batch, summary_table
from fedjax_sel.host.side_by_side import run_batches
from fedjax_sel.models import MODELS, Model, build_model
from fedjax_sel.parts.aggregators import (coordinate_median, fedasl, fedavg, krum, trimmed_mean,
                                          weighted_mean)
from fedjax_sel.parts.asynchronous import AsyncSpec, async_spec, fedasync, fedbuff
from fedjax_sel.parts.availability import (Availability, diurnal_availability,
                                           load_trace_availability, probability_availability,
                                           trace_availability, uniform_availability)
from fedjax_sel.parts.filters.filfl import FilterConfig, filfl_filter, greedy_filter, opt_filter
from fedjax_sel.parts.rules.fedalign import choose_priority, fedalign_rule, priority_only
from fedjax_sel.parts.rules.fedsrc import FedSRCConfig, fedsrc_rule
from fedjax_sel.parts.selectors.baselines import (all_selector, divfl, group_random_selector,
                                                  power_of_choice, random_selector, top_k_mask)
from fedjax_sel.parts.selectors.oort import OortConfig, oort_selector
from fedjax_sel.parts.selectors.sampling import md_selector
from fedjax_sel.parts.selectors.uacs import entropy_selector, grad_norm_selector
from fedjax_sel.parts.server_optimizers import (ServerOptimizer, fedadagrad, fedadam, fedavgm,
                                                fedyogi, server_sgd)
from fedjax_sel.parts.types import (AggregateInputs, Aggregator, ClientState, Filter, Footprint,
                                    PartCosts, Participation, RoundInputs, RoundOutcome, Scale,
                                    Selector, everyone)
from fedjax_sel.version import __version__ as __version__  # Re-exported, not an API name.

__all__ = [
    # Parts: types, availability, selectors, filters, rules, aggregators, server optimizers.
    "AggregateInputs", "Aggregator", "ClientState", "Filter", "Footprint", "PartCosts",
    "Participation", "RoundInputs", "RoundOutcome", "Scale", "Selector", "everyone",
    "Availability", "uniform_availability", "probability_availability", "diurnal_availability",
    "trace_availability", "load_trace_availability",
    "random_selector", "power_of_choice", "divfl", "all_selector", "group_random_selector",
    "top_k_mask", "entropy_selector", "grad_norm_selector", "OortConfig", "oort_selector",
    "md_selector",
    "FilterConfig", "filfl_filter", "greedy_filter", "opt_filter",
    "fedalign_rule", "priority_only", "choose_priority", "FedSRCConfig", "fedsrc_rule",
    "fedavg", "weighted_mean", "coordinate_median", "trimmed_mean", "krum", "fedasl",
    "ServerOptimizer", "server_sgd", "fedavgm", "fedadam", "fedyogi", "fedadagrad",
    "AsyncSpec", "async_spec", "fedbuff", "fedasync",
    # Clients, data and models.
    "ClientMetrics", "client_gradients", "client_metrics", "LocalHParams", "LocalResult",
    "local_train", "steps_per_client", "DATASETS", "DatasetSpec", "build_dataset", "ClientPool",
    "FederatedDataset", "flower_dataset", "MODELS", "Model", "build_model", "SystemProfile",
    "lognormal_profiles",
    # Engine and host.
    "Capacity", "Costs", "EngineState", "LrSchedule", "RoundConfig", "RunSpec", "Simulator",
    "build_run", "constant_lr", "step_decay_lr", "RunBatch", "program_groups", "run", "run_batch",
    "run_batches", "summary_table", "use_fast_compile", "use_persistent_cache",
]
