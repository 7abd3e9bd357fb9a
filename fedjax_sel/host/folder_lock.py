"""One job per output folder: an exclusive, advisory lock on `<folder>/.lock`.

Two jobs writing one folder would interleave their metrics and overwrite each other's checkpoints
and summaries, each exiting 0. `hold(folder)` takes an exclusive `fcntl.flock` on the folder's lock
file (POSIX's own advisory lock: no dependency, released by the kernel when the process ends, even
by kill -9, so a crashed job never leaves a stale lock) and writes the holder's process id into it;
a second process is refused with that id. Within one process the lock is taken once per folder
(the runner's per-run locks nest inside a launcher's).

Examples:
  >>> import tempfile
  >>> folder = tempfile.mkdtemp()
  >>> hold(folder) is hold(folder)   # Held once per process.
  True
  >>> release(folder)
"""

from __future__ import annotations

import contextlib
import fcntl
import os

LOCK_FILE = ".lock"
_HELD: dict[str, object] = {}


class FolderInUse(RuntimeError):
  """Another process holds the folder's lock."""


def hold(folder: str):
  """Locks `folder` (created if absent) for this process until `release` or the process ends.

  Raises:
    FolderInUse: naming the folder and the process that holds it.
  """
  key = os.path.realpath(folder)
  if key in _HELD:
    return _HELD[key]
  if os.path.exists(folder) and not os.path.isdir(folder):
    raise FileExistsError(f"out_dir {folder} is a file, not a folder")
  os.makedirs(folder, exist_ok=True)
  handle = open(os.path.join(folder, LOCK_FILE), "a+", encoding="utf-8")  # pylint: disable=consider-using-with
  try:
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    handle.seek(0)
    holder = handle.read().strip() or "unknown"
    handle.close()
    raise FolderInUse(f"{folder} is in use by another job (process {holder}); wait for it to "
                      "finish or write to another folder") from e
  handle.seek(0)
  handle.truncate()
  handle.write(f"{os.getpid()}\n")
  handle.flush()
  _HELD[key] = handle
  return handle


def in_use_nearby(folder: str) -> str | None:
  """A folder above or below `folder` that another process holds (a job there writes into this
  one, or this one into it), or None."""
  real = os.path.realpath(folder)
  nearby = []
  parent = os.path.dirname(real)
  while parent != os.path.dirname(parent):
    nearby.append(parent)
    parent = os.path.dirname(parent)
  if os.path.isdir(real):
    nearby += [root for root, _, files in os.walk(real) if LOCK_FILE in files and root != real]
  for candidate in nearby:
    path = os.path.join(candidate, LOCK_FILE)
    if candidate in _HELD or not os.path.exists(path):
      continue
    try:
      with open(path, encoding="utf-8") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    except OSError:
      return candidate
  return None


def release(folder: str) -> None:
  """Releases this process's lock on `folder` (nothing if it holds none)."""
  handle = _HELD.pop(os.path.realpath(folder), None)
  if handle is not None:
    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    handle.close()


@contextlib.contextmanager
def locked(folders):
  """Holds the locks of `folders` for a `with` block, releasing those it took (not those the
  process held before, e.g. a launcher's)."""
  taken = []
  try:
    for folder in folders:
      if os.path.realpath(folder) not in _HELD:
        hold(folder)
        taken.append(folder)
    yield
  finally:
    for folder in taken:
      release(folder)
