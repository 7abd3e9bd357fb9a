"""Asynchronous server rules: FedBuff and FedAsync, and their staleness functions
(docs/papers/asynchronous.md).

In the asynchronous mode (`engine/asynchronous.py`) C clients train at once, a freed slot is
refilled at once (`engine/async_schedule.py`), and a server step takes the next K updates that
arrive. An update computed from the global model of version v and
applied at version t has staleness tau = t - v, and is discounted by s(tau):

- constant: s = 1;
- polynomial: s = (1 + tau)^(-a)  (FedBuff's 1 / sqrt(1 + tau) is a = 0.5);
- hinge: s = 1 for tau <= b, else 1 / (a (tau - b) + 1)  (FedAsync).

FedBuff (Nguyen et al., AISTATS 2022) aggregates the buffer's staleness-weighted deltas,
`w + aggregate_i(w + s_i delta_i) - w`, i.e. with FedAvg's weights `w + sum_i p_i s_i delta_i`
(the paper's 1 / K is `weighting="uniform"`), and a server optimizer then takes that as its
pseudo-gradient (the paper's server learning rate is `server_sgd(lr)`). FedAsync (Xie et al.,
2019) mixes the arriving local model into the global one, `w + alpha s(tau) (x - w)`, with K = 1
(K > 1 mixes the buffer's aggregate with the mean of its weights).

Examples:
  >>> spec = fedbuff(concurrency=20, staleness="polynomial")
  >>> [round(float(x), 4) for x in staleness_weight(spec, jnp.array([0, 3, 8]))]
  [1.0, 0.5, 0.3333]
  >>> spec = fedasync(concurrency=10, staleness="hinge", a=10.0, b=4.0)
  >>> [round(float(x), 4) for x in staleness_weight(spec, jnp.array([4, 5, 6]))]
  [1.0, 0.0909, 0.0476]
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

RULES = ("fedbuff", "fedasync")
STALENESS = ("constant", "polynomial", "hinge")


class AsyncSpec(NamedTuple):
  """The asynchronous mode's static settings (part of the compiled step).

  Attributes:
    concurrency: C, clients training at once (>= K, the simulator's clients_per_round, which is
      the buffer size: updates per server step).
    rule: "fedbuff" (aggregate staleness-weighted deltas) or "fedasync" (mix the aggregate in with
      weight alpha s(tau)).
    staleness: "constant", "polynomial" or "hinge".
    a, b: the staleness function's exponent / slope and hinge point.
    alpha: FedAsync's mixing weight, in (0, 1].
    window_s: simulated seconds per availability index: a client is available at time T when the
      availability model has it at index floor(T / window_s).
    max_staleness: updates staler than this many server steps are discarded when they arrive
      (counted as `stale_dropped`, as FedScale's and FLSim's FedBuff do); None keeps every one.
  """

  concurrency: int
  rule: str = "fedbuff"
  staleness: str = "polynomial"
  a: float = 0.5
  b: float = 4.0
  alpha: float = 0.6
  window_s: float = 1.0
  max_staleness: int | None = None


def async_spec(concurrency: int, rule: str = "fedbuff", staleness: str = "polynomial",
               a: float = 0.5, b: float = 4.0, alpha: float = 0.6, window_s: float = 1.0,
               max_staleness: int | None = None) -> AsyncSpec:
  """An `AsyncSpec`, checked: ValueError naming the argument and its accepted values."""
  if rule not in RULES:
    raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
  if staleness not in STALENESS:
    raise ValueError(f"staleness must be one of {STALENESS}, got {staleness!r}")
  if int(concurrency) < 1:
    raise ValueError(f"concurrency must be >= 1, got {concurrency}")
  for name, value, low in (("a", a, 0.0), ("b", b, 0.0)):
    if not value >= low:
      raise ValueError(f"{name} must be >= {low}, got {value}")
  if not 0.0 < alpha <= 1.0:
    raise ValueError(f"alpha must be in (0, 1], got {alpha}")
  if not window_s > 0.0:
    raise ValueError(f"window_s must be > 0 simulated seconds, got {window_s}")
  if max_staleness is not None and not (isinstance(max_staleness, int) and max_staleness >= 0):
    raise ValueError(f"max_staleness must be an integer >= 0 or None, got {max_staleness!r}")
  return AsyncSpec(int(concurrency), rule, staleness, float(a), float(b), float(alpha),
                   float(window_s), max_staleness)


def fedbuff(concurrency: int, staleness: str = "polynomial", a: float = 0.5,
            window_s: float = 1.0, max_staleness: int | None = None) -> AsyncSpec:
  """FedBuff: the buffer's deltas, each weighted by s(tau) (default 1 / sqrt(1 + tau))."""
  return async_spec(concurrency, "fedbuff", staleness, a=a, window_s=window_s,
                    max_staleness=max_staleness)


def fedasync(concurrency: int, staleness: str = "polynomial", a: float = 0.5, b: float = 4.0,
             alpha: float = 0.6, window_s: float = 1.0,
             max_staleness: int | None = None) -> AsyncSpec:
  """FedAsync: `w + alpha s(tau) (x - w)` for each arriving model (use K = 1)."""
  return async_spec(concurrency, "fedasync", staleness, a=a, b=b, alpha=alpha, window_s=window_s,
                    max_staleness=max_staleness)


def staleness_weight(spec: AsyncSpec, tau: jax.Array) -> jax.Array:
  """s(tau), float32, for integer staleness values `tau >= 0`."""
  tau = jnp.asarray(tau, jnp.float32)
  if spec.staleness == "constant":
    return jnp.ones_like(tau)
  if spec.staleness == "polynomial":
    return jnp.power(1.0 + tau, -jnp.float32(spec.a))
  return jnp.where(tau <= spec.b, 1.0, 1.0 / (spec.a * (tau - spec.b) + 1.0))


def candidate_models(spec: AsyncSpec, params, updates, weights: jax.Array) -> Any:
  """`[C, ...]` the models the aggregator combines: FedBuff's `w + s_i delta_i` (`updates` hold
  deltas), FedAsync's arriving local models themselves (`updates` hold models)."""
  if spec.rule == "fedasync":
    return updates
  return jax.tree.map(
      lambda w, d: (w[None] + weights.reshape(-1, *([1] * w.ndim)) * d).astype(w.dtype),
      params, updates)


def mix(spec: AsyncSpec, params, aggregate, mask: jax.Array, weights: jax.Array) -> Any:
  """The server's new model before any server optimizer: the aggregate (FedBuff), or FedAsync's
  `w + alpha s (aggregate - w)` with s the mean weight of the arrived updates (`mask`)."""
  if spec.rule == "fedbuff":
    return aggregate
  s = jnp.sum(jnp.where(mask, weights, 0.0)) / jnp.maximum(jnp.sum(mask), 1)
  mixing = jnp.float32(spec.alpha) * s
  return jax.tree.map(lambda w, x: (w + mixing * (x.astype(jnp.float32) - w)).astype(w.dtype),
                      params, aggregate)
