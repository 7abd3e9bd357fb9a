"""The parts' contracts, checked where the round runs them.

Every mask a part returns is `[N]` bool: checked when the round is traced (`check_mask`, naming the
part). What a mask may hold is counted inside the compiled round (`CONTRACTS`: a filter's set lies
inside the available clients, a selector's choice inside the filtered-in set with at most K
clients, a rule's trained and aggregated clients inside the selected); a round with a non-zero
count stops the run (`check_contracts`), naming the part, what it broke and the round.

Example:
  >>> import jax.numpy as jnp
  >>> from fedjax_sel.parts.selectors.baselines import random_selector
  >>> from typing import NamedTuple
  >>> class Config(NamedTuple):
  ...   selector: object
  >>> try:
  ...   check_contracts(Config(random_selector()),
  ...                   {"round": jnp.int32(3), "contract": {"selector_over_k": jnp.int32(2)}})
  ... except ContractError as e:
  ...   print(str(e)[:56])
  round 3: the selector 'random' chose more than K clients
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.parts.types import part_name

# Metric key -> (part, what breaks it).
CONTRACTS = {
    "filter_outside_available": ("filter", "kept clients that are not available"),
    "selector_outside_filtered": ("selector", ("chose clients outside the available, "
                                               "filtered-in set it was given")),
    "selector_over_k": ("selector", "chose more than K clients"),
    "rule_outside_selected": ("participation", ("trained or aggregated clients that were not "
                                                "selected")),
}


class ContractError(ValueError):
  """A part returned a mask that breaks its contract (`parts/types.py`)."""


def count(mask) -> jax.Array:
  """The number of True entries of `mask`, int32."""
  return jnp.sum(mask).astype(jnp.int32)


def check_mask(config, role: str, what: str, mask, n: int) -> None:
  """At trace time: a part's `what` mask is `[N]` bool, else `ContractError` naming the part."""
  shape, dtype = tuple(jnp.shape(mask)), jnp.result_type(mask)
  if shape != (n,) or dtype != jnp.bool_:
    raise ContractError(f"the {role} {part_name(getattr(config, role))!r} returned {what} of "
                        f"shape {shape} and dtype {dtype}; a part's masks are [N] = ({n},) bool")


def no_breaks() -> dict:
  """Every contract count at 0 (a composition whose parts cannot break one)."""
  return {key: jnp.zeros((), jnp.int32) for key in CONTRACTS}


def check_contracts(config, metrics: dict, runs_axis: bool = False) -> None:
  """Raises `ContractError` naming the part, what it broke, the round (and the run, with
  `runs_axis`) when a round's contract counts are not all zero. `metrics` may hold one round, a
  `steps` stack of rounds or a batch of runs."""
  rounds = np.asarray(metrics["round"])
  for key, counts in metrics["contract"].items():
    counts = np.asarray(counts)
    if not counts.any():
      continue
    at = tuple(np.argwhere(counts)[0])
    role, what = CONTRACTS[key]
    run = f", run {at[0]}" if runs_axis else ""
    raise ContractError(f"round {int(rounds[at])}{run}: the {role} "
                        f"{part_name(getattr(config, role))!r} {what} ({int(counts[at])} "
                        "clients); the run stops here, before anything of this round is kept")


class NoteName:
  """A part's name as the notes of `noted` give it. Every `NoteName` equals every other, so the
  name, which is not what the part computes, leaves parts equal in structure equal in their
  signature (`signature.py`): FilFL's DGF and RGF, whose mode is their state, have one program.

  Example:
    >>> NoteName("dgf") == NoteName("rgf"), NoteName("dgf").text
    (True, 'dgf')
  """

  __slots__ = ("text",)

  def __init__(self, text: str):
    self.text = text

  def __eq__(self, other) -> bool:
    return isinstance(other, NoteName)

  def __hash__(self) -> int:
    return 0

  def __repr__(self) -> str:  # The same in every process: the executable store's key reads it.
    return "NoteName"


def noted(kind: str, part):
  """`part` whose functions add a note naming the part and the function to any exception they
  raise (a shape error while the round is traced, a missing statistic), so that the traceback of
  a user's broken part says which part broke. The wrappers trace as the functions do, and parts
  equal in structure stay equal (one compiled program), whatever their names."""
  if part is None:
    return None
  name = NoteName((part.spec or {}).get("name", type(part).__name__))

  def wrap(field, fn):
    def call(*args, **kwargs):
      try:
        return fn(*args, **kwargs)
      except Exception as e:
        e.add_note(f"raised by the {kind} {name.text!r} in its {field}")
        raise
    return call
  return part._replace(**{f: wrap(f, getattr(part, f)) for f in part._fields
                          if f != "spec" and callable(getattr(part, f))})
