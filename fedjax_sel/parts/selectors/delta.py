"""DELTA (Wang et al., "DELTA: Diverse Client Sampling for Fasting Federated Learning", NeurIPS
2023) as a pure `Selector` (docs/papers/selection.md, 'DELTA').

Clients are drawn K times with replacement from a distribution P that favours diverse clients
(far from the mean gradient) with large gradients, and reweighted to be unbiased: a draw of
client k weighs `lambda_k / (K P_k)`, lambda_k its share of the data. Two ways of keeping P, both
from the authors' code (neither computes the paper's local variance sigma; see the docs):

* `practical` (default; their `reweight_prac`): P starts uniform; after a round, each client that
  trained gets `w_k = lambda_k [(1 - beta) ||g_k|| + beta ||g_k - g_bar||]` (g_k its update
  `w^k - w_t`, g_bar the trained clients' plain mean), rescaled so that these clients keep the
  mass they had in P; the others keep theirs (stale).
* `full` (their `reweight_prac_theory`): every round every available client computes its full
  gradient at w_t (the `grad` stat) and `P_k ~ beta lambda_k ||g_k - g_bar|| + (1 - beta) lambda_k`.

Examples:
  >>> import jax.numpy as jnp, numpy as np
  >>> g = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
  >>> w = practical_weights(g, jnp.array([0.5, 0.25, 0.25]), jnp.ones(3, bool), 0.5)
  >>> np.asarray(w, float).round(3).tolist()
  [0.436, 0.218, 0.236]
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel import registry
from fedjax_sel.parts.selectors.baselines import stacked_rows
from fedjax_sel.parts.selectors.sampling import data_shares, reweighted_draws
from fedjax_sel.parts.types import RoundInputs, RoundOutcome, Selector

VARIANTS = ("practical", "full")


def practical_weights(g: jax.Array, share: jax.Array, mask: jax.Array, beta: float) -> jax.Array:
  """`[M]` `share_k / sum share [(1 - beta) ||g_k|| + beta ||g_k - g_bar||]` over the rows of
  `mask` (g_bar their plain mean); 0 elsewhere."""
  m = mask.astype(g.dtype)
  mean = jnp.sum(g * m[:, None], axis=0) / jnp.maximum(jnp.sum(m), 1.0)
  lam = jnp.where(mask, share, 0.0)
  lam = lam / jnp.maximum(jnp.sum(lam), 1e-30)
  value = (1.0 - beta) * jnp.linalg.norm(g, axis=1) + beta * jnp.linalg.norm(g - mean, axis=1)
  return jnp.where(mask, lam * value, 0.0)


def full_probabilities(g: jax.Array, share: jax.Array, mask: jax.Array, beta: float) -> jax.Array:
  """`[N]` `P_k ~ beta lambda_k ||g_k - g_bar|| + (1 - beta) lambda_k` over `mask` (lambda the data
  shares normalized over the mask, g_bar the plain mean)."""
  m = mask.astype(g.dtype)
  mean = jnp.sum(g * m[:, None], axis=0) / jnp.maximum(jnp.sum(m), 1.0)
  lam = jnp.where(mask, share, 0.0)
  lam = lam / jnp.maximum(jnp.sum(lam), 1e-30)
  w = jnp.where(mask, beta * lam * jnp.linalg.norm(g - mean, axis=1) + (1.0 - beta) * lam, 0.0)
  return w / jnp.maximum(jnp.sum(w), 1e-30)


class DeltaState(NamedTuple):
  """DELTA's state.

  Attributes:
    probs: `[N]` the distribution P (kept across rounds by the practical variant).
    drawn: `[N]` this round's sampling probabilities (P over the clients it could choose from).
    weights: `[N]` this round's sampling weights.
  """

  probs: jax.Array
  drawn: jax.Array
  weights: jax.Array


def delta_selector(variant: str = "practical", beta: float = 0.5) -> Selector:
  """DELTA sampling of K draws with replacement, reweighted to be unbiased.

  Args:
    variant: "practical" (trained clients refresh their mass) or "full" (every available
      client's full gradient each round).
    beta: the weight of diversity against gradient norm (practical) or data share (full), in
      [0, 1] (the authors' 0.5).
  """
  if variant not in VARIANTS:
    raise ValueError(f"delta variant must be one of {VARIANTS}, got {variant!r}")
  if registry.concrete(beta) and not 0.0 <= beta <= 1.0:
    raise ValueError(f"delta beta must be in [0, 1], got {beta}")
  full = variant == "full"

  def init(n, params):
    del params
    zeros = jnp.zeros((n,), jnp.float32)
    return DeltaState(jnp.full((n,), 1.0 / n, jnp.float32), zeros, zeros)

  def select(state, key, inputs: RoundInputs, mask):
    share = data_shares(inputs.num_examples, mask)
    if full:
      grads = stacked_rows(inputs.stats["grad"])
      probs = full_probabilities(grads, share, mask, beta)
    else:
      probs = state.probs
    p, counts, weights = reweighted_draws(key, probs, share, mask, inputs.k)
    return counts > 0, DeltaState(probs, p, weights)

  def observe(state, inputs: RoundInputs, outcome: RoundOutcome):
    if full:
      return state
    slots, done = outcome.slots, outcome.trained
    g = stacked_rows(jax.tree.map(lambda w, g0: w - g0[None], outcome.params, inputs.params))
    w = practical_weights(g, inputs.num_examples[slots].astype(jnp.float32), done, beta)
    old = jnp.sum(jnp.where(done, state.probs[slots], 0.0))
    w = jnp.where(done, w / jnp.maximum(jnp.sum(w), 1e-30) * old, state.probs[slots])
    return state._replace(probs=state.probs.at[slots].set(w))

  return Selector(init=init, select=select, observe=observe, needs=("grad",) if full else (),
                  reads_local_models=not full,
                  sampling_weights=lambda state: state.weights,
                  report=lambda state: {"max_probability": jnp.max(state.drawn),
                                        "distinct": jnp.sum(state.weights > 0)},
                  spec={"name": "delta", "variant": variant, "beta": beta})


@dataclasses.dataclass(frozen=True)
class DeltaSettings:
  """DELTA (Wang et al. 2023), the authors' code's defaults."""

  variant: str = registry.setting("practical", "practical (the trained clients refresh their "
                                  "probability from their updates) or full (every available "
                                  "client's full gradient each round).", choices=VARIANTS)
  beta: float = registry.setting(0.5, "Weight of gradient diversity.", within="[0, 1]")


@registry.register("selector", "delta", DeltaSettings, reads="private")
def _delta(settings: DeltaSettings, context: registry.BuildContext) -> Selector:
  """DELTA: diverse clients sampled with replacement, unbiased weights."""
  del context
  return delta_selector(settings.variant, settings.beta)
