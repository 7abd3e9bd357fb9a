"""Build a `FederatedDataset` by name: a source, a partition, per-client splits, a public set.

Examples:
  >>> data = build_dataset(DatasetSpec("digits", num_clients=20, partition="dirichlet"), seed=0)
  >>> data.num_clients, data.num_classes, data.feature_shape
  (20, 10, (8, 8, 1))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from fedjax_sel.data import sources
from fedjax_sel.data.federated import FederatedDataset, split_clients
from fedjax_sel.data.partition import PARTITIONS, partition

DATASETS = ("digits", "fashion_mnist", "synth", "leaf", "tfds")
PUBLIC_MODES = ("stratified", "per_client")


class DatasetSpec(NamedTuple):
  """What to build.

  Attributes:
    name: one of `DATASETS`.
    num_clients: N (for `leaf`, the first N users; 0 = all).
    partition: one of `PARTITIONS` (ignored by the natively federated `synth` and `leaf`).
    alpha: Dirichlet concentration.
    classes_per_client: k of the `k_classes` partition.
    dominant_fraction: fraction of the dominant class of the `dominant` partition.
    val_fraction, test_fraction: per-client validation / test shares.
    public_fraction: share of the data given to the server's public set.
    public_mode: "stratified" (a stratified share of the centralized pool, held out before
      partitioning) or "per_client" (that share of each client's data pooled; always used for
      natively federated synth / leaf).
    public_text: a text file cut into 80-character windows with next-character labels as the
      public set (character models); overrides public_fraction.
    public_size: keep at most this many public examples (a seeded sample); None = all.
    data_dir: folder of the IDX files (fashion_mnist) or TFDS data.
    leaf_files: LEAF JSON files or glob patterns (leaf).
    tfds_name: TFDS dataset name (tfds).
    synth_alpha, synth_beta: SYNTH(alpha, beta).
    synth_max_samples: optional cap on SYNTH client sizes.
    max_examples: optional cap on the centralized pool (subsample, seeded).
  """

  name: str = "digits"
  num_clients: int = 50
  partition: str = "dirichlet"
  alpha: float = 0.5
  classes_per_client: int = 2
  dominant_fraction: float = 0.8
  val_fraction: float = 0.0
  test_fraction: float = 0.2
  public_fraction: float = 0.0
  public_mode: str = "stratified"
  public_text: str | None = None
  public_size: int | None = None
  data_dir: str = sources.FASHION_MNIST_DIR
  leaf_files: tuple[str, ...] = ()
  tfds_name: str = "mnist"
  synth_alpha: float = 1.0
  synth_beta: float = 1.0
  synth_max_samples: int | None = None
  max_examples: int | None = None


def check_spec(spec: DatasetSpec) -> None:
  """Raises ValueError naming the bad field and its accepted values, before any compute."""
  if spec.name not in DATASETS:
    raise ValueError(f"unknown dataset {spec.name!r}; accepted: {', '.join(DATASETS)}")
  if spec.partition not in PARTITIONS:
    raise ValueError(f"unknown partition {spec.partition!r}; accepted: {', '.join(PARTITIONS)}")
  if spec.num_clients < (0 if spec.name == "leaf" else 1):
    raise ValueError(f"num_clients must be >= 1, got {spec.num_clients}")
  if spec.public_mode not in PUBLIC_MODES:
    raise ValueError(f"unknown public_mode {spec.public_mode!r}; accepted: "
                     f"{', '.join(PUBLIC_MODES)}")
  if not 0.0 <= spec.public_fraction < 1.0:
    raise ValueError(f"public_fraction must be in [0, 1), got {spec.public_fraction}")
  if spec.name == "leaf" and not spec.leaf_files:
    raise ValueError("dataset leaf needs leaf_files (LEAF JSON paths)")
  if spec.public_size is not None and spec.public_size < 1:
    raise ValueError(f"public_size must be >= 1 (or None for all), got {spec.public_size}")


def stratified_holdout(y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(kept, held-out) indices; each class gives `round(fraction * n_c)` examples (at least one
  when fraction > 0)."""
  rng = np.random.default_rng(seed)
  held = []
  for c in np.unique(y):
    idx = rng.permutation(np.flatnonzero(y == c))
    n = int(round(fraction * len(idx)))
    held.extend(idx[:max(n, 1 if fraction > 0 else 0)].tolist())
  held = np.sort(np.array(held, dtype=np.int64))
  kept = np.setdiff1d(np.arange(len(y)), held)
  return kept, held


