"""The registry's settings fields: ranges (`within`), their checks and help texts."""

import dataclasses
import math
import re

import numpy as np
import pytest

from experiments.launch import config
from fedjax_sel import registry
from fedjax_sel.data.boundary import BoundaryShape


@pytest.mark.parametrize("text,inside,outside,shown", [
    ("[0, 1)", (0.0, 0.5, 0.999), (-0.1, 1.0, math.nan, math.inf), "in [0, 1)"),
    ("(0, 1]", (1e-9, 1.0), (0.0, 1.5, math.nan), "in (0, 1]"),
    ("[0, 0.9]", (0.0, 0.9), (0.91,), "in [0, 0.9]"),
    (">= 1", (1, 2, 10**9, np.int64(3), np.float32(1.5)), (0, 0.5, math.inf, "2", True), ">= 1"),
    ("> 0", (1e-12, 3.0), (0.0, -1.0, math.nan), "> 0"),
])
def test_a_range_holds_what_it_reads_and_says_so(text, inside, outside, shown):
  within = registry.Range.parse(text)
  assert all(v in within for v in inside)
  assert not any(v in within for v in outside)
  assert str(within) == shown


@pytest.mark.parametrize("text", ["0..1", "[0 1]", "<= 3", ">= one", "[a, b)"])
def test_a_malformed_range_is_refused_naming_the_forms(text):
  with pytest.raises(ValueError, match=r"'\[0, 1\)', '\(0, 1\]', '>= 1' or '> 0'"):
    registry.Range.parse(text)


def test_check_values_names_the_field_its_range_and_its_choices():
  @dataclasses.dataclass(frozen=True)
  class Settings:
    share: float = registry.setting(0.5, "Share.", within="(0, 1]")
    rule: str = registry.setting("a", "Rule.", choices=("a", "b"))
    size: int | None = registry.setting(None, "Size (None: all).", within=">= 1")

  registry.check_values(Settings())  # None stands for a default: not checked.
  with pytest.raises(registry.SettingError, match=r"^share must be in \(0, 1\], got 0.0$"):
    registry.check_values(Settings(share=0.0))
  with pytest.raises(registry.SettingError, match="^rule must be one of a, b, got 'c'$"):
    registry.check_values(Settings(rule="c"))
  with pytest.raises(registry.SettingError) as e:
    registry.check_values(Settings(size=0))
  assert e.value.field == "size"
  assert registry.setting_help(dataclasses.fields(Settings)[0]) == "Share, in (0, 1]."


def _settings_classes():
  classes = {registry.lookup(kind, name).settings
             for kind in registry.KINDS for name in registry.names(kind)}
  return sorted(classes | set(config.SECTIONS.values()) | {BoundaryShape},
                key=lambda c: f"{c.__module__}.{c.__qualname__}")


# A range stated in words at the end of a help text ("..., in [0, 1]." or "..., >= 1.").
_RANGE_IN_WORDS = re.compile(r"(, in [\[(][^\])]*[\])]|, >=? -?[\d.]+)\.?$")


@pytest.mark.parametrize("cls", _settings_classes(), ids=lambda c: c.__qualname__)
def test_every_default_lies_in_its_fields_range_and_each_range_is_stated_once(cls):
  """A mistyped range (or default) shows here, not in a user's run; a range written into a help
  text instead of `within=` would go unchecked."""
  registry.check_values(cls())
  for f in dataclasses.fields(cls):
    help_text = f.metadata.get("help") or ""
    assert not _RANGE_IN_WORDS.search(help_text), (
        f"{cls.__name__}.{f.name}: state its range with within=, not in its help {help_text!r}")
