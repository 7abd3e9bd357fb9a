"""What a selector may read under differential privacy, and its statistics privatized.

Every registered selector declares what its choice reads (`registry.READS`, docs/papers/
privacy.md, "Selection and privacy"). Under a private aggregate (`check_selection`):

* "nothing": uniform (`random`, K of N without replacement) and Poisson (`poisson`) sampling,
  the two whose amplification by sampling the accountant states;
* "metadata" (data sizes, speeds, availability): allowed, without amplification (no bound for a
  choice that depends on public per-client facts is stated by dp-accounting; a Poisson-like
  independent inclusion with known probabilities q_k would be amplified by max q_k);
* "stats" (private statistics read as the round's scalar per-client stats): refused unless
  `selection="privatized"` (`privatized`: each is clipped to [0, B] and noised with
  N(0, (sigma_s B)^2), and the accountant composes one Gaussian of multiplier sigma_s per
  statistic and round) or `selection="unaccounted"`;
* "private" (updates, gradients, observed training losses), or undeclared: refused unless
  `selection="unaccounted"`, when the guarantee covers the aggregate only.

Example:
  >>> import jax, jax.numpy as jnp
  >>> from fedjax_sel.parts.selectors.baselines import power_of_choice
  >>> from fedjax_sel.parts.types import RoundInputs
  >>> sel = privatized(power_of_choice(d=4), noise=1.0, clip=5.0)
  >>> inputs = RoundInputs.create(jnp.ones(4), stats={"loss": jnp.arange(4.0)}, k=2)
  >>> chosen, _ = sel.select(sel.init(4, None), jax.random.PRNGKey(0), inputs, jnp.ones(4, bool))
  >>> int(chosen.sum()), statistics_read(sel)
  (2, 1)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_sel import registry
from fedjax_sel.parts.types import Selector

# The selectors whose sampling the accountant amplifies by (`accountant.Accounting.sampling`),
# when every client is available every round: uniform K of N without replacement, and Poisson.
AMPLIFIED = {"random": "uniform", "poisson": "poisson"}
READ_TEXT = {"nothing": "nothing of the clients", "metadata": "public metadata (sizes, speeds)",
             "stats": "private statistics (its per-client stats, or their last reported loss)",
             "private": "private data (updates, gradients or training losses)",
             "": "undeclared data (registered without reads=), taken as private"}


def reads(name: str) -> str:
  """What the registered selector `name` reads (`registry.READS`; "" if undeclared)."""
  return registry.lookup("selector", name).reads


def check_selection(selector: str, selection: str, others: tuple[str, ...] = ()) -> None:
  """ValueError, before any compute, naming a selector whose choice the accounting cannot cover
  under `selection` ("accounted", "privatized", "unaccounted"), or the `others` (a filter's or a
  participation rule's flag and name, which read private data)."""
  if selection == "unaccounted":
    return
  what = reads(selector)
  if what in ("stats", "private", ""):
    fix = ("--dp_selection=privatized (its statistics clipped and noised, and accounted) or "
           "--dp_selection=unaccounted" if what == "stats" else "--dp_selection=unaccounted")
    if not (what == "stats" and selection == "privatized"):
      raise ValueError(f"under differential privacy the selector {selector!r} is refused: its "
                       f"choice reads {READ_TEXT[what]}, which the accountant does not cover; "
                       f"use {fix} (the guarantee then covering the aggregate only), or a "
                       "selector reading no private data")
  elif selection == "privatized":
    raise ValueError(f"--dp_selection=privatized: the selector {selector!r} reads "
                     f"{READ_TEXT[what]}, nothing to privatize; use --dp_selection=accounted")
  if others:
    raise ValueError(f"under differential privacy {', '.join(others)} is refused: a filter or "
                     "participation rule decides from the clients' private data, which the "
                     "accountant does not cover; drop it or use --dp_selection=unaccounted")


def statistics_read(selector: Selector) -> int:
  """Private statistics a "stats" selector reads each round: its `needs`, or the last reported
  loss when it needs none (power of choice's rpow)."""
  return max(len(selector.needs), 1)


def noised(values: jax.Array, key: jax.Array, noise, clip) -> jax.Array:
  """`clip(values, 0, B) + N(0, (sigma_s B)^2)`: a statistic of sensitivity B (per client) with
  Gaussian noise of multiplier `noise`; +inf (a client never seen) stays +inf."""
  kept = jnp.clip(values, 0.0, clip) + noise * clip * jax.random.normal(key, values.shape)
  return jnp.where(jnp.isposinf(values), values, kept).astype(values.dtype)


def privatized(selector: Selector, noise: float, clip: float) -> Selector:
  """`selector` reading its statistics clipped to [0, `clip`] and noised (`noised`): those of
  its `needs`, or the clients' last reported loss when it needs none."""
  needs, inner = selector.needs, selector.select  # Not the part: its recipe holds the seed.
  if "grad" in needs:
    raise ValueError("the stacked gradients are not a scalar statistic: they cannot be privatized "
                     "here")

  def select(state, key, inputs, mask):
    own, key = jax.random.split(key)
    if needs:
      stats = type(inputs.stats)({**inputs.stats, **{
          name: noised(inputs.stats[name], jax.random.fold_in(own, i), noise, clip)
          for i, name in enumerate(needs)}})
      inputs = inputs._replace(stats=stats)
    else:
      clients = inputs.clients
      inputs = inputs._replace(clients=clients._replace(
          last_loss=noised(clients.last_loss, own, noise, clip)))
    return inner(state, key, inputs, mask)

  spec = {**(selector.spec or {"name": "selector"}), "privatized": {"noise": noise, "clip": clip}}
  return selector._replace(select=select, spec=spec, recipe=None)
