"""Centralized and natively federated data sources, all offline.

- `load_digits`: scikit-learn's bundled 8x8 handwritten digits (1797 images, ships with the
  package).
- `load_idx`: MNIST-format IDX files (e.g. Fashion-MNIST from Debian's `dataset-fashion-mnist`).
- `load_leaf_json`: LEAF's per-user JSON (FEMNIST, Shakespeare).
- `load_tfds`: any image classification dataset through `tfds.data_source` (no TensorFlow needed).
- `synthetic`: SYNTH(alpha, beta) of the FedProx paper (docs/data.md), natively federated.
"""

from __future__ import annotations

import glob
import gzip
import importlib.util
import json
import os
import struct
from typing import NamedTuple

import numpy as np

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
# A few sentences written for this project, FilFL's Shakespeare public set (the paper used a few
# sentences of its own introduction).
PUBLIC_TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "public_text.txt")

# LEAF's Shakespeare vocabulary (80 characters); index 80 is the out-of-vocabulary character.
LEAF_CHARS = ("\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}")
OOV_INDEX = len(LEAF_CHARS)
MAX_UNKNOWN_SHARE = 0.5  # A Shakespeare file with more unknown characters is refused.
FEMNIST_CLASSES = 62
VOCAB_SIZE = len(LEAF_CHARS) + 1


# Where the papers' data come from, for the errors of users who lack them (no download at run time).
PREPARE = {
    "femnist": "LEAF FEMNIST JSON: in a LEAF checkout (github.com/TalwalkarLab/leaf) run `cd "
               "data/femnist && ./preprocess.sh -s niid --sf 0.05 -k 0 -t sample` and copy "
               "data/femnist/data/all_data/*.json",
    "shakespeare": "LEAF Shakespeare JSON: in a LEAF checkout run `cd data/shakespeare && "
                   "./preprocess.sh -s niid --sf 0.2 -k 0 -t sample -tf 0.8` and copy "
                   "data/shakespeare/data/all_data/*.json",
    "tfds": "on a machine with internet run `tfds build {name} --data_dir=DIR "
            "--file_format=array_record` (tfds.data_source reads ArrayRecord files), copy DIR here "
            "and pass it as the data dir",
}


class Centralized(NamedTuple):
  """A labelled pool before partitioning: `x [n, ...]` float32, `y [n]` int32."""

  x: np.ndarray
  y: np.ndarray
  num_classes: int


def load_digits() -> Centralized:
  """scikit-learn's 8x8 digits as `[1797, 8, 8, 1]` images scaled to [0, 1].

  Read from the file scikit-learn ships (`sklearn/datasets/data/digits.csv.gz`: 64 pixel values
  0..16 and the label per row, as its `load_digits` reads it) without importing scikit-learn,
  whose import costs a launcher about a second.
  """
  spec = importlib.util.find_spec("sklearn")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError("--dataset=digits reads scikit-learn's digits: pip install "
                            "scikit-learn")
  path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
  data = np.loadtxt(path, delimiter=",", dtype=np.float64)
  x = (data[:, :-1].reshape(-1, 8, 8) / 16.0).astype(np.float32)[..., None]
  return Centralized(x, data[:, -1].astype(np.int32), 10)


def _open(path: str):
  return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def read_idx(path: str, ndim: int | None = None) -> np.ndarray:
  """Reads one IDX file (optionally gzipped) into a numpy array of its declared shape; `ndim`, if
  given, is the number of dimensions the file must declare (1 for labels, 3 for images)."""
  try:
    with _open(path) as f:
      raw = f.read()
  except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError.
    raise ValueError(f"{path}: cannot read it as {'gzip' if path.endswith('.gz') else 'IDX'} "
                     f"({e})") from e
  if len(raw) < 4:
    raise ValueError(f"{path}: empty or truncated IDX file ({len(raw)} bytes, no header)")
  zero, dtype_code, dims = struct.unpack(">HBB", raw[:4])
  if zero != 0 or dtype_code != 0x08:
    raise ValueError(f"{path}: not an unsigned-byte IDX file (magic {zero:#x}/{dtype_code:#x})")
  if ndim is not None and dims != ndim:
    raise ValueError(f"{path}: declares {dims} dimensions, expected {ndim} (images and labels "
                     "files swapped?)")
  if len(raw) < 4 + 4 * dims:
    raise ValueError(f"{path}: truncated IDX header")
  shape = struct.unpack(">" + "I" * dims, raw[4:4 + 4 * dims])
  data = np.frombuffer(raw[4 + 4 * dims:], dtype=np.uint8)
  if data.size != int(np.prod(shape)):
    raise ValueError(f"{path}: truncated or padded: declares shape {list(shape)} "
                     f"({int(np.prod(shape))} values), holds {data.size}")
  return data.reshape(shape)


def _find(data_dir: str, stem: str) -> str:
  for name in (stem, stem + ".gz"):
    path = os.path.join(data_dir, name)
    if os.path.exists(path):
      return path
  raise FileNotFoundError(f"--data_dir={data_dir}: no {stem}[.gz]; for Fashion-MNIST install the "
                          "Debian package dataset-fashion-mnist or pass the folder holding the "
                          "IDX files")


