"""fedjax's federated SQLite files (`data/federated_sqlite.py`), on small files written here in the
published format: each dataset's preprocessing and published test split, the download step
(from a file:// mirror), malformed files refused naming the file and the problem, and a
3,400-client EMNIST-shaped file through the host store from `experiments.run`."""

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
import zlib

import msgpack
import numpy as np
import pytest

import fedjax_sel as fs
from fedjax_sel.data import federated_sqlite as fsql

from tests.hang_guard import HANG_GUARD_S

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = ("CREATE TABLE federated_data (client_id BLOB NOT NULL PRIMARY KEY, data BLOB NOT NULL, "
          "num_examples INTEGER NOT NULL);")


def write_sqlite(path, clients, schema=SCHEMA):
  """`clients`: {client id (bytes): {feature: array}} as fedjax writes them."""
  if os.path.exists(path):
    os.remove(path)
  db = sqlite3.connect(path)
  db.execute(schema)
  db.executemany("INSERT INTO federated_data VALUES (?, ?, ?);",
                 [(cid, fsql.encode_blob(arrays), len(next(iter(arrays.values()))))
                  for cid, arrays in clients.items()])
  db.commit()
  db.close()


def emnist_clients(num, per_client, seed, classes=62):
  rng = np.random.default_rng(seed)
  return {f"{k:016x}:f{k:04d}_00".encode(): {
      "pixels": rng.random((per_client, 28, 28)).astype(np.float32),
      "label": rng.integers(0, classes, per_client).astype(np.int32)} for k in range(num)}


def write_emnist(folder, num=5, train=4, test=2, stem="federated_emnist"):
  os.makedirs(folder, exist_ok=True)
  tr, te = emnist_clients(num, train, 0), emnist_clients(num, test, 1)
  write_sqlite(os.path.join(folder, f"{stem}_train.sqlite"), tr)
  write_sqlite(os.path.join(folder, f"{stem}_test.sqlite"), te)
  return tr, te


def test_emnist_reads_pixels_labels_and_the_published_test_split(tmp_path):
  tr, te = write_emnist(str(tmp_path))
  data = fs.build_dataset(fs.DatasetSpec("emnist", num_clients=5, data_dir=str(tmp_path)), seed=0)
  assert data.num_clients == 5 and data.feature_shape == (28, 28, 1) and data.num_classes == 62
  for k, (cid, arrays) in enumerate(tr.items()):
    x, y = data.train.client(k)
    order = np.argsort(y, kind="stable")
    want = np.argsort(arrays["label"], kind="stable")
    np.testing.assert_array_equal(np.sort(y), np.sort(arrays["label"]))
    np.testing.assert_allclose(x[order], (1.0 - arrays["pixels"][want])[..., None])
    tx, ty = data.test.client(k)
    np.testing.assert_array_equal(ty, te[cid]["label"])  # The published split, as published.
    np.testing.assert_allclose(tx, (1.0 - te[cid]["pixels"])[..., None])


def test_emnist_digits_only_reads_the_digitsonly_files(tmp_path):
  write_emnist(str(tmp_path), stem="federated_emnist_digitsonly")
  with pytest.raises(ValueError, match="holds label"):  # Labels of 62 classes in 10-class files.
    fsql.load("emnist", str(tmp_path), 0, only_digits=True)


