"""Runs that differ in their parts' value settings share one compiled round
(`fedjax_sel/engine/sweeps.py`): each run of the batch equals the same run alone."""

import dataclasses
import itertools

import jax
import numpy as np
import optax
import pytest

import fedjax_sel as fs
from fedjax_sel import registry
from fedjax_sel.engine import runs, sweeps
from fedjax_sel.engine.placement import place
from fedjax_sel.host.compilation import CompileLog
from fedjax_sel.parts.selectors.oort import OortConfig
from tests import toy_selector

N, K, ROUNDS = 16, 4, 3


@pytest.fixture(scope="module")
def datasets():
  return [fs.build_dataset(fs.DatasetSpec("digits", num_clients=N), seed=s) for s in (0, 1)]


def _spec(datasets, selector_of, lr, seed):
  data = datasets[seed]
  profile = fs.lognormal_profiles(N, seed=0)
  context = registry.BuildContext(k=K, rounds=ROUNDS, seed=seed, num_clients=N, num_available=N,
                                  data=data, profile=profile)
  return fs.build_run(fs.build_model("logreg", data.feature_shape, 10), data,
                      lambda rate: optax.sgd(rate), fs.LocalHParams(batch_size=16),
                      fs.uniform_availability(N, 10), selector_of(context), fs.fedavg(), K,
                      seed=seed, lr_schedule=fs.constant_lr(lr), system_profile=profile,
                      capacity=fs.Capacity.of(datasets))


def _alone(spec):
  placement, state = place(spec), spec.initial_state()
  selected = []
  for _ in range(ROUNDS):
    state, metrics = placement.step(state)
    selected.append(np.asarray(metrics["selected"]))
  return state, selected


def _batched(specs, chunk):
  with CompileLog() as log:
    batch = fs.RunBatch(specs, runs_chunk=chunk)
    states, selected = batch.init(), []
    for _ in range(ROUNDS):
      states, metrics = batch.step(states)
      selected.append(np.asarray(metrics["selected"]))
  return batch, states, selected, log


def _oort(exploration):
  return lambda context: registry.build("selector", "oort",
                                        OortConfig(exploration_factor=exploration), context)


@pytest.mark.parametrize("chunk", [1, 12])
def test_a_grid_of_oort_explorations_lrs_and_seeds_is_one_program(datasets, chunk):
  grid = list(itertools.product((0.1, 0.5, 0.9), (0.05, 0.1), (0, 1)))
  specs = [_spec(datasets, _oort(e), lr, s) for e, lr, s in grid]
  batch, states, selected, log = _batched(specs, chunk)
  assert batch.config.swept == (("selector", "exploration_factor"),)
  assert log.count("_batched_step") + log.loaded_by_name["jit(_batched_step)"] == 1
  for i, spec in enumerate(specs):
    state, alone = _alone(spec)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(states.params)):
      if chunk == 1:  # Looped: bit for bit.
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b[i]))
      else:  # Vmapped: to float rounding.
        np.testing.assert_allclose(np.asarray(a), np.asarray(b[i]), rtol=1e-5, atol=1e-6)
    assert all(np.array_equal(x, y[i]) for x, y in zip(alone, selected))


def test_a_setting_the_round_reads_as_a_constant_travels_as_a_run_value(datasets):
  # tests/toy_selector.py's temperature is read inside `select`, not kept in a state.
  tempered = lambda t: lambda context: registry.build(
      "selector", "tempered_loss", toy_selector.TemperedLossSettings(temperature=t), context)
  specs = [_spec(datasets, tempered(t), 0.1, 0) for t in (0.01, 100.0)]
  batch, _, selected, log = _batched(specs, 1)
  assert batch.config.swept == (("selector", "temperature"),)
  assert log.count("_batched_step") + log.loaded_by_name["jit(_batched_step)"] == 1
  for i, spec in enumerate(specs):
    assert all(np.array_equal(x, y[i]) for x, y in zip(_alone(spec)[1], selected))
  assert any(not np.array_equal(y[0], y[1]) for y in selected)  # The values matter.


@dataclasses.dataclass(frozen=True)
class _AsNumberSettings:
  scale: float = registry.setting(1.0, "Read as a Python number by its factory.")


