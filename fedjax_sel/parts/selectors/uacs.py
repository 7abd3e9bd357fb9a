"""UACS-FL (docs/papers/uacs.md): uncertainty-based active client selection, and its baselines.

The uncertainty of client i at the global model w_t is alpha_i, the mean over its samples of the
predictive entropy H(x) = -sum_l P(y_l | x) log P(y_l | x) (natural log), which the engine computes
for every client as the `entropy` stat. Each round the entropy selector explores with probability
eps (m clients uniformly at random from the mask) and otherwise exploits (the m clients with the
highest alpha, ties to the lower index): eps = 0.1 is "Entropy+Eps-Greedy", eps = 0 "Entropy Based".
The baselines are random selection (`selectors.random_selector`) and gradient-norm selection (the m
largest full-batch gradient norms ||grad F_k(w_t)||, the `grad_norm` stat). The paper aggregates the
uniform mean of the m local models: `aggregators.fedavg("uniform")`.

All selectors are pure and jit-able and work on any mask, so they compose with every filter,
participation rule and aggregator; m is the run's K, which they read from `inputs.k`.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from fedjax_sel.parts.types import RoundInputs
  >>> sel = entropy_selector(eps=0.0)
  >>> inputs = RoundInputs.create(jnp.ones(4), stats={"entropy": jnp.array([0.1, 0.6, 0.3, 0.6])},
  ...                             k=2)
  >>> chosen, state = sel.select(sel.init(4, None), jax.random.PRNGKey(0), inputs,
  ...                            jnp.ones(4, bool))
  >>> jnp.flatnonzero(chosen).tolist(), bool(state.explored)
  ([1, 3], False)
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel import registry
from fedjax_sel.parts.selectors.baselines import top_k_mask
from fedjax_sel.parts.types import Selector

METHODS = {"entropy_eps": "Entropy+Eps-Greedy", "entropy": "Entropy Based", "random": "Random",
           "grad_norm": "Gradient Norm"}


class EntropyState(NamedTuple):
  """`eps`: the exploration probability (a state value, so runs of one program may differ in
  it); `explored`: whether the last round explored."""

  eps: jax.Array
  explored: jax.Array


def entropy_selector(eps: float = 0.1) -> Selector:
  """Epsilon-greedy top-m on the mean predictive entropy (state: `EntropyState`)."""
  if registry.concrete(eps) and not 0.0 <= eps <= 1.0:
    raise ValueError(f"exploration probability eps must be in [0, 1], got {eps}")

  def select(state, key, inputs, mask):
    k_coin, k_pick = jax.random.split(key)
    explored = jax.random.uniform(k_coin) < state.eps
    at_random = top_k_mask(jax.random.uniform(k_pick, mask.shape), mask, inputs.k)
    greedy = top_k_mask(inputs.stats["entropy"], mask, inputs.k)
    return jnp.where(explored, at_random, greedy), EntropyState(state.eps, explored)

  return Selector(init=lambda n, params: EntropyState(jnp.float32(eps), jnp.asarray(False)),
                  select=select, needs=("entropy",),
                  spec={"name": "entropy", "eps": registry.plain(eps)})


def grad_norm_selector() -> Selector:
  """The m clients with the largest full-batch gradient norm at w_t (ties to the lower index)."""

  def select(state, key, inputs, mask):
    del key
    return top_k_mask(inputs.stats["grad_norm"], mask, inputs.k), state

  return Selector(init=lambda n, params: (), select=select, needs=("grad_norm",),
                  spec={"name": "grad_norm"})


# --- Registered names (fedjax_sel.registry) ------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class EntropySettings:
  """UACS-FL's Entropy+Eps-Greedy."""

  explore_prob: float = registry.setting(0.1, "eps of Entropy+Eps-Greedy: probability of picking "
                                         "the m clients uniformly at random in a round.",
                                         flag="explore_prob", within="[0, 1]")


@registry.register("selector", "entropy", EntropySettings, reads="stats")
def _entropy(settings: EntropySettings, context: registry.BuildContext) -> Selector:
  """UACS-FL: eps-greedy top K by predictive entropy."""
  del context
  return entropy_selector(settings.explore_prob)


@registry.register("selector", "grad_norm", reads="stats")
def _grad_norm(settings, context: registry.BuildContext) -> Selector:
  """Top K by the norm of the full-batch gradient."""
  del settings, context
  return grad_norm_selector()