def test_shakespeare_windows_as_fedjax_cuts_them(tmp_path):
  text = {b"0001:A": {"snippets": np.array([b"hello", b"hi there"] * 10, object)},
          b"0002:B": {"snippets": np.array([b"To be, or not to be" * 6], object)}}
  test = {b"0001:A": {"snippets": np.array([b"hi there, again and again and again" * 4],
                                           object)}}
  write_sqlite(str(tmp_path / "shakespeare_train.sqlite"), text)
  write_sqlite(str(tmp_path / "shakespeare_test.sqlite"), test)
  data = fs.build_dataset(fs.DatasetSpec("shakespeare", num_clients=2, data_dir=str(tmp_path)),
                          seed=0)
  assert data.num_classes == fsql.SHAKESPEARE_VOCAB == 90 and data.feature_shape == (80,)
  x, y = fsql.shakespeare_windows(text[b"0001:A"]["snippets"])
  assert len(y) == (170 - 1) // 80  # 10 x (7 + 10) ids: two whole windows.
  assert data.train.counts.tolist()[0] == len(y) and data.test.counts.tolist() == [1, 0]
  # The fedjax tokenizer's test vector (ids of "hello", BOS / EOS), and an unknown byte.
  first = fsql.shakespeare_windows([b"hello", b"hi there"], 6)[0][0]
  assert first.tolist() == [1, 4, 67, 5, 5, 26]
  assert fsql.shakespeare_windows([b"~~"], 2)[0].tolist() == [[1, fsql.OOV]]
  model = fs.build_model("char_lstm", data.feature_shape, data.num_classes)
  assert model.num_classes == 90


def test_cifar100_deals_the_other_test_clients_over_the_train_clients(tmp_path):
  rng = np.random.default_rng(0)
  make = lambda n: {str(k).encode(): {"image": rng.integers(0, 256, (3, 32, 32, 3), np.uint8),
                                      "label": rng.integers(0, 100, 3),
                                      "coarse_label": rng.integers(0, 20, 3)} for k in range(n)}
  tr, te = make(5), make(2)
  write_sqlite(str(tmp_path / "federated_cifar100_train.sqlite"), tr)
  write_sqlite(str(tmp_path / "federated_cifar100_test.sqlite"), te)
  got = fsql.load("cifar100_fed", str(tmp_path))
  assert got.num_classes == 100 and len(got.xs) == 5
  np.testing.assert_allclose(got.xs[0][0, 0, 0], (tr[b"0"]["image"][0, 0, 0] / 255
                                                   - fsql.CIFAR_MEAN) / fsql.CIFAR_STD, rtol=1e-5)
  assert [y.tolist() for y in got.test_ys] == [te[str(k % 2).encode()]["label"].tolist()
                                               for k in range(5)]


def test_download_fetches_checks_and_places_the_files(tmp_path):
  mirror = tmp_path / "mirror" / "emnist"
  write_emnist(str(mirror))
  said = []
  paths = fsql.download("emnist", str(tmp_path / "cache"),
                        base_url=(tmp_path / "mirror").as_uri(), log=said.append)
  assert [os.path.basename(p) for p in paths] == ["federated_emnist_train.sqlite",
                                                  "federated_emnist_test.sqlite"]
  assert all(os.path.exists(p) for p in paths) and "5 clients" in said[1]
  assert "no published digest" in said[1]
  assert fsql.load("emnist", str(tmp_path / "cache"), 3).num_classes == 62


def test_download_refuses_a_file_whose_digest_differs(tmp_path, monkeypatch):
  mirror = tmp_path / "mirror" / "emnist"
  write_emnist(str(mirror))
  monkeypatch.setitem(fsql.CHECKSUMS, "federated_emnist_train.sqlite", "0" * 64)
  with pytest.raises(ValueError, match="SHA-256 .* published 0000"):
    fsql.download("emnist", str(tmp_path / "cache"), base_url=(tmp_path / "mirror").as_uri())
  assert not os.listdir(tmp_path / "cache")  # Nothing half-written is left.


def test_download_offline_names_the_address_and_every_file_to_copy(tmp_path, monkeypatch):
  write_emnist(str(tmp_path / "mirror" / "emnist"))
  fsql.download("emnist", str(tmp_path / "cache"), base_url=(tmp_path / "mirror").as_uri())
  os.remove(tmp_path / "cache" / "federated_emnist_test.sqlite")  # One file fetched, one not.

  def offline(source, timeout):
    del source, timeout
    raise urllib.error.URLError(socket.gaierror(-2, "Name or service not known"))
  monkeypatch.setattr(urllib.request, "urlopen", offline)
  with pytest.raises(FileNotFoundError) as e:
    fsql.download("emnist", str(tmp_path / "cache"))
  published = "https://storage.googleapis.com/gresearch/fedjax/emnist/federated_emnist_test.sqlite"
  assert str(e.value) == (
      f"--download of emnist: cannot reach {published} ([Errno -2] Name or service not known): "
      f"this machine seems offline. Copy emnist's published files into --data_dir "
      f"({tmp_path / 'cache'}) from a machine with a network, then run again: "
      f"federated_emnist_test.sqlite (published at {published})")
  assert sorted(os.listdir(tmp_path / "cache")) == ["federated_emnist_train.sqlite"]