@registry.register("selector", "tests_as_number", _AsNumberSettings)
def _as_number(settings, context):
  del context
  rounds = int(settings.scale * 3)  # A Python number: this setting cannot be a run value.
  return fs.Selector(init=lambda n, params: (),
                     select=lambda state, key, inputs, mask: (mask & (inputs.round < rounds),
                                                              state),
                     spec={"name": "tests_as_number"})


def test_a_value_setting_a_factory_reads_as_a_number_is_named(datasets):
  as_number = lambda s: lambda context: registry.build("selector", "tests_as_number",
                                                       _AsNumberSettings(scale=s), context)
  specs = [_spec(datasets, as_number(s), 0.1, 0) for s in (1.0, 2.0)]
  with pytest.raises(ValueError, match="tests_as_number's scale, which a part's factory reads "
                                       "as a Python number.*sweep='structural'"):
    _batched(specs, 1)


def test_settings_declare_how_they_sweep():
  fields = {f.name: f for f in dataclasses.fields(OortConfig)}
  assert registry.sweeps(fields["exploration_factor"]) == "value"
  assert registry.sweeps(fields["pacer_step"]) == "structural"  # An int: a history's length.
  assert registry.sweeps(fields["variant"]) == "structural"
  with pytest.raises(ValueError, match="sweep must be one of"):
    registry.setting(1.0, "x", sweep="maybe")


def test_runs_group_by_the_program_they_share(datasets):
  poc = lambda d: lambda context: registry.build(
      "selector", "poc", registry.lookup("selector", "poc").settings(d=d), context)
  specs = [_spec(datasets, poc(d), lr, 0) for d in (4, 8) for lr in (0.05, 0.1)]
  specs += [_spec(datasets, _oort(e), 0.1, 0) for e in (0.2, 0.4)]
  # Power of choice's d sets how many candidates it scores (structural): a program per value.
  assert sweeps.program_groups([s.config for s in specs]) == [[0, 1], [2, 3], [4, 5]]


def _value_settings():
  """(kind, part, field) of every value setting of the package's parts (`registry.sweeps`)."""
  out = []
  for kind in ("selector", "filter", "rule", "aggregator", "server_optimizer"):
    for name in registry.names(kind):
      entry = registry.lookup(kind, name)
      if not entry.factory.__module__.startswith("fedjax_sel."):  # This file's own.
        continue
      for field in dataclasses.fields(entry.settings):
        if registry.sweeps(field) == "value" and isinstance(field.default, float):
          out.append((kind, name, field.name))
  return out


ARGUMENT = {"selector": "selector", "filter": "filter", "rule": "participation",
            "aggregator": "aggregator", "server_optimizer": "server_optimizer"}


@pytest.mark.parametrize("kind,name,field", _value_settings())
def test_every_value_setting_of_the_registry_traces_as_a_run_value(kind, name, field):
  """What the registry calls a value is one: two runs that differ in it batch as one program
  whose round traces with the setting as a traced scalar (else it must say "structural")."""
  data = fs.build_dataset(fs.DatasetSpec("digits", num_clients=N, val_fraction=0.2,
                                         public_fraction=0.1), seed=0)
  model = fs.build_model("logreg", data.feature_shape, 10)
  profile = fs.lognormal_profiles(N, seed=0)
  context = registry.BuildContext(k=K, rounds=10, num_clients=N, num_available=N, data=data,
                                  model=model, profile=profile)
  base = registry.lookup(kind, name).settings()
  value = getattr(base, field)
  specs = []
  for v in (value, value * 0.9 if value else 0.1):
    parts = {"selector": fs.random_selector(), "aggregator": fs.fedavg()}
    parts[ARGUMENT[kind]] = registry.build(kind, name, dataclasses.replace(base, **{field: v}),
                                           context)
    specs.append(fs.build_run(model, data, lambda rate: optax.sgd(rate),
                              fs.LocalHParams(batch_size=16), fs.uniform_availability(N, 12),
                              parts.pop("selector"), parts.pop("aggregator"), K, seed=0,
                              system_profile=profile, **parts))
  batch = fs.RunBatch(specs, runs_chunk=1)
  assert batch.config.swept == ((ARGUMENT[kind], field),)
  jax.eval_shape(lambda s: runs._batched_step(batch.keyed, s, batch.arrays, batch.run_values),
                 batch.init())
