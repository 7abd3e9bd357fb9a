"""Client availability S_t: a pure function of (seed, round) (SPEC section 0, step 1).

Example:
  >>> avail = uniform_availability(num_clients=10, num_available=4, period=5)
  >>> int(avail.sample(0, 3).sum()), bool((avail.sample(0, 3) == avail.sample(0, 4)).all())
  (4, True)
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel import keys as keylib


class Availability(NamedTuple):
  """`sample(seed, round) -> [N] bool`; jit-able in both arguments."""

  sample: Callable[[jax.Array, jax.Array], jax.Array]
  num_available: int


def uniform_availability(num_clients: int, num_available: int, period: int = 5,
                         redraw_first_period: bool = False) -> Availability:
  """n clients drawn uniformly without replacement, redrawn every `period` rounds.

  Args:
    num_clients: N.
    num_available: n, in 1..N.
    period: rounds between redraws (`avail_period`), >= 1.
    redraw_first_period: also redraw every round during the first `period` rounds (FilFL's
      reference mode).
  """
  if not 1 <= num_available <= num_clients:
    raise ValueError(f"num_available must be in 1..{num_clients} (num_clients), got {num_available}")
  if period < 1:
    raise ValueError(f"avail_period must be >= 1, got {period}")

  def sample(seed, round_idx):
    epoch = round_idx // period
    if redraw_first_period:
      epoch = jnp.where(round_idx < period, round_idx, period + epoch)
    u = jax.random.uniform(keylib.round_key(seed, epoch, keylib.AVAILABILITY), (num_clients,))
    chosen = jax.lax.top_k(u, num_available)[1]
    return jnp.zeros((num_clients,), bool).at[chosen].set(True)

  return Availability(sample, num_available)