def test_download_names_the_servers_refusal(tmp_path, monkeypatch):
  def refused(source, timeout):
    del timeout
    raise urllib.error.HTTPError(source, 403, "Forbidden", None, None)
  monkeypatch.setattr(urllib.request, "urlopen", refused)
  with pytest.raises(FileNotFoundError, match=r"shakespeare_train.sqlite answered HTTP 403 "
                     r"Forbidden\. Copy .* shakespeare_test.sqlite \(published at") as e:
    fsql.download("shakespeare", str(tmp_path))
  assert "offline" not in str(e.value)


def test_missing_files_are_named_all_at_once(tmp_path):
  published = "https://storage.googleapis.com/gresearch/fedjax/emnist/federated_emnist"
  with pytest.raises(FileNotFoundError) as e:
    fsql.load("emnist", str(tmp_path))
  assert str(e.value) == (
      f"no such files in {tmp_path}: federated_emnist_train.sqlite (published at "
      f"{published}_train.sqlite), federated_emnist_test.sqlite (published at "
      f"{published}_test.sqlite): run with --download to fetch them, or copy them into --data_dir")
  write_stackoverflow(str(tmp_path))
  os.remove(tmp_path / "stackoverflow_test.sqlite")
  os.remove(tmp_path / fsql.VOCAB_FILE)
  with pytest.raises(FileNotFoundError, match=r"in \S+: stackoverflow_test.sqlite \(published at "
                     r".*\), stackoverflow.word_count \(published at .*\): run with --download "
                     "to fetch them"):
    fsql.load("stackoverflow_nwp", str(tmp_path))


def _rewrite(path, sql, *args):
  db = sqlite3.connect(path)
  db.execute(sql, args)
  db.commit()
  db.close()


@pytest.mark.parametrize("break_it,needle", [
    (lambda p: _rewrite(p, "UPDATE federated_data SET data = ? WHERE rowid = 2", b"not zlib"),
     "client b'0000000000000001:f0001_00': its data blob is not zlib-compressed msgpack"),
    (lambda p: _rewrite(p, "UPDATE federated_data SET data = ? WHERE rowid = 1",
                        zlib.compress(b"\xc7\x03\x09abc")),  # msgpack ext of an unknown type 9.
     "its data blob is not zlib-compressed msgpack"),
    (lambda p: _rewrite(p, "UPDATE federated_data SET num_examples = 7 WHERE rowid = 1"),
     "says num_examples=7 but holds"),
    (lambda p: _rewrite(p, "ALTER TABLE federated_data DROP COLUMN num_examples"),
     "has no column 'num_examples'"),
    (lambda p: _rewrite(p, "ALTER TABLE federated_data RENAME TO clients"),
     "has no table 'federated_data'"),
    (lambda p: open(p, "wb").write(b"plain text, not a database" * 100), "not an SQLite file"),
])
def test_malformed_train_files_are_refused_naming_file_and_problem(tmp_path, break_it, needle):
  write_emnist(str(tmp_path))
  path = str(tmp_path / "federated_emnist_train.sqlite")
  break_it(path)
  with pytest.raises(ValueError, match=f"{path}: .*{needle}" if "not an" not in needle else
                     needle):
    fsql.load("emnist", str(tmp_path))


