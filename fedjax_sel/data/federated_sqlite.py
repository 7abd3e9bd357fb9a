"""fedjax's federated SQLite files (EMNIST, Shakespeare, Stack Overflow, CIFAR-100), read as
published.

Each split is one SQLite file with the table `federated_data(client_id BLOB, data BLOB,
num_examples INTEGER)`, a row per client: `data` is the zlib-compressed msgpack map of the
client's arrays by feature name, each array a msgpack extension (type 1: `[shape, dtype name,
C-order bytes]`; type 3: a NumPy scalar the same way; type 4: an array of byte strings as
`[shape, [bytes, ...]]`). The files keep fedjax's names, so a fedjax cache (`~/.cache/fedjax`,
the default data dir) is read as it is:

- `emnist`: federated_emnist_{train,test}.sqlite (`--emnist_only_digits`: the
  federated_emnist_digitsonly_ files), features pixels [n, 28, 28] float32 (1 = background) and
  label [n]; x = 1 - pixels as [28, 28, 1] (ink = 1, as fedjax feeds its models), 62 classes (10).
- `shakespeare`: shakespeare_{train,test}.sqlite, feature snippets [n] (byte strings); windows
  of 80 of fedjax's 90 character ids, each labelled with the id that follows it
  (`shakespeare_windows`).
- `stackoverflow_nwp`: stackoverflow_{train,test}.sqlite, feature tokens [n] (byte strings of
  space-separated words, one sentence each), and fedjax's vocabulary file stackoverflow.word_count
  (lines `word count`, most frequent first; its first 10,000 words). Ids as fedjax's tokenizer
  gives them: 0 pads, 1 begins and 2 ends a sentence, word i of the vocabulary is 3 + i and any
  other word the out-of-vocabulary id 10,003 (10,004 classes). Each sentence gives one example per
  target token of fedjax's `x, y = ids[:-1], ids[1:]` cut at 20 (`stackoverflow_windows`): the ids
  before the target, left-padded with 0 to 20, labelled with the target; the mean loss over a
  client's examples is fedjax's per-token loss. The held-out split is not read.
- `cifar100_fed`: federated_cifar100_{train,test}.sqlite, features image [n, 32, 32, 3] uint8,
  label [n], coarse_label [n]; x = (image / 255 - mean) / std per channel (fedjax's constants,
  no augmentation), 100 classes.

Each feature read is checked to hold the dtype and example shape listed (`FIELDS`) before it is
preprocessed: Shakespeare snippets stored as integers, say, would otherwise be read as their raw
bytes (nearly all out of vocabulary) and trained on. A file of another type is refused naming the
file, the client, the field and the type expected; so is a label outside the classes, in either
split, and a vocabulary file starting with a byte-order mark (`read_vocab`).

Train and test hold the same client ids for EMNIST and Shakespeare (each client's published test
split is its test pool; a test client unknown to the train file is refused). Stack Overflow's test
split holds the users who posted after its cut-off date: a train client's test pool is its own test
posts (none when it has none); test users not in the train file are not read. CIFAR-100's 100 test
clients are other clients than its 500 train clients: test client `k mod 100` is train client k's
test pool, so the pooled test accuracy is the published test set's (each test example counted five
times) and per-client test accuracy is not a client's own.

Nothing is fetched unless asked: `download(name, folder)` (the launchers' `--download`) fetches
the published files, checks each against its SHA-256 where one is published (fedjax publishes
none for EMNIST and Shakespeare: their structure is checked instead, and the digest printed), and
moves it in place only then.

Examples:
  >>> import zlib, msgpack
  >>> blob = zlib.compress(msgpack.packb({"label": encode_array(np.arange(3, dtype=np.int32))}))
  >>> decode_blob(blob, "f.sqlite", b"c0")["label"].tolist()
  [0, 1, 2]
"""

from __future__ import annotations

import codecs
import hashlib
import http.client
import os
import sqlite3
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from typing import NamedTuple

import msgpack
import numpy as np

from fedjax_sel.data import store

TABLE = "federated_data"
COLUMNS = ("client_id", "data", "num_examples")
EXT_ARRAY, EXT_SCALAR, EXT_BYTES_ARRAY = 1, 3, 4
DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cache", "fedjax")
BASE_URL = "https://storage.googleapis.com/gresearch/fedjax"
TIMEOUT_S = 60  # A download's wait for the server, per connection attempt and read.

