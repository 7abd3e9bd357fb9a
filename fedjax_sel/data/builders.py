"""Build a `FederatedDataset` by name: a source, a partition, per-client splits, a public set.

Examples:
  >>> data = build_dataset(DatasetSpec("digits", num_clients=20, partition="dirichlet"), seed=0)
  >>> data.num_clients, data.num_classes, data.feature_shape
  (20, 10, (8, 8, 1))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from fedjax_sel import registry
from fedjax_sel.data import federated_sqlite, sources
from fedjax_sel.data.federated import FederatedDataset, split_clients
from fedjax_sel.data.partition import PARTITIONS, partition

DATASETS = ("digits", "fashion_mnist", "synth", "leaf", "tfds", "emnist", "shakespeare",
            "stackoverflow_nwp", "cifar100_fed")  # The registered ones built in.
PUBLIC_MODES = ("stratified", "per_client")
SPLIT_SEED = 2  # `build_dataset` splits each client's examples with its seed + SPLIT_SEED.


class DatasetSpec(NamedTuple):
  """What to build.

  Attributes:
    name: one of `DATASETS`.
    num_clients: N (for `leaf`, the first N users; 0 = all).
    partition: one of `PARTITIONS` (ignored by the natively federated `synth` and `leaf`).
    alpha: Dirichlet concentration.
    classes_per_client: k of the `k_classes` partition.
    dominant_fraction: fraction of the dominant class of the `dominant` partition.
    shards_per_client: shards each client holds under the `shards` partition.
    emnist_only_digits: `emnist` reads fedjax's digits-only files (10 classes).
    download: `emnist` and `shakespeare` fetch their published files into `data_dir` when absent.
    size_skew: the `lognormal_sizes` partition's sigma, the `power_law_sizes` one's Pareto shape.
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
  shards_per_client: int = 2
  size_skew: float = 1.0
  emnist_only_digits: bool = False
  download: bool = False
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
  registry.lookup("dataset", spec.name)  # An unknown name lists the registered ones.
  if spec.partition not in PARTITIONS:
    raise ValueError(f"unknown partition {spec.partition!r}; accepted: {', '.join(PARTITIONS)}")
  if spec.num_clients < (0 if spec.name == "leaf" else 1):
    raise ValueError(f"num_clients must be >= 1, got {spec.num_clients}")
  if spec.public_mode not in PUBLIC_MODES:
    raise ValueError(f"unknown public_mode {spec.public_mode!r}; accepted: "
                     f"{', '.join(PUBLIC_MODES)}")
  if not 0.0 <= spec.public_fraction < 1.0:
    raise ValueError(f"public_fraction must be in [0, 1), got {spec.public_fraction}")
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


class NamedDataset(NamedTuple):
  """A named dataset's loader: `load(spec, seed)` gives a centralized pool (`sources.Centralized`,
  split among the clients by `spec.partition`) or, when `federated`, its own clients' data
  `(xs, ys, num_classes)`."""

  load: Callable[[DatasetSpec, int], Any]
  federated: bool = False


# --- Registered names (fedjax_sel.registry): a dataset's own settings, flags of the same names as
# the `DatasetSpec` fields they fill.

@registry.register("dataset", "digits")
def _digits(settings, context: registry.BuildContext) -> NamedDataset:
  """scikit-learn's 8x8 handwritten digits (1797 images, offline)."""
  del settings, context
  return NamedDataset(lambda spec, seed: sources.load_digits())


def _data_dir_setting():
  return registry.setting(sources.FASHION_MNIST_DIR, "Folder of the Fashion-MNIST IDX files, or "
                          "the TFDS data dir holding ArrayRecord files.", flag="data_dir")


@dataclasses.dataclass(frozen=True)
class IdxSettings:
  data_dir: str = _data_dir_setting()


@registry.register("dataset", "fashion_mnist", IdxSettings)
def _fashion_mnist(settings: IdxSettings, context: registry.BuildContext) -> NamedDataset:
  """Fashion-MNIST from IDX files (the Debian package dataset-fashion-mnist)."""
  del context
  return NamedDataset(lambda spec, seed: sources.load_idx(settings.data_dir, "train"))


@dataclasses.dataclass(frozen=True)
class TfdsSettings:
  tfds_name: str = registry.setting("mnist", "TFDS dataset name (e.g. cifar10), read from "
                                    "--data_dir, never downloaded.", flag="tfds_name")
  data_dir: str = _data_dir_setting()


@registry.register("dataset", "tfds", TfdsSettings)
def _tfds(settings: TfdsSettings, context: registry.BuildContext) -> NamedDataset:
  """A TFDS dataset prepared as ArrayRecord files (never downloaded)."""
  del context
  folder = None if settings.data_dir == sources.FASHION_MNIST_DIR else settings.data_dir
  return NamedDataset(lambda spec, seed: sources.load_tfds(settings.tfds_name, "train", folder))


