"""The parts of a round as flags: one vocabulary for every launcher.

Every launcher imports this module, so a setting has one flag name everywhere (`--poc_d`,
`--eps0`, `--fedsrc_beta`, `--krum_f`, ...), and the builders below turn the flags into parts:
`make_selector`, `make_filter`, `make_rule`, `make_aggregator`. `experiments/run.py` composes any
of them (`--selector`, `--filter`, `--rule`, `--aggregator`, `--server_opt`); the paper launchers
use the ones their paper needs. Flag errors are `app.UsageError`s naming the flag.

Names: selectors random, poc, divfl, entropy, grad_norm, oort; filters none, dgf, rgf; rules none,
fedalign, fedsrc; aggregators fedavg, median, trimmed_mean, krum, multi_krum, fedasl; server
optimizers none, sgd, momentum, adam, yogi, adagrad (`common.py`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from absl import app, flags

import fedjax_sel as fs
from experiments import flag_binding
from fedjax_sel import fedalign, fedsrc, registry

FLAGS = flags.FLAGS

# The parts' settings as flags (each setting's help, type and default where the part is
# registered, fedjax_sel.registry); --selector here, the other kinds' choices in experiments/run.py.
flag_binding.define_parts(("selector",))
flag_binding.define_parts(("filter", "rule", "aggregator"), choose=False)


# --- Builders -----------------------------------------------------------------------------------

def context(k: int, data=None, model=None, profile=None, seed: int = 0) -> registry.BuildContext:
  """What the parts' factories read besides their settings, from the flags and the run."""
  available = FLAGS.num_available or FLAGS.num_clients
  return registry.BuildContext(k=k, rounds=FLAGS.rounds, seed=seed,
                               num_clients=FLAGS.num_clients if data is None else data.num_clients,
                               num_available=available, data=data, model=model, profile=profile,
                               local_epochs=FLAGS.local_epochs)


def build(kind: str, name: str, ctx: registry.BuildContext):
  """Part `name` of `kind` with its settings from the flags; a refusal names the flag."""
  try:
    return registry.build(kind, name, flag_binding.part_settings(kind, name), ctx)
  except ValueError as e:
    raise flag_binding.part_error(kind, name, e) from e


def check(kind: str, name: str, ctx: registry.BuildContext) -> None:
  """The settings of part `name` of `kind` from the flags, before any data."""
  try:
    registry.check(kind, name, flag_binding.part_settings(kind, name), ctx)
  except ValueError as e:
    raise flag_binding.part_error(kind, name, e) from e


def check_selector(k: int, available: int) -> None:
  """The --selector's settings with K clients per round of at most `available`."""
  check("selector", FLAGS.selector, context(k)._replace(num_available=available))


def make_selector(k: int, name: str | None = None, data=None, profile=None) -> fs.Selector:
  """The selector `name` (default --selector) for K clients; Oort's first durations come from the
  clients' `profile` and data sizes when given."""
  return build("selector", name or FLAGS.selector, context(k, data, profile=profile))


def make_filter(mode: str, model):
  """FilFL's filter (`mode` dgf or rgf) on the public set, or None for `none`."""
  if mode == "none":
    return None
  return build("filter", mode, context(FLAGS.clients_per_round, model=model))


def check_fedalign() -> None:
  """FedALIGN's flags, before any data."""
  check("rule", "fedalign", context(FLAGS.clients_per_round))
  if FLAGS.align_split == "val" and FLAGS.val_fraction <= 0:
    raise app.UsageError("--align_split=val needs --val_fraction > 0")


def priority_mask(n: int, label_hist, seed: int) -> np.ndarray:
  """The priority set the flags choose among `n` clients (flag errors as usage errors)."""
  settings = flag_binding.part_settings("rule", "fedalign")
  data = None if label_hist is None else _Hist(label_hist)
  ctx = context(FLAGS.clients_per_round, seed=seed)._replace(num_clients=n, data=data)
  try:
    return settings.priority(ctx)
  except ValueError as e:
    raise flag_binding.part_error("rule", "fedalign", e) from e


class _Hist(NamedTuple):
  """The label histogram a priority draw reads, where a launcher has no dataset object."""

  label_hist: np.ndarray


def fedalign_rule(priority, eps0: float | None = None) -> fs.Participation:
  """FedALIGN's rule over the `priority` clients from the flags (`eps0` overrides --eps0)."""
  s = flag_binding.part_settings("rule", "fedalign")
  return fedalign.fedalign_rule(priority, FLAGS.rounds, eps0=s.eps0 if eps0 is None else eps0,
                                schedule=s.schedule, warmup_fraction=s.warmup_fraction,
                                metric=s.metric, split=s.split)


def fedsrc_config() -> fedsrc.FedSRCConfig:
  return flag_binding.part_settings("rule", "fedsrc").config()


def check_fedsrc() -> None:
  """FedSRC's flags, naming the one at fault."""
  check("rule", "fedsrc", context(FLAGS.clients_per_round))
  if FLAGS.decision_stat == "val_loss" and FLAGS.val_fraction <= 0:
    raise app.UsageError("--decision_stat=val_loss needs --val_fraction > 0 (each client's "
                         "held-out data)")


def make_aggregator(name: str) -> fs.Aggregator:
  """The aggregator `name` (a registered one; fedsrc means FedSRC's FedAvg)."""
  name = "fedavg" if name == "fedsrc" else name
  return build("aggregator", name, context(FLAGS.clients_per_round))


def check_aggregators(names) -> None:
  """The settings of the aggregators `names`, against K clients per round."""
  for name in sorted(set(names)):
    check("aggregator", "fedavg" if name == "fedsrc" else name, context(FLAGS.clients_per_round))
