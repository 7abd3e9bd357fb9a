"""The parts of a round as flags: one vocabulary for every launcher.

Every launcher imports this module, so a setting has one flag name everywhere (`--poc_d`,
`--eps0`, `--fedsrc_beta`, `--krum_f`, ...), and the builders below turn the flags into parts:
`make_selector`, `make_filter`, `make_rule`, `make_aggregator`. `experiments/run.py` composes any
of them (`--selector`, `--filter`, `--rule`, `--aggregator`, `--server_opt`); the paper launchers
use the ones their paper needs. Flag errors are `app.UsageError`s naming the flag.

Names: selectors random, poc, divfl, entropy, grad_norm, oort; filters none, dgf, rgf; rules none,
fedalign, fedsrc; aggregators fedavg, median, trimmed_mean, krum, multi_krum, fedasl; server
optimizers none, sgd, momentum, adam, yogi, adagrad (`common.py`).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from absl import app, flags

import fedjax_sel as fs
from fedjax_sel import aggregators as aggs
from fedjax_sel import fedalign, fedsrc, filtering, oort, uacs
from fedjax_sel.models import per_example_loss
from fedjax_sel.selectors import DIVFL_PROXIES, POC_VARIANTS, divfl, power_of_choice

FLAGS = flags.FLAGS
SELECTORS = ("random", "poc", "divfl", "entropy", "grad_norm", "oort")
FILTERS = ("none", "dgf", "rgf")
RULES = ("none", "fedalign", "fedsrc")
AGGREGATORS = ("fedavg", "median", "trimmed_mean", "krum", "multi_krum", "fedasl")

# Selection.
flags.DEFINE_enum("selector", "random", SELECTORS, "Client selector (applied to the available, "
                  "filtered-in clients): random (uniform K), poc (power of choice, --poc_d, "
                  "--poc_variant), divfl (facility location on gradients, --divfl_proxy), "
                  "entropy (UACS: eps-greedy top K by predictive entropy, --explore_prob), "
                  "grad_norm (top K by gradient norm), oort (Oort's utility and duration, "
                  "--oort_*).")
flags.DEFINE_enum("poc_variant", "pow", POC_VARIANTS, "Power of choice: the loss a candidate "
                  "reports: pow (all its training data), cpow (one mini-batch), rpow (its last "
                  "reported training loss).")
flags.DEFINE_integer("poc_d", None, "Power-of-choice candidates d (default 2K).", lower_bound=1)
flags.DEFINE_enum("divfl_proxy", "gradient", DIVFL_PROXIES, "DivFL: how a trained client's row of "
                  "the gradient table is refreshed: gradient (at w_t) or update (w^k - w_t).")
flags.DEFINE_float("explore_prob", 0.1, "eps of Entropy+Eps-Greedy: probability of picking the m "
                   "clients uniformly at random in a round, in [0, 1].")
flags.DEFINE_float("oort_round_threshold", 30.0, "Oort: initial preferred-duration percentile "
                   "(the pacer moves it), in [0, 100].")
flags.DEFINE_float("oort_exploration", 0.9, "Oort: initial exploration factor (decays by 0.98 to "
                   "0.3), in [0, 1].")

# Filtering (FilFL).
flags.DEFINE_integer("filter_period", 5, "h: filter every h rounds (and when availability changes).",
                     lower_bound=1)
flags.DEFINE_enum("empty_value", "zero", filtering.EMPTY_VALUES, "R of the empty set: zero (the "
                  "reference code's, default) or global (C - F^P(w_t): the unchanged model).")
flags.DEFINE_float("filter_const", 10.0, "FilFL: the constant C of the filter objective R(S) = C "
                   "- F^P(w_S).")
flags.DEFINE_enum("filter_order", "random", filtering.ORDERS, "FilFL: the greedy pass's client "
                  "order, random or index.")

# Participation rules: FedALIGN.
flags.DEFINE_integer("num_priority", 2, "Number of priority clients, drawn by seed (unless "
                     "--priority_ids or --priority_classes is given).", lower_bound=0)
flags.DEFINE_list("priority_ids", [], "Explicit priority client ids (instead of a random draw).")
flags.DEFINE_list("priority_classes", [], "Priority clients: those holding any of these classes.")
flags.DEFINE_float("eps0", 0.2, "eps_0, the initial alignment tolerance: a non-priority client joins "
                   "when its loss (or accuracy) is within eps_t of the priority clients' (default "
                   "0.2; 0.4 for the high SYNTH noise level unless given).")
flags.DEFINE_enum("eps_schedule", "linear", fedalign.SCHEDULES, "How eps_t decays from eps_0 to 0 "
                  "at the last round after the warm-up.")
flags.DEFINE_float("warmup_fraction", 0.1, "Share of the rounds at the start with priority clients "
                   "only, in [0, 1).")
flags.DEFINE_enum("align_metric", "loss", fedalign.METRICS, "What clients compare with the "
                  "priority clients: loss, or accuracy (the paper's experiments' proxy).")
flags.DEFINE_enum("align_split", "train", fedalign.SPLITS, "Data a client evaluates the global "
                  "model on to decide: its training data or its validation split (--val_fraction).")

# Participation rules: FedSRC.
flags.DEFINE_enum("fedsrc_mode", "paper", fedsrc.MODES, "paper: phi = median + alpha*sigma with "
                  "alpha adapted to the participation target; reference: the reference code's rule "
                  "(median + ref_beta*std, floor --ref_cut).")
flags.DEFINE_float("fedsrc_beta", 0.5, "beta: how much a client's heterogeneity index lowers its "
                   "threshold, Phi_k = phi*(1 - beta*RHI_k), in [0, 0.9].")
flags.DEFINE_float("kappa", 0.7, "kappa: RHI's weight of the class-count index against the label "
                   "entropy, in [0, 1].")
flags.DEFINE_float("participation_target", 0.7, "Share of the sampled clients that should train; "
                   "alpha adapts to hold it on average, in (0, 1].")
flags.DEFINE_float("alpha0", 1.0, "Initial alpha (spread multiplier of the server threshold).")
flags.DEFINE_float("alpha_gain", 1.0, "Alpha's step per unit of participation shortfall.")
flags.DEFINE_float("alpha_max", 5.0, "FedSRC: upper bound of alpha, the spread multiplier of the "
                   "server threshold, >= 0.")
flags.DEFINE_enum("decision_stat", "val_loss", fedsrc.DECISION_STATS, "The loss a client checks "
                  "against its threshold: on its own held-out data drawn like its training data "
                  "(val_loss: the validation split, corrupted like the training data of a bad "
                  "client; default), its test split (kept clean for global scoring, so blind to "
                  "corruption), one mini-batch, or all its training data.")
flags.DEFINE_float("reinclude_prob", 0.1, "q: probability that an abstaining client trains anyway, "
                   "in [0, 1].")
flags.DEFINE_integer("reinclude_after", 0, "An abstaining client trains anyway after this many "
                     "consecutive abstentions (0 = never).", lower_bound=0)
flags.DEFINE_enum("reported_loss", "train", fedsrc.REPORTED_LOSSES, "What participants report for "
                  "the next threshold: their mean loss over local training (the paper) or the "
                  "loss they checked at the global model (same scale as the decision).")
flags.DEFINE_float("ref_beta", 1.0, "Reference mode: multiplier of the losses' sample std.")
flags.DEFINE_float("ref_cut", 0.0, "FedSRC reference mode: floor of the cutoff, in loss units.")

# Aggregators.
flags.DEFINE_float("trim_beta", 0.3, "Trimmed mean: share trimmed per side, in [0, 0.5).")
flags.DEFINE_enum("trim_rounding", "floor", aggs.TRIM_ROUNDINGS, "Trimmed mean: int(beta*n) "
                  "(floor, textbook) or ceil(beta*n) (the reference code's) per side.")
flags.DEFINE_string("krum_f", "0.3", "Krum's assumed Byzantine models f: a count (e.g. 2) or a "
                    "fraction of the aggregated models (e.g. 0.3); needs n >= 2f + 3.")
flags.DEFINE_integer("multi_krum_m", 0, "Multi-Krum: models averaged (0 = n - f).", lower_bound=0)
flags.DEFINE_bool("krum_normalized", False, "Krum on L2-normalized models (the FedSRC reference "
                  "code's distance).")
flags.DEFINE_float("fedasl_alpha", 1.0, "FedASL: band around the median loss, in sigmas.")
flags.DEFINE_float("fedasl_beta", 0.2, "FedASL: weight v_k of a client inside the band, in sigmas "
                   "of the losses, >= 0.")


# --- Builders -----------------------------------------------------------------------------------

def check_selector(k: int, available: int) -> None:
  """The selector flags that cannot apply with K clients per round of at most `available`."""
  if FLAGS.poc_d is not None and not k <= FLAGS.poc_d <= available:
    raise app.UsageError(f"--poc_d must be in {k}..{available} (--clients_per_round to the "
                         f"clients available at once), got {FLAGS.poc_d}")
  if FLAGS.selector == "entropy" and not 0.0 <= FLAGS.explore_prob <= 1.0:
    raise app.UsageError(f"--explore_prob must be in [0, 1], got {FLAGS.explore_prob}")
  if FLAGS.selector == "oort":
    try:
      oort.check_config(oort_config())
    except ValueError as e:
      raise app.UsageError(f"--{e}") from e


def oort_config() -> oort.OortConfig:
  return oort.OortConfig(exploration_factor=FLAGS.oort_exploration,
                         round_threshold=FLAGS.oort_round_threshold)


def make_selector(k: int, name: str | None = None, data=None, profile=None) -> fs.Selector:
  """The selector `name` (default --selector) for K clients; Oort's first durations come from the
  clients' `profile` and data sizes when given."""
  name = name or FLAGS.selector
  if name == "poc":
    return power_of_choice(k, FLAGS.poc_d, FLAGS.poc_variant)
  if name == "divfl":
    return divfl(k, FLAGS.divfl_proxy)
  if name == "entropy":
    return uacs.entropy_selector(k, FLAGS.explore_prob)
  if name == "grad_norm":
    return uacs.grad_norm_selector(k)
  if name == "oort":
    durations = None
    if profile is not None and data is not None:
      durations = np.maximum(np.asarray(data.train.counts) * FLAGS.local_epochs
                             / np.asarray(profile.speed), 1e-3)
    return oort.oort_selector(k, durations, oort_config())
  return fs.random_selector(k)


