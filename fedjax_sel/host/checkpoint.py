"""Checkpoints that cannot run code when loaded, written atomically, checked when read.

Format: flax's msgpack serialization (`flax.serialization.msgpack_serialize`), chosen over pickle
because its decoder builds only numbers, strings, lists, dicts and numpy arrays (a crafted file
cannot construct objects or call functions), and over orbax-checkpoint because a simulation state
is one small pytree written by one process: orbax's asynchronous, tensorstore-backed, multi-host
machinery would add a dependency and a directory layout for nothing we use (flax is already ours).

A file is `MAGIC`, the SHA-256 of the payload in hex and a newline, then the payload: a msgpack map
`{"fingerprint": {...}, "leaves": {"0": array, ...}}` of the state's leaves in `jax.tree.leaves`
order. Reading checks the magic (foreign file), the checksum (truncated or corrupted file) and each
leaf's shape and dtype against a template state (a state of another structure), naming the file.
Writing goes to a temporary file, fsyncs it, renames it over the old one and fsyncs the folder, so
a crash leaves either the old checkpoint or the new one.

Examples:
  >>> import jax.numpy as jnp, tempfile, os
  >>> path = os.path.join(tempfile.mkdtemp(), "ckpt.msgpack")
  >>> save(path, {"w": jnp.ones(3)}, {"seed": 0})
  >>> state, fingerprint = load(path, {"w": jnp.zeros(3)})
  >>> state["w"].tolist(), fingerprint
  ([1.0, 1.0, 1.0], {'seed': 0})
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

import jax
import numpy as np
from flax import serialization

# 2: the fingerprint holds the launcher's job config by field (issue 31), not its flags.
# 3: one vocabulary: the runner's entries are named as the job config's fields (lr, prox_mu,
#    batch_size, local_epochs, local_steps; the parts by kind), where version 2 had its own.
VERSION = 3
MAGIC = b"fedjax_sel checkpoint v%d\n" % VERSION
_OLDER = re.compile(rb"fedjax_sel checkpoint v(\d+)\n")


class CheckpointError(ValueError):
  """A checkpoint that is foreign, truncated, corrupted, of another structure or another run.

  Attributes:
    changed: for a run started with other settings, the `(key, stored, current)` of each
      fingerprint entry that differs (empty otherwise): of a nested entry (the parts' specs) the
      values that differ, keyed by their dotted path (`parts.selector.d`); `ABSENT` stands for
      an entry one side lacks.
  """

  def __init__(self, message: str, changed: tuple = ()):
    super().__init__(message)
    self.changed = tuple(changed)


class WriteError(OSError):
  """A file of a run could not be written (a full disk, a quota, a folder removed): the message
  names the file; temporary files are removed and what was written before is kept."""

  def __str__(self) -> str:
    return str(self.strerror)


def write_error(path: str, error: OSError, kept: str) -> WriteError:
  """A `WriteError` naming `path`, the system's reason and what is `kept`."""
  reason = error.strerror or str(error)
  return WriteError(error.errno, f"cannot write {path}: {reason}; {kept}")


def previous(path: str) -> str:
  """Where `save(..., keep_previous=True)` keeps the checkpoint it replaced."""
  return path + ".prev"


def write_atomic(path: str, data: bytes, kept: str = "the file is unchanged",
                 keep_previous: bool = False) -> None:
  """Writes `data` to `path` through a temporary file renamed over it, synced to disk: a reader
  sees the old file or the new one, never part of one. A failure raises `WriteError` naming the
  file and what is `kept`; with `keep_previous`, the file replaced stays at `previous(path)`."""
  tmp = path + ".tmp"
  try:
    with open(tmp, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
  except OSError as e:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise write_error(path, e, kept) from e
  if keep_previous and os.path.exists(path):
    os.replace(path, previous(path))
  os.replace(tmp, path)
  folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
  try:
    os.fsync(folder)
  finally:
    os.close(folder)


def save(path: str, state: Any, fingerprint: dict, keep_previous: bool = False) -> None:
  """Writes `state` (any pytree of arrays) and its run's `fingerprint` atomically to `path`; with
  `keep_previous`, the checkpoint it replaces stays at `previous(path)` (the runs of a batch,
  checkpointed one after another, can then all resume from one round after a kill)."""
  leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(jax.device_get(state))]
  payload = serialization.msgpack_serialize(
      {"fingerprint": fingerprint, "leaves": {str(i): leaf for i, leaf in enumerate(leaves)}})
  digest = hashlib.sha256(payload).hexdigest().encode()
  write_atomic(path, MAGIC + digest + b"\n" + payload,
               "the previous checkpoint and the finished rounds' metrics are kept: free space "
               "and resume", keep_previous)


def load(path: str, template: Any, fingerprint: dict | None = None) -> tuple[Any, dict]:
  """Reads a checkpoint written by `save` into the structure of `template`.

  Args:
    path: the file.
    template: a state of the structure to read into.
    fingerprint: when given, the run's current fingerprint: a checkpoint of another run is refused
      naming the settings that differ, before its structure is compared (a changed setting such
      as the number of clients also changes the state's shapes; the setting is the better news).
      Its entry `DEFAULTS` ({setting: default value}) lets a setting that one side lacks (added
      to the library after the run started, or removed since) match the other side's value
      when that is the setting's default.

  Returns:
    (state as numpy arrays in `template`'s tree structure, the fingerprint dict).

  Raises:
    CheckpointError: naming `path`, when the file is not a fedjax_sel checkpoint, is truncated or
      corrupted (checksum), was written with other settings than `fingerprint`, or holds leaves
      of other shapes or dtypes than `template`'s.
  """
  stored, found = _read(path)
  if fingerprint is not None:
    defaults = fingerprint.get(DEFAULTS, {})
    absent = object()

    def same(key) -> bool:  # A setting one side lacks matches the other side at its default.
      a, b = found.get(key, absent), fingerprint.get(key, absent)
      if a is absent or b is absent:
        value = b if a is absent else a
        return key in defaults and _normal(value) == _normal(defaults[key])
      return _normal(a) == _normal(b)

    changed = [c for k in sorted((set(found) | set(fingerprint)) - {DEFAULTS}) if not same(k)
               for c in _changes(k, found.get(k, ABSENT), fingerprint.get(k, ABSENT))]
    if changed:
      raise CheckpointError(f"cannot resume {path}: the run was started with other settings "
                            "(checkpoint -> now): " + "; ".join(f"{k}: {a!r} -> {b!r}"
                                                                for k, a, b in changed), changed)
  want, treedef = jax.tree.flatten(template)
  if len(stored) != len(want):
    raise CheckpointError(f"{path} holds a state of {len(stored)} arrays, this run's has "
                          f"{len(want)}: {_OTHER_STATE}")
  leaves = []
  for i, w in enumerate(want):
    got = np.asarray(stored[str(i)])
    if got.shape != np.shape(w) or got.dtype != np.asarray(w).dtype:
      raise CheckpointError(f"{path}: array {i} is {got.dtype}{list(got.shape)}, this run "
                            f"expects {np.asarray(w).dtype}{list(np.shape(w))}: {_OTHER_STATE}")
    leaves.append(got)
  return jax.tree.unflatten(treedef, leaves), found


def _read(path: str) -> tuple[dict, dict]:
  """A checkpoint's leaves (by index) and fingerprint, its magic and checksum checked."""
  with open(path, "rb") as f:
    blob = f.read()
  older = _OLDER.match(blob)
  if older is not None and int(older.group(1)) != VERSION:
    raise CheckpointError(f"{path} is a version {int(older.group(1))} checkpoint; this fedjax_sel "
                          f"reads version {VERSION}: rerun the run from its start with "
                          "--overwrite (or resume it with the fedjax_sel that wrote it)")
  if not blob.startswith(MAGIC):
    raise CheckpointError(f"{path} is not a fedjax_sel checkpoint (it does not start with "
                          f"{MAGIC.strip().decode()!r})")
  head = len(MAGIC) + 65
  digest, payload = blob[len(MAGIC):head - 1], blob[head:]
  if blob[head - 1:head] != b"\n" or hashlib.sha256(payload).hexdigest().encode() != digest:
    raise CheckpointError(f"{path} is truncated or corrupted (its SHA-256 checksum does not match)")
  try:
    content = serialization.msgpack_restore(payload)
    stored = content["leaves"]
    fingerprint = dict(content["fingerprint"])
  except Exception as e:  # A payload with the right checksum but another layout.
    raise CheckpointError(f"{path} does not hold a fedjax_sel state ({e})") from e
  return stored, fingerprint


DEFAULTS = "defaults"  # A fingerprint's {setting: default value}, not compared itself.

# Why a checkpoint's arrays may not fit the run: its parts kept other state (FilFL's filter,
# for one, now keeps its DGF or RGF mode; it kept nothing before).
_OTHER_STATE = ("it was written by another configuration, or by another version of fedjax_sel "
                "whose parts kept other state; rerun the run from its start with --overwrite (or "
                "resume it with the fedjax_sel that wrote it)")


ABSENT = "(absent)"  # A fingerprint entry, or a nested value, that one side lacks.


def _changes(key: str, stored: Any, current: Any) -> list[tuple[str, Any, Any]]:
  """`(key, stored, current)`, or, for two dicts, the same of each nested value that differs
  (`parts.selector.d`), so that a refusal names what changed rather than both specs."""
  if not (isinstance(stored, dict) and isinstance(current, dict)):
    return [(key, stored, current)]
  return [c for name in sorted(set(stored) | set(current), key=str)
          if _normal(stored.get(name, ABSENT)) != _normal(current.get(name, ABSENT))
          for c in _changes(f"{key}.{name}", stored.get(name, ABSENT),
                            current.get(name, ABSENT))]


def _normal(value):
  """Lists and tuples compare equal (msgpack turns tuples into lists)."""
  if isinstance(value, (list, tuple)):
    return [_normal(v) for v in value]
  if isinstance(value, dict):
    return {k: _normal(v) for k, v in value.items()}
  return value
