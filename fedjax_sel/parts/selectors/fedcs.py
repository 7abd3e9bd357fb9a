"""FedCS (Nishio and Yonetani, "Client Selection for Federated Learning with Heterogeneous
Resources in Mobile Edge", ICC 2019) as a pure `Selector` on the simulated clock
(docs/papers/selection.md, 'FedCS').

A round asks a random share of the clients it may choose from for their resources (the
`request` share, the paper's C), then selects greedily, as the paper's Algorithm 2: the server
broadcasts the model (as slow as the slowest link of the selected set), clients compute in
parallel and upload one after another; each step takes the candidate that lengthens the schedule
least, `T^d(S + k) - T^d(S) + t_UL(k) + max(0, t_UD(k) - Theta)`, and keeps it when the round
then ends before the deadline, `T^d(S + k) + Theta' < deadline` (Theta the end of the last upload).
A rejected candidate is dropped and the greedy goes on. At most K are kept (the simulator's
slots). t_UD is a client's expected compute time, t_UL and the broadcast its transfer time of one
model copy (`timing.py`).

Examples:
  >>> import jax.numpy as jnp
  >>> fedcs_greedy(jnp.ones(3, bool), jnp.array([1.0, 5.0, 2.0]), jnp.array([1.0, 1.0, 1.0]),
  ...              deadline=5.0, k=3).tolist()
  [True, False, True]
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel import registry
from fedjax_sel.parts.selectors.baselines import top_k_mask
from fedjax_sel.parts.selectors.timing import context_times
from fedjax_sel.parts.types import RoundInputs, Selector


def fedcs_greedy(candidates: jax.Array, compute: jax.Array, transfer: jax.Array,
                 deadline, k: int) -> jax.Array:
  """`[N]` bool: Algorithm 2's greedy over `candidates` (ties to the lower index), at most `k`
  kept; `compute` and `transfer` are `[N]` seconds (t_UD; t_UL and the broadcast)."""
  n = candidates.shape[0]
  compute = compute.astype(jnp.float32)
  transfer = transfer.astype(jnp.float32)

  def step(_, carry):
    remaining, chosen, theta, broadcast, count = carry
    widened = jnp.maximum(broadcast, transfer)       # T^d of S + {k}: its slowest link.
    cost = widened - broadcast + transfer + jnp.maximum(0.0, compute - theta)
    x = jnp.argmin(jnp.where(remaining, cost, jnp.inf))
    live = remaining[x]
    theta_x = theta + transfer[x] + jnp.maximum(0.0, compute[x] - theta)
    keep = live & (widened[x] + theta_x < deadline) & (count < k)
    return (remaining.at[x].set(False), chosen.at[x].set(chosen[x] | keep),
            jnp.where(keep, theta_x, theta), jnp.where(keep, widened[x], broadcast),
            count + keep.astype(jnp.int32))

  carry = (candidates, jnp.zeros((n,), bool), jnp.float32(0.0), jnp.float32(0.0), jnp.int32(0))
  return jax.lax.fori_loop(0, n, step, carry)[1]


class FedCSState(NamedTuple):
  """The clients' expected `[N]` compute and transfer seconds, and the deadline."""

  compute: jax.Array
  transfer: jax.Array
  deadline: jax.Array


def fedcs_selector(compute, transfer, deadline_s: float, request: float = 0.1) -> Selector:
  """FedCS for at most K clients.

  Args:
    compute: `[N]` expected compute seconds per round (t_UD).
    transfer: `[N]` seconds to move one model copy (t_UL, and the broadcast).
    deadline_s: the round's deadline in seconds (T_round), > 0.
    request: the share of the clients asked for their resources each round (C), in (0, 1]; at
      least K are asked.
  """
  compute = np.asarray(compute, np.float32)
  transfer = np.asarray(transfer, np.float32)
  if not (math.isfinite(deadline_s) and deadline_s > 0):
    raise ValueError(f"fedcs deadline must be a finite number of seconds > 0, got {deadline_s}")
  if registry.concrete(request) and not 0.0 < request <= 1.0:
    raise ValueError(f"fedcs request must be in (0, 1], got {request}")

  def init(n, params):
    del params
    if n != compute.shape[0]:
      raise ValueError(f"fedcs was given {compute.shape[0]} clients' times for {n} clients")
    # In the state, not the program: runs of other data (seeds) share one compiled round.
    return FedCSState(jnp.asarray(compute), jnp.asarray(transfer), jnp.float32(deadline_s))

  def select(state, key, inputs: RoundInputs, mask):
    asked = max(inputs.k, math.ceil(request * mask.shape[0]))
    candidates = top_k_mask(jax.random.uniform(key, mask.shape), mask, asked)
    # The greedy over the asked clients alone (O(asked^2), not O(N^2)).
    ids = jnp.nonzero(candidates, size=asked, fill_value=0)[0]
    live = jnp.arange(asked) < jnp.sum(candidates)
    kept = fedcs_greedy(live, state.compute[ids], state.transfer[ids], state.deadline, inputs.k)
    return jnp.zeros(mask.shape, bool).at[ids].max(kept & live), state

  return Selector(init=init, select=select,
                  spec={"name": "fedcs", "deadline_s": float(deadline_s),
                        "request": request})


@dataclasses.dataclass(frozen=True)
class FedCSSettings:
  """FedCS (Nishio and Yonetani 2019)."""

  deadline_s: float | None = registry.setting(None, "The round deadline it schedules for, in "
                                              "seconds (default: the run's --deadline_s, else "
                                              "twice the median client's expected round alone).",
                                              within="> 0")
  request: float = registry.setting(0.1, "Share of the clients asked for their resources each "
                                    "round (the paper's C; at least K).", within="(0, 1]",
                                    sweep="structural")  # A count of clients asked.


def default_deadline(context: registry.BuildContext, round_alone: np.ndarray) -> float:
  """The run's clock deadline where it has one, else twice the median client's round alone."""
  if context.deadline_s:
    return float(context.deadline_s)
  return float(2.0 * np.median(round_alone))


@registry.register("selector", "fedcs", FedCSSettings, requires=("clock",),
                   reads="metadata")
def _fedcs(settings: FedCSSettings, context: registry.BuildContext) -> Selector:
  """FedCS: greedy deadline-aware selection with sequential uploads, on the clock."""
  times = context_times(context, "fedcs")
  deadline = settings.deadline_s or default_deadline(context, times.round)
  return fedcs_selector(times.compute, times.transfer, deadline, settings.request)