def test_a_missing_feature_and_unknown_test_clients_are_refused(tmp_path):
  write_emnist(str(tmp_path))
  extra = emnist_clients(7, 1, 2)  # Clients 5 and 6 are not in the train file.
  write_sqlite(str(tmp_path / "federated_emnist_test.sqlite"), dict(list(extra.items())[5:]))
  with pytest.raises(ValueError, match="2 test clients are not in"):
    fsql.load("emnist", str(tmp_path))
  write_sqlite(str(tmp_path / "other_train.sqlite"), {b"c": {"label": np.zeros(2, np.int32)}})
  with pytest.raises(ValueError, match="client b'c' has no feature 'pixels'"):
    list(fsql.read_clients(str(tmp_path / "other_train.sqlite"), ("pixels", "label")))


def test_a_3400_client_emnist_file_runs_through_the_host_store(tmp_path):
  """EMNIST's shape (3,400 writers, 28 x 28 pixels, 62 classes), two examples each, from
  experiments.run with the host store: every client read, rounds trained."""
  write_emnist(str(tmp_path / "emnist"), num=3400, train=2, test=1)
  out = tmp_path / "run"
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.run", "--dataset=emnist",
       f"--data_dir={tmp_path / 'emnist'}", "--num_clients=3400", "--num_available=200",
       "--clients_per_round=10", "--rounds=2", "--model=logreg", "--store=host", "--seeds=0",
       f"--out_dir={out}"], cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  recs = [json.loads(line) for line in open(out / "seed0" / "metrics.jsonl", encoding="utf-8")]
  assert [r["round"] for r in recs] == [0, 1] and recs[-1]["num_trained"] == 10
  assert len(recs[-1]["participations"]) == 3400


@pytest.mark.slow  # The preset's path is run on LEAF's files by default (test_filfl_presets).
def test_filfl_shakespeare_preset_reads_fedjax_shakespeare(tmp_path):
  """The FilFL preset on fedjax's Shakespeare: its public text cut in the clients' vocabulary,
  DGF filtering a round."""
  lines = [b"To be, or not to be, that is the question: whether tis nobler in the mind " * 3]
  clients = {f"{k:04d}:X".encode(): {"snippets": np.array(lines * 2, object)} for k in range(12)}
  write_sqlite(str(tmp_path / "shakespeare_train.sqlite"), clients)
  write_sqlite(str(tmp_path / "shakespeare_test.sqlite"), clients)
  out = tmp_path / "run"
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.filfl", "--preset=shakespeare", "--dataset=shakespeare",
       f"--data_dir={tmp_path}", "--num_clients=12", "--num_available=6", "--clients_per_round=3",
       "--rounds=1", "--filters=dgf", "--seeds=0", f"--out_dir={out}"], cwd=REPO,
      capture_output=True, text=True, timeout=HANG_GUARD_S)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  data = fs.build_dataset(fs.DatasetSpec("shakespeare", num_clients=12, data_dir=str(tmp_path),
                                         public_text=fs.data.sources.PUBLIC_TEXT), seed=0)
  assert data.public_x.max() < fsql.SHAKESPEARE_VOCAB and data.public_x[0, 0] == fsql.BOS


# --- Stack Overflow ------------------------------------------------------------------------------

WORDS = [b"the", b"to", b"a", b"how", b"i", b"is", b"python", b"list", b"sort", b"error"]


def write_stackoverflow(folder, num=4):
  """Users' sentences (some longer than 20 words, an empty one, unknown words) and a vocabulary
  file of 8 of the 10 words."""
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, fsql.VOCAB_FILE), "w", encoding="utf-8") as f:
    f.writelines(f"{w.decode()} {1000 - i}\n" for i, w in enumerate(WORDS[:8]))
  rng = np.random.default_rng(0)
  sentence = lambda n: b" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), n))
  make = lambda k, n: {"tokens": np.array([sentence(int(m)) for m in rng.integers(1, 30, n)]
                                          + ([b""] if k == 0 else []), object),
                       "type": np.array([b"question"] * (n + (k == 0)), object)}
  train = {f"{k:08d}".encode(): make(k, 3 + k) for k in range(num)}
  test = {f"{k:08d}".encode(): make(k, 2) for k in (1, 2)}
  test[b"99999999"] = make(5, 2)  # A user who posted only after the cut-off date.
  write_sqlite(os.path.join(folder, "stackoverflow_train.sqlite"), train)
  write_sqlite(os.path.join(folder, "stackoverflow_test.sqlite"), test)
  return train, test