def make_filter(mode: str, model, gammas=(0.5, 0.75, 0.9, 1.0), opt: bool = False,
                submod_samples: int = 0):
  """FilFL's filter (`mode` dgf or rgf) on the public set, or None for `none`."""
  if mode == "none":
    return None

  def public_loss(p, x, y):
    return jnp.mean(per_example_loss(model, p, x, y))

  cfg = filtering.FilterConfig(
      mode=mode, period=FLAGS.filter_period, empty_value=FLAGS.empty_value,
      const=FLAGS.filter_const, order=FLAGS.filter_order, opt=opt,
      submod_samples=submod_samples, gammas=tuple(gammas))
  return filtering.filfl_filter(public_loss, cfg)


def check_fedalign() -> None:
  """FedALIGN's flags, before any data."""
  if FLAGS.eps0 < 0:
    raise app.UsageError(f"--eps0 must be >= 0, got {FLAGS.eps0}")
  if not 0.0 <= FLAGS.warmup_fraction < 1.0:
    raise app.UsageError(f"--warmup_fraction must be in [0, 1), got {FLAGS.warmup_fraction}")
  if FLAGS.priority_ids and FLAGS.priority_classes:
    raise app.UsageError("give at most one of --priority_ids and --priority_classes")
  for flag in ("priority_ids", "priority_classes"):
    try:
      [int(v) for v in FLAGS[flag].value]
    except ValueError as e:
      raise app.UsageError(f"--{flag} must be integers, got {FLAGS[flag].value}") from e
  if not FLAGS.priority_classes:  # Classes need the data; a count or ids are checked now.
    priority_mask(FLAGS.num_clients, None, seed=0)
  if FLAGS.align_split == "val" and FLAGS.val_fraction <= 0:
    raise app.UsageError("--align_split=val needs --val_fraction > 0")


