"""Private aggregates (user-level differential privacy): DP-FedAvg, adaptive clipping, DP-FTRL.

Each is an `Aggregator` (docs/papers/privacy.md): every aggregated client's update
`delta_k = w^k - w_t` is clipped to L2 norm S (`clipping.py`), the clipped updates are summed,
Gaussian noise is added to the sum and the sum is divided by a fixed denominator (the expected
cohort: K for a fixed-size uniform cohort, q N for Poisson sampling; never the number of clients
that actually took part, which would make the sensitivity depend on the cohort). Every aggregated
client weighs the same (user-level privacy). The new model `w_t + (sum + noise) / denominator`
goes to the server optimizer as any aggregate does, so each mechanism composes with every server
optimizer (its step is post-processing). Noise keys derive from (seed, round) (`keys.py`).

* `dp_fedavg` (McMahan et al., ICLR 2018): noise N(0, (z S)^2) per coordinate.
* `dp_adaptive` (Andrew et al., NeurIPS 2021): S follows a target quantile gamma of the update
  norms, `S <- S exp(-eta (b - gamma))`, b the noised share of unclipped updates (noise
  sigma_b); the update's noise multiplier is `z_delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)` so that
  both queries together cost what one Gaussian of multiplier z costs (their Theorem 1).
* `dp_ftrl` (Kairouz et al., ICML 2021): the noise of the prefix sums of the clipped updates comes
  from a binary tree (`noise.tree_prefix_noise`), restarted every `restart` rounds; the round's
  update is the difference of two noisy prefix sums. Each client enters a tree at most once (a
  client chosen again before the restart is left out of the sum), so its guarantee rests on that
  cap, not on how the clients were sampled.

The mechanisms' metrics (clip norm, share of clipped updates, noise std) are in their state
(`DPState`); the accountant (`accountant.py`) turns the configuration into epsilon on the host.

Example:
  >>> import jax, jax.numpy as jnp
  >>> from fedjax_sel.parts.types import AggregateInputs
  >>> agg = dp_fedavg(noise_multiplier=0.0, clip=1.0, denominator=2.0)
  >>> new, state = agg.apply(agg.init(2, None), jnp.zeros(2), jnp.array([[3., 4.], [.3, .4]]),
  ...                        AggregateInputs(jnp.array([True, True]), jnp.ones(2), jnp.zeros(2),
  ...                                        keys=lambda t: jax.random.PRNGKey(0)))
  >>> [round(float(v), 4) for v in new], float(state.clipped_share)
  ([0.45, 0.6], 0.5)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel import registry
from fedjax_sel.parts.types import AggregateInputs, Aggregator, engine_input
from fedjax_sel.privacy.clipping import clip_factors, update_norms, updates
from fedjax_sel.privacy.noise import gaussian_like, tree_depth, tree_prefix_noise

# How the accounting treats the selector's choice (`--dp_selection`): "accounted", the selector
# must read nothing private; "privatized", the private statistics it reads are noised
# (`selection.privatized`) and composed in the accountant; "unaccounted", they are read as they
# are, and the guarantee covers the aggregate only (every output says so).
SELECTION_MODES = ("accounted", "privatized", "unaccounted")
ACCOUNTANTS = ("rdp", "pld")
MECHANISMS = {"dp_fedavg": "fedavg", "dp_adaptive": "adaptive", "dp_ftrl": "ftrl"}


class DPState(NamedTuple):
  """A private aggregate's state and its round's metrics.

  Attributes:
    clip: the clip norm S of the next round (adaptive clipping moves it).
    round_clip: the clip norm this round used.
    clipped_share: share of this round's aggregated updates whose norm exceeded it.
    noise_std: std per coordinate of the noise on this round's sum (DP-FTRL: of one tree node).
    aggregated: updates in this round's sum.
    contributed: DP-FTRL's `[N]` bool, the clients in the current tree (`[0]` for the others).
  """

  clip: jax.Array
  round_clip: jax.Array
  clipped_share: jax.Array
  noise_std: jax.Array
  aggregated: jax.Array
  contributed: jax.Array

  @staticmethod
  def create(clip, num_clients: int = 0) -> DPState:
    zero = jnp.zeros((), jnp.float32)
    clip = jnp.asarray(clip, jnp.float32)
    return DPState(clip, clip, zero, zero, zero,
                   jnp.zeros((num_clients,), bool))


def noised_aggregate(global_params: Any, client_params: Any, mask: jax.Array, clip,
                     noise: Any, denominator) -> tuple[Any, jax.Array, jax.Array]:
  """`w_t + (sum_k f_k delta_k + noise) / denominator` over the slots of `mask`, f_k the clip
  factors; (new model, `[K]` update norms, `[K]` clip factors).

  It is computed as `sum_k (f_k / d) w^k + (1 - sum_k f_k / d) w_t + noise / d`, so that with no
  noise, no clipping and d aggregated clients it is FedAvg's uniform mean, bit for bit.
  """
  norms = update_norms(updates(global_params, client_params))
  factors = clip_factors(norms, clip)
  kept = jnp.where(mask, factors, 0.0)
  coef = kept / denominator
  rest = (denominator - jnp.sum(kept)) / denominator

  def leaf(stack, old, n):
    rows = jnp.where((coef != 0).reshape(-1, *([1] * (stack.ndim - 1))), stack, 0)
    new = jnp.tensordot(coef, rows.astype(jnp.float32), axes=1) + rest * old.astype(jnp.float32)
    return (new + n / denominator).astype(old.dtype)

  return jax.tree.map(leaf, client_params, global_params, noise), norms, factors


def noise_std(noise_multiplier, clip) -> jax.Array:
  """`z S`, the std of the noise on a sum of updates clipped to S (0 where z = 0, even for an
  infinite S)."""
  z = jnp.asarray(noise_multiplier, jnp.float32)
  return jnp.where(z > 0, z * clip, 0.0).astype(jnp.float32)


def _share(flags: jax.Array, mask: jax.Array) -> jax.Array:
  return jnp.sum(flags & mask) / jnp.maximum(jnp.sum(mask), 1).astype(jnp.float32)


def _round_keys(inputs: AggregateInputs, name: str):
  return engine_input(inputs, "keys", name)


def dp_fedavg(noise_multiplier, clip, denominator) -> Aggregator:
  """DP-FedAvg: clip to `clip`, add N(0, (z clip)^2) to the sum, divide by `denominator`.

  Args:
    noise_multiplier: z, the noise std over the sensitivity `clip` (0: no noise).
    clip: S, the L2 norm each client's update is clipped to (inf: no clipping).
    denominator: the fixed divisor of the noised sum (the expected cohort).
  """

  def apply(state: DPState, global_params, client_params, inputs: AggregateInputs):
    key = _round_keys(inputs, "dp_fedavg")(inputs.round)
    std = noise_std(noise_multiplier, clip)
    noise = gaussian_like(key, global_params, std)
    new, norms, _ = noised_aggregate(global_params, client_params, inputs.mask, clip, noise,
                                     denominator)
    return new, state._replace(round_clip=jnp.asarray(clip, jnp.float32),
                               clipped_share=_share(norms > clip, inputs.mask),
                               noise_std=jnp.asarray(std, jnp.float32),
                               aggregated=jnp.sum(inputs.mask).astype(jnp.float32))

  return Aggregator(init=lambda n, params: DPState.create(clip), apply=apply,
                    spec={"name": "dp_fedavg", "noise_multiplier": registry.plain(noise_multiplier),
                          "clip": registry.plain(clip),
                          "denominator": registry.plain(denominator)})


def update_noise_multiplier(noise_multiplier, count_noise):
  """Andrew et al.'s Theorem 1: the update's noise multiplier `z_delta = (z^-2 -
  (2 sigma_b)^-2)^(-1/2)` that leaves, with the count's noise sigma_b, the privacy of one Gaussian
  of multiplier z (0 for z = 0; needs z < 2 sigma_b).

  >>> round(float(update_noise_multiplier(1.0, 5.0)), 4)
  1.005
  """
  z = jnp.asarray(noise_multiplier, jnp.float32)
  inverse = 1.0 / jnp.maximum(z, 1e-30) ** 2 - 1.0 / (2.0 * count_noise) ** 2
  return jnp.where(z > 0, 1.0 / jnp.sqrt(jnp.maximum(inverse, 1e-30)), 0.0)


def dp_adaptive(noise_multiplier, initial_clip, denominator, target_quantile=0.5,
                clip_lr=0.2, count_noise=None) -> Aggregator:
  """DP-FedAvg whose clip norm follows the `target_quantile` of the update norms (Andrew et al.
  2021, geometric update): the round clips with C, counts the unclipped updates with noise
  N(0, sigma_b^2) (each client adding `1[norm <= C] - 1/2`), and the next C is
  `C exp(-clip_lr (b - target_quantile))`, b the noised share.

  Args:
    noise_multiplier: z, the whole round's noise multiplier (update and count together).
    initial_clip: C at round 0 (the paper's 0.1).
    denominator: the fixed divisor (the expected cohort m).
    target_quantile: gamma.
    clip_lr: eta_C (the paper's 0.2).
    count_noise: sigma_b (None: the paper's m / 20).
  """
  sigma_b = denominator / 20.0 if count_noise is None else count_noise
  if registry.concrete(noise_multiplier, sigma_b) and 0 < noise_multiplier >= 2 * sigma_b:
    raise ValueError(f"adaptive clipping needs the count's noise sigma_b = {float(sigma_b):g} "
                     f"above z / 2 = {noise_multiplier / 2:g} (Theorem 1)")
  z_delta = update_noise_multiplier(noise_multiplier, sigma_b)

  def apply(state: DPState, global_params, client_params, inputs: AggregateInputs):
    key = _round_keys(inputs, "dp_adaptive")(inputs.round)
    clip = state.clip
    std = z_delta * clip
    noise = gaussian_like(jax.random.fold_in(key, 0), global_params, std)
    new, norms, _ = noised_aggregate(global_params, client_params, inputs.mask, clip, noise,
                                     denominator)
    bits = jnp.where(inputs.mask, (norms <= clip).astype(jnp.float32) - 0.5, 0.0)
    count = jnp.sum(bits) + sigma_b * jax.random.normal(jax.random.fold_in(key, 1))
    share = count / denominator + 0.5
    next_clip = clip * jnp.exp(-clip_lr * (share - target_quantile))
    return new, state._replace(clip=next_clip.astype(jnp.float32), round_clip=clip,
                               clipped_share=_share(norms > clip, inputs.mask),
                               noise_std=jnp.asarray(std, jnp.float32),
                               aggregated=jnp.sum(inputs.mask).astype(jnp.float32))

  return Aggregator(init=lambda n, params: DPState.create(initial_clip), apply=apply,
                    spec={"name": "dp_adaptive",
                          "noise_multiplier": registry.plain(noise_multiplier),
                          "initial_clip": registry.plain(initial_clip),
                          "denominator": registry.plain(denominator),
                          "target_quantile": registry.plain(target_quantile),
                          "clip_lr": registry.plain(clip_lr),
                          "count_noise": registry.plain(sigma_b)})


def dp_ftrl(noise_multiplier, clip, denominator, restart: int) -> Aggregator:
  """DP-FTRL's aggregate with tree-aggregation noise, restarted every `restart` rounds (Kairouz
  et al. 2021): the round's update is `(P_s - P_{s-1}) / denominator`, P_s the noisy prefix sum
  of the clipped updates of steps 1..s of the current tree (each tree node's noise N(0, (z S)^2)).
  A client contributes to a tree at most once: chosen again before the restart, its update is
  left out (`DPState.contributed`).

  Args:
    noise_multiplier: z of each tree node.
    clip: S.
    denominator: the fixed divisor (the expected cohort).
    restart: rounds per tree (a static count: the tree's depth follows it).
  """
  depth = tree_depth(restart)

  def apply(state: DPState, global_params, client_params, inputs: AggregateInputs):
    keys = _round_keys(inputs, "dp_ftrl")
    t = inputs.round
    start = (t // restart) * restart
    step = (t - start + 1).astype(jnp.int32)
    contributed = jnp.where(step == 1, False, state.contributed)
    use = inputs.mask & ~contributed[inputs.clients]
    contributed = contributed.at[inputs.clients].max(use)
    std = noise_std(noise_multiplier, clip)
    tree_key = keys(start)
    now = tree_prefix_noise(tree_key, global_params, std, step, depth)
    before = tree_prefix_noise(tree_key, global_params, std, step - 1, depth)
    noise = jax.tree.map(jnp.subtract, now, before)
    new, norms, _ = noised_aggregate(global_params, client_params, use, clip, noise, denominator)
    return new, state._replace(round_clip=jnp.asarray(clip, jnp.float32),
                               clipped_share=_share(norms > clip, use),
                               noise_std=jnp.asarray(std, jnp.float32),
                               aggregated=jnp.sum(use).astype(jnp.float32),
                               contributed=contributed)

  return Aggregator(init=lambda n, params: DPState.create(clip, n), apply=apply,
                    spec={"name": "dp_ftrl", "noise_multiplier": registry.plain(noise_multiplier),
                          "clip": registry.plain(clip),
                          "denominator": registry.plain(denominator), "restart": restart})


# --- Registered names (fedjax_sel.registry) ------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PrivacySettings:
  """What every private aggregate shares: its noise, clip and denominator (run values: a sweep
  over them is one program) and how the run is accounted (read on the host)."""

  noise: float = registry.setting(1.0, "Noise multiplier z: the noise std over the clip norm.",
                                  flag="dp_noise", within=">= 0")
  clip: float = registry.setting(1.0, "Clip norm S of each client's whole model update (adaptive "
                                 "clipping: its initial value).", flag="dp_clip", within="> 0")
  denominator: float = registry.setting(0.0, "Fixed divisor of the noised sum of updates (0: the "
                                        "expected cohort, K for a fixed-size cohort and q N for "
                                        "--selector=poisson).", flag="dp_denominator",
                                        within=">= 0")
  delta: float | None = registry.setting(None, "The delta of the reported epsilon (default "
                                         "1 / N^1.1).", flag="dp_delta", within="(0, 1)",
                                         sweep="structural")
  target_epsilon: float | None = registry.setting(
      None, "Privacy budget: the run stops (records and summary kept) after the last round whose "
      "epsilon stays within it.", flag="dp_target_epsilon", within="> 0", sweep="structural")
  noise_for_epsilon: float | None = registry.setting(
      None, "Calibrate the noise multiplier (in place of --dp_noise) so that the planned rounds "
      "spend this epsilon.", flag="dp_noise_for_epsilon", within="> 0", sweep="structural")
  selection: str = registry.setting("accounted", "How the selector's choice is accounted: "
                                    "accounted (it must read no private statistic), privatized "
                                    "(the statistics it reads are clipped and noised, and "
                                    "composed in the accountant) or unaccounted (read as they "
                                    "are: the guarantee covers the aggregate only).",
                                    flag="dp_selection", choices=SELECTION_MODES)
  stats_noise: float = registry.setting(1.0, "With --dp_selection=privatized: noise multiplier "
                                        "of each private statistic the selector reads.",
                                        flag="dp_stats_noise", within="> 0", sweep="structural")
  stats_clip: float = registry.setting(5.0, "With --dp_selection=privatized: each statistic is "
                                       "clipped to [0, this bound] before its noise.",
                                       flag="dp_stats_clip", within="> 0", sweep="structural")
  accountant: str = registry.setting("rdp", "Accountant of Google's dp-accounting: rdp (Renyi DP) "
                                     "or pld (privacy loss distributions, tighter).",
                                     flag="dp_accountant", choices=ACCOUNTANTS)

  def divisor(self, context: registry.BuildContext):
    """The fixed denominator: the setting, or K where it is 0 (the launcher puts q N in its
    place for Poisson sampling)."""
    return jnp.where(jnp.asarray(self.denominator) > 0, self.denominator, float(context.k))


@registry.register("aggregator", "dp_fedavg", PrivacySettings, label="DP-FedAvg")
def _dp_fedavg(settings: PrivacySettings, context: registry.BuildContext) -> Aggregator:
  """DP-FedAvg: clipped updates, Gaussian noise, a fixed denominator (McMahan et al. 2018)."""
  return dp_fedavg(settings.noise, settings.clip, settings.divisor(context))


@dataclasses.dataclass(frozen=True)
class AdaptiveSettings(PrivacySettings):
  """Adaptive clipping's quantile, step and count noise (Andrew et al. 2021)."""

  target_quantile: float = registry.setting(0.5, "Target quantile gamma of the update norms the "
                                            "clip norm follows.", flag="dp_target_quantile",
                                            within="(0, 1)")
  clip_lr: float = registry.setting(0.2, "Step eta_C of the clip norm's geometric update.",
                                    flag="dp_clip_lr", within="> 0")
  count_noise: float = registry.setting(1.0, "Noise std sigma_b of the count of unclipped updates "
                                        "as a multiple of z (Theorem 1 needs it above 1/2; the "
                                        "update's noise grows by (1 - 1 / (4 c^2))^(-1/2), 15.5% "
                                        "at 1; the paper's sigma_b = m / 20 at m = 100, z = 1 is "
                                        "5).", flag="dp_count_noise", within="> 0.5")


@registry.register("aggregator", "dp_adaptive", AdaptiveSettings,
                   label="DP-FedAvg (adaptive clip)")
def _dp_adaptive(settings: AdaptiveSettings, context: registry.BuildContext) -> Aggregator:
  """DP-FedAvg whose clip norm tracks a quantile of the update norms (Andrew et al. 2021)."""
  return dp_adaptive(settings.noise, settings.clip, settings.divisor(context),
                     settings.target_quantile, settings.clip_lr,
                     settings.count_noise * settings.noise)


@dataclasses.dataclass(frozen=True)
class FTRLSettings(PrivacySettings):
  """DP-FTRL's tree restarts (Kairouz et al. 2021)."""

  restart: int = registry.setting(0, "Rounds per tree of DP-FTRL's noise (a client contributes to "
                                  "a tree at most once; 0: ceil(N / K), one pass over the "
                                  "clients).", flag="dp_tree_restart", within=">= 0")

  def rounds_per_tree(self, context: registry.BuildContext) -> int:
    return self.restart or max(1, math.ceil(context.num_clients / max(context.k, 1)))


@registry.register("aggregator", "dp_ftrl", FTRLSettings, label="DP-FTRL")
def _dp_ftrl(settings: FTRLSettings, context: registry.BuildContext) -> Aggregator:
  """DP-FTRL: tree-aggregation noise on the prefix sums of clipped updates, restarted."""
  return dp_ftrl(settings.noise, settings.clip, settings.divisor(context),
                 settings.rounds_per_tree(context))
