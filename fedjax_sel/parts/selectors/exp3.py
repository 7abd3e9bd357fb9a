"""A bandit client sampler: EXP3 over the clients (Salehi, Celis, Thiran, "Stochastic Optimization
with Bandit Sampling", arXiv:1708.02544), as FedLab ships it (`MultiArmedBanditSampler`), as a
pure `Selector` (docs/papers/selection.md, 'Bandit sampler').

Each client has a weight w_k (1 at first); the sampling distribution mixes the weights with the
uniform one, `p = (1 - eta) w / sum w + eta / N`. A round draws K clients with replacement from p
(restricted to the clients it may choose from); each drawn client's update enters the aggregate
with the unbiased weight `draws * lambda_k / (K p_k)`, lambda_k its share of the data. After the
round every drawn client that trained reports a feedback a_k (`lambda_k ||w^k - w_t||` by
default, FedLab's author's convention; or its training loss) and its weight grows by
`exp(delta (a_k / N)^2 / p_k^3)`, `delta = sqrt(eta^4 ln N / (N^5 T L^2))` for T rounds and a
feedback bound L.

Examples:
  >>> import jax.numpy as jnp, numpy as np
  >>> np.asarray(exp3_probabilities(jnp.array([1.0, 3.0]), 0.4), float).round(4).tolist()
  [0.35, 0.65]
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel import registry
from fedjax_sel.parts.selectors.sampling import data_shares, reweighted_draws
from fedjax_sel.parts.types import RoundInputs, RoundOutcome, Selector

FEEDBACKS = ("update_norm", "loss")


class EXP3State(NamedTuple):
  """EXP3's state.

  Attributes:
    weight: `[N]` the bandit's weights w_k.
    probs: `[N]` this round's sampling probabilities (over the clients it could choose from).
    weights: `[N]` this round's sampling weights (draws lambda_k / (K p_k)).
  """

  weight: jax.Array
  probs: jax.Array
  weights: jax.Array


def exp3_probabilities(weight: jax.Array, eta: float) -> jax.Array:
  """`(1 - eta) w / sum w + eta / N`."""
  return (1.0 - eta) * weight / jnp.sum(weight) + eta / weight.shape[0]


def exp3_update(weight: jax.Array, drawn: jax.Array, probs: jax.Array, feedback: jax.Array,
                delta: float) -> jax.Array:
  """`[N]` the weights after a round: each drawn client's (once, however often it was drawn)
  multiplied by `exp(delta (feedback / N)^2 / p^3)`, p its probability when drawn."""
  n = weight.shape[0]
  gain = delta * (feedback ** 2 / float(n) ** 2) / jnp.maximum(probs, 1e-30) ** 3
  return jnp.where(drawn, weight * jnp.exp(gain), weight)


def exp3_delta(num_clients: int, rounds: int, bound: float, eta: float) -> float:
  """`sqrt(eta^4 ln N / (N^5 T L^2))`, FedLab's step."""
  return math.sqrt(eta ** 4 * math.log(max(num_clients, 2)) / (num_clients ** 5 * rounds
                                                                * bound ** 2))


def exp3_selector(rounds: int, eta: float = 0.4, bound: float = 1.0,
                  feedback: str = "update_norm") -> Selector:
  """EXP3 sampling of K draws with replacement, reweighted to be unbiased.

  Args:
    rounds: T, the rounds of the run (in the step size delta).
    eta: the uniform share of the distribution, in (0, 1].
    bound: L, a bound on the feedback, > 0.
    feedback: "update_norm" (lambda_k ||w^k - w_t||) or "loss" (the mean training loss).
  """
  if rounds < 1:
    raise ValueError(f"exp3 needs rounds >= 1, got {rounds}")
  if registry.concrete(eta, bound) and not (0.0 < eta <= 1.0 and bound > 0.0):
    raise ValueError(f"exp3 needs eta in (0, 1] and bound > 0, got eta={eta}, bound={bound}")
  if feedback not in FEEDBACKS:
    raise ValueError(f"exp3 feedback must be one of {FEEDBACKS}, got {feedback!r}")

  def init(n, params):
    del params
    return EXP3State(jnp.ones((n,), jnp.float32), jnp.full((n,), 1.0 / n, jnp.float32),
                     jnp.zeros((n,), jnp.float32))

  def select(state, key, inputs: RoundInputs, mask):
    p, counts, weights = reweighted_draws(key, exp3_probabilities(state.weight, eta),
                                          data_shares(inputs.num_examples, mask), mask,
                                          inputs.k)
    return counts > 0, state._replace(probs=p, weights=weights)

  def observe(state, inputs: RoundInputs, outcome: RoundOutcome):
    n = state.weight.shape[0]
    slots = outcome.slots
    if feedback == "loss":
      value = outcome.train_loss
    else:
      moved = jax.tree.leaves(jax.tree.map(lambda w, g: w - g[None], outcome.params,
                                           inputs.params))
      norm = jnp.sqrt(sum(jnp.sum(a.reshape(a.shape[0], -1) ** 2, axis=1) for a in moved))
      available = state.probs > 0
      value = data_shares(inputs.num_examples, available)[slots] * norm
    drawn = jnp.zeros((n,), bool).at[slots].max(outcome.trained)
    per_client = jnp.zeros((n,), jnp.float32).at[slots].max(
        jnp.where(outcome.trained, value, 0.0).astype(jnp.float32))
    delta = exp3_delta(n, rounds, bound, eta)
    return state._replace(weight=exp3_update(state.weight, drawn, state.probs, per_client, delta))

  return Selector(init=init, select=select, observe=observe,
                  reads_local_models=feedback == "update_norm",
                  sampling_weights=lambda state: state.weights,
                  report=lambda state: {"max_probability": jnp.max(state.probs),
                                        "distinct": jnp.sum(state.weights > 0)},
                  spec={"name": "exp3", "rounds": rounds, "eta": eta, "bound": bound,
                        "feedback": feedback})


@dataclasses.dataclass(frozen=True)
class EXP3Settings:
  """EXP3 bandit sampling (FedLab's MultiArmedBanditSampler)."""

  eta: float = registry.setting(0.4, "The uniform share of the sampling distribution (FedLab's "
                                "0.4).", within="(0, 1]", sweep="structural")  # Sets gamma.
  bound: float = registry.setting(1.0, "L, a bound on the clients' feedback.", within="> 0",
                                  sweep="structural")  # Sets gamma, a Python number.
  feedback: str = registry.setting("update_norm", "A trained client's feedback: update_norm (data "
                                   "share x update norm) or loss.", choices=FEEDBACKS)


@registry.register("selector", "exp3", EXP3Settings, reads="private")
def _exp3(settings: EXP3Settings, context: registry.BuildContext) -> Selector:
  """EXP3 bandit sampling with replacement, unbiased weights (FedLab's sampler)."""
  return exp3_selector(max(context.rounds, 1), **dataclasses.asdict(settings))