@dataclasses.dataclass(frozen=True)
class SynthSettings:
  synth_alpha: float = registry.setting(1.0, "SYNTH(alpha, beta): spread of the clients' models "
                                        "(alpha).", flag="synth_alpha", within=">= 0")
  synth_beta: float = registry.setting(1.0, "SYNTH(alpha, beta): spread of the clients' feature "
                                       "means (beta).", flag="synth_beta", within=">= 0")


@registry.register("dataset", "synth", SynthSettings)
def _synth(settings: SynthSettings, context: registry.BuildContext) -> NamedDataset:
  """SYNTH(alpha, beta) (Li et al. 2020): natively federated, generated."""
  del context

  def load(spec, seed):
    xs, ys = sources.synthetic(settings.synth_alpha, settings.synth_beta, spec.num_clients, seed,
                               max_samples=spec.synth_max_samples)
    return xs, ys, 10
  return NamedDataset(load, federated=True)


@dataclasses.dataclass(frozen=True)
class LeafSettings:
  leaf_files: tuple[str, ...] = registry.setting((), "LEAF JSON files or glob patterns.",
                                                 flag="leaf_files")

  def check(self, context: registry.BuildContext) -> None:
    del context
    if not self.leaf_files:
      raise registry.SettingError("leaf_files", "is needed: the LEAF JSON files (paths or glob "
                                  "patterns)")


@registry.register("dataset", "leaf", LeafSettings)
def _leaf(settings: LeafSettings, context: registry.BuildContext) -> NamedDataset:
  """LEAF's natively federated JSON (FEMNIST, Shakespeare)."""
  del context

  def load(spec, seed):
    del seed
    paths = sources.leaf_paths(list(settings.leaf_files))
    _, xs, ys = sources.load_leaf_json(paths)
    if spec.num_clients > len(xs):
      raise ValueError(f"num_clients={spec.num_clients} but the LEAF files {paths} hold "
                       f"{len(xs)} users")
    if spec.num_clients:
      xs, ys = xs[:spec.num_clients], ys[:spec.num_clients]
    is_text = xs[0].ndim == 2 and xs[0].dtype.kind == "i"
    return xs, ys, sources.VOCAB_SIZE if is_text else sources.FEMNIST_CLASSES
  return NamedDataset(load, federated=True)


@dataclasses.dataclass(frozen=True)
class SqliteSettings:
  data_dir: str = _data_dir_setting()
  download: bool = registry.setting(False, "Fetch the dataset's published files into --data_dir "
                                    "when they are not there (emnist, shakespeare, "
                                    "stackoverflow_nwp; never otherwise).", flag="download")


@dataclasses.dataclass(frozen=True)
class EmnistSettings(SqliteSettings):
  emnist_only_digits: bool = registry.setting(False, "Read fedjax's digits-only files (10 "
                                              "classes).", flag="emnist_only_digits")


def _published_files(name: str, settings: SqliteSettings) -> tuple[str, bool]:
  """(folder, only_digits) of fedjax's files of `name`, fetched first with `download`; the
  generic data dir default means fedjax's own cache (~/.cache/fedjax)."""
  folder = (federated_sqlite.DEFAULT_DIR if settings.data_dir == sources.FASHION_MNIST_DIR
            else settings.data_dir)
  digits = getattr(settings, "emnist_only_digits", False)
  if settings.download:
    federated_sqlite.download(name, folder, digits)
  return folder, digits


def _sqlite(name: str, settings) -> NamedDataset:
  """fedjax's federated SQLite files of `name` (`federated_sqlite.py`)."""
  def load(spec, seed):
    del seed
    folder, digits = _published_files(name, settings)
    return federated_sqlite.load(name, folder, spec.num_clients, digits)
  return NamedDataset(load, federated=True)


def published_store(name: str, settings: SqliteSettings, folder: str, num_clients: int,
                    seed: int) -> FederatedDataset:
  """fedjax's files of dataset `name` streamed into a store at `folder`, one client in memory at a
  time (`federated_sqlite.write_store`): what `build_dataset` builds for `seed` without a
  validation split or public set, for populations that do not fit in memory."""
  data_dir, digits = _published_files(name, settings)
  return federated_sqlite.write_store(name, folder, data_dir, num_clients, digits,
                                      seed=seed + SPLIT_SEED)


@registry.register("dataset", "emnist", EmnistSettings)
def _emnist(settings: EmnistSettings, context: registry.BuildContext) -> NamedDataset:
  """Federated EMNIST (3,400 writers; fedjax's SQLite files), its published test split."""
  del context
  return _sqlite("emnist", settings)


@registry.register("dataset", "shakespeare", SqliteSettings)
def _shakespeare(settings: SqliteSettings, context: registry.BuildContext) -> NamedDataset:
  """Shakespeare's speakers (fedjax's SQLite files), windows of 80 characters, its published test
  split."""
  del context
  return _sqlite("shakespeare", settings)