def priority_mask(n: int, label_hist, seed: int) -> np.ndarray:
  """The priority set the flags choose among `n` clients (flag errors as usage errors)."""
  try:
    if FLAGS.priority_ids:
      return fedalign.choose_priority(n, ids=[int(v) for v in FLAGS.priority_ids])
    if FLAGS.priority_classes:
      return fedalign.choose_priority(n, classes=[int(v) for v in FLAGS.priority_classes],
                                      label_hist=label_hist)
    return fedalign.choose_priority(n, count=FLAGS.num_priority, seed=seed + 7,
                                    label_hist=label_hist)
  except ValueError as e:
    flag = ("--priority_ids" if FLAGS.priority_ids else "--priority_classes"
            if FLAGS.priority_classes else "--num_priority")
    raise app.UsageError(f"{flag}: {e}") from e


def fedalign_rule(priority, eps0: float | None = None) -> fs.Participation:
  """FedALIGN's rule over the `priority` clients from the flags (`eps0` overrides --eps0)."""
  return fedalign.fedalign_rule(priority, FLAGS.rounds,
                                eps0=FLAGS.eps0 if eps0 is None else eps0,
                                schedule=FLAGS.eps_schedule, warmup_fraction=FLAGS.warmup_fraction,
                                metric=FLAGS.align_metric, split=FLAGS.align_split)


