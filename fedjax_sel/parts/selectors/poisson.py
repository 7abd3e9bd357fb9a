"""Poisson sampling: each available client joins the round independently with probability q.

The sampling of DP-FedAvg's privacy analysis (McMahan et al., ICLR 2018; docs/papers/privacy.md):
the cohort's size varies from round to round (Binomial(n, q) of the n available clients). A
compiled round has K training slots, so the cohort is padded to K and masked; K is the cap. A
round that draws more than K clients keeps K of them uniformly at random (truncated Poisson
sampling) and reports it (`truncated`); the accountant accounts for that truncation
(docs/papers/privacy.md, "Poisson sampling and its cap"), and the launcher refuses a cap whose
truncation would matter. The chosen clients carry no sampling weights: a private aggregate divides
their sum by the expected cohort q N, and FedAvg averages them as a set.

Example:
  >>> import jax, jax.numpy as jnp
  >>> from fedjax_sel.parts.types import RoundInputs
  >>> sel = poisson_selector(0.5)
  >>> inputs = RoundInputs.create(jnp.ones(1000), k=600)
  >>> chosen, state = sel.select(sel.init(1000, None), jax.random.PRNGKey(0), inputs,
  ...                            jnp.ones(1000, bool))
  >>> 450 < int(chosen.sum()) < 550, bool(state.truncated)
  (True, False)
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel import registry
from fedjax_sel.parts.selectors.baselines import top_k_mask
from fedjax_sel.parts.types import Selector


class PoissonState(NamedTuple):
  """The round's draw: clients sampled before the cap, and whether the cap cut them."""

  sampled: jax.Array
  truncated: jax.Array


def poisson_selector(sample_rate) -> Selector:
  """Each client of the mask with probability `sample_rate` (q), at most K of them (a uniform K
  of the drawn when more were drawn)."""

  def select(state, key, inputs, mask):
    del state
    drawn = mask & jax.random.bernoulli(jax.random.fold_in(key, 0), sample_rate, mask.shape)
    kept = top_k_mask(jax.random.uniform(jax.random.fold_in(key, 1), mask.shape), drawn,
                      inputs.k)
    sampled = jnp.sum(drawn)
    return kept, PoissonState(sampled, sampled > inputs.k)

  return Selector(init=lambda n, params: PoissonState(jnp.zeros((), jnp.int32),
                                                      jnp.zeros((), bool)),
                  select=select,
                  report=lambda state: {"sampled": state.sampled, "truncated": state.truncated},
                  spec={"name": "poisson", "sample_rate": registry.plain(sample_rate)})


@dataclasses.dataclass(frozen=True)
class PoissonSettings:
  """Poisson sampling's rate."""

  sample_rate: float = registry.setting(0.1, "Probability q that each available client joins a "
                                        "round (the cohort, about q N, is capped at K).",
                                        flag="sample_rate", within="(0, 1]")

  def check(self, context: registry.BuildContext) -> None:
    expected = self.sample_rate * context.num_available
    if context.num_available and expected > context.k:
      warnings.warn(f"Poisson sampling (--sample_rate={self.sample_rate:g}) draws about q n = "
                    f"{expected:g} clients a round, above the cap K = {context.k} "
                    "(--clients_per_round): most rounds keep K of them (truncated Poisson "
                    "sampling); raise K well above q n", stacklevel=2)


@registry.register("selector", "poisson", PoissonSettings, reads="nothing")
def _poisson(settings: PoissonSettings, context: registry.BuildContext) -> Selector:
  """Poisson sampling: each client independently with probability q, capped at K."""
  del context
  return poisson_selector(settings.sample_rate)