def load_idx(data_dir: str, split: str = "train") -> Centralized:
  """MNIST-format IDX images/labels (`train` or `t10k`) as `[n, 28, 28, 1]` floats in [0, 1]."""
  prefix = {"train": "train", "test": "t10k"}[split]
  images_path = _find(data_dir, f"{prefix}-images-idx3-ubyte")
  labels_path = _find(data_dir, f"{prefix}-labels-idx1-ubyte")
  images, labels = read_idx(images_path, 3), read_idx(labels_path, 1)
  if len(images) != len(labels):
    raise ValueError(f"{images_path} holds {len(images)} images but {labels_path} "
                     f"{len(labels)} labels")
  x = (images.astype(np.float32) / 255.0)[..., None]
  return Centralized(x, labels.astype(np.int32), int(labels.max()) + 1)


def encode_chars(text: str) -> np.ndarray:
  """Maps characters to LEAF vocabulary indices (unknown characters to `OOV_INDEX`)."""
  table = {c: i for i, c in enumerate(LEAF_CHARS)}
  return np.array([table.get(c, OOV_INDEX) for c in text], dtype=np.int32)


def leaf_paths(patterns: list[str]) -> list[str]:
  """Expands glob patterns (e.g. `data/leaf/femnist/*.json`) into sorted file paths; a pattern
  that matches no file raises FileNotFoundError naming it."""
  paths = []
  for pattern in patterns:
    found = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else (
        [pattern] if os.path.isfile(pattern) else [])
    if not found:
      raise FileNotFoundError(f"LEAF files {pattern!r}: no such file")
    paths.extend(found)
  real = [os.path.realpath(p) for p in paths]
  twice = sorted({p for p, r in zip(paths, real) if real.count(r) > 1})
  if twice:
    raise ValueError(f"LEAF files given twice (every user would be loaded twice): "
                     f"{', '.join(twice)}")
  return paths


def load_leaf_json(paths: list[str]) -> tuple[list[str], list[np.ndarray], list[np.ndarray]]:
  """Reads LEAF JSON files `{"users", "num_samples", "user_data": {uid: {"x", "y"}}}`.

  FEMNIST rows (784 floats) become `[28, 28, 1]` images; Shakespeare strings become index
  sequences and their next-character labels vocabulary indices.

  Returns:
    (user ids, per-user x arrays, per-user y arrays), users in file order.
  """
  users, xs, ys = [], [], []
  source = {}  # user -> the file that holds it
  for path in paths:
    blob = _leaf_blob(path)
    chars = unknown = 0  # Shakespeare characters of this file, and those outside the vocabulary.
    for uid, n in zip(blob["users"], blob["num_samples"]):
      if uid in source:
        where = "twice in its 'users'" if source[uid] == path else f"also in {source[uid]}"
        raise ValueError(f"{path}: user {uid!r} is listed {where}; each user must appear once")
      source[uid] = path
      ud = blob["user_data"].get(uid)
      if not isinstance(ud, dict) or not {"x", "y"} <= set(ud):
        raise ValueError(f"{path}: user {uid!r} is listed in 'users' but has no 'x' and 'y' in "
                         "'user_data'")
      if len(ud["y"]) != n or len(ud["x"]) != n:
        raise ValueError(f"{path}: user {uid} declares {n} samples but holds {len(ud['x'])} x "
                         f"and {len(ud['y'])} y")
      if ud["x"] and isinstance(ud["x"][0], str):
        if any(not isinstance(s, str) or len(s) != len(ud["x"][0]) for s in ud["x"]):
          raise ValueError(f"{path}: user {uid}: Shakespeare inputs must be strings of one length")
        if any(not isinstance(c, str) or len(c) != 1 for c in ud["y"]):
          raise ValueError(f"{path}: user {uid}: Shakespeare labels must be single characters")
        x = np.stack([encode_chars(s) for s in ud["x"]]) if n else np.zeros((0, 80), np.int32)
        y = np.array([encode_chars(c)[0] for c in ud["y"]], dtype=np.int32)
        chars += x.size + y.size
        unknown += int(np.sum(x == OOV_INDEX) + np.sum(y == OOV_INDEX))
      else:
        try:
          x = _json_numbers("x", ud["x"]).astype(np.float32).reshape(n, 28, 28, 1)
          labels = _json_numbers("y", ud["y"]).reshape(n)
        except (ValueError, TypeError) as e:
          raise ValueError(f"{path}: user {uid}: x rows must be Shakespeare strings or FEMNIST's "
                           f"784 numbers, with integer labels ({e})") from e
        if np.any(labels != np.round(labels)):
          bad = labels[labels != np.round(labels)][0]
          raise ValueError(f"{path}: user {uid} has a fractional label ({bad}); labels are "
                           "integer classes")
        if not np.all(np.isfinite(x)):
          raise ValueError(f"{path}: user {uid} has non-finite pixel values")
        y = labels.astype(np.int32)
        if n and (y.min() < 0 or y.max() >= FEMNIST_CLASSES):
          raise ValueError(f"{path}: user {uid} has labels outside 0..{FEMNIST_CLASSES - 1} "
                           f"({y.min()}..{y.max()})")
      users.append(uid)
      xs.append(x)
      ys.append(y)
    if chars and unknown > MAX_UNKNOWN_SHARE * chars:
      raise ValueError(f"{path}: {unknown / chars:.0%} of its characters are outside LEAF's "
                       f"{len(LEAF_CHARS)}-character Shakespeare vocabulary (at most "
                       f"{MAX_UNKNOWN_SHARE:.0%} may be): it is not LEAF Shakespeare text, and a "
                       "model would learn to predict the unknown character")
  return users, xs, ys