FEDSRC_FLAG_OF = {"beta": "fedsrc_beta", "target": "participation_target", "cut": "ref_cut",
                  "fedsrc_mode": "fedsrc_mode", "participation": "participation_target"}


def fedsrc_config() -> fedsrc.FedSRCConfig:
  return fedsrc.FedSRCConfig(
      mode=FLAGS.fedsrc_mode, beta=FLAGS.fedsrc_beta, kappa=FLAGS.kappa,
      target=FLAGS.participation_target, alpha0=FLAGS.alpha0, alpha_gain=FLAGS.alpha_gain,
      alpha_max=FLAGS.alpha_max, decision_stat=FLAGS.decision_stat,
      reinclude_prob=FLAGS.reinclude_prob, reinclude_after=FLAGS.reinclude_after,
      reported_loss=FLAGS.reported_loss, ref_beta=FLAGS.ref_beta, cut=FLAGS.ref_cut)


def check_fedsrc() -> None:
  """FedSRC's flags, naming the one at fault."""
  try:
    fedsrc.check_config(fedsrc_config())
  except ValueError as e:
    field = str(e).split()[0]
    raise app.UsageError(f"--{FEDSRC_FLAG_OF.get(field, field)}: {e}") from e
  if FLAGS.decision_stat == "val_loss" and FLAGS.val_fraction <= 0:
    raise app.UsageError("--decision_stat=val_loss needs --val_fraction > 0 (each client's "
                         "held-out data)")


def krum_f():
  text = FLAGS.krum_f
  try:
    return float(text) if "." in text else int(text)
  except ValueError as e:
    raise app.UsageError(f"--krum_f must be a count or a fraction, got {text!r}") from e


AGGREGATOR_FLAGS = {"trimmed_mean": "--trim_beta / --trim_rounding", "krum": "--krum_f",
                    "multi_krum": "--krum_f / --multi_krum_m",
                    "fedasl": "--fedasl_alpha / --fedasl_beta"}


def make_aggregator(name: str) -> fs.Aggregator:
  """The aggregator `name` (one of AGGREGATORS; fedsrc means FedSRC's FedAvg)."""
  if name in ("fedsrc", "fedavg"):
    return fs.fedavg(FLAGS.weighting)
  if name == "median":
    return aggs.coordinate_median()
  if name == "trimmed_mean":
    return aggs.trimmed_mean(FLAGS.trim_beta, FLAGS.trim_rounding)
  if name in ("krum", "multi_krum"):
    multi = FLAGS.multi_krum_m if name == "multi_krum" else None
    return aggs.krum(krum_f(), multi=multi, normalize=FLAGS.krum_normalized)
  return aggs.fedasl(FLAGS.fedasl_alpha, FLAGS.fedasl_beta)


def check_aggregators(names) -> None:
  """The settings of the aggregators `names`, against K clients per round."""
  for name in set(names) & {"trimmed_mean", "fedasl", "krum", "multi_krum"}:
    try:
      make_aggregator(name)
    except ValueError as e:
      raise app.UsageError(f"{AGGREGATOR_FLAGS[name]}: {e}") from e
  k = FLAGS.clients_per_round
  if set(names) & {"krum", "multi_krum"}:
    try:
      aggs.check_krum(k, krum_f())
    except ValueError as e:
      raise app.UsageError(f"--krum_f / --clients_per_round: {e}") from e
  if "multi_krum" in names:
    most = k - aggs.byzantine_count(k, krum_f())
    if FLAGS.multi_krum_m > most:
      raise app.UsageError(f"--multi_krum_m={FLAGS.multi_krum_m} cannot apply: Multi-Krum "
                           f"averages at most n - f = {most} of the K={k} models; accepted 0 "
                           f"(= n - f) to {most}")
