"""Optimal client sampling (Chen, Horvath, Richtarik, "Optimal Client Sampling for Federated
Learning", TMLR 2022) as a pure `Selector` (docs/papers/selection.md, 'Optimal client sampling').

A round's cohort is K clients drawn uniformly from those it may choose from; all of them train
(`inputs.update_norms`, with the round's keys, so the ones that upload send the update they
computed) and report `u_k = m_k ||w^k - w_t||`. Each then uploads independently with
probability p_k, chosen to minimize the aggregate's variance under an expected budget of m
uploads: `p_k = min(1, C u_k)` with C such that `sum p = m`. The authors' code (and ours, by
default) approximates C in `j_max` rescaling steps (AOCS):

    p = min(1, m u / sum u); repeat: C = (m - n + |p < 1|) / sum_{p < 1} p; p = min(1, C p);
    stop once C <= 1.

An upload weighs `(m_k / sum_cohort m) / p_k` in the aggregate, unbiased for the cohort's FedAvg.

Examples:
  >>> import jax.numpy as jnp, numpy as np
  >>> p = aocs_probabilities(jnp.array([1.0, 1.0, 4.0]), jnp.ones(3, bool), 2.0, 4)
  >>> np.asarray(p, float).round(4).tolist()
  [0.5, 0.5, 1.0]
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel import registry
from fedjax_sel.parts.selectors.baselines import top_k_mask
from fedjax_sel.parts.selectors.sampling import data_shares
from fedjax_sel.parts.types import PartCosts, RoundInputs, Selector, engine_input


def aocs_probabilities(u: jax.Array, mask: jax.Array, budget: float, steps: int) -> jax.Array:
  """`[N]` inclusion probabilities over the clients of `mask` with norms `u`: AOCS's `steps`
  rescalings (many steps give the exact optimum); all `budget / n` when every norm is 0."""
  n = jnp.sum(mask)
  u = jnp.where(mask, u, 0.0)
  total = jnp.sum(u)
  p = jnp.where(total > 0, jnp.minimum(1.0, budget * u / jnp.maximum(total, 1e-30)),
                jnp.minimum(1.0, budget / jnp.maximum(n, 1)))
  p = jnp.where(mask, p, 0.0)

  def rescale(_, carry):
    p, done = carry
    below = mask & (p < 1.0)
    mass = jnp.sum(jnp.where(below, p, 0.0))
    c = jnp.where(mass > 0, (budget - n + jnp.sum(below)) / jnp.maximum(mass, 1e-30), 1.0)
    stepped = jnp.where(mask, jnp.minimum(1.0, c * p), 0.0)
    return jnp.where(done, p, stepped), done | (c <= 1.0)

  return jax.lax.fori_loop(0, steps, rescale, (p, jnp.asarray(False)))[0]


class OCSState(NamedTuple):
  """Optimal client sampling's round.

  Attributes:
    probs: `[N]` the cohort's inclusion probabilities (0 outside it).
    weights: `[N]` the uploads' sampling weights.
    samples: the training samples of the cohort's clients that did not upload (their cost; the
      uploaders' is the round's own).
    cohort: the cohort's size.
  """

  probs: jax.Array
  weights: jax.Array
  samples: jax.Array
  cohort: jax.Array


def ocs_selector(budget: float = 3.0 / 32.0, steps: int = 4) -> Selector:
  """Optimal client sampling: a cohort of K trains, about `budget` K of them upload.

  Args:
    budget: the expected uploads m as a share of the cohort of K (every cohort client trains;
      at most K upload), in (0, 1]: m = budget K (at least `math.ulp(1.0)`).
    steps: AOCS's rescaling steps (the authors' j_max, 4).
  """
  if steps < 1:
    raise ValueError(f"ocs needs steps >= 1, got {steps}")
  if registry.concrete(budget) and not 0.0 < budget <= 1.0:
    raise ValueError(f"ocs budget (expected uploads per cohort client) must be in (0, 1], got "
                     f"{budget}")

  def select(state, key, inputs: RoundInputs, mask):
    del state
    uploads = max(budget * inputs.k, math.ulp(1.0))
    k_cohort, k_draw = jax.random.split(key)
    cohort = top_k_mask(jax.random.uniform(k_cohort, mask.shape), mask, inputs.k)
    norms, samples = engine_input(inputs, "update_norms", "ocs")(cohort)
    share = data_shares(inputs.num_examples, cohort)
    probs = aocs_probabilities(share * norms, cohort, uploads, steps)
    chosen = cohort & (jax.random.uniform(k_draw, mask.shape) < probs)
    weights = jnp.where(chosen, share / jnp.maximum(probs, 1e-30), 0.0)
    # The uploaders' training is charged with the round's; the rest of the cohort's here.
    return chosen, OCSState(probs, weights.astype(jnp.float32),
                            jnp.sum(jnp.where(chosen, 0.0, samples)), jnp.sum(cohort))

  def init(n, params):
    del params
    zeros = jnp.zeros((n,), jnp.float32)
    return OCSState(zeros, zeros, jnp.float32(0.0), jnp.int32(0))

  return Selector(init=init, select=select, sampling_weights=lambda state: state.weights,
                  report=lambda state: {"expected_uploads": jnp.sum(state.probs),
                                        "cohort": state.cohort},
                  costs=lambda state: PartCosts(gradients_computed=state.cohort,
                                                gradient_samples=state.samples),
                  spec={"name": "ocs", "budget": budget, "steps": steps})


@dataclasses.dataclass(frozen=True)
class OCSSettings:
  """Optimal client sampling (Chen et al. 2022), the authors' defaults."""

  budget: float = registry.setting(3.0 / 32.0, "Expected uploads per round as a share of the "
                                   "K-client cohort (the authors': 3 of 32).", within="(0, 1]",
                                   sweep="structural")  # Branches of the rescaling.
  steps: int = registry.setting(4, "AOCS's rescaling steps j_max (the authors' 4; many give the "
                                "exact optimum).", within=">= 1")


@registry.register("selector", "ocs", OCSSettings, reads="private")
def _ocs(settings: OCSSettings, context: registry.BuildContext) -> Selector:
  """Optimal client sampling: a trained cohort uploads by its update norms, unbiased weights."""
  del context
  return ocs_selector(settings.budget, settings.steps)
