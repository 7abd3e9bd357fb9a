"""A selector defined outside the package, as a researcher would write one: registered on import,
run by `experiments.run --selector=tests.toy_selector:lowest_index` (test_registry.py)."""

import dataclasses

import jax
import jax.numpy as jnp

import fedjax_sel as fs
from fedjax_sel import registry


@dataclasses.dataclass(frozen=True)
class LowestIndexSettings:
  """Settings of the toy selector."""

  offset: int = registry.setting(0, "Skip this many of the lowest-index available clients.")


@registry.register("selector", "lowest_index", LowestIndexSettings, reads="nothing")
def lowest_index(settings: LowestIndexSettings, context: registry.BuildContext) -> fs.Selector:
  """The K available clients of lowest index (after `offset` of them)."""
  del context
  offset = settings.offset

  def select(state, key, inputs, mask):
    del key
    rank = jnp.cumsum(mask) - 1
    return mask & (rank >= offset) & (rank < offset + inputs.k), state

  return fs.Selector(init=lambda n, params: (), select=select,
                     spec={"name": "lowest_index", "offset": offset})


@dataclasses.dataclass(frozen=True)
class TemperedLossSettings:
  """Settings of the tempered-loss selector."""

  temperature: float = registry.setting(1.0, "Softmax temperature over the clients' losses.",
                                        within="> 0")


@registry.register("selector", "tempered_loss", TemperedLossSettings, reads="stats")
def tempered_loss(settings: TemperedLossSettings, context: registry.BuildContext) -> fs.Selector:
  """K available clients drawn without replacement with probabilities softmax(loss / T)."""
  del context
  temperature = settings.temperature  # A float: a batch sweeps it as a run value.

  def select(state, key, inputs, mask):
    logits = jnp.where(mask, inputs.stats["loss"] / temperature, -jnp.inf)
    scores = logits + jax.random.gumbel(key, mask.shape)
    rank = jnp.argsort(jnp.argsort(-scores))
    return mask & (rank < inputs.k), state

  return fs.Selector(init=lambda n, params: (), select=select, needs=("loss",),
                     spec={"name": "tempered_loss", "temperature": temperature})