# Shakespeare, as fedjax tokenizes it: byte `TABLE[i]` is id 3 + i; 0 pads, 1 begins and 2 ends a
# snippet; any other byte is the out-of-vocabulary id 89.
SHAKESPEARE_BYTES = (b"dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\n"
                     b"aeimquyAEIMQUY]!%)-159\r")
PAD, BOS, EOS = 0, 1, 2
OOV = 3 + len(SHAKESPEARE_BYTES)
SHAKESPEARE_VOCAB = OOV + 1
SEQUENCE = 80
VOCAB_FILE = "stackoverflow.word_count"
STACKOVERFLOW_WORDS = 10000
STACKOVERFLOW_LENGTH = 20
CIFAR_MEAN = np.array([0.4914, 0.4822, 0.4465], np.float32)
CIFAR_STD = np.array([0.2023, 0.1994, 0.2010], np.float32)
# What fedjax's files hold in each feature the loaders read: (dtype kinds, what that is, the shape
# of one example). "OS": byte strings (msgpack extension type 4), item by item.
FIELDS = {
    "pixels": ("f", "floats (fedjax's float32, 1 = background)", (28, 28)),
    "label": ("iu", "integer class ids (a float label would be truncated)", ()),
    "image": ("u", "uint8 pixel values 0..255", (32, 32, 3)),
    "snippets": ("OS", "byte strings (msgpack extension type 4)", ()),
    "tokens": ("OS", "byte strings of space-separated words (msgpack extension type 4)", ()),
}
# Byte-order marks a vocabulary file may start with, UTF-32 first (its mark starts with UTF-16's).
BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
        (codecs.BOM_UTF8, "UTF-8"), (codecs.BOM_UTF16_LE, "UTF-16"),
        (codecs.BOM_UTF16_BE, "UTF-16"))


class Published(NamedTuple):
  """A natively federated dataset with its published per-client test split."""

  xs: list
  ys: list
  num_classes: int
  test_xs: list
  test_ys: list


def files(name: str, only_digits: bool = False) -> tuple[str, str]:
  """The published (train, test) file names of dataset `name`."""
  if name == "emnist":
    stem = "federated_emnist_digitsonly" if only_digits else "federated_emnist"
    return f"{stem}_train.sqlite", f"{stem}_test.sqlite"
  if name == "shakespeare":
    return "shakespeare_train.sqlite", "shakespeare_test.sqlite"
  if name == "stackoverflow_nwp":
    return "stackoverflow_train.sqlite", "stackoverflow_test.sqlite"
  if name == "cifar100_fed":
    return "federated_cifar100_train.sqlite", "federated_cifar100_test.sqlite"
  raise ValueError(f"unknown federated SQLite dataset {name!r}; accepted: "
                   f"{', '.join(DATASETS)}")


def url(name: str, filename: str) -> str:
  """Where fedjax publishes `filename` (CIFAR-100 is converted by fedjax from TFF's file and has
  no published SQLite file of its own)."""
  if name == "cifar100_fed":
    raise ValueError("cifar100_fed has no published SQLite file: fedjax converts TFF's "
                     "cifar100.sqlite.lzma on first use; run fedjax.datasets.cifar100.load_data() "
                     f"once where fedjax is installed and copy {filename} from ~/.cache/fedjax")
  folder = "stackoverflow" if name == "stackoverflow_nwp" else name
  return f"{BASE_URL}/{folder}/{filename}"


def published_files(name: str, only_digits: bool = False) -> tuple[str, ...]:
  """Every file dataset `name` reads: its (train, test) files, then Stack Overflow's vocabulary."""
  return (*files(name, only_digits), *((VOCAB_FILE,) if name == "stackoverflow_nwp" else ()))


def _absent(name: str, data_dir: str, only_digits: bool) -> list[str]:
  """Dataset `name`'s files (`published_files`) that `data_dir` lacks."""
  return [f for f in published_files(name, only_digits)
          if not os.path.isfile(os.path.join(data_dir, f))]


def _listing(name: str, filenames: list[str]) -> str:
  """Dataset `name`'s files `filenames`, each with where it is published."""
  return ", ".join(f"{f} (published at {url(name, f)})" for f in filenames)


