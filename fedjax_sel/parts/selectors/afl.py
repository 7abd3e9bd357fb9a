"""AFL, active federated learning (Goetz et al., "Active Federated Learning", arXiv:1909.12641,
2019), as a pure `Selector` (docs/papers/selection.md, 'AFL').

Each client holds a valuation from its last participation, `v_k = sqrt(m_k) * (mean loss)` (the
paper's `L(D_k) / sqrt(m_k)` with L the summed loss; `valuation="plato"` takes Plato's
`mean loss / sqrt(m_k)`), -inf before its first. A round then:

1. sets the `alpha1` share of the mask's clients with the lowest valuations to -inf (the
   unvalued count among them);
2. draws `floor((1 - alpha3) K)` clients without replacement with probability proportional to
   `exp(alpha2 v_k)` among the clients with a finite valuation (fewer if fewer have one);
3. fills the rest of the K uniformly from the mask's other clients.

The loss is the client's mean training loss over its local steps this round (what it reports
with its update, as Plato's first release did), so valuing costs no extra forward pass.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> sel = afl_selector()
  >>> state = sel.init(4, None)
  >>> state.valuation.tolist()  # No client valued yet: the K are drawn uniformly.
  [-inf, -inf, -inf, -inf]
  >>> inputs = RoundInputs.create(jnp.array([10, 40, 20, 30]), k=2)
  >>> chosen, state = sel.select(state, jax.random.PRNGKey(0), inputs, inputs.available)
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

VALUATIONS = ("paper", "plato")


class AFLState(NamedTuple):
  """`[N]` each client's valuation (-inf before its first participation)."""

  valuation: jax.Array


def afl_probabilities(valuation: jax.Array, mask: jax.Array, alpha1: float,
                      alpha2: float) -> jax.Array:
  """`[N]` the weighted draw's probabilities: the `int(alpha1 |mask|)` lowest valuations of the
  mask (-inf first, ties to the lower index) left out, `exp(alpha2 v)` normalized over the rest
  with a finite valuation (all 0 when none has one)."""
  v = jnp.where(mask, valuation, -jnp.inf)
  order = jnp.argsort(jnp.where(mask, v, jnp.inf), stable=True)
  rank = jnp.zeros(v.shape, jnp.int32).at[order].set(jnp.arange(v.shape[0], dtype=jnp.int32))
  dropped = rank < jnp.floor(alpha1 * jnp.sum(mask)).astype(jnp.int32)
  keep = mask & ~dropped & jnp.isfinite(v)
  # Shifted by the largest kept valuation: the same ratios, without overflow.
  top = jnp.max(jnp.where(keep, v, -jnp.inf))
  weight = jnp.where(keep, jnp.exp(alpha2 * (v - jnp.where(jnp.isfinite(top), top, 0.0))), 0.0)
  return weight / jnp.maximum(jnp.sum(weight), 1e-30)


def afl_selector(alpha1: float = 0.75, alpha2: float = 0.01, alpha3: float = 0.1,
                 valuation: str = "paper") -> Selector:
  """AFL for K clients.

  Args:
    alpha1: share of the lowest-valued clients left out of the weighted draw, in [0, 1).
    alpha2: softmax temperature on the valuations, >= 0.
    alpha3: share of the K drawn uniformly, in [0, 1].
    valuation: "paper" (`sqrt(m_k)` times the mean loss) or "plato" (the mean loss over
      `sqrt(m_k)`).
  """
  if registry.concrete(alpha1, alpha2, alpha3) and not (
      0.0 <= alpha1 < 1.0 and alpha2 >= 0.0 and 0.0 <= alpha3 <= 1.0):
    raise ValueError(f"AFL needs alpha1 in [0, 1), alpha2 >= 0, alpha3 in [0, 1]; got "
                     f"alpha1={alpha1}, alpha2={alpha2}, alpha3={alpha3}")
  if valuation not in VALUATIONS:
    raise ValueError(f"afl valuation must be one of {VALUATIONS}, got {valuation!r}")

  def select(state, key, inputs: RoundInputs, mask):
    weighted = int(np.floor((1.0 - alpha3) * inputs.k))
    probs = afl_probabilities(state.valuation, mask, alpha1, alpha2)
    k_weighted, k_uniform = jax.random.split(key)
    first = draw_without_replacement(k_weighted, probs, mask & (probs > 0), weighted)
    rest = draw_without_replacement(k_uniform, jnp.ones(mask.shape), mask & ~first,
                                    inputs.k - jnp.sum(first))
    return first | rest, state

  def observe(state, inputs: RoundInputs, outcome: RoundOutcome):
    size = inputs.num_examples[outcome.slots].astype(jnp.float32)
    scale = jnp.sqrt(size) if valuation == "paper" else 1.0 / jnp.sqrt(jnp.maximum(size, 1.0))
    value = scale * outcome.train_loss
    keep = outcome.trained & jnp.isfinite(value)
    old = state.valuation[outcome.slots]
    return AFLState(state.valuation.at[outcome.slots].set(jnp.where(keep, value, old)))

  return Selector(init=lambda n, params: AFLState(jnp.full((n,), -jnp.inf, jnp.float32)),
                  select=select, observe=observe,
                  report=lambda state: {"valued": jnp.sum(jnp.isfinite(state.valuation))},
                  spec={"name": "afl", "alpha1": alpha1, "alpha2": alpha2,
                        "alpha3": alpha3, "valuation": valuation})


@dataclasses.dataclass(frozen=True)
class AFLSettings:
  """AFL (Goetz et al. 2019), Plato's defaults."""

  alpha1: float = registry.setting(0.75, "Share of the lowest-valued clients left out of the "
                                   "weighted draw.", within="[0, 1)")
  alpha2: float = registry.setting(0.01, "Softmax temperature on the valuations.", within=">= 0")
  alpha3: float = registry.setting(0.1, "Share of the K drawn uniformly.", within="[0, 1]",
                                   sweep="structural")  # A count of clients.
  valuation: str = registry.setting("paper", "A client's valuation: paper (sqrt(m_k) x mean loss) "
                                    "or plato (mean loss / sqrt(m_k)).", choices=VALUATIONS)


@registry.register("selector", "afl", AFLSettings, reads="private")
def _afl(settings: AFLSettings, context: registry.BuildContext) -> Selector:
  """AFL: softmax over loss valuations, the lowest left out, a uniform share."""
  del context
  return afl_selector(**dataclasses.asdict(settings))
