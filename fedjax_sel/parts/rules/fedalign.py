"""FedALIGN (docs/papers/fedalign.md): prioritized FL in which non-priority clients join only when
aligned.

A priority set P (a `[N]` mask) defines the objective F(w) = sum_{k in P} p_k F_k(w). Each round the
server broadcasts w_t and F(w_t), the data-weighted mean of the priority clients' losses at w_t
(before local training). Priority clients always train and are aggregated. A non-priority client k
computes F_k(w_t) on its own data; it trains and uploads only if F_k(w_t) <= F(w_t) + eps_t, and the
server aggregates it only if F_k(w_t) >= F(w_t) - eps_t (Algorithm 1: together |F - F_k| <= eps_t).
With `metric="accuracy"` the comparison is on accuracies and the inequalities flip: train iff
A_k >= A - eps_t, aggregate iff A_k <= A + eps_t. Ties at exactly eps_t are included.

The first `warmup_fraction` of the rounds (rounded) train and aggregate priority clients only; after
that eps_t follows a schedule from eps_0 to 0 at the last round (t' = t - warm-up rounds):
  linear:   eps_0 * (1 - t' / (T - 1 - warm-up))  (eps_0 if only one round follows the warm-up);
  constant: eps_0;
  inverse:  eps_0 / (1 + t');
  or any jit-able callable t' -> eps_t.

Under partial participation (a selector sampling each group), F(w_t) is the mean over the priority
clients sampled this round: the server hears only from them.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from fedjax_sel.parts.types import RoundInputs
  >>> rule = fedalign_rule(jnp.array([True, False, False, False]), rounds=10, eps0=0.2,
  ...                      warmup_fraction=0.0, schedule="constant")
  >>> stats = {"loss": jnp.array([1.0, 1.1, 1.5, 0.5])}
  >>> inputs = RoundInputs.create(jnp.ones(4), stats=stats)
  >>> train, agg, _ = rule.apply(rule.init(4, None), jax.random.PRNGKey(0), inputs,
  ...                             jnp.ones(4, bool))
  >>> train.tolist(), agg.tolist()   # Client 3 trains (0.5 <= 1.2) but is refused (0.5 < 0.8).
  ([True, True, False, True], [True, True, False, False])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel import registry
from fedjax_sel.parts.types import Participation, RoundInputs

SCHEDULES = ("linear", "constant", "inverse")
METRICS = ("loss", "accuracy")
SPLITS = ("train", "val")

Schedule = Callable[[jax.Array], jax.Array]


def warmup_rounds(rounds: int, warmup_fraction: float) -> int:
  """Rounds of priority-only warm-up: round(fraction * T)."""
  return int(round(warmup_fraction * rounds))


def eps_schedule(schedule: str | Schedule, eps0: float, rounds: int,
                 warmup_fraction: float) -> Schedule:
  """Round t -> eps_t for the rounds after the warm-up (see the module docstring).

  Examples:
    >>> f = eps_schedule("linear", 0.2, rounds=12, warmup_fraction=0.1)   # 1 warm-up round.
    >>> [round(float(f(t)), 3) for t in (1, 6, 11)]
    [0.2, 0.1, 0.0]
  """
  check_schedule(schedule, eps0, rounds, warmup_fraction)
  fn = _eps_of_round(schedule, rounds, warmup_fraction)
  return lambda t: fn(t, jnp.float32(eps0))


def _eps_of_round(schedule: str | Schedule, rounds: int, warmup_fraction: float):
  """(t, eps_0) -> eps_t: eps_0 is an argument (the rule keeps it in its state, so runs of one
  program may differ in it)."""
  w = warmup_rounds(rounds, warmup_fraction)
  span = max(rounds - 1 - w, 1)

  def since(t):
    return jnp.maximum(jnp.asarray(t) - w, 0).astype(jnp.float32)

  if callable(schedule):
    return lambda t, eps0: jnp.asarray(schedule(since(t)), jnp.float32)
  if schedule == "linear":
    return lambda t, eps0: eps0 * jnp.maximum(1.0 - since(t) / span, 0.0)
  if schedule == "constant":
    return lambda t, eps0: eps0 + 0.0 * since(t)
  return lambda t, eps0: eps0 / (1.0 + since(t))


def check_schedule(schedule, eps0: float, rounds: int, warmup_fraction: float) -> None:
  """Raises ValueError naming the bad argument and its accepted range."""
  if not callable(schedule) and schedule not in SCHEDULES:
    raise ValueError(f"eps_schedule must be one of {SCHEDULES} or a callable, got {schedule!r}")
  if registry.concrete(eps0) and not (np.isfinite(eps0) and eps0 >= 0):
    raise ValueError(f"eps0 (initial alignment tolerance) must be a finite number >= 0, got {eps0}")
  if registry.concrete(warmup_fraction) and not 0.0 <= warmup_fraction < 1.0:
    raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction}")
  if rounds < 1:
    raise ValueError(f"rounds must be >= 1, got {rounds}")


def check_priority(priority: np.ndarray) -> None:
  """Refuses an empty priority set and one that holds every client (then FedALIGN is FedAvg)."""
  priority = np.asarray(priority, bool)
  if not priority.any():
    raise ValueError("the priority set is empty: choose at least one priority client")
  if priority.all():
    raise ValueError(f"the priority set holds all {priority.size} clients: FedALIGN would be "
                     "plain FedAvg; leave at least one non-priority client")


def alignment_masks(value, objective, eps, priority, chosen, warmup, metric: str = "loss"):
  """(train, aggregate) `[N]` masks of Algorithm 1 for per-client `value` (loss or accuracy at
  w_t), the priority `objective` and tolerance `eps`."""
  if metric == "loss":
    may_train, may_join = value <= objective + eps, value >= objective - eps
  else:
    may_train, may_join = value >= objective - eps, value <= objective + eps
  others = ~priority & ~warmup
  train = chosen & (priority | (others & may_train))
  return train, train & (priority | (others & may_join))


class FedALIGNState(NamedTuple):
  """FedALIGN's round values (reported under "rule", `eps0` and `priority` aside).

  Attributes:
    eps: eps_t (0 during the warm-up).
    warmup: whether the round is in the warm-up (priority clients only).
    objective: F(w_t), the priority clients' data-weighted metric.
    others_trained, others_aggregated: non-priority clients trained / aggregated.
    closest_gap: the smallest |F_k - F| of a selected non-priority client.
    eps0: eps_0 (a state value: runs of one program may differ in it).
    priority: `[N]` bool, the priority clients.
  """

  eps: jax.Array
  warmup: jax.Array
  objective: jax.Array
  others_trained: jax.Array
  others_aggregated: jax.Array
  closest_gap: jax.Array
  eps0: jax.Array
  priority: jax.Array


def fedalign_rule(priority, rounds: int, eps0: float = 0.2, schedule: str | Schedule = "linear",
                  warmup_fraction: float = 0.1, metric: str = "loss",
                  split: str = "train") -> Participation:
  """The FedALIGN participation rule.

  Args:
    priority: `[N]` bool, the priority set P.
    rounds: T (the schedule reaches 0 at round T - 1).
    eps0: initial tolerance eps_0 (in units of the metric).
    schedule: "linear", "constant", "inverse" or a callable t' -> eps.
    warmup_fraction: share of the rounds with priority clients only, in [0, 1).
    metric: "loss" or "accuracy" (the paper's experiments' proxy).
    split: data a client evaluates w_t on: "train" or "val" (its validation split).

  The state holds eps_0 and the priority mask (values of the run, not of the compiled program) and,
  reported in the round metrics under "rule": `eps`, `warmup`, `objective` (F(w_t) or
  the priority accuracy), `others_trained`, `others_aggregated` (non-priority clients), and
  `closest_gap`, the smallest |F_k - F| over the non-priority clients asked this round (0 when none
  was): when it stays above eps_t, nobody aligns and FedALIGN is the "None" run.
  """
  if metric not in METRICS:
    raise ValueError(f"align_metric must be one of {METRICS}, got {metric!r}")
  if split not in SPLITS:
    raise ValueError(f"align_split must be one of {SPLITS}, got {split!r}")
  check_priority(priority)
  check_schedule(schedule, eps0, rounds, warmup_fraction)
  eps_fn = _eps_of_round(schedule, rounds, warmup_fraction)
  w_rounds = warmup_rounds(rounds, warmup_fraction)
  priority = np.asarray(priority, bool)
  stat = metric if split == "train" else f"val_{metric}"

  def init(num_clients, params):
    del params  # The rule's state does not depend on the model.
    del num_clients
    z = jnp.zeros((), jnp.float32)
    return FedALIGNState(eps=z, warmup=jnp.asarray(True), objective=z, others_trained=z,
                         others_aggregated=z, closest_gap=z, eps0=jnp.float32(eps0),
                         priority=jnp.asarray(priority))

  def apply(state, key, inputs: RoundInputs, chosen):
    del key
    prio = state.priority
    value = inputs.stats[stat]
    weights = jnp.where(prio & chosen, inputs.num_examples, 0).astype(jnp.float32)
    objective = jnp.sum(weights * value) / jnp.maximum(jnp.sum(weights), 1e-30)
    warmup = jnp.asarray(inputs.round) < w_rounds
    eps = eps_fn(inputs.round, state.eps0)
    train, aggregate = alignment_masks(value, objective, eps, prio, chosen, warmup, metric)
    count = lambda m: jnp.sum(m & ~prio).astype(jnp.float32)
    others = ~prio & chosen
    gap = jnp.min(jnp.where(others, jnp.abs(value - objective), jnp.inf))
    return train, aggregate, state._replace(eps=jnp.where(warmup, 0.0, eps), warmup=warmup,
                                  objective=objective, others_trained=count(train),
                                  others_aggregated=count(aggregate),
                                  closest_gap=jnp.where(jnp.any(others), gap, 0.0))

  def report(state):
    return {k: v for k, v in state._asdict().items() if k not in ("eps0", "priority")}

  spec = {"name": "fedalign", "priority": np.flatnonzero(priority).tolist(), "rounds": rounds,
          "eps0": registry.plain(eps0), "warmup_fraction": float(warmup_fraction), "metric": metric,
          "split": split, "schedule": schedule if isinstance(schedule, str) else getattr(
              schedule, "__qualname__", "callable")}
  return Participation(init=init, apply=apply, needs=(stat,), report=report, spec=spec)


class PriorityState(NamedTuple):
  """`[N]` bool: the priority clients."""

  priority: jax.Array


def priority_only(priority) -> Participation:
  """The "None" baseline: only the priority clients train and are aggregated (FedAvg on P)."""
  check_priority(priority)
  priority = np.asarray(priority, bool)
  return Participation(init=lambda n, params: PriorityState(jnp.asarray(priority)),
                       apply=lambda state, key, inputs, chosen: (chosen & state.priority,
                                                                 chosen & state.priority, state),
                       spec={"name": "priority_only",
                             "priority": np.flatnonzero(priority).tolist()})


PRIORITY_CHOICES = ("random", "ids", "classes")


def choose_priority(num_clients: int, *, count: int = 0, ids=(), classes=(), label_hist=None,
                    seed: int = 0) -> np.ndarray:
  """`[N]` priority mask: explicit `ids`, the clients holding any training example of the given
  `classes`, or else `count` clients drawn by seed (one of the three). A drawn set with
  `label_hist` spreads over the clients' majority classes: no class holds a second priority client
  before every class holds one (two priority clients on one class would make the priority
  objective a narrower task than the `count` the user asked for).

  Examples:
    >>> choose_priority(5, ids=[1, 3]).tolist()
    [False, True, False, True, False]
  """
  if sum([bool(count), len(ids) > 0, len(classes) > 0]) > 1:
    raise ValueError("choose the priority set one way: a count, ids or classes")
  mask = np.zeros(num_clients, bool)
  if len(ids):
    bad = [i for i in ids if not 0 <= int(i) < num_clients]
    if bad:
      raise ValueError(f"priority ids {bad} out of range 0..{num_clients - 1}")
    mask[np.asarray(ids, int)] = True
  elif len(classes):
    hist = np.asarray(label_hist)
    bad = [c for c in classes if not 0 <= int(c) < hist.shape[1]]
    if bad:
      raise ValueError(f"priority classes {bad} out of range 0..{hist.shape[1] - 1}")
    mask = (hist[:, np.asarray(classes, int)] > 0).any(axis=1)
  else:
    if not 1 <= count < num_clients:
      raise ValueError(f"num_priority must be in 1..{num_clients - 1}, got {count}")
    perm = np.random.default_rng(seed).permutation(num_clients)
    if label_hist is not None:  # Draw order, then the clients' rank within their majority class.
      majority = np.asarray(label_hist).argmax(axis=1)[perm]
      rank = np.array([np.sum(majority[:i] == majority[i]) for i in range(num_clients)])
      perm = perm[np.lexsort((np.arange(num_clients), rank))]
    mask[perm[:count]] = True
  check_priority(mask)
  return mask


# --- Registered names (fedjax_sel.registry) ------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FedALIGNSettings:
  """FedALIGN's priority set and alignment schedule."""

  num_priority: int = registry.setting(2, "Number of priority clients, drawn by seed (unless "
                                       "--priority_ids or --priority_classes is given).",
                                       flag="num_priority")
  priority_ids: tuple[int, ...] = registry.setting((), "Explicit priority client ids (instead of a "
                                                   "random draw).", flag="priority_ids")
  priority_classes: tuple[int, ...] = registry.setting((), "Priority clients: those holding any of "
                                                       "these classes.", flag="priority_classes")
  eps0: float = registry.setting(0.2, "eps_0, the initial alignment tolerance: a non-priority "
                                 "client joins when its loss (or accuracy) is within eps_t of the "
                                 "priority clients'.", flag="eps0", within=">= 0")
  schedule: str = registry.setting("linear", "How eps_t decays from eps_0 to 0 at the last round "
                                   "after the warm-up.", flag="eps_schedule", choices=SCHEDULES)
  warmup_fraction: float = registry.setting(0.1, "Share of the rounds at the start with priority "
                                            "clients only.", flag="warmup_fraction",
                                            within="[0, 1)", sweep="structural")  # A round count.
  metric: str = registry.setting("loss", "What clients compare with the priority clients: loss, or "
                                 "accuracy (the paper's experiments' proxy).", flag="align_metric",
                                 choices=METRICS)
  split: str = registry.setting("train", "Data a client evaluates the global model on to decide: "
                                "its training data or its validation split (--val_fraction).",
                                flag="align_split", choices=SPLITS)

  def requires(self) -> dict[str, str]:
    """The validation split, where clients decide on it (`registry.requirements`)."""
    return {"validation": "split"} if self.split == "val" else {}

  def check(self, context: registry.BuildContext) -> None:
    if self.priority_ids and self.priority_classes:
      raise registry.SettingError("priority_ids", "and priority_classes: give at most one")
    if not self.priority_classes or context.data is not None:  # Classes need the data.
      self.priority(context)

  def priority(self, context: registry.BuildContext) -> np.ndarray:
    """`[N]` the priority clients (drawn with seed + 7 unless given)."""
    label_hist = None if context.data is None else context.data.label_hist
    field = ("priority_ids" if self.priority_ids else "priority_classes"
             if self.priority_classes else "num_priority")
    try:
      if self.priority_ids:
        return choose_priority(context.num_clients, ids=list(self.priority_ids))
      if self.priority_classes:
        return choose_priority(context.num_clients, classes=list(self.priority_classes),
                               label_hist=label_hist)
      return choose_priority(context.num_clients, count=self.num_priority,
                             seed=context.seed + 7, label_hist=label_hist)
    except ValueError as e:
      raise registry.SettingError(field, f"is refused: {e}") from e


@registry.register("rule", "fedalign", FedALIGNSettings, requires=("priority",))
def _fedalign(settings: FedALIGNSettings, context: registry.BuildContext) -> Participation:
  """FedALIGN: non-priority clients join when aligned with the priority clients."""
  return fedalign_rule(settings.priority(context), context.rounds, eps0=settings.eps0,
                       schedule=settings.schedule, warmup_fraction=settings.warmup_fraction,
                       metric=settings.metric, split=settings.split)