def _missing(name: str, data_dir: str, missing: list[str]) -> FileNotFoundError:
  """The error of dataset `name`'s files `missing` (all of them) that `data_dir` lacks, with
  where each is published and how to get it."""
  where = f"no such file{'s' if len(missing) > 1 else ''} in {data_dir}"
  if name == "cifar100_fed":
    return FileNotFoundError(f"{where}: {', '.join(missing)}. fedjax converts TFF's CIFAR-100 on "
                             "first use: run fedjax.datasets.cifar100.load_data() once where "
                             "fedjax is installed and copy ~/.cache/fedjax/federated_cifar100_"
                             "*.sqlite into --data_dir")
  them = "them" if len(missing) > 1 else "it"
  return FileNotFoundError(f"{where}: {_listing(name, missing)}: run with --download to fetch "
                           f"{them}, or copy {them} into --data_dir")


# Published SHA-256 digests (none for fedjax's EMNIST and Shakespeare files).
CHECKSUMS = {
    "federated_cifar100_train.sqlite":
        "a4dc2f4ac4c9b6e7bd5234a1b568389384c00c903dcd34001c3cf50a4a81c713",
    "federated_cifar100_test.sqlite":
        "74416c6ee8f41b1086f0e0e3c5289ac6df5a641100df48e8b583411a55de891f",
}


# --- The blobs ----------------------------------------------------------------------------------

def encode_array(a: np.ndarray) -> msgpack.ExtType:
  """A NumPy array as fedjax's msgpack extension (type 1; type 4 for arrays of bytes)."""
  a = np.asarray(a)
  if a.dtype == object or a.dtype.kind == "S":
    items = [bytes(b) for b in a.ravel()]
    return msgpack.ExtType(EXT_BYTES_ARRAY, msgpack.packb((list(a.shape), items),
                                                          use_bin_type=True))
  return msgpack.ExtType(EXT_ARRAY, msgpack.packb(
      (list(a.shape), a.dtype.name, np.ascontiguousarray(a).tobytes()), use_bin_type=True))


def encode_blob(arrays: dict) -> bytes:
  """A client's arrays as a `data` blob (what the tests' fixtures write)."""
  return zlib.compress(msgpack.packb({k: encode_array(v) for k, v in arrays.items()},
                                     use_bin_type=True))


def _ext(code: int, payload: bytes):
  if code in (EXT_ARRAY, EXT_SCALAR):
    shape, dtype, buf = msgpack.unpackb(payload, raw=True)
    array = np.frombuffer(buf, np.dtype(dtype.decode())).reshape(shape)
    return array[()] if code == EXT_SCALAR else array
  if code == EXT_BYTES_ARRAY:
    shape, items = msgpack.unpackb(payload, raw=True)
    out = np.empty(len(items), object)
    out[:] = items
    return out.reshape(shape)
  raise ValueError(f"msgpack extension type {code} (accepted: 1 array, 3 scalar, 4 byte strings)")


def decode_blob(blob: bytes, path: str, client) -> dict:
  """One client's `data` blob as {feature: array}; ValueError naming the file and client."""
  try:
    value = msgpack.unpackb(zlib.decompress(blob), ext_hook=_ext, raw=False)
  except (zlib.error, ValueError, TypeError, msgpack.UnpackException) as e:
    raise ValueError(f"{path}: client {client!r}: its data blob is not zlib-compressed msgpack of "
                     f"arrays ({e})") from e
  if not isinstance(value, dict) or not all(isinstance(v, np.ndarray) for v in value.values()):
    raise ValueError(f"{path}: client {client!r}: its data blob is not a map of feature arrays")
  return value


# --- The files ----------------------------------------------------------------------------------

def _connect(path: str) -> sqlite3.Connection:
  if not os.path.isfile(path):
    raise FileNotFoundError(path)
  try:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    names = [r[1] for r in db.execute(f"PRAGMA table_info({TABLE})")]
  except sqlite3.DatabaseError as e:
    raise ValueError(f"{path}: not an SQLite file ({e})") from e
  if not names:
    raise ValueError(f"{path}: has no table {TABLE!r} (a federated SQLite file has "
                     f"{TABLE}({', '.join(COLUMNS)}))")
  missing = [c for c in COLUMNS if c not in names]
  if missing:
    raise ValueError(f"{path}: table {TABLE!r} has no column {missing[0]!r} (it needs "
                     f"{', '.join(COLUMNS)})")
  return db