def fedjax_pairs(sentences, vocab, length=20):
  """A plain transcription of fedjax's StackoverflowTokenizer (x, y = ids[:-1], ids[1:], cut at
  `length`): the (context before each target, target) pairs a causal model trains on."""
  pairs = []
  for s in sentences:
    ids = [1] + [vocab.get(w, 3 + len(vocab)) for w in bytes(s).split(b" ")] + [2]
    x, y = ids[:-1][:length], ids[1:][:length]
    for j, target in enumerate(y):
      pairs.append(([0] * (length - j - 1) + x[:j + 1], target))
  return pairs


def test_stackoverflow_windows_are_fedjax_token_pairs(tmp_path):
  train, test = write_stackoverflow(str(tmp_path))
  vocab = fsql.read_vocab(str(tmp_path / fsql.VOCAB_FILE))
  assert vocab[b"the"] == 3 and len(vocab) == 8
  data = fs.build_dataset(fs.DatasetSpec("stackoverflow_nwp", num_clients=4,
                                         data_dir=str(tmp_path)), seed=0)
  assert data.num_classes == 8 + 4 and data.feature_shape == (20,)
  for k, arrays in enumerate(train.values()):
    x, y = fsql.stackoverflow_windows(arrays["tokens"], vocab)
    assert [(r.tolist(), int(t)) for r, t in zip(x, y)] == fedjax_pairs(arrays["tokens"], vocab)
    got_x, got_y = data.train.client(k)  # The same examples, shuffled by split_clients.
    assert sorted(zip(map(tuple, got_x.astype(int)), got_y)) == sorted(zip(map(tuple, x), y))
  # Train clients' own test posts; a test user the train file lacks is not read.
  assert data.test.counts.tolist() == [0] + [
      len(fedjax_pairs(test[f"{k:08d}".encode()]["tokens"], vocab)) for k in (1, 2)] + [0]
  assert fs.build_model("word_lstm", data.feature_shape, data.num_classes).num_classes == 12


def test_stackoverflow_store_is_written_a_client_at_a_time_as_built_in_memory(tmp_path):
  """`federated_sqlite.write_store` (two passes, one client in memory) writes the pools
  `build_dataset` builds in memory, array for array."""
  write_stackoverflow(str(tmp_path / "so"))
  spec = fs.DatasetSpec("stackoverflow_nwp", num_clients=3, data_dir=str(tmp_path / "so"),
                        test_fraction=0.0)
  want = fs.build_dataset(spec, seed=0)
  got = fsql.write_store("stackoverflow_nwp", str(tmp_path / "store"), str(tmp_path / "so"),
                         num_clients=3, seed=2)
  for split in ("train", "val", "test"):
    for a, b in zip(getattr(want, split), getattr(got, split)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_array_equal(want.label_hist, got.label_hist)
  assert got.num_classes == want.num_classes and got.name == "stackoverflow_nwp"


@pytest.mark.parametrize("text,needle", [
    ("\ufeffthe 10\nto 9\n", "starts with a UTF-8 byte-order mark"),
    ("the 10\nto\n", "line 2 is b'to\\\\n', not `word count`"),
    ("the 10\nthe 9\n", "line 2 lists b'the' a second time"),
    ("", "holds no words"),
])
def test_a_malformed_vocabulary_is_refused_naming_file_and_line(tmp_path, text, needle):
  write_stackoverflow(str(tmp_path))
  (tmp_path / fsql.VOCAB_FILE).write_text(text, encoding="utf-8")
  with pytest.raises(ValueError, match=f"{fsql.VOCAB_FILE}: {needle}"):
    fsql.load("stackoverflow_nwp", str(tmp_path))
  os.remove(tmp_path / fsql.VOCAB_FILE)
  with pytest.raises(FileNotFoundError, match=r"no such file in \S+: stackoverflow.word_count "
                     r"\(published at \S+/fedjax/stackoverflow/stackoverflow.word_count\): run "
                     "with --download to fetch it"):
    fsql.load("stackoverflow_nwp", str(tmp_path))


def test_stackoverflow_download_fetches_the_vocabulary_too(tmp_path):
  write_stackoverflow(str(tmp_path / "mirror" / "stackoverflow"))
  said = []
  paths = fsql.download("stackoverflow_nwp", str(tmp_path / "cache"),
                        base_url=(tmp_path / "mirror").as_uri(), log=said.append)
  assert [os.path.basename(p) for p in paths] == ["stackoverflow_train.sqlite",
                                                  "stackoverflow_test.sqlite", fsql.VOCAB_FILE]
  assert "8 words" in said[-1]
  assert len(fsql.load("stackoverflow_nwp", str(tmp_path / "cache")).xs) == 4


@pytest.mark.slow
def test_stackoverflow_store_from_make_store_trains_the_word_lstm(tmp_path):
  """The documented path: make_store streams the files into a store, experiments.run trains
  fedjax's Stack Overflow LSTM on it through the host store."""
  write_stackoverflow(str(tmp_path / "so"), num=12)
  common = ["--dataset=stackoverflow_nwp", f"--data_dir={tmp_path / 'so'}", "--num_clients=12"]
  proc = subprocess.run([sys.executable, "-m", "experiments.make_store", *common,
                         f"--store_out={tmp_path / 'store'}"], cwd=REPO, capture_output=True,
                        text=True, timeout=HANG_GUARD_S)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  out = tmp_path / "run"
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.run", f"--store_dir={tmp_path / 'store'}",
       "--store=host", "--num_clients=12", "--num_available=6", "--clients_per_round=3",
       "--rounds=2", "--model=word_lstm", "--seeds=0", f"--out_dir={out}"], cwd=REPO,
      capture_output=True, text=True, timeout=HANG_GUARD_S)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  recs = [json.loads(line) for line in open(out / "seed0" / "metrics.jsonl", encoding="utf-8")]
  assert [r["round"] for r in recs] == [0, 1] and recs[-1]["num_trained"] == 3


