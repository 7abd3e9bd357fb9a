r"""Writes a federated dataset once to a memory-mapped client store, for runs with --store_dir.

  python -m experiments.make_store --dataset=leaf --leaf_files='data/leaf/femnist/*.json' \
      --num_clients=0 --store_out=stores/femnist
  python -m experiments.make_store --synth_clients=1000000 --synth_max_samples=20 \
      --store_out=stores/synth1m
  python -m experiments.make_store --dataset=stackoverflow_nwp --num_clients=0 \
      --store_out=stores/stackoverflow

The first builds any dataset the launchers build (the same data flags: LEAF JSON, TFDS, IDX,
digits, SYNTH, partitions and splits; seed --seeds' first) and writes it with
`fedjax_sel.data.store.write_store`; fedjax's federated SQLite files (emnist, shakespeare,
stackoverflow_nwp, cifar100_fed) are written one client at a time instead
(`federated_sqlite.write_store`: Stack Overflow's users do not fit in memory); the second
generates a SYNTH(alpha, beta) population of
--synth_clients clients (SYNTH(1, 1), or `--dataset=synth --synth_alpha=A --synth_beta=B`) block
by block straight to disk (`synth_store`), for populations that would not fit in memory. Then,
e.g.:

  python -m experiments.run --store_dir=stores/synth1m --store=host --model=logreg \
      --num_available=100 --clients_per_round=10 --rounds=20 --eval_every=10
"""

import dataclasses
import os
import time

from absl import app

import fedjax_sel as fs
from experiments.launch import build, cli, config, flag_binding
from experiments.launch.config import option
from fedjax_sel.data import federated_sqlite, store
from fedjax_sel.data.builders import SynthSettings, published_store

# The flags this tool reads: the data flags, the seed and --overwrite.
USED = ("partition", "num_clients", "dirichlet_alpha", "classes_per_client", "dominant_fraction",
        "test_fraction", "val_fraction", "public_fraction", "max_examples", "overwrite")


@dataclasses.dataclass(frozen=True)
class MakeStoreOptions:
  store_out: str | None = option(None, "Folder to write the store to (must not hold one; "
                                 "required).")
  synth_clients: int | None = option(None, "Generate a SYNTH population of this many clients "
                                     "instead of building --dataset.", within=">= 1")
  synth_max_samples: int | None = option(None, "Cap on each generated client's examples.",
                                         within=">= 2")


DEFAULTS = config.JobConfig(launcher="experiments.make_store", options=MakeStoreOptions())
BINDING = flag_binding.define(DEFAULTS, exclude=tuple(
    f for section in config.SECTIONS for f in config.field_names(section) if f not in USED),
    choose=("dataset",), replay=False)


def _published(cfg: config.JobConfig, out: str, seed: int) -> fs.FederatedDataset:
  """fedjax's files of the chosen dataset, streamed into the store (train and published test
  pools only)."""
  chosen = cfg.parts.dataset
  for flag, value in (("val_fraction", cfg.data.val_fraction),
                      ("public_fraction", cfg.data.public_fraction)):
    if value:
      raise app.UsageError(f"--{flag}={value}: --dataset={chosen.name} is written with its "
                           f"published test split and no other; pass --{flag}=0")
  try:
    return published_store(chosen.name, chosen.settings, out, cfg.data.num_clients, seed)
  except (FileNotFoundError, ValueError) as e:
    raise app.UsageError(f"--dataset={chosen.name}: {e}") from e


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {list(argv[1:])}: a flag takes its value after "
                         "'='")
  cfg = BINDING.job_config()
  opts = cfg.options
  out = opts.store_out
  if out is None:
    raise app.UsageError("--store_out is required: the folder to write the store to")
  if os.path.exists(os.path.join(out, store.STORE_FILE)) and not cfg.output.overwrite:
    raise app.UsageError(f"--store_out={out} already holds a store; pass --overwrite to replace it")
  start = time.perf_counter()
  seed = cfg.seeds[0]
  if opts.synth_clients:
    chosen = cfg.parts.dataset  # --dataset=synth --synth_alpha=... sets the generator's spreads.
    synth = chosen.settings if chosen.name == "synth" else SynthSettings()
    data = store.synth_store(out, opts.synth_clients, alpha=synth.synth_alpha,
                             beta=synth.synth_beta, seed=seed,
                             max_samples=opts.synth_max_samples,
                             test_fraction=cfg.data.test_fraction)
  elif cfg.parts.dataset.name in federated_sqlite.DATASETS:
    data = _published(cfg, out, seed)
  else:
    try:
      data = fs.build_dataset(build.dataset_spec(cfg), seed)
    except (FileNotFoundError, ValueError) as e:
      raise app.UsageError(f"--dataset={cfg.parts.dataset.name}: {e}") from e
    store.write_store(out, data)
  print(f"wrote {out}: {data.name}, N={data.num_clients}, {data.train.x.shape[0]} training rows, "
        f"{time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
  cli.launch(main, BINDING)
