"""FedCor (Tang et al., "FedCor: Correlation-Based Active Client Selection Strategy for
Heterogeneous Federated Learning", CVPR 2022) as a pure `Selector` (docs/papers/selection.md,
'FedCor').

A Gaussian process models the clients' loss changes between rounds, `dL ~ N(mu, Sigma)` with
`Sigma = X^T X + noise^2 I`, X a learned `[D, N]` embedding (the authors' linear kernel). It is
fitted by maximizing the gamma-discounted marginal likelihood of the loss changes seen on
*random* rounds (Adam, lr 0.01), whose loss changes every available client reports (it evaluates
the global model before and after the round):

* the first `warmup + 1` rounds are random; the GP is fitted once after them (1000 steps, with
  the mean re-estimated as the discounted mean of the history) or after each (150 steps, the mean
  kept at 0), as the authors' `update_mean` has it;
* later, every `interval`-th round is random and refits the GP (100 steps), resetting the
  discount;
* the other rounds select K clients greedily: each step takes the client k maximizing
  `discount_k / sqrt(Sigma_kk) * sum_{i remaining} p_i Sigma_ik` (the expected drop of the
  data-weighted loss if k's loss change comes out one posterior deviation low), then conditions
  Sigma on k; a selected client's discount is multiplied by beta until the next refit.

Examples:
  >>> import jax.numpy as jnp
  >>> x = jnp.array([[1.0, 0.8, 0.0], [0.0, 0.6, 0.0], [0.0, 0.0, 1.0]])  # Sigma_01 = 0.8.
  >>> p = jnp.array([0.5, 0.25, 0.25])
  >>> greedy_select(x, p, jnp.ones(3), jnp.ones(3, bool), 2).tolist()
  [True, False, True]
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_sel import registry
from fedjax_sel.parts.selectors.baselines import top_k_mask
from fedjax_sel.parts.selectors.sampling import data_shares
from fedjax_sel.parts.types import Footprint, PartCosts, RoundInputs, Scale, Selector

NOISE = 0.01  # The authors' fixed (untrained) observation noise.


def covariance(x: jax.Array) -> jax.Array:
  """`[N, N]` `X^T X + noise^2 I` (the linear kernel, the authors' default)."""
  return x.T @ x + NOISE ** 2 * jnp.eye(x.shape[1], dtype=x.dtype)


def greedy_select(x: jax.Array, p: jax.Array, discount: jax.Array, mask: jax.Array,
                  k: int) -> jax.Array:
  """`[N]` bool: K greedy steps over the clients of `mask` (ties to the lower index), each taking
  the k maximizing `discount_k / sqrt(Sigma_kk) sum_{i remaining} p_i Sigma_ik` and conditioning
  Sigma on it, for the covariance `Sigma = X^T X + noise^2 I` of the `[D, N]` features `x`.

  Sigma is never formed: after t steps it is `Sigma_0 - U U^T`, U holding one column per chosen
  client (conditioning on j subtracts `u u^T` with `u = Sigma[:, j] / sqrt(Sigma_jj)`), so its
  diagonal, a column and the weighted column sums cost O(N (D + t)) a step instead of O(N^2).
  """
  n = x.shape[1]
  jitter = NOISE ** 2
  u = jnp.zeros((n, min(k, n)), x.dtype)

  def step(t, carry):
    u, diag, remaining, chosen = carry
    q = jnp.where(remaining, p, 0.0).astype(x.dtype)
    weighted = x.T @ (x @ q) + jitter * q - u @ (u.T @ q)
    score = discount / jnp.sqrt(jnp.maximum(diag, 1e-30)) * weighted
    j = jnp.argmax(jnp.where(remaining, score, -jnp.inf))
    ok = remaining[j]
    col = x.T @ x[:, j] + jitter * (jnp.arange(n) == j) - u @ u[j]
    new = col / jnp.sqrt(jnp.maximum(col[j], 1e-30))
    new = jnp.where(ok, new, 0.0)
    return (u.at[:, t].set(new), diag - new * new, remaining.at[j].set(False),
            chosen.at[j].set(chosen[j] | ok))

  diag = jnp.sum(x * x, axis=0) + jitter
  carry = (u, diag, mask, jnp.zeros(mask.shape, bool))
  return jax.lax.fori_loop(0, min(k, n), step, carry)[3]


def _factor(sigma: jax.Array, seen: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The Cholesky factor of Sigma over the clients of `seen` (the others' rows and columns become
  the identity) and its log-determinant."""
  keep = seen[:, None] & seen[None, :]
  chol = jnp.linalg.cholesky(jnp.where(keep, sigma, jnp.eye(sigma.shape[0], dtype=sigma.dtype)))
  return chol, 2.0 * jnp.sum(jnp.log(jnp.diag(chol)))


def _row_nll(sigma: jax.Array, mu: jax.Array, value: jax.Array, seen: jax.Array) -> jax.Array:
  """`-log N(value; mu, Sigma)` over the clients of `seen` (their residuals; the others' are 0).
  A vector solve, not `_shared_nll` of one row: the per-row gradient keeps the bits of the
  `lax.map` over rows it replaced."""
  chol, logdet = _factor(sigma, seen)
  r = jnp.where(seen, value - mu, 0.0)
  a = jax.scipy.linalg.cho_solve((chol, True), r)
  return 0.5 * (r @ a + logdet + jnp.sum(seen) * jnp.log(2.0 * jnp.pi))


def _shared_nll(sigma: jax.Array, mu: jax.Array, values: jax.Array, seen: jax.Array) -> jax.Array:
  """`[B]` `_row_nll` of each row of `values`, all over the clients of `seen`: one factor, and one
  solve with the rows as its columns."""
  chol, logdet = _factor(sigma, seen)
  r = jnp.where(seen, values - mu, 0.0)
  a = jax.scipy.linalg.cho_solve((chol, True), r.T)
  return 0.5 * (jnp.sum(r.T * a, axis=0) + logdet + jnp.sum(seen) * jnp.log(2.0 * jnp.pi))


def gp_loss(x: jax.Array, mu: jax.Array, values: jax.Array, observed: jax.Array,
            weights: jax.Array) -> jax.Array:
  """`-sum_e w_e log N(values_e; mu, Sigma)` over the history's rows of weight > 0, each over
  its observed clients (the objective `fit` descends; `gp_grad` is its gradient)."""
  sigma = covariance(x)
  rows = jax.lax.map(lambda vs: _row_nll(sigma, mu, *vs), (values, observed))
  return jnp.sum(jnp.where(weights > 0, weights * rows, 0.0))


@jax.custom_batching.sequential_vmap
def gp_grad(x: jax.Array, mu: jax.Array, values: jax.Array, observed: jax.Array,
            weights: jax.Array) -> jax.Array:
  """`d gp_loss / d x`, visiting only the history's rows of weight > 0.

  When those rows observed the same clients (every client available), they share one Cholesky
  factor and one solve. Otherwise the rows are visited one at a time in a loop over the live rows
  only: the ring buffer holds `history + 1` rows but on most rounds few are live (16 of 101 at
  the fit after the default warm-up), where a `lax.map` over the buffer would factor every row,
  live or not, 6x the work. One row's factor is in memory at a time.

  Under `vmap` (the engine's runs axis) the runs' gradients are taken one after another
  (`sequential_vmap`), so that every Cholesky factor and triangular solve is of one matrix:
  jaxlib 0.10's CPU LAPACK kernels hand a batch of matrices to XLA:CPU's thread pool in chunks
  and block a pool thread until they finish, and two such calls at once (the two branches of a
  batched `cond`, or a solve and a factor's derivative) hold both threads of a 2-core machine
  and never finish. Batched factors were no faster: 100 steps of `fit` over 3 runs of 50 clients
  with 16 live rows took 0.25 s one run after another, 0.36 s batched.
  """
  sigma, back = jax.vjp(covariance, x)
  live = weights > 0
  first = observed[jnp.argmax(live)]
  shared = jnp.all(jnp.where(live[:, None], observed == first[None, :], True))

  def one_factor():
    return jax.grad(lambda s: jnp.sum(jnp.where(live, weights * _shared_nll(
        s, mu, values, first), 0.0)))(sigma)

  def per_row():
    order = jnp.argsort(~live, stable=True)  # The live rows first, in their order.
    count = jnp.sum(live)

    def body(i, total):  # The last live row first, as the transposed lax.map adds them.
      r = order[count - 1 - i]
      _, row_back = jax.vjp(lambda s: _row_nll(s, mu, values[r], observed[r]), sigma)
      return total + row_back(weights[r])[0]

    return jax.lax.fori_loop(0, count, body, jnp.zeros_like(sigma))

  return back(jax.lax.cond(shared, one_factor, per_row))[0]


def fit(x: jax.Array, mu: jax.Array, values: jax.Array, observed: jax.Array,
        weights: jax.Array, steps, lr: float = 0.01) -> jax.Array:
  """X after `steps` (a traced int is fine) Adam steps on `gp_loss`, from a fresh Adam state (the
  authors build a new optimizer on each fit).

  Under `vmap` the runs are fitted one after another, each by the program of one run, so a run's
  fit is the same to the bit batched or not (see `gp_grad` for why no factor is batched).
  """
  opt = optax.adam(lr)

  @jax.custom_batching.sequential_vmap
  def one_run(x, mu, values, observed, weights, steps):
    def body(_, carry):
      x, state = carry
      updates, state = opt.update(gp_grad(x, mu, values, observed, weights), state, x)
      return optax.apply_updates(x, updates), state

    return jax.lax.fori_loop(0, steps, body, (x, opt.init(x)))[0]

  return one_run(x, mu, values, observed, weights, jnp.asarray(steps))


def discounted_mean(values: jax.Array, observed: jax.Array, weights: jax.Array) -> jax.Array:
  """`[N]` each client's weighted mean loss change over the history (the authors' MLE_Mean)."""
  w = weights[:, None] * observed
  return jnp.sum(w * values, axis=0) / jnp.where(jnp.sum(w, axis=0) > 0, jnp.sum(w, axis=0), 1e-6)


class FedCorState(NamedTuple):
  """FedCor's state.

  Attributes:
    x: `[D, N]` the clients' embedding.
    mu: `[N]` the GP's mean.
    values: `[B, N]` the history of loss changes (a ring buffer by round).
    observed: `[B, N]` which clients reported each.
    epochs: `[B]` each row's round (-1: empty).
    discount: `[N]` each client's discount.
    prev_loss: `[N]` the losses at the start of the last random round.
    prev_observed: `[N]` the clients that reported them.
    pending: whether the last round was random (its loss changes are read this round).
    evaluated: `[N]` the clients that evaluated the global model this round.
    fitted: whether the GP was refitted this round.
  """

  x: jax.Array
  mu: jax.Array
  values: jax.Array
  observed: jax.Array
  epochs: jax.Array
  discount: jax.Array
  prev_loss: jax.Array
  prev_observed: jax.Array
  pending: jax.Array
  evaluated: jax.Array
  fitted: jax.Array


@dataclasses.dataclass(frozen=True)
class FedCorConfig:
  """FedCor's settings (the authors' FMNIST experiment); each field is also a launcher flag.

  Attributes:
    warmup: random warm-up rounds before the GP selects (rounds 0..warmup), >= 0.
    interval: every interval-th later round is random and refits the GP, >= 1.
    history: rounds of loss changes the GP is fitted on, >= 1.
    gamma: discount of older loss changes in the fit, in (0, 1].
    beta: a selected client's discount factor until the next fit, in (0, 1].
    dimension: D, the dimension of the clients' learned embedding, >= 1.
    update_mean: fit the GP's mean to the loss changes (the authors' default) or keep it at 0.
  """

  warmup: int = registry.setting(15, "Random warm-up rounds before the GP selects (rounds "
                                 "0..warmup).", within=">= 0")
  interval: int = registry.setting(10, "Every interval-th later round is random and refits the GP.",
                                   within=">= 1")
  history: int = registry.setting(100, "Rounds of loss changes the GP is fitted on.", within=">= 1")
  gamma: float = registry.setting(0.95, "Discount of older loss changes in the fit.",
                                  within="(0, 1]")
  beta: float = registry.setting(0.95, "A selected client's discount factor until the next fit.",
                                 within="(0, 1]")
  dimension: int = registry.setting(15, "Dimension of the clients' learned embedding.",
                                    within=">= 1")
  update_mean: bool = registry.setting(True, "Fit the GP's mean to the loss changes (the authors' "
                                       "default) or keep it at 0.")


def gp_footprint(scale: Scale, config: FedCorConfig) -> Footprint:
  """FedCor's costliest round: a GP fit, the one after the warm-up (1000 Adam steps, 150 without
  `update_mean`, over the warm-up's `min(history, warmup) + 1` rows), or a later refit (100
  steps over at most `history // interval + 1` more rows) if that is more work. A step factors
  the `[N, N]` covariance (N^3 / 3 flops) and differentiates the factor (about 4 N^3: two
  triangular solves with N right-hand sides and a product): once when every history row
  observed the same clients, as when all N are available (then each of the history's
  `history + 1` rows solves with it), else once per live row of the history (each factor
  recomputed in the backward pass). XLA's buffers for a step hold fourteen `[N, N]`
  float32 arrays (56 N^2 bytes, measured at N = 500-3000).

  Example:
    >>> f = gp_footprint(Scale(num_clients=1000, num_available=1000, k=10, model_size=650),
    ...                  FedCorConfig())
    >>> f"{f.flops:.2e} flops, {f.memory / 1e6:.0f} MB"
    '5.03e+12 flops, 57 MB'
  """
  n, d = scale.num_clients, config.dimension
  per_row = scale.num_available < n
  steps, rows = 1000 if config.update_mean else 150, min(config.history, config.warmup) + 1
  when = "the GP fit after the warm-up"
  later = min(config.history + 1, rows + config.history // config.interval + 1)
  if per_row and 100 * later > steps * rows:
    steps, rows, when = 100, later, "a GP refit after a later random round"
  factor = n ** 3 / 3.0 + 4.0 * n ** 3
  step_flops = (rows * (factor + n ** 3 / 3.0) + 6.0 * d * n * n if per_row
                else factor + 6.0 * (config.history + 1 + d) * n * n)
  how = f"once per live history row ({rows}: clients' availability varies)" if per_row else "once"
  return Footprint(
      flops=steps * step_flops, memory=56.0 * n * n + 8.0 * (config.history + 1 + d) * n,
      step=f"{when}: {steps} Adam steps, each factoring the [N, N] covariance {how}",
      cheaper=("a shorter fedcor warmup or history (one factor a live row), or every client "
               "available (one factor a step)" if per_row else ""))


def fedcor_selector(seed: int = 0, config: FedCorConfig = FedCorConfig()) -> Selector:
  """FedCor for K clients; the embedding starts from `seed` (`randn(D, N) / sqrt(D)`)."""
  registry.check_values(config)
  cfg = config
  rows = cfg.history + 1

  def init(n, params):
    del params
    x = jax.random.normal(jax.random.PRNGKey(seed), (cfg.dimension, n)) / np.sqrt(cfg.dimension)
    zeros = jnp.zeros((n,), jnp.float32)
    return FedCorState(x.astype(jnp.float32), zeros, jnp.zeros((rows, n), jnp.float32),
                       jnp.zeros((rows, n), bool), jnp.full((rows,), -1, jnp.int32),
                       jnp.ones((n,), jnp.float32), zeros, jnp.zeros((n,), bool),
                       jnp.asarray(False), jnp.zeros((n,), bool), jnp.asarray(False))

  def random_round(t):
    return (t <= cfg.warmup) | (t % cfg.interval == 0)

  def select(state, key, inputs: RoundInputs, mask):
    t = jnp.asarray(inputs.round, jnp.int32)
    loss = inputs.stats["loss"]
    last = t - 1
    # The last random round's loss changes, from the clients that reported at both ends.
    seen = state.pending & state.prev_observed & mask
    slot = jnp.mod(last, rows)
    values = jnp.where(state.pending, state.values.at[slot].set(
        jnp.where(seen, loss - state.prev_loss, 0.0)), state.values)
    observed = jnp.where(state.pending, state.observed.at[slot].set(seen), state.observed)
    epochs = jnp.where(state.pending, state.epochs.at[slot].set(last), state.epochs)
    newest = jnp.max(epochs)
    live = (epochs >= 0) & (epochs + cfg.history >= newest)
    weights = jnp.where(live, cfg.gamma ** (newest - epochs).astype(jnp.float32), 0.0)
    observed = observed & live[:, None]
    # Fit after the warm-up (or each warm-up round) and after every later random round.
    in_warmup = last <= cfg.warmup
    if cfg.update_mean:
      steps = jnp.where(in_warmup, jnp.where(last == cfg.warmup, 1000, 0), 100)
    else:
      steps = jnp.where(in_warmup, 150, 100)
    steps = jnp.where(state.pending, steps, 0)
    mu = state.mu
    if cfg.update_mean:
      mu = jnp.where(steps > 0, discounted_mean(values, observed, weights), mu)
    x = jax.lax.cond(steps > 0, lambda: fit(state.x, mu, values, observed, weights, steps),
                     lambda: state.x)
    discount = jnp.where(state.pending & ~in_warmup, 1.0, state.discount)
    # This round: random, or FedCor's greedy.
    p = data_shares(inputs.num_examples, mask)
    rand = random_round(t)
    chosen = jax.lax.cond(
        rand, lambda: top_k_mask(jax.random.uniform(key, mask.shape), mask, inputs.k),
        lambda: greedy_select(x, p, discount, mask, inputs.k))
    discount = jnp.where(rand, discount, jnp.where(chosen, discount * cfg.beta, discount))
    return chosen, FedCorState(x, mu, values, observed, epochs, discount,
                               jnp.where(rand, loss, state.prev_loss),
                               jnp.where(rand, mask, state.prev_observed), rand,
                               mask & (rand | state.pending), steps > 0)

  return Selector(init=init, select=select, needs=("loss",),
                  report=lambda state: {"fitted": state.fitted,
                                        "history": jnp.sum(jnp.any(state.observed, axis=1))},
                  costs=lambda state: PartCosts(evaluated=state.evaluated),
                  footprint=lambda scale: gp_footprint(scale, cfg),
                  spec={"name": "fedcor", "seed": seed, **dataclasses.asdict(cfg)})


@registry.register("selector", "fedcor", FedCorConfig, reads="stats")
def _fedcor(settings: FedCorConfig, context: registry.BuildContext) -> Selector:
  """FedCor: a Gaussian process of loss changes, greedy posterior-variance selection."""
  return fedcor_selector(context.seed, settings)
