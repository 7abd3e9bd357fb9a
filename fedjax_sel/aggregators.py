"""Aggregators: combine the stacked `[K, ...]` local models of the aggregated slots.

Each factory returns an `Aggregator(init, apply)`; `apply(state, global_params, client_params,
inputs)` returns the new global model; with no aggregated slot the global model is kept.

Example:
  >>> import jax.numpy as jnp
  >>> from fedjax_sel.components import AggregateInputs
  >>> agg = fedavg(weighting="examples")
  >>> new, _ = agg.apply((), jnp.zeros(2), jnp.array([[1., 1.], [4., 4.]]),
  ...                    AggregateInputs(jnp.array([True, True]), jnp.array([3, 1]), jnp.zeros(2)))
  >>> new.tolist()
  [1.75, 1.75]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_sel.components import AggregateInputs, Aggregator

WEIGHTINGS = ("uniform", "examples")


def normalized(weights: jax.Array) -> jax.Array:
  """`w / sum(w)`, or all zeros when the weights sum to 0."""
  total = jnp.sum(weights)
  return jnp.where(total > 0, weights / jnp.maximum(total, 1e-30), 0.0)


def weighted_mean(client_params, weights: jax.Array, fallback):
  """`sum_k w_k p_k / sum_k w_k`, or `fallback` when all weights are 0."""
  total = jnp.sum(weights)
  safe = normalized(weights)

  def avg(stack, old):
    mean = jnp.tensordot(safe, stack, axes=1)
    return jnp.where(total > 0, mean, old)

  return jax.tree.map(avg, client_params, fallback)


def fedavg(weighting: str = "examples") -> Aggregator:
  """FedAvg: mean of the aggregated models, uniform or weighted by m_k."""
  if weighting not in WEIGHTINGS:
    raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")

  def weights(mask: jax.Array, num_examples: jax.Array) -> jax.Array:
    w = mask.astype(jnp.float32)
    if weighting == "examples":
      w = w * num_examples.astype(jnp.float32)
    return w

  def apply(state, global_params, client_params, inputs: AggregateInputs):
    return weighted_mean(client_params, weights(inputs.mask, inputs.num_examples),
                         global_params), state

  return Aggregator(init=lambda params: (), apply=apply,
                    linear_weights=lambda mask, n: normalized(weights(mask, n)))
