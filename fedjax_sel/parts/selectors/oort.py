"""Oort (Lai et al., "Oort: Efficient Federated Learning via Guided Participant Selection", OSDI
2021) as a pure `Selector` over client-state arrays, with FedScale's defaults and rules
(docs/papers/beyond.md).

Each client has a statistical utility (its reward: `|B_k| sqrt(mean of the squared per-sample
training losses)` from its last participation, its data size m_k before it took part), a duration
(its last round's simulated seconds from `system.py`, or the expected one given to the factory)
and the round it last took part. A round (`cur = t + 1`, FedScale's count) then:

1. Pacer: the mean reward of last round's exploited clients that reported back joins a history;
   every `pacer_step` rounds (from round 2 * pacer_step) the sum of the last `pacer_step` entries
   is compared with the step before: flat (within 10%) raises the round threshold by
   `pacer_delta` (up to 100), a jump (5x) lowers it (down to `pacer_delta`).
2. Preferred duration: the `round_threshold` percentile of every client's duration (inf at 100).
3. Scores of the explored feasible clients: rewards clipped at the `clip_bound` quantile of the
   feasible positive rewards, min-max normalized (min scaled by 0.999), plus the temporal
   uncertainty `sqrt(0.1 log(cur) / (last round + 1))`; a client slower than preferred is
   multiplied by `(preferred / duration) ** round_penalty`; FedScale takes the score's absolute
   value.
4. Exploitation: the exploration factor decays (`* exploration_decay`, floor `exploration_min`);
   `K - int(K exploration)` clients (FedScale; the paper's reading: `int(K (1 - exploration))`),
   at most the explored ones, are drawn without replacement with probability proportional to
   score among those scoring at least `cut_off_util` times the next-best score past that count
   (FedScale: and in any case the `10 * count + 1` best).
5. Exploration: the unexplored feasible clients, each weighted by its data size (with the same
   duration penalty), the `sample_window` times as many as needed kept by weight, and the rest of
   the K drawn from them by weight. With no unexplored client left, FedScale keeps the exploration
   factor at its floor; the paper's reading stops exploring for good.
6. Any slot still free goes to a uniformly drawn feasible client.

`variant="fedscale"` (the default) follows FedScale's `getTopK` (SymbioticLab/FedScale,
`thirdparty/oort/oort.py`); `variant="paper"` the Oort repository's (SymbioticLab/Oort,
`oort/oort.py`), which reads as the paper does; `variant="pyramidfl"` PyramidFL's fork of it
(liecn/PyramidFL, `oort/oort.py`: the exploitation count capped one below the explored clients,
exploration stopped once no available client is unexplored), which `pyramidfl_selector` runs with
PyramidFL's defaults. Defaults are FedScale's: exploration 0.9 decaying
by 0.98 to 0.3, round penalty 2, pacer step 20 and delta 5, round threshold 30, cut-off utility
0.05, clip bound 0.9, sample window 5. (FedScale's `exploration_alpha`, 0.3, weighs staleness
only in its logs; it is not used here.) Where both codes index past the end of the sorted scores
(fewer explored clients than the exploitation count; they raise), the cut-off is 0. Randomness:
weighted draws without replacement are Gumbel top-k with the round's selection key.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from fedjax_sel.parts.types import RoundInputs
  >>> sel = oort_selector()
  >>> state = sel.init(4, None)
  >>> inputs = RoundInputs.create(jnp.array([10, 40, 20, 30]), k=2)
  >>> chosen, state = sel.select(state, jax.random.PRNGKey(0), inputs, jnp.ones(4, bool))
  >>> int(chosen.sum())
  2
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel import registry
from fedjax_sel.parts.selectors.sampling import draw_without_replacement
from fedjax_sel.parts.types import RoundInputs, RoundOutcome, Selector


VARIANTS = ("fedscale", "paper", "pyramidfl")


@dataclasses.dataclass(frozen=True)
class OortConfig:
  """Oort's settings (FedScale's defaults); each field is also a launcher flag (`--oort_<field>`,
  the initial exploration factor `--oort_exploration`).

  Attributes:
    exploration_factor: initial share of the K explored (unexplored clients), in [0, 1].
    exploration_decay: its decay per round, in [0, 1].
    exploration_min: its floor, in [0, 1].
    round_penalty: alpha, the exponent of the duration penalty of a slow client's utility, >= 0.
    pacer_step: rounds per pacer window (W), >= 1.
    pacer_delta: the pacer's step of the preferred-duration percentile, in [0, 100].
    round_threshold: initial preferred-duration percentile (the pacer moves it), in [0, 100].
    cut_off_util: exploited clients come from those above (1 - cut_off_util) times the K-th
      utility, in [0, 1].
    clip_bound: utilities are clipped at this quantile, in [0, 1].
    sample_window: explored clients come from the first sample_window x (clients to explore) of
      the unexplored, fastest first, >= 1.
    variant: the rules: "fedscale" (FedScale's `getTopK`), "paper" (the Oort repository's, the
      paper's reading; see the module) or "pyramidfl" (PyramidFL's fork).
  """

  exploration_factor: float = registry.setting(0.9, "Initial exploration factor (decays by "
                                               "--oort_exploration_decay to "
                                               "--oort_exploration_min).", within="[0, 1]",
                                               flag="oort_exploration")
  exploration_decay: float = registry.setting(0.98, "The exploration factor's decay per round.",
                                              within="[0, 1]")
  exploration_min: float = registry.setting(0.3, "The exploration factor's floor.", within="[0, 1]")
  round_penalty: float = registry.setting(2.0, "Exponent of the duration penalty of a slow "
                                          "client's utility.", within=">= 0")
  pacer_step: int = registry.setting(20, "Rounds per pacer window.", within=">= 1")
  pacer_delta: float = registry.setting(5.0, "The pacer's step of the preferred-duration "
                                        "percentile.", within="[0, 100]")
  round_threshold: float = registry.setting(30.0, "Initial preferred-duration percentile (the "
                                            "pacer moves it).", within="[0, 100]")
  cut_off_util: float = registry.setting(0.05, "Exploited clients come from those above (1 - this) "
                                         "x the K-th utility.", within="[0, 1]")
  clip_bound: float = registry.setting(0.9, "Quantile at which utilities are clipped.",
                                       within="[0, 1]")
  sample_window: float = registry.setting(5.0, "Explored clients come from this many times the "
                                          "number to explore of the fastest unexplored.",
                                          within=">= 1")
  variant: str = registry.setting("fedscale", "The rules: fedscale (FedScale's getTopK), paper "
                                  "(the Oort repository's, as the paper reads) or pyramidfl "
                                  "(PyramidFL's fork).", choices=VARIANTS)


class OortState(NamedTuple):
  """Oort's per-client statistics and its pacer.

  Attributes:
    reward: `[N]` statistical utility at the client's last participation (|B_k| sqrt(mean l^2)).
    duration: `[N]` the client's last round duration (seconds; the given or equal ones before).
    time_stamp: `[N]` round after which the client last reported (0: never).
    count: `[N]` participations.
    exploration, exploration_min: the exploration share and its floor (decayed each round).
    round_threshold: the pacer's preferred-duration percentile.
    history: the last 2 * pacer_step rounds' summed utilities (the pacer's window).
    last_exploit: `[N]` the clients exploited last round.
    reported: `[N]` clients that have reported once.
    preferred: the preferred round duration (the threshold's percentile of the durations).
  """

  reward: jax.Array
  duration: jax.Array
  time_stamp: jax.Array
  count: jax.Array
  exploration: jax.Array
  exploration_min: jax.Array
  round_threshold: jax.Array
  history: jax.Array
  last_exploit: jax.Array
  reported: jax.Array
  preferred: jax.Array


class OortPlan(NamedTuple):
  """The deterministic part of a selection (what `select` samples from), for tests and reports."""

  scores: jax.Array          # [N] exploitation scores (0 for unexplored or infeasible clients)
  preferred: jax.Array       # preferred duration (inf when the threshold is 100)
  exploit_len: jax.Array     # clients to exploit
  candidates: jax.Array      # [N] bool, the exploitation candidates
  explore_len: jax.Array     # clients to explore
  explore_pool: jax.Array    # [N] bool, the unexplored clients kept by the sample window
  explore_weight: jax.Array  # [N] their weights
  state: OortState           # the state after the pacer and the exploration decay


def _sorted_quantile(values, mask, q) -> jax.Array:
  """`sorted(values[mask])[min(int(len * q), len - 1)]` (FedScale's index rule)."""
  count = jnp.sum(mask)
  ordered = jnp.sort(jnp.where(mask, values, jnp.inf))
  index = jnp.minimum(jnp.floor(count * q).astype(jnp.int32), count - 1)
  return ordered[jnp.maximum(index, 0)]


def plan(cfg: OortConfig, k: int, state: OortState, inputs: RoundInputs, mask) -> OortPlan:
  """Steps 1-5 of a selection, up to the random draws."""
  n = mask.shape[0]
  cur = jnp.asarray(inputs.round, jnp.int32) + 1
  size = inputs.num_examples.astype(jnp.float32)
  explored = state.count > 0
  reward = jnp.where(explored, state.reward, size)
  # 1. Pacer.
  back = state.last_exploit & state.reported
  util = jnp.sum(jnp.where(back, reward, 0.0)) / (jnp.sum(back) + 1e-4)
  history = jnp.concatenate([state.history[1:], util[None]])
  step = cfg.pacer_step
  last, current = jnp.sum(history[:step]), jnp.sum(history[step:])
  pace = (cur >= 2 * step) & (cur % step == 0)
  threshold = state.round_threshold
  threshold = jnp.where(pace & (jnp.abs(current - last) <= last * 0.1),
                        jnp.minimum(100.0, threshold + cfg.pacer_delta),
                        jnp.where(pace & (jnp.abs(current - last) >= last * 5),
                                  jnp.maximum(cfg.pacer_delta, threshold - cfg.pacer_delta),
                                  threshold))
  # 2. Preferred duration, over every client.
  duration = state.duration
  preferred = jnp.where(threshold < 100.0,
                        _sorted_quantile(duration, jnp.ones((n,), bool), threshold / 100.0),
                        jnp.inf)
  penalty = jnp.where(duration > preferred,
                      (preferred / jnp.maximum(duration, 1e-4)) ** cfg.round_penalty, 1.0)
  # 3. Scores of the explored feasible clients.
  positive = mask & (reward > 0)
  clip = _sorted_quantile(reward, positive, cfg.clip_bound)
  low = jnp.min(jnp.where(positive, reward, jnp.inf)) * 0.999
  high = jnp.max(jnp.where(positive, reward, -jnp.inf))
  spread = jnp.maximum(high - low, 1e-4)
  uncertainty = jnp.sqrt(0.1 * jnp.log(cur.astype(jnp.float32))
                         / (state.time_stamp.astype(jnp.float32) + 1.0))
  lake = mask & explored
  fedscale = cfg.variant == "fedscale"
  scores = ((jnp.minimum(reward, clip) - low) / spread + uncertainty) * penalty
  scores = jnp.where(lake, jnp.abs(scores) if fedscale else scores, 0.0)
  # 4. Exploitation count and candidates.
  exploration = jnp.maximum(state.exploration * cfg.exploration_decay, state.exploration_min)
  if fedscale:
    wanted = k - jnp.floor(k * exploration).astype(jnp.int32)
  else:
    wanted = jnp.floor(k * (1.0 - exploration)).astype(jnp.int32)
  # PyramidFL caps the count one below the explored clients (its cut-off index stays in range).
  most = jnp.sum(lake) - (1 if cfg.variant == "pyramidfl" else 0)
  exploit_len = jnp.maximum(jnp.minimum(wanted, most), 0)
  order = jnp.argsort(jnp.where(lake, -scores, jnp.inf), stable=True)
  rank = jnp.zeros((n,), jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32))
  cut = jnp.where(exploit_len < jnp.sum(lake), scores[order[jnp.minimum(exploit_len, n - 1)]],
                  0.0) * cfg.cut_off_util
  # FedScale keeps at least the 10 * exploit_len + 1 best whatever their scores.
  kept = (rank <= 10 * exploit_len) if fedscale else jnp.zeros((n,), bool)
  candidates = lake & ((scores >= cut) | kept)
  # 5. Exploration pool.
  unexplored = mask & ~explored
  explore_len = jnp.minimum(jnp.sum(unexplored), k - exploit_len)
  weight = jnp.where(unexplored, size * penalty, -jnp.inf)
  window = jnp.minimum(jnp.floor(cfg.sample_window * explore_len).astype(jnp.int32),
                       jnp.sum(unexplored))
  rank = jnp.argsort(jnp.argsort(-weight))  # 0 for the heaviest.
  pool = unexplored & (rank < window)
  # FedScale keeps exploring at its floor; PyramidFL stops once no available client is unexplored.
  none_left = ~jnp.any(~explored & (mask if cfg.variant == "pyramidfl" else True))
  none_left &= not fedscale
  new_state = state._replace(history=history, round_threshold=threshold,
                   exploration=jnp.where(none_left, 0.0, exploration),
                   exploration_min=jnp.where(none_left, 0.0, state.exploration_min),
                   reported=jnp.zeros((n,), bool))
  return OortPlan(scores, preferred, exploit_len, candidates, explore_len, pool,
                  jnp.where(pool, weight, 0.0), new_state)


def oort_selector(durations=None, config: OortConfig = OortConfig()) -> Selector:
  """Oort's training selector for K clients.

  Args:
    durations: optional `[N]` expected seconds per client for the first rounds (e.g. from a
      `system.SystemProfile`); later rounds use what the clock measured. Default: all equal.
    config: `OortConfig` (FedScale's defaults).
  """
  registry.check_values(config)
  given = None if durations is None else np.asarray(durations, np.float32)
  if given is not None and not np.all(np.isfinite(given) & (given > 0)):
    raise ValueError("oort durations must be finite and > 0")

  def init(n, params):
    del params
    duration = jnp.ones((n,), jnp.float32) if given is None else jnp.asarray(given)
    return OortState(reward=jnp.zeros((n,), jnp.float32), duration=duration,
                     time_stamp=jnp.zeros((n,), jnp.int32), count=jnp.zeros((n,), jnp.int32),
                     exploration=jnp.float32(config.exploration_factor),
                     exploration_min=jnp.float32(config.exploration_min),
                     round_threshold=jnp.float32(config.round_threshold),
                     history=jnp.zeros((2 * config.pacer_step,), jnp.float32),
                     last_exploit=jnp.zeros((n,), bool), reported=jnp.zeros((n,), bool),
                     preferred=jnp.float32(jnp.inf))

  def select(state, key, inputs, mask):
    p = plan(config, inputs.k, state, inputs, mask)
    k_exploit, k_explore, k_fill = jax.random.split(key, 3)
    exploit = draw_without_replacement(k_exploit, p.scores, p.candidates, p.exploit_len)
    explore = draw_without_replacement(k_explore, p.explore_weight, p.explore_pool & ~exploit,
                             p.explore_len)
    chosen = exploit | explore
    fill = draw_without_replacement(k_fill, jnp.ones(mask.shape, jnp.float32), mask & ~chosen,
                          inputs.k - jnp.sum(chosen))
    return chosen | fill, p.state._replace(last_exploit=exploit, preferred=p.preferred)

  def observe(state, inputs: RoundInputs, outcome: RoundOutcome):
    slots, done = outcome.slots, outcome.trained
    size = inputs.num_examples[slots].astype(jnp.float32)
    utility = size * jnp.sqrt(jnp.maximum(outcome.train_loss_sq, 0.0))
    keep = lambda new, old: jnp.where(done, new, old)
    duration = state.duration
    if outcome.client_times is not None:
      duration = duration.at[slots].set(keep(outcome.client_times[slots], duration[slots]))
    cur = jnp.asarray(inputs.round, jnp.int32) + 1
    return state._replace(reward=state.reward.at[slots].set(keep(utility, state.reward[slots])),
                duration=duration,
                time_stamp=state.time_stamp.at[slots].set(keep(cur, state.time_stamp[slots])),
                count=state.count.at[slots].add(done.astype(jnp.int32)),
                reported=state.reported.at[slots].max(done))

  def report(state):
    return {"exploration": state.exploration, "round_threshold": state.round_threshold,
            "preferred_duration": state.preferred}

  return Selector(init=init, select=select, observe=observe, report=report,
                  spec={"name": "oort", **dataclasses.asdict(config),
                        "durations": "given" if given is not None else "equal"})


# --- Registered names (fedjax_sel.registry) ------------------------------------------------------

@registry.register("selector", "oort", OortConfig, reads="private")
def _oort(settings: OortConfig, context: registry.BuildContext) -> Selector:
  """Oort: statistical utility and duration, explored and exploited (FedScale's getTopK); its
  first durations from the clients' system profile and data sizes, when the run has a clock."""
  return oort_selector(_durations(context), settings)


def _durations(context: registry.BuildContext):
  """The clients' expected compute seconds on the clock (None without one)."""
  if context.profile is None or context.data is None:
    return None
  return np.maximum(np.asarray(context.data.train.counts) * context.local_epochs
                    / np.asarray(context.profile.speed), 1e-3)


PYRAMIDFL_CONFIG = OortConfig(exploration_decay=0.95, exploration_min=0.2, round_threshold=10.0,
                              pacer_delta=10.0, clip_bound=0.98, cut_off_util=0.7,
                              variant="pyramidfl")


def pyramidfl_selector(durations=None) -> Selector:
  """PyramidFL's selection (Li et al., MobiCom 2022): Oort's ranking with its fork's rules and
  its defaults (`PYRAMIDFL_CONFIG`: exploration decay 0.95 to 0.2, round threshold 10, pacer
  delta 10, clip bound 0.98, cut-off utility 0.7); its per-client local iterations and update
  dropout act after selection and are not part of it."""
  return oort_selector(durations, PYRAMIDFL_CONFIG)._replace(
      spec={"name": "pyramidfl", "durations": "given" if durations is not None else "equal"})


@registry.register("selector", "pyramidfl", requires=("clock",),
                   reads="private")
def _pyramidfl(settings, context: registry.BuildContext) -> Selector:
  """PyramidFL: Oort's utility ranking with its fork's rules and defaults, on the clock."""
  del settings
  return pyramidfl_selector(_durations(context))
