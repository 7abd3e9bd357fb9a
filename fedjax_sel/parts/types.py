"""The pluggable parts of a round, each a small pure pair in the style of optax.

A round (docs/engine.md, 'The round') is availability -> filter -> selector -> participation rule ->
local training -> aggregator -> state updates. Every part is a NamedTuple of pure, jit-able
functions with explicit state and keys, static shapes and boolean masks over the N clients, so any
filter composes with any selector, participation rule and aggregator. Each factory records its name
and settings in the part's `spec` (`describe`), which a resumed run's fingerprint compares.

The engine enforces the parts' contracts: every mask a part returns is `[N]` bool (checked when the
round is traced, naming the part); a filter's set lies inside the available clients, a selector's
choice inside the filtered-in set with at most K clients, a rule's trained and aggregated clients
inside the selected (counted inside the compiled round, `engine/contracts.py`; a round that breaks
one stops the run, naming the part and the round).

Parts read a `RoundInputs`: the round index, the global model, the available mask, client-state
arrays (`stats`, computed by the engine for the names the parts declare in `needs`) and the
persistent `ClientState`. After training, every part may `observe` the `RoundOutcome`.

Stats names the engine can compute (all `[N]`, at the round's global model, before training):
  loss, accuracy, entropy: on each client's training data;
  batch_loss: on one random mini-batch (B examples, drawn with replacement) of its training data;
  val_loss, val_accuracy, test_loss, test_accuracy: on its validation / test data;
  grad_norm: norm of the full-batch gradient of F_k;
  grad: the stacked full-batch gradients `[N, ...]`.
A part that needs the gradients of only a few clients calls `inputs.gradients(ids)` instead of
declaring `grad`: the engine then computes nothing for the others (DivFL refreshes K rows).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

STAT_NAMES = ("loss", "accuracy", "entropy", "batch_loss", "val_loss", "val_accuracy", "test_loss",
              "test_accuracy", "grad_norm", "grad")
# The stats that evaluate the global model on every example of one of a client's splits.
SPLIT_STATS = {"train": frozenset({"loss", "accuracy", "entropy"}),
               "val": frozenset({"val_loss", "val_accuracy"}),
               "test": frozenset({"test_loss", "test_accuracy"})}


class ClientState(NamedTuple):
  """Persistent per-client arrays `[N]`.

  Attributes:
    last_loss: training loss reported at the last participation (+inf if never).
    last_round: round of the last participation (-1 if never).
    participations: number of rounds the client trained and uploaded.
    consecutive_skips: rounds in a row the client was selected but did not train.
  """

  last_loss: jax.Array
  last_round: jax.Array
  participations: jax.Array
  consecutive_skips: jax.Array

  @staticmethod
  def create(num_clients: int) -> ClientState:
    """Every client never seen: built on the host and placed, so nothing compiles."""
    n = (num_clients,)
    return jax.device_put(ClientState(np.full(n, np.inf, np.float32), np.full(n, -1, np.int32),
                                      np.zeros(n, np.int32), np.zeros(n, np.int32)))


class RoundInputs(NamedTuple):
  """What the parts of a round may read.

  Attributes:
    round: the round index t (scalar int).
    params: the global model w_t.
    available: `[N]` bool, S_t.
    stats: dict of `[N]` client-state arrays named in the parts' `needs`.
    clients: the persistent `ClientState`.
    num_examples: `[N]` training examples per client (m_k).
    label_hist: `[N, C]` training label histogram per client.
    gradients: on demand, `ids [M] -> [M, ...]` full-batch gradients of F_k at w_t of those
      clients (the `grad` stat's rows, computed only when called); None outside the engine.
    public_x, public_y: the server's public set (an argument of the compiled round, so runs with
      different public sets share it); None outside the engine.
    available_at: the run's availability model, `round -> [N]` bool (e.g. the next round's, as
      REFL's oracle reads it); None outside the engine.
    update_norms: on demand, `mask [N] -> ([N] norms, [N] samples)`: the clients of `mask` (at
      most K) train as the round would train them (same keys, so a client selected afterwards
      computes the same update) and report the norm of their update `w^k - w_t` and the samples
      it took (0 for the others); None outside the engine.
    k: K, the round's training slots (a Python int: shapes may depend on it). The engine's value
      is the one place K lives: a selector reads it here and takes no K of its own.
  """

  round: jax.Array
  params: Any
  available: jax.Array
  stats: dict
  clients: ClientState
  num_examples: jax.Array
  label_hist: jax.Array
  gradients: Callable[[jax.Array], Any] | None = None
  public_x: jax.Array | None = None
  public_y: jax.Array | None = None
  available_at: Callable[[jax.Array], jax.Array] | None = None
  update_norms: Callable[[jax.Array], tuple[jax.Array, jax.Array]] | None = None
  k: int | None = None

  @staticmethod
  def create(num_examples: Any, **fields) -> RoundInputs:
    """The inputs of round 0 outside the engine, for calling a part by hand: every client
    available, a fresh `ClientState`, no stats; `fields` set any other field by name.

    Args:
      num_examples: `[N]` training examples per client (m_k); N is its length.
      **fields: `RoundInputs` fields to set instead of their defaults.

    Example:
      >>> import jax.numpy as jnp
      >>> inputs = RoundInputs.create(jnp.array([10, 40, 20]), stats={"loss": jnp.ones(3)})
      >>> int(inputs.available.sum()), inputs.clients.last_round.tolist()
      (3, [-1, -1, -1])
    """
    num_examples = jnp.asarray(num_examples)
    n = num_examples.shape[0]
    defaults = {"round": jnp.int32(0), "params": None, "available": jnp.ones((n,), bool),
                "stats": {}, "clients": ClientState.create(n), "label_hist": None}
    return RoundInputs(num_examples=num_examples, **{**defaults, **fields})


class RoundOutcome(NamedTuple):
  """What happened in a round, for the parts' `observe`.

  Attributes:
    slots: `[K]` client ids of the trained slots.
    trained: `[K]` bool, slot trained and uploaded.
    aggregated: `[K]` bool, slot's model entered the aggregate.
    train_loss: `[K]` mean local training loss.
    params: stacked `[K, ...]` local models (None when the engine streamed a linear aggregate and
      no part declared `reads_local_models`).
    new_params: the aggregated global model w_{t+1}.
    train_loss_sq: `[K]` mean squared per-sample training loss (Oort's utility).
    client_times: `[N]` simulated seconds each client spent this round (`system.py`; None
      without a clock).
  """

  slots: jax.Array
  trained: jax.Array
  aggregated: jax.Array
  train_loss: jax.Array
  params: Any
  new_params: Any
  train_loss_sq: jax.Array | None = None
  client_times: jax.Array | None = None


def engine_input(inputs: RoundInputs, field: str, part: str):
  """`inputs.<field>`, one of the callables the engine provides (`gradients`, `available_at`,
  `update_norms`); outside the engine (None) a ValueError naming the part that reads it."""
  value = getattr(inputs, field)
  if value is None:
    raise ValueError(f"{part} reads inputs.{field}, which the simulator's round provides: run it "
                     "in the simulator")
  return value


def _no_state(*_):
  return ()


def _keep_state(state, *_):
  return state


# A forward pass over one sample, in training steps per sample (a step is about a forward and a
# backward pass of twice its cost): what the clock charges an evaluated sample and what FedSRC's
# net savings subtract.
FORWARD_COST = 1.0 / 3.0


class Stats(dict):
  """The round's per-client statistics by name (`[N]` arrays): those the parts declared in their
  `needs`. Reading one nobody declared says what to declare (instead of a bare KeyError)."""

  def __missing__(self, name):
    raise KeyError(f"the stat {name!r} was not computed this round: declare it in the part that "
                   f"reads it, needs=({name!r},); computed: {sorted(self) or 'none'}")


class PartCosts(NamedTuple):
  """What a part charges the round beyond the engine's own accounting, as the engine reads it
  (display-only numbers go in a part's `report` or `info` instead).

  Attributes:
    evaluated: `[N]` bool clients that computed the part's stats (power-of-choice's d candidates),
      charged instead of every available client; None: every available client.
    gradients_computed: int32 client gradients the part asked `inputs.gradients` for this round
      (simulation work, added to the round's `gradients_computed`).
    gradient_samples: float32 training samples of those clients (their cost, added to
      `client_grad_samples`).
    server_public_samples: float32 samples of the server's public set the part evaluated
      (FilFL's greedy passes and OPT).
  """

  evaluated: Any = None
  gradients_computed: Any = 0
  gradient_samples: Any = 0.0
  server_public_samples: Any = 0.0


def _no_costs(*_) -> PartCosts:
  return PartCosts()


class Scale(NamedTuple):
  """The sizes of a run a part's `footprint` may depend on, known when the run is built.

  Attributes:
    num_clients: N, the clients the part's arrays span.
    num_available: n, the clients available per round (the availability model's).
    k: K, the round's training slots.
    model_size: D, the model's parameters (a flattened model or update holds D values).
  """

  num_clients: int
  num_available: int
  k: int
  model_size: int


class Footprint(NamedTuple):
  """What a part's own computation takes of the machine in its costliest round, declared by the
  part so that `build_run` estimates its time and memory before round 0 (`engine/footprints.py`):
  it warns when that round would take over a minute, and refuses a run whose part would not fit in
  memory or would take half a day a round. A part whose work grows with N no faster than the
  engine's own (linearly) declares nothing.

  Attributes:
    flops: floating-point operations of its dense linear algebra (matrix products, Cholesky
      factors, triangular solves): compute-bound, timed at the device's FLOP rate.
    traffic: bytes its memory-bound passes read and write (element-wise operations, reductions,
      copies of large arrays; a pass that reads an `[N, N]` float32 array and writes another moves
      8 N^2 bytes), timed at the device's memory bandwidth.
    memory: bytes its largest arrays take at once (its state and working arrays).
    step: what the costliest round does, for the messages.
    cheaper: a cheaper setting or part, suggested when it is too costly.

  Example:
    >>> def gram_footprint(scale):  # An [N, N] Gram matrix of the clients' updates, every round.
    ...   n, d = scale.num_clients, scale.model_size
    ...   return Footprint(flops=2.0 * n * n * d, memory=4.0 * n * (n + d),
    ...                    step="every round: the [N, N] Gram matrix of the clients' updates")
    >>> gram_footprint(Scale(num_clients=1000, num_available=100, k=10, model_size=650)).memory
    6600000.0
  """

  flops: float = 0.0
  traffic: float = 0.0
  memory: float = 0.0
  step: str = ""
  cheaper: str = ""


def _no_footprint(_) -> Footprint:
  return Footprint()


class Selector(NamedTuple):
  """Picks at most K clients from a mask.

  `init(num_clients, params) -> state`;
  `select(state, key, inputs, mask) -> (chosen [N] bool, state)`.
  `reads_local_models`: whether `observe` reads `outcome.params` (the stacked local models).
  `report(state) -> dict` of scalars written into the round's metrics under `"selector"`, read
  after `observe` (display only).
  `costs(state) -> PartCosts`: what the selector charges; its `evaluated` is read right after
  `select`, its gradient counts after `observe`.
  `sampling_weights(state) -> [N] float32`, when set, read right after `select`: the weight c_k
  of each chosen client's update in the aggregate, `w_{t+1} = w_t + sum_k c_k (w^k - w_t)` over
  the aggregated clients, as an unbiased sampler's estimator has it (e.g. `p_k / pi_k`, p_k the
  client's share of the data and pi_k its inclusion probability, so that the expected aggregate
  is full participation's). A selector that draws with replacement reports each drawn client
  once in its mask and its multiplicity in these weights (a client drawn twice trains once and
  counts twice). Aggregators with `applies_sampling_weights` use them; the others aggregate the
  chosen clients as a set and say so in their docs.
  """

  init: Callable[[int, Any], Any]
  """`init(num_clients, params) -> state`: the selector's state before round 0."""
  select: Callable[..., tuple[jax.Array, Any]]
  """`select(state, key, inputs, mask) -> (chosen [N] bool, state)`: at most K of `mask`."""
  needs: tuple[str, ...] = ()
  """Statistics `select` reads from `inputs.stats` (`STATS`), computed for it each round."""
  observe: Callable[[Any, RoundInputs, RoundOutcome], Any] = _keep_state
  """`observe(state, inputs, outcome) -> state`: what the round taught (losses, times)."""
  reads_local_models: bool = False
  """Whether `observe` reads `outcome.params` (the stacked local models)."""
  report: Callable[[Any], dict] = lambda state: {}
  """`report(state) -> {name: scalar}` written under `"selector"` in the round's metrics."""
  spec: dict | None = None
  """The settings that built it, for provenance and the compiled program's signature."""
  costs: Callable[[Any], PartCosts] = _no_costs
  """`costs(state) -> PartCosts`: the evaluations and gradients the selector charged."""
  footprint: Callable[[Scale], Footprint] = _no_footprint
  """`footprint(scale) -> Footprint`: its own work in its costliest round, estimated at build."""
  sampling_weights: Callable[[Any], jax.Array] | None = None
  """`sampling_weights(state) -> [N]`: each chosen client's weight c_k in the aggregate."""
  recipe: Any = None
  """How the registry built it (`registry.Recipe`), or None: lets a batch sweep its settings."""


class Filter(NamedTuple):
  """Maps the available set to a filtered-in set.

  `apply(state, key, inputs, mask, local) -> (filtered [N] bool, state, info)` where `local` is a
  `(slots [n], valid [n], LocalResult)` of every available client's local model when
  `trains_available` (FilFL), else None. `info` is a dict of scalars/arrays for the metrics.
  Filtering runs on rounds with `t % period == 0` or a change of availability; other rounds reuse
  the last filtered-in set (intersected with the available set). `uses_public`: `apply` reads
  the server's public set (`inputs.public_x`, `inputs.public_y`), which must then be non-empty.
  `costs(info) -> PartCosts`: what a filtering round charged (from its `info`).
  """

  init: Callable[[int, Any], Any]
  """`init(num_clients, params) -> state`: the filter's state before round 0."""
  apply: Callable[..., tuple[jax.Array, Any, dict]]
  """`apply(state, key, inputs, mask, local) -> (filtered [N] bool, state, info)`."""
  period: int = 1
  """Filter every `period` rounds (and on a change of availability); reuse the set between."""
  trains_available: bool = False
  """Whether `apply` needs every available client's local model (`local`; FilFL)."""
  needs: tuple[str, ...] = ()
  """Statistics `apply` reads from `inputs.stats` (`STATS`)."""
  uses_public: bool = False
  """Whether `apply` reads the server's public set (`inputs.public_x`, `inputs.public_y`)."""
  spec: dict | None = None
  """The settings that built it, for provenance and the compiled program's signature."""
  costs: Callable[[dict], PartCosts] = _no_costs
  """`costs(info) -> PartCosts`: what a filtering round charged."""
  footprint: Callable[[Scale], Footprint] = _no_footprint
  """`footprint(scale) -> Footprint`: its own work in its costliest round, estimated at build."""
  recipe: Any = None
  """How the registry built it (`registry.Recipe`), or None: lets a batch sweep its settings."""


class Participation(NamedTuple):
  """Client-side decision of the selected clients (FedALIGN, FedSRC).

  `apply(state, key, inputs, chosen) -> (train [N] bool, aggregate [N] bool, state)`: who trains
  (and uploads), and whom of those the server aggregates.
  `report(state) -> dict` of scalars the engine writes into the round's metrics under `"rule"`
  (e.g. the round's threshold), read after `observe`.
  """

  init: Callable[[int, Any], Any]
  """`init(num_clients, params) -> state`: the rule's state before round 0."""
  apply: Callable[..., tuple[jax.Array, jax.Array, Any]]
  """`apply(state, key, inputs, chosen) -> (train [N] bool, aggregate [N] bool, state)`."""
  needs: tuple[str, ...] = ()
  """Statistics `apply` reads from `inputs.stats` (`STATS`)."""
  observe: Callable[[Any, RoundInputs, RoundOutcome], Any] = _keep_state
  """`observe(state, inputs, outcome) -> state`: what the round taught."""
  reads_local_models: bool = False
  """Whether `observe` reads `outcome.params` (the stacked local models)."""
  report: Callable[[Any], dict] = lambda state: {}
  """`report(state) -> {name: scalar}` written under `"rule"` in the round's metrics."""
  footprint: Callable[[Scale], Footprint] = _no_footprint
  """`footprint(scale) -> Footprint`: its own work in its costliest round, estimated at build."""
  spec: dict | None = None
  """The settings that built it, for provenance and the compiled program's signature."""
  recipe: Any = None
  """How the registry built it (`registry.Recipe`), or None: lets a batch sweep its settings."""


class AggregateInputs(NamedTuple):
  """Per-slot `[K]` facts an aggregator may weigh: mask of aggregated slots, m_k, training loss,
  and the selector's sampling weights c_k (None unless the selector has `sampling_weights`).

  The engine's round also gives the round index, the slots' client ids and `keys`, `round ->`
  the aggregator's key of that round (`keys.round_key(seed, round, keys.AGGREGATE)`), for the
  noise of a private aggregate (`fedjax_sel/privacy`); None outside the engine."""

  mask: jax.Array
  num_examples: jax.Array
  train_loss: jax.Array
  sampling_weights: jax.Array | None = None
  round: jax.Array | None = None
  clients: jax.Array | None = None
  keys: Callable[[jax.Array], jax.Array] | None = None


class Aggregator(NamedTuple):
  """`apply(state, global_params, client_params [K, ...], inputs) -> (new_global, state)`.

  `linear_weights(mask [K], num_examples [K]) -> [K]`, when set, says the aggregate is
  `sum_k weights_k w^k` with weights known before training (summing to 1, or all 0 to keep the
  global model); the engine then streams it out of local training chunk by chunk instead of holding
  all K local models.
  `applies_sampling_weights`: given a selector's sampling weights c_k (`AggregateInputs`), the
  aggregate is `w_t + sum_k c_k (w^k - w_t)` (streamed likewise); otherwise they are ignored.
  """

  init: Callable[[int, Any], Any]
  """`init(num_clients, params) -> state`: the aggregator's state before round 0."""
  apply: Callable[..., tuple[Any, Any]]
  """`apply(state, global_params, client_params [K, ...], inputs) -> (new_global, state)`."""
  linear_weights: Callable[[jax.Array, jax.Array], jax.Array] | None = None
  """`linear_weights(mask [K], num_examples [K]) -> [K]`: set when the aggregate is linear."""
  spec: dict | None = None
  """The settings that built it, for provenance and the compiled program's signature."""
  applies_sampling_weights: bool = False
  """Whether the aggregate weighs updates by the selector's sampling weights c_k."""
  recipe: Any = None
  """How the registry built it (`registry.Recipe`), or None: lets a batch sweep its settings."""


def everyone() -> Participation:
  """Every selected client trains and is aggregated (the default rule)."""
  return Participation(init=_no_state, apply=lambda state, key, inputs, chosen: (chosen, chosen,
                                                                                  state),
                       spec={"name": "everyone"})


def describe(part) -> dict:
  """A part's name and settings, as its factory recorded them in `spec` (what a resumed run's
  fingerprint compares); a part built without one is described by the name of its function, with
  a warning that its settings are not covered.

  Examples:
    >>> from fedjax_sel.parts.selectors.baselines import power_of_choice
    >>> describe(power_of_choice(d=6))
    {'name': 'poc', 'd': 6, 'variant': 'pow'}
  """
  if part is None:
    return {"name": "none"}
  if part.spec is not None:  # As JSON holds it (tuples as lists), for checkpoints and files.
    return json.loads(json.dumps(part.spec, default=str))
  main = part.select if isinstance(part, Selector) else part.apply
  name = getattr(main, "__qualname__", type(main).__name__)
  warnings.warn(f"a {type(part).__name__} without a spec ({name}): a resumed run checks its name "
                "only, its settings are not covered; pass spec={'name': ..., **settings} to cover "
                "them",
                stacklevel=2)
  return {"name": name, "settings": "not recorded"}


def part_name(part) -> str:
  """A part's name for messages (its spec's name, else its function's)."""
  if part.spec is not None:
    return str(part.spec.get("name", "?"))
  main = part.select if isinstance(part, Selector) else part.apply
  return getattr(main, "__qualname__", type(main).__name__)