def _json_numbers(field: str, values) -> np.ndarray:
  """A LEAF user's `field` as float64; ValueError naming the field unless it holds JSON numbers
  only (strings such as "3" and booleans are refused, not converted)."""
  array = np.asarray(values)
  if array.dtype.kind not in "iuf":
    held = {"U": "strings", "b": "booleans", "O": "null or mixed values"}.get(array.dtype.kind,
                                                                            str(array.dtype))
    raise ValueError(f"field {field!r} holds {held}, expected numbers")
  return array.astype(np.float64)


def _leaf_blob(path: str) -> dict:
  """One LEAF JSON file, its keys checked."""
  try:
    with open(path, encoding="utf-8") as f:
      blob = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"{path}: not a readable LEAF JSON file ({e})") from e
  missing = {"users", "num_samples", "user_data"} - set(blob if isinstance(blob, dict) else ())
  if missing:
    raise ValueError(f"{path}: LEAF JSON misses the keys {sorted(missing)}")
  if not blob["users"]:
    raise ValueError(f"{path}: its 'users' list is empty")
  if len(blob["users"]) != len(blob["num_samples"]):
    raise ValueError(f"{path}: {len(blob['users'])} users but {len(blob['num_samples'])} "
                     "num_samples")
  return blob


def load_tfds(name: str, split: str = "train", data_dir: str | None = None) -> Centralized:
  """An image classification dataset via `tfds.data_source` (works without TensorFlow, and
  inside `tfds.testing.mock_data` for tests). Never downloads: a dataset that is not prepared in
  `data_dir` (ArrayRecord format) raises FileNotFoundError saying how to prepare it."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  try:
    source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    len(source)  # An unprepared dataset can open and fail here, on its empty splits.
  except (NotImplementedError, AssertionError, FileNotFoundError, ValueError, KeyError) as e:
    where = data_dir or "the default TFDS data dir (~/tensorflow_datasets)"
    raise FileNotFoundError(f"TFDS dataset {name!r} is not prepared in {where}: "
                            + PREPARE["tfds"].format(name=name) + f" ({e})") from e
  items = [source[i] for i in range(len(source))]
  x = np.stack([np.asarray(it["image"], dtype=np.float32) / 255.0 for it in items])
  y = np.array([int(it["label"]) for it in items], dtype=np.int32)
  return Centralized(x, y, int(source.dataset_info.features["label"].num_classes))


def synthetic(alpha: float, beta: float, num_clients: int, seed: int, *, dim: int = 60,
              num_classes: int = 10, max_samples: int | None = None,
              ) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """SYNTH(alpha, beta): per-client features and labels (docs/data.md).

  alpha, beta are standard deviations: u_k ~ N(0, alpha^2), B_k ~ N(0, beta^2), W_k ~ N(u_k, 1),
  b_k ~ N(u_k, 1), v_k ~ N(B_k, 1), x ~ N(v_k, diag(j^-1.2)), y = argmax(x W_k + b_k),
  n_k = int(lognormal(4, 2)) + 50, optionally capped at `max_samples`.
  """
  if alpha < 0 or beta < 0:
    raise ValueError(f"SYNTH alpha and beta must be >= 0, got {alpha}, {beta}")
  rng = np.random.default_rng(seed)
  sizes = rng.lognormal(4, 2, num_clients).astype(int) + 50
  if max_samples is not None:
    sizes = np.minimum(sizes, max_samples)
  u = rng.normal(0, alpha, num_clients)
  big_b = rng.normal(0, beta, num_clients)
  std_x = np.power(np.arange(1, dim + 1, dtype=np.float64), -1.2) ** 0.5
  xs, ys = [], []
  for k in range(num_clients):
    v = rng.normal(big_b[k], 1, dim)
    w = rng.normal(u[k], 1, (dim, num_classes))
    b = rng.normal(u[k], 1, num_classes)
    x = v + rng.standard_normal((sizes[k], dim)) * std_x
    xs.append(x.astype(np.float32))
    ys.append(np.argmax(x @ w + b, axis=1).astype(np.int32))
  return xs, ys


def char_windows(text: str, window: int = 80) -> tuple[np.ndarray, np.ndarray]:
  """Cuts text into `window`-character inputs with the next character as label."""
  codes = encode_chars(text)
  n = len(codes) - window
  if n < 1:
    raise ValueError(f"text of {len(codes)} characters is too short for {window}-character windows")
  x = np.stack([codes[i:i + window] for i in range(n)])
  return x.astype(np.int32), codes[window:window + n].astype(np.int32)