def check_field(path: str, client, name: str, array: np.ndarray) -> None:
  """Refuses feature `name` of a client unless its dtype and example shape are fedjax's (`FIELDS`).

  Raises:
    ValueError: naming the file, the client, the field, what it holds and the type expected.
  """
  kinds, expected, shape = FIELDS[name]
  where = f"{path}: client {client!r}: field {name!r}"
  if array.dtype.kind not in kinds:
    held = "byte strings" if array.dtype.kind in "OS" else f"{array.dtype} values"
    raise ValueError(f"{where} holds {held}, expected {expected}")
  if array.ndim != 1 + len(shape) or array.shape[1:] != shape:
    raise ValueError(f"{where} has shape {list(array.shape)}, expected "
                     f"[{', '.join(['n', *map(str, shape)])}] of {expected}")
  if kinds == "OS":
    for i, item in enumerate(array.tolist()):
      if not isinstance(item, bytes):
        raise ValueError(f"{where}: item {i} is {type(item).__name__} {item!r:.40}, expected "
                         f"{expected}")


def read_clients(path: str, features: tuple[str, ...]) -> Iterator[tuple[object, dict]]:
  """(client id, {feature: array}) per row, in the file's order; ValueError naming the file and
  client for a bad blob, a missing feature, a feature of another type than fedjax's
  (`check_field`), or arrays whose length is not `num_examples`."""
  db = _connect(path)
  try:
    for client, blob, count in db.execute(
        f"SELECT client_id, data, num_examples FROM {TABLE} ORDER BY rowid"):
      arrays = decode_blob(blob, path, client)
      absent = [f for f in features if f not in arrays]
      if absent:
        raise ValueError(f"{path}: client {client!r} has no feature {absent[0]!r} (it has "
                         f"{sorted(arrays)})")
      for f in features:
        check_field(path, client, f, arrays[f])
      lengths = {f: len(arrays[f]) for f in features}
      if any(n != count for n in lengths.values()):
        raise ValueError(f"{path}: client {client!r} says num_examples={count} but holds "
                         f"{lengths}")
      yield client, arrays
  finally:
    db.close()


def check_file(path: str) -> int:
  """The number of clients of a federated SQLite file, after checking its table and its first
  client's blob (ValueError naming the file)."""
  db = _connect(path)
  try:
    first = db.execute(f"SELECT client_id, data FROM {TABLE} ORDER BY rowid LIMIT 1").fetchone()
    if first is not None:
      decode_blob(first[1], path, first[0])
    return int(db.execute(f"SELECT COUNT(*) FROM {TABLE}").fetchone()[0])
  finally:
    db.close()


# --- Preprocessing ------------------------------------------------------------------------------

_BYTE_IDS = np.full(256, OOV, np.int32)
_BYTE_IDS[np.frombuffer(SHAKESPEARE_BYTES, np.uint8)] = np.arange(3, OOV, dtype=np.int32)


def shakespeare_windows(snippets, length: int = SEQUENCE) -> tuple[np.ndarray, np.ndarray]:
  """fedjax's windows of one client: its snippets as `[BOS] + ids + [EOS]`, joined, cut into
  consecutive windows of `length` ids; each window labelled with the id that follows it (LEAF's
  next-character task); the last window's padding left out.

  Examples:
    >>> x, y = shakespeare_windows([b"hello", b"hi there"], length=10)
    >>> x.tolist(), y.tolist()
    ([[1, 4, 67, 5, 5, 26, 2, 1, 4, 68]], [16])
  """
  joined = np.concatenate([np.concatenate([[BOS], _BYTE_IDS[np.frombuffer(bytes(s), np.uint8)],
                                           [EOS]]) for s in snippets]).astype(np.int32)
  windows = (len(joined) - 1) // length  # Windows whose next id exists.
  x = joined[:windows * length].reshape(windows, length)
  y = joined[length:(windows + 1) * length:length]
  return x, y


def _emnist(arrays: dict) -> tuple[np.ndarray, np.ndarray]:
  return (1.0 - arrays["pixels"].astype(np.float32))[..., None], arrays["label"].astype(np.int32)


def _cifar(arrays: dict) -> tuple[np.ndarray, np.ndarray]:
  x = (arrays["image"].astype(np.float32) / 255.0 - CIFAR_MEAN) / CIFAR_STD
  return x, arrays["label"].astype(np.int32)


def _shakespeare(arrays: dict) -> tuple[np.ndarray, np.ndarray]:
  return shakespeare_windows(arrays["snippets"])


