"""Unbiased client sampling: draws with unequal probabilities and the weights that undo them.

A sampler draws clients with unequal probabilities and reports, through the selector's
`sampling_weights`, the weight c_k of each drawn client's update in the aggregate
`w_{t+1} = w_t + sum_k c_k (w^k - w_t)` (`aggregators.sampled_update`), chosen so that its
expectation is full participation's `w_t + sum_k p_k (w^k - w_t)`, p_k = m_k / sum_j m_j:

* K draws with replacement from q (MD sampling, clustered sampling): c_k = (draws of k) / K when
  q is p, and `(draws of k) p_k / (K q_k)` in general;
* independent inclusions with probabilities pi_k (optimal client sampling): c_k = p_k / pi_k.

This module holds those draws and MD sampling (Li et al., "Federated Optimization in
Heterogeneous Networks", MLSys 2020: K clients drawn with replacement by data size, each draw
counted once in a plain average), the baseline that unbiased sampling papers compare against.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> sel = md_selector()
  >>> inputs = RoundInputs.create(jnp.array([10, 0, 30, 60]), k=3)
  >>> chosen, state = sel.select(sel.init(4, None), jax.random.PRNGKey(0), inputs,
  ...                            jnp.ones(4, bool))
  >>> float(state.weights.sum()), bool(chosen[1])
  (1.0, False)
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel import registry
from fedjax_sel.parts.types import RoundInputs, Selector


class SampledState(NamedTuple):
  """`[N]` float32: each client's sampling weight c_k this round (0 if not drawn)."""

  weights: jax.Array


def data_shares(num_examples: jax.Array, mask: jax.Array) -> jax.Array:
  """`[N]` p_k = m_k / sum_{j in mask} m_j inside `mask` (0 outside; uniform when the mask holds
  no example)."""
  m = jnp.where(mask, num_examples.astype(jnp.float32), 0.0)
  total = jnp.sum(m)
  uniform = mask.astype(jnp.float32) / jnp.maximum(jnp.sum(mask), 1)
  return jnp.where(total > 0, m / jnp.maximum(total, 1e-30), uniform)


def draws_with_replacement(key: jax.Array, probs: jax.Array) -> jax.Array:
  """`[N]` int32 counts of `probs.shape[0]`-way draws, one per row of `probs [D, N]` (each row a
  distribution over the clients; D draws in all, each from its own row)."""
  logits = jnp.log(jnp.maximum(probs, 0.0))
  ids = jax.random.categorical(key, logits, axis=-1)
  return jnp.zeros((probs.shape[-1],), jnp.int32).at[ids].add(1)


def draws_from(key: jax.Array, probs: jax.Array, k: int) -> jax.Array:
  """`[N]` int32 counts of `k` draws with replacement from the one distribution `probs` (by its
  inverse CDF: O(N + k log N), where `draws_with_replacement` on k copies is O(k N)); a client of
  probability 0 is never drawn."""
  cdf = jnp.cumsum(probs)
  u = jax.random.uniform(key, (k,)) * cdf[-1]
  ids = jnp.minimum(jnp.searchsorted(cdf, u, side="right"), probs.shape[0] - 1)
  return jnp.zeros(probs.shape, jnp.int32).at[ids].add(1)


def reweighted_draws(key: jax.Array, probs: jax.Array, share: jax.Array, mask: jax.Array,
                     k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """K draws with replacement from `probs` over `mask` (normalized; uniform over the mask where
  it holds no mass): `(p [N], counts [N], weights [N])`, each client's sampling weight
  `draws share / (K p)` (unbiased for the `share`-weighted aggregate)."""
  p = jnp.where(mask, probs, 0.0)
  p = jnp.where(jnp.sum(p) > 0, p, mask.astype(jnp.float32))
  p = p / jnp.maximum(jnp.sum(p), 1e-30)
  counts = jnp.where(jnp.any(mask), draws_from(key, p, k), 0)
  weights = counts * share / (k * jnp.maximum(p, 1e-30))
  return p, counts, weights.astype(jnp.float32)


def draw_without_replacement(key: jax.Array, weights: jax.Array, mask: jax.Array,
                             count) -> jax.Array:
  """`[N]` bool: `count` (a traced int is fine) clients of `mask` drawn without replacement with
  probability proportional to `weights` (Gumbel top-k; weight 0 is never drawn while others
  remain), or all of `mask` when it holds fewer."""
  n = mask.shape[0]
  keyed = jnp.where(mask, jnp.log(jnp.maximum(weights, 1e-30)) + jax.random.gumbel(key, (n,)),
                    -jnp.inf)
  rank = jnp.argsort(jnp.argsort(-keyed))
  return mask & (rank < count)


def md_selector() -> Selector:
  """MD sampling: K clients drawn with replacement from the mask with probability
  p_k = m_k / sum m, the aggregate the plain mean over the K draws (a client drawn twice trains
  once and counts twice: c_k = draws / K; fewer distinct clients when a client is drawn twice)."""

  def select(state, key, inputs: RoundInputs, mask):
    del state
    p = data_shares(inputs.num_examples, mask)
    counts = draws_from(key, p, inputs.k)
    counts = jnp.where(jnp.any(mask), counts, 0)
    return counts > 0, SampledState(counts.astype(jnp.float32) / inputs.k)

  return Selector(init=lambda n, params: SampledState(jnp.zeros((n,), jnp.float32)),
                  select=select, sampling_weights=lambda state: state.weights,
                  report=lambda state: {"distinct": jnp.sum(state.weights > 0)},
                  spec={"name": "md"})


@registry.register("selector", "md", reads="metadata")
def _md(settings, context: registry.BuildContext) -> Selector:
  """MD sampling: K draws with replacement by data size, each draw weighted 1/K (FedProx)."""
  del settings, context
  return md_selector()
