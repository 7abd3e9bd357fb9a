"""The registry: its settings fields (ranges, `within`, their checks and help texts), and the
parts it finds where they are written."""

import ast
import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from experiments.launch import config
from fedjax_sel import registry
from fedjax_sel.data.boundary import BoundaryShape

from tests.hang_guard import HANG_GUARD_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


NEW_PART = """
import runpy, sys
import fedjax_sel.parts.selectors as selectors
selectors.__path__.append(sys.argv[1])  # As if the module were written in that folder.
from fedjax_sel import registry

print("listed:", "lowest_index" in registry.names("selector"))
sys.argv = ["experiments.run", "--selector=lowest_index", "--num_clients=12",
            "--num_available=6", "--clients_per_round=3", "--rounds=2", "--seeds=0",
            "--out_dir=" + sys.argv[2]]
runpy.run_module("experiments.run", run_name="__main__")
"""


def test_a_new_selector_is_one_module_registered_where_it_is_written(tmp_path):
  """A selector module (tests/toy_selector.py, as a researcher writes one) dropped among the
  package's selectors, no list edited: the registry lists it, and `experiments.run` runs it by its
  plain name."""
  folder = tmp_path / "written"
  folder.mkdir()
  shutil.copy(os.path.join(ROOT, "tests", "toy_selector.py"), folder / "lowest_first.py")
  out = tmp_path / "job"
  proc = subprocess.run([sys.executable, "-c", NEW_PART, str(folder), str(out)], cwd=ROOT,
                        capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
  assert proc.returncode == 0 and "listed: True" in proc.stdout, proc.stdout + proc.stderr
  with open(out / "config.json", encoding="utf-8") as f:
    assert json.load(f)["parts"]["selector"]["name"] == "lowest_index"
  with open(out / "seed0" / "metrics.jsonl", encoding="utf-8") as f:
    assert [json.loads(line)["num_selected"] for line in f] == [3, 3]


def test_the_listing_order_is_the_package_modules_order():
  """Names are listed by the module registering them (folders in turn, modules by name), the
  same in every process: --help and the docs read this order."""
  modules = registry.package_modules()
  package = lambda m: registry.PACKAGES.index(".".join(m.split(".")[:2]))
  assert modules == tuple(sorted(modules, key=lambda m: (package(m), m)))
  rank = {m: i for i, m in enumerate(modules)}
  for kind in registry.KINDS:
    owners = [registry.lookup(kind, n).factory.__module__ for n in registry.names(kind)]
    ranks = [rank[m] for m in owners if m in rank]  # Parts registered elsewhere come after.
    assert ranks == sorted(ranks) and owners[:len(ranks)] == [m for m in owners if m in rank]


def test_the_builder_names_no_part():
  """The launchers' builder reads what a part needs and how it is labelled from the registry
  (`requires`, a settings' `requires()`, `label`): no part's name is written in it."""
  path = os.path.join(ROOT, "experiments", "launch", "build.py")
  with open(path, encoding="utf-8") as f:
    words = {n.value for n in ast.walk(ast.parse(f.read()))
             if isinstance(n, ast.Constant) and isinstance(n.value, str)}
  round_parts = ("selector", "filter", "rule", "aggregator", "server_optimizer", "availability")
  named = {name for kind in round_parts for name in registry.names(kind)} & words
  assert not named, named
