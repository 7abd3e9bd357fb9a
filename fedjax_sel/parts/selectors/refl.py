"""REFL's intelligent participant selection (Abdelmoniem et al., "REFL: Resource-Efficient
Federated Learning", EuroSys 2023) as a pure `Selector` (docs/papers/selection.md, 'REFL').

Least available first: a round's priority clients are those available now that will not be
available next round (their availability window closes), read from the run's availability model
as REFL's code reads its device trace (an oracle one round ahead). Its imperfect prediction is
modelled as REFL's code does: each round a random `1 - accuracy` share of the priority clients
and of the others is left out. The K come from the priority clients uniformly; when fewer, all of
them and the rest uniformly from the other available clients.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from fedjax_sel.parts.types import RoundInputs
  >>> later = lambda r: jnp.array([True, False, True, False])
  >>> inputs = RoundInputs.create(jnp.ones(4), available_at=later, k=2)
  >>> sel = refl_selector(accuracy=1.0)
  >>> chosen, _ = sel.select(sel.init(4, None), jax.random.PRNGKey(0), inputs,
  ...                        jnp.array([True, True, True, True]))
  >>> chosen.tolist()
  [False, True, False, True]
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel import registry
from fedjax_sel.parts.selectors.baselines import top_k_mask
from fedjax_sel.parts.types import RoundInputs, Selector, engine_input


class REFLState(NamedTuple):
  """`[N]` bool: this round's priority clients (available now, gone next round)."""

  priority: jax.Array


def refl_selector(accuracy: float = 0.9) -> Selector:
  """REFL's least-available-first selection of K clients.

  Args:
    accuracy: the availability predictor's accuracy, in (0, 1]: each round a random
      `1 - accuracy` share of the priority clients and of the others is not considered.
  """
  if registry.concrete(accuracy) and not 0.0 < accuracy <= 1.0:
    raise ValueError(f"refl accuracy must be in (0, 1], got {accuracy}")

  def select(state, key, inputs: RoundInputs, mask):
    del state
    later = engine_input(inputs, "available_at", "refl")(jnp.asarray(inputs.round) + 1)
    leaving = mask & ~later
    k_keep, k_first, k_rest = jax.random.split(key, 3)
    u = jax.random.uniform(k_keep, mask.shape)
    staying = mask & ~leaving

    def kept(group):  # REFL keeps int(|group| accuracy) of a group, uniformly.
      count = jnp.floor(jnp.sum(group) * accuracy).astype(jnp.int32)
      rank = jnp.argsort(jnp.argsort(jnp.where(group, u, jnp.inf)))
      return group & (rank < count)

    priority, others = kept(leaving), kept(staying)
    first = top_k_mask(jax.random.uniform(k_first, mask.shape), priority, inputs.k)
    need = inputs.k - jnp.sum(first)
    u_rest = jnp.where(others, jax.random.uniform(k_rest, mask.shape), jnp.inf)
    rest = others & (jnp.argsort(jnp.argsort(u_rest)) < need)
    return first | rest, REFLState(priority)

  return Selector(init=lambda n, params: REFLState(jnp.zeros((n,), bool)), select=select,
                  report=lambda state: {"priority": jnp.sum(state.priority)},
                  spec={"name": "refl", "accuracy": accuracy})


@dataclasses.dataclass(frozen=True)
class REFLSettings:
  """REFL (Abdelmoniem et al. 2023), its experiments' setting."""

  accuracy: float = registry.setting(0.9, "The availability predictor's accuracy (a random 1 - "
                                     "accuracy share of the clients is not considered each round).",
                                     within="(0, 1]")


@registry.register("selector", "refl", REFLSettings, requires=("availability",),
                   reads="metadata")
def _refl(settings: REFLSettings, context: registry.BuildContext) -> Selector:
  """REFL: the clients whose availability ends first, from the availability model."""
  del context
  return refl_selector(settings.accuracy)
