"""What the executable store trusts: a private folder, and files sealed with the user's secret.

A stored program is native code, and JAX's `serialize_executable` reads its trees back with
pickle, so a file someone else planted in the cache folder would run its payload in every later
process. The store therefore reads nothing it cannot prove this user wrote:

- **Sealed files.** Each file carries an HMAC-SHA256 tag keyed by a secret kept outside the cache
  folder (`$FEDJAX_SEL_STORE_KEY`, else `$XDG_CONFIG_HOME/fedjax_sel/store.key` or
  `~/.config/fedjax_sel/store.key`, created on first use with mode 0600), over the key the file is
  filed under and its content. A file whose tag does not verify (planted, damaged, or another
  program's file moved under this key) is never unpickled: the program is compiled again.
- **Private places.** A cache folder, store folder or file that another user owns or may write
  (group- or world-writable), or a secret others may read, is refused with a one-line warning on
  stderr, and the program is compiled as without the store.

Example:
  >>> sealed = seal(b"k" * 32, "abc", b"program")
  >>> unseal(b"k" * 32, "abc", sealed), unseal(b"k" * 32, "abd", sealed)
  (b'program', None)
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import stat
import sys

SECRET_ENV = "FEDJAX_SEL_STORE_KEY"  # The secret's file, when not the default.
MAGIC = b"fedjax_sel-sealed-v1\n"  # Each sealed file's first bytes.
_TAG_BYTES = hashlib.sha256().digest_size


def secret_path() -> str:
  """Where the secret is kept: `$FEDJAX_SEL_STORE_KEY`, else the user's config folder."""
  explicit = os.environ.get(SECRET_ENV)
  if explicit:
    return explicit
  base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
  return os.path.join(base, "fedjax_sel", "store.key")


def untrusted(path: str, private: bool = False) -> str | None:
  """Why `path` cannot be trusted (another user owns it, or others may write it; with `private`,
  others may read it too), or None when it can (or does not exist)."""
  try:
    info = os.stat(path)
  except OSError:
    return None
  uid = getattr(os, "getuid", lambda: info.st_uid)()
  if info.st_uid != uid:
    return f"{path} is owned by uid {info.st_uid}, not by this user (uid {uid})"
  mask = 0o077 if private else 0o022
  if info.st_mode & mask:
    what = "read or written" if private else "written"
    return (f"{path} may be {what} by other users (mode {stat.filemode(info.st_mode)}): "
            f"chmod go-{'rwx' if private else 'w'} {path}")
  return None


@functools.cache
def warn_once(reason: str) -> None:
  """One line on stderr per distinct `reason` in this process."""
  print(f"warning: the executable store is off: {reason}; programs are compiled instead",
        file=sys.stderr)


@functools.cache
def secret() -> bytes | None:
  """This user's secret (made on first use), or None when it cannot be kept private (warned)."""
  path = secret_path()
  try:
    if not os.path.exists(path):
      _create(path)
    reason = untrusted(os.path.dirname(path) or ".") or untrusted(path, private=True)
    if reason is not None:
      warn_once(reason)
      return None
    with open(path, "rb") as f:
      value = f.read()
  except OSError as e:
    warn_once(f"its secret {path} cannot be read or made ({e.strerror})")
    return None
  if len(value) < 16:
    warn_once(f"its secret {path} holds {len(value)} bytes, fewer than 16")
    return None
  return value


def _create(path: str) -> None:
  """32 random bytes at `path`, mode 0600; the first of several processes doing so wins."""
  os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
  partial = f"{path}.{os.getpid()}.tmp"
  fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
  try:
    os.write(fd, os.urandom(32))
  finally:
    os.close(fd)
  try:
    os.link(partial, path)  # Fails if another process made it first: theirs is kept.
  except FileExistsError:
    pass
  finally:
    os.remove(partial)


def _tag(key: bytes, name: str, body: bytes) -> bytes:
  return hmac.new(key, name.encode() + b"\0" + body, hashlib.sha256).digest()


def seal(key: bytes, name: str, body: bytes) -> bytes:
  """`body` as the file filed under `name`: the magic, its tag, then the body."""
  return MAGIC + _tag(key, name, body) + body


def unseal(key: bytes, name: str, data: bytes) -> bytes | None:
  """The body of a file sealed under `name` with `key`, or None when its tag does not verify."""
  if not data.startswith(MAGIC):
    return None
  tag, body = data[len(MAGIC):len(MAGIC) + _TAG_BYTES], data[len(MAGIC) + _TAG_BYTES:]
  return body if hmac.compare_digest(tag, _tag(key, name, body)) else None
