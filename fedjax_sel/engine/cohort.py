"""The round's cohort: who was chosen (`selection.choose`) and their local training.

The cohort is decided in two halves around its training (`training.train`, outside the filter's
`lax.cond`): `plan_cohort` says who trains, `finish_cohort` reads what they trained. Without a
filter that trains every available client, the selected clients train in K slots. With one
(FilFL's train-all mode) the round trains n slots: on a filtering round every available client
(the filter reads their models), else the clients selected from the kept filtered-in set; the
cohort then gathers the selected clients' already-trained models (no retraining).

Example:
  >>> import jax.numpy as jnp
  >>> gathered_slots(jnp.array([2, 0, 3]), jnp.array([True, True, False]), jnp.array([0, 2]),
  ...                4).tolist()
  [1, 0]
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.engine.description import RoundConfig
from fedjax_sel.engine.selection import (Filtered, Selection, any_run, choose, filter_round_flag,
                                         kept_selection, zeros_like_shapes)
from fedjax_sel.engine.state import DataArrays, EngineState, RunValues
from fedjax_sel.engine.training import (Request, Trained, nonzero_slots, per_client, request,
                                        sampling_weights, without_nonfinite)
from fedjax_sel.parts.types import RoundInputs


class Cohort(NamedTuple):
  """Who takes part in the round and what their local training produced.

  Attributes:
    filtered: the filtered-in set (`selection.Filtered`).
    selection: the selection and the rule's masks (`selection.Selection`).
    trained: the selected clients' local results in K slots (`training.Trained`).
    train_samples: float32 training samples processed this round.
    uploads: float32 models uploaded (clients trained).
    downloads: float32 models downloaded (clients trained or selected).
    client_samples: `[N]` float32 training samples of each client this round.
  """

  filtered: Filtered
  selection: Selection
  trained: Trained
  train_samples: jax.Array
  uploads: jax.Array
  downloads: jax.Array
  client_samples: jax.Array

  @property
  def broken(self) -> dict:
    """The contract counts of the filter, the selector and the rule."""
    return {**self.selection.broken, "filter_outside_available": self.filtered.outside}


def _cohort(filtered: Filtered, selection: Selection, trained: Trained, train_samples,
            trained_models, client_samples) -> Cohort:
  return Cohort(filtered, selection, trained, train_samples.astype(jnp.float32),
                trained_models.astype(jnp.float32),
                jnp.maximum(trained_models, jnp.sum(selection.chosen)).astype(jnp.float32),
                client_samples)


def gathered_slots(slots_n, valid_n, slots, n: int) -> jax.Array:
  """Each of `slots`' clients' index among the trained slots `slots_n` (`valid_n` of them)."""
  where = jnp.zeros((n,), jnp.int32).at[jnp.where(valid_n, slots_n, n)].set(
      jnp.arange(slots_n.shape[0]), mode="drop")
  return where[slots]


class CohortPlan(NamedTuple):
  """The cohort decided before its training (`plan_cohort`), and the training to run.

  Attributes:
    request: who trains, in which slots (`training.Request`).
    filtered: the filtered-in set, when decided before training (None in FilFL's train-all
      mode, whose filter reads the trained models).
    selection: the selection, when decided before training (None in the train-all mode).
    kept: the train-all mode's selection from the kept filtered-in set (else None).
  """

  request: Request
  filtered: Filtered | None = None
  selection: Selection | None = None
  kept: Selection | None = None


def training_layout(config: RoundConfig) -> tuple[int, bool]:
  """(slots the round trains in, whether the aggregate is folded out of training): with the
  `TrainingConfig`, what fixes the round's training program. n slots in FilFL's train-all mode,
  K otherwise."""
  filt = config.filter
  if filt is not None and filt.trains_available:
    return config.availability.num_available, False
  return config.k, config.stream


def plan_cohort(config: RoundConfig, state: EngineState, arrays: DataArrays, run: RunValues,
                inputs: RoundInputs, lr) -> CohortPlan:
  """Who trains this round: chosen before training, or, in FilFL's train-all mode, every
  available client on a filtering round and the selection from the kept set on the others."""
  size, streamed = training_layout(config)
  filt = config.filter
  if filt is not None and filt.trains_available:
    avail = inputs.available
    filtering = any_run(config, filter_round_flag(config, state, avail))
    reuse = lambda: kept_selection(config, state, inputs, run)
    # Not computed on filtering rounds, whose selection follows the filter.
    kept = jax.lax.cond(filtering, lambda: zeros_like_shapes(jax.eval_shape(reuse)), reuse)
    return CohortPlan(request(config, arrays, jnp.where(filtering, avail, kept.train_mask),
                              size, lr), kept=kept)
  filtered, selection = choose(config, state, inputs, run)
  return CohortPlan(request(config, arrays, selection.train_mask, size, lr,
                            selection.aggregate_mask if streamed else None,
                            sampling_weights(config, selection.selector_state)),
                    filtered, selection)


def finish_cohort(config: RoundConfig, state: EngineState, run: RunValues, inputs: RoundInputs,
                  plan: CohortPlan, trained: Trained) -> Cohort:
  """The round's cohort from its plan and the planned training (see the module's docstring)."""
  if plan.kept is None:
    slots, valid, res = trained
    return _cohort(plan.filtered, plan.selection, trained, jnp.sum(res.samples), jnp.sum(valid),
                   per_client(plan.filtered.mask, slots, valid, res.samples))
  return _train_available(config, state, run, inputs, plan.kept, trained)


def _train_available(config: RoundConfig, state: EngineState, run: RunValues,
                     inputs: RoundInputs, kept: Selection, local: Trained) -> Cohort:
  """FilFL's train-all mode: every available client trained on a filtering round (the selection
  from the kept set decided who trained on other rounds); the selected clients' models are then
  gathered from those."""
  params, avail = state.params, inputs.available
  if config.exclude_nonfinite:
    finite, clean = without_nonfinite(local.result, params)
    local = Trained(local.slots, local.valid & finite, clean)
  filtered, selection = choose(config, state, inputs, run, local, kept)
  slots_n, valid_n, res_n = local
  slots, valid = nonzero_slots(selection.train_mask, config.k)
  n = avail.shape[0]
  res = jax.tree.map(lambda a: a[gathered_slots(slots_n, valid_n, slots, n)], res_n)
  res = res._replace(train_loss=jnp.where(valid, res.train_loss, 0.0),
                     samples=jnp.where(valid, res.samples, 0.0),
                     train_loss_sq=jnp.where(valid, res.train_loss_sq, 0.0))
  # A run of a batch that did not need this filtering round pays for its K clients only.
  trained_all = filtered.own
  fmask = filtered.mask
  return _cohort(
      filtered, selection, Trained(slots, valid, res),
      jnp.where(trained_all, jnp.sum(res_n.samples), jnp.sum(res.samples)),
      jnp.where(trained_all, jnp.sum(valid_n), jnp.sum(valid)),
      jnp.where(trained_all, per_client(fmask, slots_n, valid_n, res_n.samples),
                per_client(fmask, slots, valid, res.samples)))