def _refuse_bom(path: str, head: bytes) -> None:
  """ValueError naming the file and the byte-order mark `head` (its first bytes) starts with."""
  for bom, encoding in BOMS:
    if head.startswith(bom):
      raise ValueError(f"{path}: starts with a {encoding} byte-order mark ({bom!r}); a vocabulary "
                       "is read as fedjax publishes it, UTF-8 text without one (the mark would "
                       "become part of its first word): save it as UTF-8 without a byte-order "
                       "mark, or fetch it again with --download")


def read_vocab(path: str, size: int = STACKOVERFLOW_WORDS) -> dict[bytes, int]:
  """fedjax's Stack Overflow vocabulary: the first `size` words of `path` (lines `word count`,
  most frequent first) as {word: id}, ids from 3 (0, 1 and 2 are PAD, BOS and EOS).

  A file starting with a byte-order mark is refused, not stripped: fedjax's file has none, and
  one (an editor's re-save) would become part of the first, most frequent word.

  Raises:
    FileNotFoundError: naming the file, where it is published and `--download`.
    ValueError: naming the file and line that is not `word count`, a word listed twice, or the
      byte-order mark the file starts with.
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: no such file. It is published at "
                            f"{url('stackoverflow_nwp', VOCAB_FILE)}: run with --download to "
                            "fetch it, or copy it into --data_dir")
  vocab = {}
  with open(path, "rb") as f:
    _refuse_bom(path, f.read(4))
    f.seek(0)
    for number, line in enumerate(f, 1):
      if len(vocab) == size:
        break
      fields = line.split()
      if len(fields) != 2 or not fields[1].isdigit():
        raise ValueError(f"{path}: line {number} is {line[:60]!r}, not `word count`")
      if fields[0] in vocab:
        raise ValueError(f"{path}: line {number} lists {fields[0]!r} a second time")
      vocab[fields[0]] = 3 + len(vocab)
  if not vocab:
    raise ValueError(f"{path}: holds no words")
  return vocab


def stackoverflow_windows(sentences, vocab: dict[bytes, int],
                          length: int = STACKOVERFLOW_LENGTH) -> tuple[np.ndarray, np.ndarray]:
  """One client's next-word examples: each sentence as fedjax's ids `[BOS] + words + [EOS]`
  (a word outside `vocab` is the out-of-vocabulary id `3 + len(vocab)`), one example per target
  of fedjax's `y = ids[1:length + 1]`: the ids before it, left-padded with PAD (0) to `length`,
  labelled with it. Sentence by sentence, target by target.

  Examples:
    >>> x, y = stackoverflow_windows([b"how to sort", b"sort"], {b"sort": 3, b"to": 4}, length=3)
    >>> x.tolist(), y.tolist()
    ([[0, 0, 1], [0, 1, 5], [1, 5, 4], [0, 0, 1], [0, 1, 3]], [5, 4, 3, 3, 2])
  """
  oov = 3 + len(vocab)
  rows = [[BOS, *(vocab.get(w, oov) for w in bytes(s).split(b" ")), EOS] for s in sentences]
  if not rows:
    return np.zeros((0, length), np.int32), np.zeros((0,), np.int32)
  targets = np.array([min(len(r) - 1, length) for r in rows])
  ids = np.zeros((len(rows), length + 1), np.int32)
  for i, r in enumerate(rows):
    ids[i, :targets[i] + 1] = r[:targets[i] + 1]
  sentence = np.repeat(np.arange(len(rows)), targets)
  position = np.arange(len(sentence)) - np.repeat(np.cumsum(targets) - targets, targets) + 1
  # Window j of target t holds ids[t - length + j] (PAD before the sentence starts).
  source = position[:, None] - length + np.arange(length)[None, :]
  x = np.where(source >= 0, ids[sentence[:, None], np.maximum(source, 0)], PAD)
  return x.astype(np.int32), ids[sentence, position]


class _Reader(NamedTuple):
  """What reading dataset `name` needs: its two files, features and preprocessing."""

  train_file: str
  test_file: str
  features: tuple[str, ...]
  prepare: object
  num_classes: int


DATASETS = {  # name -> (features, classes); the preprocessing is `_reader`'s.
    "emnist": (("pixels", "label"), 62),
    "shakespeare": (("snippets",), SHAKESPEARE_VOCAB),
    "stackoverflow_nwp": (("tokens",), STACKOVERFLOW_WORDS + 4),
    "cifar100_fed": (("image", "label"), 100),
}


def _reader(name: str, data_dir: str, only_digits: bool) -> _Reader:
  """Dataset `name`'s files (checked to exist, every missing one named at once) and
  preprocessing."""
  features, classes = DATASETS[name]
  missing = _absent(name, data_dir, only_digits)
  if missing:
    raise _missing(name, data_dir, missing)
  train_file, test_file = (os.path.join(data_dir, f) for f in files(name, only_digits))
  prepare = {"emnist": _emnist, "shakespeare": _shakespeare, "cifar100_fed": _cifar}.get(name)
  if name == "emnist" and only_digits:
    classes = 10
  if name == "stackoverflow_nwp":
    vocab = read_vocab(os.path.join(data_dir, VOCAB_FILE))
    classes = len(vocab) + 4
    prepare = lambda arrays: stackoverflow_windows(arrays["tokens"], vocab)
  return _Reader(train_file, test_file, features, prepare, classes)


def _prepared(reader: _Reader, path: str, client, arrays: dict) -> tuple[np.ndarray, np.ndarray]:
  """One client's (x, y) of file `path`, its labels checked to lie in the dataset's classes."""
  x, y = reader.prepare(arrays)
  outside = y[(y < 0) | (y >= reader.num_classes)]
  if len(outside):
    raise ValueError(f"{path}: client {client!r} holds label {int(outside[0])}, outside "
                     f"0..{reader.num_classes - 1}")
  return x, y


def _train_clients(reader: _Reader, num_clients: int) -> Iterator[tuple[object, tuple]]:
  """The first `num_clients` (0: all) train clients, preprocessed, labels checked."""
  count = 0
  for client, arrays in read_clients(reader.train_file, reader.features):
    if num_clients and count == num_clients:
      return
    count += 1
    yield client, _prepared(reader, reader.train_file, client, arrays)
  if num_clients > count:
    raise ValueError(f"{reader.train_file}: holds {count} clients, fewer than num_clients="
                     f"{num_clients}")


def _all_ids(path: str) -> list:
  db = _connect(path)
  try:
    return [r[0] for r in db.execute(f"SELECT client_id FROM {TABLE}")]
  finally:
    db.close()


def _test_pools(name: str, reader: _Reader, ids: list) -> Iterator[tuple[int, tuple]]:
  """(train index, its test pool) for the train clients `ids` that have one (module docstring)."""
  if name == "cifar100_fed":  # Other clients: test client k mod T serves train client k.
    pools = [_prepared(reader, reader.test_file, c, a)
             for c, a in read_clients(reader.test_file, reader.features)]
    for k in range(len(ids) if pools else 0):
      yield k, pools[k % len(pools)]
    return
  index = {c: k for k, c in enumerate(ids)}
  if name != "stackoverflow_nwp":
    known = set(_all_ids(reader.train_file))
    unknown = [c for c in _all_ids(reader.test_file) if c not in known]
    if unknown:
      raise ValueError(f"{reader.test_file}: {len(unknown)} test clients are not in "
                       f"{reader.train_file} (first: {unknown[0]!r}); the two files must be one "
                       "dataset's splits")
  for client, arrays in read_clients(reader.test_file, reader.features):
    if client in index:
      yield index[client], _prepared(reader, reader.test_file, client, arrays)


def load(name: str, data_dir: str = DEFAULT_DIR, num_clients: int = 0,
         only_digits: bool = False) -> Published:
  """Dataset `name`'s first `num_clients` train clients (0: all) with their published test
  splits (see the module's table), in memory (`write_store` for populations that do not fit).

  Raises:
    FileNotFoundError: naming every missing file, where each is published and `--download`.
    ValueError: naming the file and the client of malformed data, or test clients the train file
      does not hold.
  """
  reader = _reader(name, data_dir, only_digits)
  ids, xs, ys = [], [], []
  for client, (x, y) in _train_clients(reader, num_clients):
    ids.append(client)
    xs.append(x)
    ys.append(y)
  empty = (xs[0][:0], ys[0][:0]) if xs else (np.zeros((0,)), np.zeros((0,), np.int32))
  test = [empty] * len(ids)
  for k, pool in _test_pools(name, reader, ids):
    test[k] = pool
  return Published(xs, ys, reader.num_classes, [p[0] for p in test], [p[1] for p in test])


def write_store(name: str, folder: str, data_dir: str = DEFAULT_DIR, num_clients: int = 0,
                only_digits: bool = False, seed: int = 0):
  """Writes dataset `name` straight to a memory-mapped client store (`data/store.py`), one
  client in memory at a time, and opens it: for Stack Overflow's 342,477 users, whose windows do
  not fit in memory. Two passes over the files (counting, then writing); the store holds what
  `build_dataset` with `val_fraction=0` and no public set builds in memory (each client's training
  rows in the same seeded order), so a run on it is the same.
  """
  reader = _reader(name, data_dir, only_digits)
  ids, counts, shape = [], [], None
  for client, (x, y) in _train_clients(reader, num_clients):
    ids.append(client)
    counts.append(len(y))
    shape = x.shape[1:]
  if not ids:
    raise ValueError(f"{reader.train_file}: holds no clients")
  test_counts = np.zeros(len(ids), np.int64)
  for k, (_, y) in _test_pools(name, reader, ids):
    test_counts[k] = len(y)
  writer = store.StoreWriter(folder, {"train": np.array(counts), "test": test_counts},
                             shape, reader.num_classes)
  rng = np.random.default_rng(seed)  # As `split_clients` orders each client's training rows.
  for k, (_, (x, y)) in enumerate(_train_clients(reader, num_clients)):
    order = rng.permutation(len(y))
    writer.put("train", k, x[order], y[order])
  for k, (x, y) in _test_pools(name, reader, ids):
    writer.put("test", k, x, y)
  return writer.close(name)


def _unreachable(source: str, error: Exception) -> str:
  """Why `source` could not be fetched: the server's answer, or that this machine seems offline."""
  if isinstance(error, urllib.error.HTTPError):
    return f"{source} answered HTTP {error.code} {error.reason}"
  reason = error.reason if isinstance(error, urllib.error.URLError) else error
  return f"cannot reach {source} ({reason or type(error).__name__}): this machine seems offline"


def _fetch(source: str, part: str) -> str:
  """Streams `source` into the file `part`; the SHA-256 (hex) of what it wrote."""
  digest = hashlib.sha256()
  with (urllib.request.urlopen(source, timeout=TIMEOUT_S) as response,  # noqa: S310
        open(part, "wb") as out):
    while chunk := response.read(1 << 20):
      digest.update(chunk)
      out.write(chunk)
  return digest.hexdigest()


def download(name: str, data_dir: str, only_digits: bool = False, base_url: str = BASE_URL,
             log=print) -> list[str]:
  """Fetches dataset `name`'s published files into `data_dir` (those not there yet): each into
  a `.part` file, checked (its SHA-256 against `CHECKSUMS` where published, then its table and
  first blob, or the vocabulary's first line), then moved in place. Returns the paths.

  Raises:
    FileNotFoundError: a file that cannot be fetched (no network, or the server's refusal): naming
      its address, why, and every file still missing with where it is published, to copy into
      `data_dir` by hand (the `.part` removed).
    ValueError: naming the file whose digest or structure does not match (the `.part` removed).
  """
  os.makedirs(data_dir, exist_ok=True)
  paths = []
  for filename in published_files(name, only_digits):
    path = os.path.join(data_dir, filename)
    paths.append(path)
    if os.path.exists(path):
      continue
    source = url(name, filename).replace(BASE_URL, base_url.rstrip("/"), 1)
    log(f"downloading {source}")
    part = path + ".part"
    try:
      digest = _fetch(source, part)
    except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as e:
      if os.path.exists(part):
        os.remove(part)
      raise FileNotFoundError(f"--download of {name}: {_unreachable(source, e)}. Copy {name}'s "
                              f"published files into --data_dir ({data_dir}) from a machine with "
                              "a network, then run again: "
                              f"{_listing(name, _absent(name, data_dir, only_digits))}") from e
    want = CHECKSUMS.get(filename)
    try:
      if want is not None and digest != want:
        raise ValueError(f"{source}: SHA-256 {digest}, published {want}")
      what = (f"{len(read_vocab(part, 1 << 30))} words" if filename == VOCAB_FILE
              else f"{check_file(part)} clients")
    except ValueError:
      os.remove(part)
      raise
    os.replace(part, path)
    log(f"{path}: {what}, SHA-256 {digest}"
        + ("" if want else " (no published digest to check against)"))
  return paths
