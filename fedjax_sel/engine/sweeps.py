"""Runs that differ in their parts' numeric settings, batched as one program.

A part built by the registry (`registry.build`) keeps its recipe: its kind, name, settings and
build context. Runs of a `RunBatch` whose parts differ only in settings the registry calls values
(`registry.sweeps`: floats by default, such as Oort's exploration factor, FedSRC's target or a
server optimizer's tau) share one compiled round: each run carries its values in
`RunValues.settings`, and inside the round each part is built again from its recipe with the run's
values as traced scalars, so every run of the batch computes with its own. Settings that set a
shape or a branch ("structural": power of choice's d, a count) give each value its own program.

Example:
  >>> from fedjax_sel import registry
  >>> from fedjax_sel.parts.selectors.oort import OortConfig
  >>> oort = lambda e: registry.build("selector", "oort", OortConfig(exploration_factor=e),
  ...                                 registry.BuildContext(k=3, rounds=10))
  >>> for name, values in differing([oort(0.3), oort(0.9)]):
  ...   print(name, values)
  exploration_factor (0.3, 0.9)
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from fedjax_sel.engine.contracts import noted
from fedjax_sel.engine.description import program_key

# The config's parts, and how an error inside each names it (`contracts.noted`; None: not noted).
PARTS = {"selector": "selector", "filter": "filter", "participation": "participation rule",
         "aggregator": "aggregator", "server_optimizer": None}


def differing(parts: Sequence[Any]) -> list[tuple[str, tuple[Any, ...]]]:
  """The value settings (`registry.Recipe.value_fields`) in which registry-built `parts` of one
  kind and name differ, each with its values per part; [] for parts without recipes."""
  recipes = [getattr(p, "recipe", None) for p in parts]
  if any(r is None for r in recipes) or len({(r.kind, r.name) for r in recipes}) != 1:
    return []
  out = []
  for field in recipes[0].value_fields():
    values = [getattr(r.settings, field) for r in recipes]
    numbers_only = all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values)
    if numbers_only and len(set(values)) > 1:  # None among them: a program of its own.
      out.append((field, tuple(values)))
  return out


def swept(configs: Sequence[Any]) -> tuple[tuple[str, str], ...]:
  """The `(part, setting)` pairs the round configs of a batch differ in as run values."""
  return tuple((part, field) for part in PARTS
               for field, _ in differing([getattr(c, part) for c in configs]))


def _with(config, pairs, value_of) -> Any:
  """`config` with each part of `pairs` rebuilt with `value_of(part, setting)` for its settings."""
  parts = {}
  for part in {p for p, _ in pairs}:
    values = {field: value_of(part, field) for p, field in pairs if p == part}
    rebuilt = getattr(config, part).recipe.with_values(**values)
    parts[part] = rebuilt if PARTS[part] is None else noted(PARTS[part], rebuilt)
  return config._replace(**parts)


def aligned(config, like, pairs) -> Any:
  """`config` with the swept settings of `like` (a run's config as run 0's, to compare programs)."""
  return _with(config, pairs, lambda part, field: getattr(getattr(like, part).recipe.settings,
                                                          field))


def program_groups(configs: Sequence[Any]) -> list[list[int]]:
  """The runs (indices of their round configs) grouped by the program they can share: runs that
  differ only in run values and value settings fall in one group (a `RunBatch` each), and each
  value of a structural setting makes its own group."""
  groups: list[list[int]] = []
  keys: list[Any] = []
  for i, config in enumerate(configs):
    config = config._replace(proximal=False)  # A batch turns it on for all (mu 0 is a no-op).
    for group, key in zip(groups, keys):
      first = configs[group[0]]._replace(proximal=False)
      if program_key(aligned(config, first, swept([first, config]))) == key:
        group.append(i)
        break
    else:
      groups.append([i])
      keys.append(program_key(config))
  return groups


def run_settings(config, pairs) -> dict[str, jax.Array]:
  """A run's values of the swept settings, as `RunValues.settings` holds them."""
  return {f"{part}.{field}": jnp.float32(getattr(getattr(config, part).recipe.settings, field))
          for part, field in pairs}


def with_run_settings(config, pairs, settings: dict[str, jax.Array]) -> Any:
  """`config` whose swept parts compute with the run's `settings` (inside the traced round)."""
  if not pairs:
    return config
  try:
    return _with(config, pairs, lambda part, field: settings[f"{part}.{field}"])
  except jax.errors.ConcretizationTypeError as e:
    names = ", ".join(f"{getattr(config, p).recipe.name}'s {f}" for p, f in pairs)
    raise ValueError(f"the runs differ in {names}, which a part's factory reads as a Python "
                     "number, so it cannot travel as a run value: declare it "
                     "registry.setting(..., sweep='structural') (a program per value), or "
                     "batch runs of one value") from e


def check_traceable(config, pairs, settings: dict[str, jax.Array]) -> None:
  """Builds the swept parts from traced `settings` once, so that a factory that needs a
  setting's concrete value is named (`with_run_settings`'s error) before anything runs."""
  if pairs:
    jax.make_jaxpr(lambda s: (with_run_settings(config, pairs, s), 0)[1])(settings)