@pytest.mark.parametrize("make,needle", [
    (lambda d: str(d / "missing.txt"), r"cannot be read as UTF-8 text \(No such file"),
    (lambda d: str(d), r"cannot be read as UTF-8 text \(Is a directory"),
    (lambda d: (d / "short.txt").write_text("To be", encoding="utf-8") and str(d / "short.txt"),
     "5 characters, too short for one window"),
])
def test_a_public_text_that_cannot_serve_is_refused_naming_it(tmp_path, make, needle):
  clients = {b"0001:A": {"snippets": np.array([b"To be, or not to be" * 9], object)}}
  write_sqlite(str(tmp_path / "shakespeare_train.sqlite"), clients)
  write_sqlite(str(tmp_path / "shakespeare_test.sqlite"), clients)
  path = make(tmp_path)
  with pytest.raises(ValueError, match=f"public_text={path}: {needle}"):
    fs.build_dataset(fs.DatasetSpec("shakespeare", num_clients=1, data_dir=str(tmp_path),
                                    public_text=path), seed=0)
  with pytest.raises(ValueError, match="do not hold character windows"):
    fs.build_dataset(fs.DatasetSpec("digits", num_clients=5, public_text=path), seed=0)


# --- Files whose types are wrong (issue 49) ------------------------------------------------------

