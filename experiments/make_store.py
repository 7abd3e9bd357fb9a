r"""Writes a federated dataset once to a memory-mapped client store, for runs with --store_dir.

  python -m experiments.make_store --dataset=leaf --leaf_files='data/leaf/femnist/*.json' \
      --num_clients=0 --store_out=stores/femnist
  python -m experiments.make_store --synth_clients=1000000 --synth_max_samples=20 \
      --store_out=stores/synth1m

The first builds any dataset the launchers build (the same data flags: LEAF JSON, TFDS, IDX,
digits, SYNTH, partitions and splits; seed --seeds' first) and writes it with
`fedjax_sel.data.store.write_store`; the second generates a SYNTH(--synth_alpha, --synth_beta)
population of --synth_clients clients block by block straight to disk (`synth_store`), for
populations that would not fit in memory. Then, e.g.:

  python -m experiments.run --store_dir=stores/synth1m --store=host --model=logreg \
      --num_available=100 --clients_per_round=10 --rounds=20 --eval_every=10
"""

import os
import time

from absl import app, flags

import fedjax_sel as fs
from experiments import common
from fedjax_sel.data import store

FLAGS = flags.FLAGS
# --help lists the flags this tool reads: the data flags, the seed and --overwrite.
USED = ("dataset", "partition", "num_clients", "dirichlet_alpha", "classes_per_client",
        "dominant_fraction", "test_fraction", "val_fraction", "public_fraction", "data_dir",
        "leaf_files", "tfds_name", "synth_alpha", "synth_beta", "max_examples", "seeds",
        "overwrite")
for _flag in USED:
  flags.declare_key_flag(_flag)
flags.DEFINE_string("store_out", None, "Folder to write the store to (must not hold one).")
flags.DEFINE_integer("synth_clients", None, "Generate a SYNTH population of this many clients "
                     "instead of building --dataset.", lower_bound=1)
flags.DEFINE_integer("synth_max_samples", None, "Cap on each generated client's examples.",
                     lower_bound=2)
flags.mark_flag_as_required("store_out")


def main(argv):
  del argv
  out = FLAGS.store_out
  if os.path.exists(os.path.join(out, store.STORE_FILE)) and not FLAGS.overwrite:
    raise app.UsageError(f"--store_out={out} already holds a store; pass --overwrite to replace it")
  common.check_finite()
  start = time.perf_counter()
  if FLAGS.synth_clients:
    data = store.synth_store(out, FLAGS.synth_clients, alpha=FLAGS.synth_alpha,
                             beta=FLAGS.synth_beta, seed=common.seeds()[0],
                             max_samples=FLAGS.synth_max_samples,
                             test_fraction=FLAGS.test_fraction)
  else:
    try:
      data = fs.build_dataset(common.dataset_spec(), common.seeds()[0])
    except (FileNotFoundError, ValueError) as e:
      raise app.UsageError(f"--dataset={FLAGS.dataset}: {e}") from e
    store.write_store(out, data)
  print(f"wrote {out}: {data.name}, N={data.num_clients}, {data.train.x.shape[0]} training rows, "
        f"{time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
  app.run(common.cli(main))