def _pool_fraction(xs, ys, fraction: float, seed: int):
  """Moves `fraction` of each client's examples into a pooled public set."""
  rng = np.random.default_rng(seed)
  keep_x, keep_y, pub_x, pub_y = [], [], [], []
  for x, y in zip(xs, ys):
    perm = rng.permutation(len(y))
    n = min(int(round(fraction * len(y))), max(len(y) - 1, 0))
    pub_x.append(x[perm[:n]])
    pub_y.append(y[perm[:n]])
    keep_x.append(x[perm[n:]])
    keep_y.append(y[perm[n:]])
  return keep_x, keep_y, (np.concatenate(pub_x), np.concatenate(pub_y))


def _tfds(spec: DatasetSpec, seed: int) -> sources.Centralized:
  del seed
  return sources.load_tfds(spec.tfds_name, "train", None if spec.data_dir ==
                           sources.FASHION_MNIST_DIR else spec.data_dir)


def _synth(spec: DatasetSpec, seed: int):
  xs, ys = sources.synthetic(spec.synth_alpha, spec.synth_beta, spec.num_clients, seed,
                             max_samples=spec.synth_max_samples)
  return xs, ys, 10


def _leaf(spec: DatasetSpec, seed: int):
  del seed
  paths = sources.leaf_paths(list(spec.leaf_files))
  _, xs, ys = sources.load_leaf_json(paths)
  if spec.num_clients > len(xs):
    raise ValueError(f"num_clients={spec.num_clients} but the LEAF files {paths} hold "
                     f"{len(xs)} users")
  if spec.num_clients:
    xs, ys = xs[:spec.num_clients], ys[:spec.num_clients]
  is_text = xs[0].ndim == 2 and xs[0].dtype.kind == "i"
  return xs, ys, sources.VOCAB_SIZE if is_text else sources.FEMNIST_CLASSES


class NamedDataset(NamedTuple):
  """A named dataset: `load(spec, seed)` gives a centralized pool (`sources.Centralized`, split
  among the clients by `spec.partition`) or, when `federated`, its own clients' data
  `(xs, ys, num_classes)`."""

  load: Callable[[DatasetSpec, int], Any]
  federated: bool = False


_NAMED = {  # One entry per dataset.
    "digits": NamedDataset(lambda spec, seed: sources.load_digits()),
    "fashion_mnist": NamedDataset(lambda spec, seed: sources.load_idx(spec.data_dir, "train")),
    "synth": NamedDataset(_synth, federated=True),
    "leaf": NamedDataset(_leaf, federated=True),
    "tfds": NamedDataset(_tfds),
}
assert tuple(_NAMED) == DATASETS


def natively_federated(name: str) -> bool:
  """Whether dataset `name` comes split by client (no partition applies)."""
  return _NAMED[name].federated


def _centralized(spec: DatasetSpec, seed: int) -> sources.Centralized:
  data = _NAMED[spec.name].load(spec, seed)
  if spec.max_examples is not None and spec.max_examples < len(data.y):
    idx = np.sort(np.random.default_rng(seed).permutation(len(data.y))[:spec.max_examples])
    data = sources.Centralized(data.x[idx], data.y[idx], data.num_classes)
  return data


def build_dataset(spec: DatasetSpec, seed: int) -> FederatedDataset:
  """Builds the federated dataset described by `spec` (seeded)."""
  check_spec(spec)
  public = None
  if natively_federated(spec.name):
    xs, ys, num_classes = _NAMED[spec.name].load(spec, seed)
    if spec.public_fraction > 0:
      xs, ys, public = _pool_fraction(xs, ys, spec.public_fraction, seed + 1)
  else:
    data = _centralized(spec, seed)
    x, y, num_classes = data
    if spec.public_fraction > 0 and spec.public_mode == "stratified":
      kept, held = stratified_holdout(y, spec.public_fraction, seed + 1)
      public = (x[held], y[held])
      x, y = x[kept], y[kept]
    parts = partition(spec.partition, y, spec.num_clients, num_classes, seed,
                      alpha=spec.alpha, k=spec.classes_per_client, fraction=spec.dominant_fraction)
    xs, ys = [x[p] for p in parts], [y[p] for p in parts]
    if spec.public_fraction > 0 and spec.public_mode == "per_client":
      xs, ys, public = _pool_fraction(xs, ys, spec.public_fraction, seed + 1)
  if spec.public_text is not None:
    with open(spec.public_text, encoding="utf-8") as f:
      public = sources.char_windows(f.read())
  if public is not None and spec.public_size is not None and spec.public_size < len(public[1]):
    keep = np.sort(np.random.default_rng(seed + 3).permutation(len(public[1]))[:spec.public_size])
    public = (public[0][keep], public[1][keep])
  name = spec.name if natively_federated(spec.name) else f"{spec.name}/{spec.partition}"
  return split_clients(xs, ys, num_classes=num_classes, val_fraction=spec.val_fraction,
                       test_fraction=spec.test_fraction, seed=seed + 2, public=public, name=name)
