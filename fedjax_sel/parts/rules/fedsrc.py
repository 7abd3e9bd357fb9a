"""FedSRC (docs/papers/fedsrc.md): clients that decide themselves whether to train.

Each round the server sends the global model w_t and a threshold phi computed from the training
losses the participants of the previous round reported. A sampled client k evaluates w_t on its own
test data (or, as an option, on one mini-batch) and trains and uploads only if that loss is at most
its personal threshold Phi_k, which tightens with the client's heterogeneity index RHI_k. Abstaining
clients save their training and their upload, at the price of one forward pass over the evaluated
samples.

Paper mode (default):
  phi = median(L) + alpha * sigma, sigma = sqrt(mean((L - median(L))^2)) over the reported losses L;
  Phi_k = phi * (1 - beta * RHI_k); alpha is adapted after every gated round by an integral step,
  alpha <- clip(alpha + alpha_gain * (target - rate), 0, alpha_max), where rate is the share of the
  sampled clients that trained. Since alpha stays bounded, the summed shortfall
  sum_t (target - rate_t) = (alpha_T - alpha_0) / alpha_gain stays bounded too, so the participation
  rate holds the target *on average over rounds* (a fixed-size sign step would only balance the
  number of rounds above and below the target).
Reference mode (`mode="reference"`, the reference code's rule):
  cutoff = max(median(L) + ref_beta * std(L), cut) with the sample standard deviation about the
  mean; client k trains iff its loss <= cutoff - RHI_k * std(L); alpha is not used.
Both modes: round 0 (no reported losses yet) everyone sampled trains; an abstaining client takes
part anyway with probability `reinclude_prob`, or after `reinclude_after` consecutive abstentions
(0 = never); a round with fewer than two participants keeps the previous global model and threshold.

Robust aggregators (median, trimmed mean, Krum, Multi-Krum, FedASL) live in `aggregators.py`; any of
them combines with this rule.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from fedjax_sel.parts.types import RoundInputs
  >>> rule = fedsrc_rule()
  >>> inputs = RoundInputs.create(jnp.ones(3), stats={"test_loss": jnp.array([0.1, 5.0, 0.2])},
  ...                             label_hist=jnp.eye(3, dtype=jnp.int32))
  >>> train, agg, state = rule.apply(rule.init(3, None), jax.random.PRNGKey(0), inputs,
  ...                                 jnp.ones(3, bool))
  >>> train.tolist()   # Round 0: everyone sampled trains.
  [True, True, True]
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel import keys as keylib
from fedjax_sel import registry
from fedjax_sel.parts.aggregators import median_spread
from fedjax_sel.parts.types import FORWARD_COST, Participation, RoundInputs, RoundOutcome

MODES = ("paper", "reference")
DECISION_STATS = ("test_loss", "val_loss", "batch_loss", "loss")
REPORTED_LOSSES = ("train", "decision")
DECISION_HELP = ("The loss a client checks against its threshold: on its own held-out data drawn "
                 "like its training data (val_loss: the validation split, corrupted like the "
                 "training data of a bad client), its test split (kept clean for global scoring, "
                 "so blind to corruption), one mini-batch, or all its training data.")


def heterogeneity_index(label_hist, kappa: float = 0.7):
  """`[N]` RHI_k = kappa * HI_k + (1 - kappa) * (1 - NE_k) from `[N, C]` label histograms.

  HI_k = 1 - (c_k - 1) / (C - 1) with c_k the classes client k holds; NE_k the entropy of its label
  distribution divided by log c_k (NE = 1 when c_k <= 1). An IID client scores near 0, a one-class
  client kappa (its NE is 1 by convention). Works on numpy and jax arrays.
  """
  xp = jnp if isinstance(label_hist, jax.Array) else np
  hist = label_hist.astype(xp.float32)
  num_classes = hist.shape[1]
  c = xp.sum(hist > 0, axis=1).astype(xp.float32)
  p = hist / xp.maximum(xp.sum(hist, axis=1, keepdims=True), 1.0)
  ent = -xp.sum(xp.where(p > 0, p * xp.log(xp.where(p > 0, p, 1.0)), 0.0), axis=1)
  ne = xp.where(c > 1, ent / xp.log(xp.maximum(c, 2.0)), 1.0)
  hi = 1.0 - (c - 1.0) / max(num_classes - 1, 1)
  return kappa * hi + (1.0 - kappa) * (1.0 - ne)


@dataclasses.dataclass(frozen=True)
class FedSRCConfig:
  """FedSRC's settings (docs/papers/fedsrc.md); each field is also a launcher flag.

  Attributes:
    mode: "paper" or "reference".
    beta: RHI personalization of the threshold, Phi_k = phi * (1 - beta * RHI_k), in [0, 0.9].
    kappa: RHI's mix of the class-count index and the label entropy, in [0, 1].
    target: participation target, share of the sampled clients, in (0, 1].
    alpha0: initial alpha (spread multiplier of phi).
    alpha_gain: integral step of alpha per unit of participation shortfall.
    alpha_max: upper bound of alpha (lower bound 0).
    decision_stat: the loss a client compares with its threshold: "test_loss" (its test split),
      "val_loss" (its validation split), "batch_loss" (one mini-batch of its training data) or
      "loss" (all its training data). The paper's "test loss" is the loss on the client's own
      held-out data, drawn like its training data. `data.corruption.corrupt_clients` corrupts
      training and validation splits but keeps test splits clean (the global model is scored on
      them), so with corrupted clients use "val_loss": a bad client's test split would look clean.
    reinclude_prob: q, probability that an abstaining client takes part anyway, in [0, 1].
    reinclude_after: consecutive abstentions after which a client takes part anyway (0 = never).
    reported_loss: what participants report for the next threshold: "train" (their mean loss over
      local training, docs/papers/fedsrc.md) or "decision" (the loss they checked, at w_t: the same
      scale as the comparison; under label skew local training drives the training loss far
      below any client's loss at w_t, and the "train" threshold then starves participation).
    ref_beta: reference mode's multiplier of the sample std.
    cut: reference mode's floor of the cutoff (+inf lets every client pass: plain FedAvg).
  """

  mode: str = registry.setting("paper", "paper: phi = median + alpha*sigma with alpha adapted to "
                               "the participation target; reference: the reference code's rule "
                               "(median + ref_beta*std, floor --ref_cut).", flag="fedsrc_mode",
                               choices=MODES)
  beta: float = registry.setting(0.5, "beta: how much a client's heterogeneity index lowers its "
                                 "threshold, Phi_k = phi*(1 - beta*RHI_k).", within="[0, 0.9]",
                                 flag="fedsrc_beta")
  kappa: float = registry.setting(0.7, "kappa: RHI's weight of the class-count index against the "
                                  "label entropy.", within="[0, 1]", flag="kappa")
  target: float = registry.setting(0.7, "Share of the sampled clients that should train; alpha "
                                   "adapts to hold it on average.", within="(0, 1]",
                                   flag="participation_target")
  alpha0: float = registry.setting(1.0, "Initial alpha (spread multiplier of the server "
                                   "threshold).", within=">= 0", flag="alpha0")
  alpha_gain: float = registry.setting(1.0, "Alpha's step per unit of participation shortfall.",
                                       within=">= 0", flag="alpha_gain")
  alpha_max: float = registry.setting(5.0, "Upper bound of alpha, the spread multiplier of the "
                                      "server threshold.", within=">= 0", flag="alpha_max")
  decision_stat: str = registry.setting("test_loss", DECISION_HELP,
                                        flag="decision_stat", choices=DECISION_STATS)
  reinclude_prob: float = registry.setting(0.1, "q: probability that an abstaining client trains "
                                           "anyway.", within="[0, 1]", flag="reinclude_prob")
  reinclude_after: int = registry.setting(0, "An abstaining client trains anyway after this many "
                                          "consecutive abstentions (0 = never).", within=">= 0",
                                          flag="reinclude_after")
  reported_loss: str = registry.setting("train", "What participants report for the next threshold: "
                                        "their mean loss over local training (the paper) or the "
                                        "loss they checked at the global model (same scale as the "
                                        "decision).", flag="reported_loss", choices=REPORTED_LOSSES)
  ref_beta: float = registry.setting(1.0, "Reference mode: multiplier of the losses' sample std.",
                                     within=">= 0", flag="ref_beta")
  cut: float = registry.setting(0.0, "Reference mode: floor of the cutoff, in loss units.",
                                flag="ref_cut")

  def check(self, context: registry.BuildContext) -> None:
    del context
    check_config(self)


def check_config(cfg: FedSRCConfig) -> None:
  """Raises `registry.SettingError` (a ValueError) naming the bad field and its accepted range,
  before any compute."""
  registry.check_values(cfg)
  if registry.concrete(cfg.alpha0, cfg.alpha_max) and cfg.alpha0 > cfg.alpha_max:
    raise registry.SettingError("alpha0", f"({cfg.alpha0}) must be <= alpha_max ({cfg.alpha_max})")
  if registry.concrete(cfg.cut) and (np.isnan(cfg.cut) or cfg.cut == -np.inf):
    raise registry.SettingError("cut", f"must be a number or +inf (every client passes), got "
                                f"{cfg.cut}")


def sample_std(values: jax.Array, mask: jax.Array) -> jax.Array:
  """Sample standard deviation (about the mean, n - 1 denominator) of the masked values; 0 for
  fewer than two."""
  n = jnp.sum(mask)
  mean = jnp.sum(jnp.where(mask, values, 0.0)) / jnp.maximum(n, 1)
  var = jnp.sum(jnp.where(mask, (values - mean) ** 2, 0.0)) / jnp.maximum(n - 1, 1)
  return jnp.where(n >= 2, jnp.sqrt(var), 0.0)


def server_threshold(cfg: FedSRCConfig, median, spread, alpha):
  """The server's threshold phi: paper median + alpha*spread (sigma about the median); reference
  max(median + ref_beta*spread, cut) (the sample std)."""
  if cfg.mode == "paper":
    return median + alpha * spread
  return jnp.maximum(median + cfg.ref_beta * spread, cfg.cut)


def client_thresholds(cfg: FedSRCConfig, median, spread, alpha, rhi):
  """`[N]` personal thresholds from phi (`server_threshold`): paper phi*(1 - beta*RHI_k);
  reference phi - RHI_k*spread."""
  phi = server_threshold(cfg, median, spread, alpha)
  if cfg.mode == "paper":
    return phi * (1.0 - cfg.beta * rhi)
  return phi - rhi * spread


class FedSRCState(NamedTuple):
  """FedSRC's server threshold and round values.

  Attributes:
    ready: whether the server has losses to set a threshold from (after a round with >= 2).
    median, spread: the reported losses' median and spread (MAD or sample std).
    alpha: the spread multiplier, adapted to the participation target (paper mode).
    phi: the round's server threshold (0 before `ready`).
    selected, passed: sampled clients, and those under their threshold.
    rate: share of the sampled clients that trained.
    gated: whether the round's clients checked a threshold.
    checked: `[N]` the loss each client checked.
    beta, target: run values (runs of one program may differ in them).
  """

  ready: jax.Array
  median: jax.Array
  spread: jax.Array
  alpha: jax.Array
  phi: jax.Array
  selected: jax.Array
  passed: jax.Array
  rate: jax.Array
  gated: jax.Array
  checked: jax.Array
  beta: jax.Array
  target: jax.Array


def fedsrc_rule(cfg: FedSRCConfig = FedSRCConfig()) -> Participation:
  """The FedSRC participation rule.

  State (a dict of scalars): `beta` and `target` (the run's), `ready` (losses have been reported),
  `median`, `spread`, `alpha`, and
  for the report `gated` (the threshold applied this round), `phi` (the server threshold of the
  round, 0 when not gated), `selected`, `passed` (sampled clients under their threshold), `rate`
  (share of the sampled clients that trained).
  """
  check_config(cfg)
  # beta and the participation target are run values kept in the state, so runs that differ
  # only in them share one compiled round; the functions below capture the rest of the config.
  rule_cfg = dataclasses.replace(cfg, beta=0.0, target=0.0)

  def init(num_clients, params):
    del params  # The rule's state does not depend on the model.
    f = lambda v: jnp.asarray(v, jnp.float32)
    return FedSRCState(ready=jnp.asarray(False), median=f(0.0), spread=f(0.0),
                       alpha=f(cfg.alpha0), phi=f(0.0), selected=f(0.0), passed=f(0.0),
                       rate=f(1.0), gated=jnp.asarray(False),
                       checked=jnp.zeros((num_clients,), jnp.float32), beta=f(cfg.beta),
                       target=f(cfg.target))

  def apply(state, key, inputs: RoundInputs, chosen):
    run_cfg = dataclasses.replace(rule_cfg, beta=state.beta)
    value = inputs.stats[run_cfg.decision_stat]
    rhi = heterogeneity_index(inputs.label_hist, run_cfg.kappa)
    thresholds = client_thresholds(run_cfg, state.median, state.spread, state.alpha, rhi)
    passed = value <= thresholds
    n = chosen.shape[0]
    u = jax.vmap(lambda k: jax.random.uniform(k))(keylib.client_keys(key, jnp.arange(n)))
    forced = u < run_cfg.reinclude_prob
    if run_cfg.reinclude_after > 0:
      forced |= inputs.clients.consecutive_skips >= run_cfg.reinclude_after
    train = chosen & jnp.where(state.ready, passed | forced, True)
    phi = server_threshold(run_cfg, state.median, state.spread, state.alpha)
    state = state._replace(phi=jnp.where(state.ready, phi, 0.0),
                 selected=jnp.sum(chosen).astype(jnp.float32),
                 passed=jnp.sum(chosen & passed).astype(jnp.float32), gated=state.ready,
                 checked=value.astype(jnp.float32))
    aggregate = train & (jnp.sum(train) >= 2)
    return train, aggregate, state

  def observe(state, inputs: RoundInputs, outcome: RoundOutcome):
    del inputs
    reported = outcome.trained
    n = jnp.sum(reported)
    losses = (outcome.train_loss if rule_cfg.reported_loss == "train" else
              state.checked[outcome.slots]).astype(jnp.float32)
    if rule_cfg.mode == "paper":
      median, spread = median_spread(losses, reported)
    else:
      median, _ = median_spread(losses, reported)
      spread = sample_std(losses, reported)
    enough = n >= 2
    rate = n / jnp.maximum(state.selected, 1.0)
    alpha = state.alpha
    if rule_cfg.mode == "paper":
      stepped = jnp.clip(alpha + rule_cfg.alpha_gain * (state.target - rate), 0.0,
                         rule_cfg.alpha_max)
      alpha = jnp.where(state.gated, stepped, alpha)
    return state._replace(ready=state.ready | enough,
                median=jnp.where(enough, median, state.median),
                spread=jnp.where(enough, spread, state.spread), alpha=alpha, rate=rate)

  def report(state):
    return {k: getattr(state, k) for k in ("gated", "phi", "alpha", "median", "spread",
                                           "selected", "passed", "rate")}

  return Participation(init=init, apply=apply, needs=(cfg.decision_stat,), observe=observe,
                       report=report, spec={"name": "fedsrc", **dataclasses.asdict(cfg)})


# --- Accounting (host side, from the per-round records) ---------------------------------------



class Savings(NamedTuple):
  """Per-round `[T]` savings of the abstaining clients (docs/papers/fedsrc.md, 'Savings').

  Attributes:
    abstained: sampled clients that did not train.
    train_samples_saved: training samples the abstainers did not process (gross computation saved).
    eval_samples: samples every sampled client evaluated to decide (rounds after the first).
    net_samples_saved: gross minus `FORWARD_COST` times the evaluated samples.
    uploads_saved: uploads skipped (one per abstainer).
    train_samples: training samples processed by those who trained.
  """

  abstained: np.ndarray
  train_samples_saved: np.ndarray
  eval_samples: np.ndarray
  net_samples_saved: np.ndarray
  uploads_saved: np.ndarray
  train_samples: np.ndarray

  def totals(self) -> dict:
    return {k: float(np.sum(v)) for k, v in self._asdict().items()}


def savings(records: list[dict], train_samples_per_client: np.ndarray,
            eval_samples_per_client: np.ndarray) -> Savings:
  """Savings of each round from its `selected` and `trained_clients` id lists.

  Args:
    records: per-round records of a run (`fedjax_sel.run`'s output or metrics.jsonl lines).
    train_samples_per_client: `[N]` samples a client processes when it trains (E * m_k, or
      steps * B).
    eval_samples_per_client: `[N]` samples a client evaluates to decide (its test split, or B).
  """
  rows = []
  for r in records:
    sel = np.asarray(r["selected"], int)
    tr = np.asarray(r["trained_clients"], int)
    gated = bool(r["rule"]["gated"])
    abst = np.setdiff1d(sel, tr)
    saved = float(train_samples_per_client[abst].sum())
    evals = float(eval_samples_per_client[sel].sum()) if gated else 0.0
    rows.append((len(abst), saved, evals, saved - FORWARD_COST * evals, len(abst),
                 float(train_samples_per_client[tr].sum())))
  cols = np.array(rows, dtype=float).reshape(-1, 6).T
  return Savings(*cols)


def exclusions(records: list[dict], kinds: np.ndarray) -> dict[str, np.ndarray]:
  """Per round `[T]`, for each client kind (`kinds [N]`: "good" or a corruption kind), how many
  sampled clients of that kind abstained, and how many were sampled."""
  out = {}
  for kind in sorted(set(kinds.tolist())):
    members = kinds == kind
    sampled, excluded = [], []
    for r in records:
      sel = np.zeros(len(kinds), bool)
      sel[np.asarray(r["selected"], int)] = True
      tr = np.zeros(len(kinds), bool)
      tr[np.asarray(r["trained_clients"], int)] = True
      sampled.append(int((sel & members).sum()))
      excluded.append(int((sel & ~tr & members).sum()))
    out[f"{kind}_sampled"], out[f"{kind}_excluded"] = np.array(sampled), np.array(excluded)
  return out


# --- Registered names (fedjax_sel.registry) ------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FedSRCSettings(FedSRCConfig):
  """FedSRC's settings as the launchers set them: `FedSRCConfig` with the decision on the
  validation split by default (the split corrupted like a bad client's training data)."""

  decision_stat: str = registry.setting("val_loss", DECISION_HELP, flag="decision_stat",
                                        choices=DECISION_STATS)

  def requires(self) -> dict[str, str]:
    """The validation split, where the decision is on it (`registry.requirements`)."""
    return {"validation": "decision_stat"} if self.decision_stat == "val_loss" else {}


@registry.register("rule", "fedsrc", FedSRCSettings)
def _fedsrc(settings: FedSRCSettings, context: registry.BuildContext) -> Participation:
  """FedSRC: clients abstain when their loss at the global model exceeds their threshold."""
  del context
  return fedsrc_rule(settings)