@registry.register("dataset", "stackoverflow_nwp", SqliteSettings)
def _stackoverflow(settings: SqliteSettings, context: registry.BuildContext) -> NamedDataset:
  """Stack Overflow's users (fedjax's SQLite files and vocabulary): next-word prediction over
  fedjax's 10,000 words, windows of 20, its published test split."""
  del context
  return _sqlite("stackoverflow_nwp", settings)


@registry.register("dataset", "cifar100_fed", SqliteSettings)
def _cifar100(settings: SqliteSettings, context: registry.BuildContext) -> NamedDataset:
  """CIFAR-100 in 500 clients (TFF's split, as fedjax converts it to SQLite)."""
  del context
  return _sqlite("cifar100_fed", settings)


def source(spec: DatasetSpec, seed: int = 0) -> NamedDataset:
  """The loader of the dataset `spec.name` names (registered, `module:name` included), its
  settings read from the `DatasetSpec` fields of the same names."""
  entry = registry.lookup("dataset", spec.name)
  values = {f.name: getattr(spec, registry.setting_flag(spec.name, f))
            for f in dataclasses.fields(entry.settings)
            if hasattr(spec, registry.setting_flag(spec.name, f))}
  values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
  context = registry.BuildContext(k=0, rounds=0, seed=seed, num_clients=spec.num_clients)
  return registry.build("dataset", spec.name, entry.settings(**values), context)


def _centralized(named: NamedDataset, spec: DatasetSpec, seed: int) -> sources.Centralized:
  data = named.load(spec, seed)
  if spec.max_examples is not None and spec.max_examples < len(data.y):
    idx = np.sort(np.random.default_rng(seed).permutation(len(data.y))[:spec.max_examples])
    data = sources.Centralized(data.x[idx], data.y[idx], data.num_classes)
  return data


def _public_text(path: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
  """The server's public set cut from the text at `path` into the clients' character windows.

  Raises:
    ValueError: starting `public_text=PATH:`, for a file that cannot be read, clients that do not
      hold character windows, or a text too short for one window.
  """
  vocabularies = (federated_sqlite.SHAKESPEARE_VOCAB, sources.VOCAB_SIZE)
  if num_classes not in vocabularies:
    raise ValueError(f"public_text={path}: the clients do not hold character windows "
                     f"({num_classes} classes); a public text is for the Shakespeare datasets "
                     "(--dataset=shakespeare, or --dataset=leaf with LEAF's Shakespeare JSON)")
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except (OSError, UnicodeDecodeError) as e:
    raise ValueError(f"public_text={path}: cannot be read as UTF-8 text "
                     f"({getattr(e, 'strerror', None) or e})") from e
  try:
    if num_classes == federated_sqlite.SHAKESPEARE_VOCAB:
      windows = federated_sqlite.shakespeare_windows([text.encode()])
    else:
      windows = sources.char_windows(text)
  except ValueError as e:
    raise ValueError(f"public_text={path}: {e}") from e
  if not len(windows[1]):
    raise ValueError(f"public_text={path}: {len(text)} characters, too short for one window")
  return windows


def build_dataset(spec: DatasetSpec, seed: int) -> FederatedDataset:
  """Builds the federated dataset described by `spec` (seeded)."""
  check_spec(spec)
  public = None
  named = source(spec, seed)
  tests = None
  if named.federated:
    loaded = named.load(spec, seed)
    xs, ys, num_classes = loaded[:3]
    if isinstance(loaded, federated_sqlite.Published):
      tests = (loaded.test_xs, loaded.test_ys)
    if spec.public_fraction > 0:
      xs, ys, public = _pool_fraction(xs, ys, spec.public_fraction, seed + 1)
  else:
    data = _centralized(named, spec, seed)
    x, y, num_classes = data
    if spec.public_fraction > 0 and spec.public_mode == "stratified":
      kept, held = stratified_holdout(y, spec.public_fraction, seed + 1)
      public = (x[held], y[held])
      x, y = x[kept], y[kept]
    parts = partition(spec.partition, y, spec.num_clients, num_classes, seed,
                      alpha=spec.alpha, k=spec.classes_per_client, fraction=spec.dominant_fraction,
                      shards_per_client=spec.shards_per_client, size_skew=spec.size_skew)
    xs, ys = [x[p] for p in parts], [y[p] for p in parts]
    if spec.public_fraction > 0 and spec.public_mode == "per_client":
      xs, ys, public = _pool_fraction(xs, ys, spec.public_fraction, seed + 1)
  if spec.public_text is not None:  # In the vocabulary of the clients' windows.
    public = _public_text(spec.public_text, num_classes)
  if public is not None and spec.public_size is not None and spec.public_size < len(public[1]):
    keep = np.sort(np.random.default_rng(seed + 3).permutation(len(public[1]))[:spec.public_size])
    public = (public[0][keep], public[1][keep])
  name = spec.name if named.federated else f"{spec.name}/{spec.partition}"
  return split_clients(xs, ys, num_classes=num_classes, val_fraction=spec.val_fraction,
                       test_fraction=0.0 if tests is not None else spec.test_fraction,
                       seed=seed + SPLIT_SEED, public=public, name=name, tests=tests)