PIXELS = np.full((2, 28, 28), 0.5, np.float32)
LABELS = np.array([1, 2], np.int32)
WRONG_TYPES = [  # (case, dataset, a client's arrays, what the error says after the client)
    # Read as each integer's raw bytes (98% out of vocabulary) and trained on, before.
    ("Shakespeare snippets as integers", "shakespeare", {"snippets": np.arange(200)},
     "field 'snippets' holds int64 values, expected byte strings"),
    ("Shakespeare snippets as floats", "shakespeare", {"snippets": np.linspace(0, 1, 3)},
     "field 'snippets' holds float64 values, expected byte strings"),
    ("Stack Overflow tokens as integers", "stackoverflow_nwp", {"tokens": np.arange(3)},
     "field 'tokens' holds int64 values, expected byte strings of space-separated words"),
    ("EMNIST labels as floats (truncated, before)", "emnist",
     {"pixels": PIXELS, "label": np.array([1.7, 2.0])},
     r"field 'label' holds float64 values, expected integer class ids \(a float label would be "
     "truncated"),
    ("EMNIST pixels as uint8 (1 - 255 = -254, before)", "emnist",
     {"pixels": (PIXELS * 255).astype(np.uint8), "label": LABELS},
     "field 'pixels' holds uint8 values, expected floats"),
    ("EMNIST pixels as byte strings (parsed as floats, before)", "emnist",
     {"pixels": np.array([b"0.5", b"1"], object), "label": LABELS},
     "field 'pixels' holds byte strings, expected floats"),
    ("EMNIST pixels flattened", "emnist", {"pixels": PIXELS.reshape(2, 784), "label": LABELS},
     r"field 'pixels' has shape \[2, 784\], expected \[n, 28, 28\] of floats"),
    ("CIFAR-100 images scaled to floats (divided by 255 again, before)", "cifar100_fed",
     {"image": np.zeros((2, 32, 32, 3), np.float32), "label": LABELS},
     "field 'image' holds float32 values, expected uint8 pixel values 0..255"),
    ("a negative label", "emnist", {"pixels": PIXELS, "label": np.array([-1, 2])},
     "holds label -1, outside 0..61"),
]


@pytest.mark.parametrize("case,name,arrays,needle", WRONG_TYPES, ids=[c[0] for c in WRONG_TYPES])
def test_a_file_whose_types_are_wrong_is_refused_naming_file_client_and_field(
    tmp_path, case, name, arrays, needle):
  del case
  write_stackoverflow(str(tmp_path))  # Its vocabulary; its files are overwritten below.
  train, test = (str(tmp_path / f) for f in fsql.files(name))
  write_sqlite(train, {b"c0": arrays})
  write_sqlite(test, {b"c0": arrays})
  with pytest.raises(ValueError, match=f"^{re.escape(train)}: client b'c0'(:)? {needle}"):
    fs.build_dataset(fs.DatasetSpec(name, num_clients=1, data_dir=str(tmp_path)), seed=0)


def test_a_test_file_whose_snippets_hold_none_is_refused_naming_it(tmp_path):
  """The test split is checked as the train split is: a type-4 array holding a None (bytes(None)
  raised a bare TypeError, and an integer n was read as n zero bytes)."""
  clients = {b"c0": {"snippets": np.array([b"To be, or not to be" * 9], object)}}
  write_sqlite(str(tmp_path / "shakespeare_train.sqlite"), clients)
  write_sqlite(str(tmp_path / "shakespeare_test.sqlite"), clients)
  path = str(tmp_path / "shakespeare_test.sqlite")
  for item, held in ((None, "NoneType None"), (5, "int 5")):
    payload = msgpack.packb(([2], [b"To be", item]), use_bin_type=True)
    blob = zlib.compress(msgpack.packb(
        {"snippets": msgpack.ExtType(fsql.EXT_BYTES_ARRAY, payload)}, use_bin_type=True))
    _rewrite(path, "UPDATE federated_data SET data = ?, num_examples = 2", blob)
    with pytest.raises(ValueError, match=f"^{re.escape(path)}: client b'c0': field 'snippets': "
                       f"item 1 is {held}, expected byte strings"):
      fsql.load("shakespeare", str(tmp_path))


@pytest.mark.parametrize("encoding,name", [("utf-8-sig", "UTF-8"), ("utf-16", "UTF-16"),
                                           ("utf-32", "UTF-32")])
def test_a_vocabulary_with_a_byte_order_mark_is_refused_naming_it(tmp_path, encoding, name):
  """Before, a UTF-8 mark became part of the first (most frequent) word, which then never
  matched: every 'the' was out of vocabulary."""
  path = tmp_path / fsql.VOCAB_FILE
  path.write_text("the 10\nto 9\n", encoding=encoding)
  with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: starts with a {name} "
                     "byte-order mark"):
    fsql.read_vocab(str(path))
