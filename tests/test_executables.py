"""The executable store's keys, files, seals and folder (`fedjax_sel/engine/executables.py`); a
second process loading the round untraced is `test_runs.py`'s."""

import importlib
import os
import pickle
import sys
import time
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.engine import executables, store_keys, store_trust
from fedjax_sel.engine.signature import signature
from fedjax_sel.host.compilation import CompileLog, cache_dir, use_persistent_cache
from fedjax_sel.parts.selectors.baselines import random_selector


class _ByIdentity:
  """A value whose equality is identity: its signature cannot be the same in two processes."""


def test_a_signature_with_a_value_by_identity_is_not_stored():
  assert store_keys.canonical(signature(random_selector().select)) is not None
  assert store_keys.canonical(signature((1, _ByIdentity()))) is None  # ("value", ...) by id.
  assert store_keys.canonical(signature((1, bytearray(b"x")))) is None  # ("object", id).


def test_sets_are_written_in_one_order():
  a = store_keys.canonical(signature(frozenset(f"name{i}" for i in range(20))))
  b = store_keys.canonical(signature(frozenset(f"name{i}" for i in reversed(range(20)))))
  assert a == b


def test_the_key_changes_with_the_config_the_argument_types_and_the_sources(tmp_path):
  types = store_keys.avals([jnp.ones(3)])
  key = store_keys.store_key("f", ("a", 1), (), types, "tree")
  assert key == store_keys.store_key("f", ("a", 1), (), types, "tree")
  assert key != store_keys.store_key("f", ("a", 2), (), types, "tree")
  assert key != store_keys.store_key("f", ("a", 1), (), store_keys.avals([jnp.ones(4)]), "tree")
  assert key != store_keys.store_key("f", ("a", 1), (), store_keys.avals([jnp.ones(3, int)]),
                                      "tree")
  module = tmp_path / "user_selector_module.py"
  module.write_text("K = 1\n")
  sys.path.insert(0, str(tmp_path))
  try:
    user = importlib.import_module("user_selector_module")
    config = signature((user, 3))  # The module read by name: its source is part of the key.
    before = store_keys.store_key("f", config, (), types, "tree")
    module.write_text("K = 22\n")  # An edit of a user's module: another key.
    os.utime(module, ns=(1, 1))
    assert store_keys.store_key("f", config, (), types, "tree") != before
  finally:
    sys.path.remove(str(tmp_path))
    sys.modules.pop("user_selector_module", None)


def test_a_class_without_a_source_file_is_not_stored():
  model = type("NotebookModel", (), {"__module__": "__main__", "__hash__": lambda self: 1,
                                     "__eq__": lambda self, other: True})()
  main_file = getattr(sys.modules["__main__"], "__file__", None)
  try:
    sys.modules["__main__"].__file__ = None  # As in a notebook.
    assert store_keys.store_key("f", signature((model,)), (), (), "") is None
  finally:
    sys.modules["__main__"].__file__ = main_file


def _fresh(fn):
  """`fn` with a constant of its own, so JAX's persistent cache cannot supply it (a program the
  cache supplies is not stored); lowered by `_lower`."""
  c = float(int.from_bytes(os.urandom(3), "little"))
  return lambda x: fn(x) + c


def _lower(fn):
  return jax.jit(fn).lower(jnp.ones(5))


def test_a_stored_program_round_trips_and_a_damaged_file_is_compiled_again(tmp_path):
  path = str(tmp_path / "program.exe")
  lowered = _lower(_fresh(lambda x: jnp.where(x > 0.5, x * 2.0, x).sum()))
  compiled = executables.compile_and_save(lowered, path)
  x = jnp.linspace(0.0, 1.0, 5)
  loaded = executables.load(path)
  with CompileLog() as log:
    assert float(executables.first_call(loaded, (x,), path, "jit(f)")) == float(compiled(x))
  assert log.loaded_by_name == {"jit(f)": 1} and log.loaded == 1
  with open(path, "r+b") as f:  # Truncated, as a crash while writing would leave it.
    f.truncate(100)
  assert executables.load(path) is None


def test_a_program_from_jax_s_cache_is_not_stored(tmp_path):
  c = float(int.from_bytes(os.urandom(3), "little"))
  first, again = (lambda x: jnp.cos(x) + c), (lambda x: jnp.cos(x) + c)  # One program, twice.
  _lower(first).compile()  # Compiled and written to JAX's persistent cache (the tests run with it).
  # The same program from another function: not in memory, so a hit of the persistent cache (no
  # jax.clear_caches(), which would drop every program of the test process).
  path = str(tmp_path / "program.exe")
  compiled = executables.compile_and_save(_lower(again), path)
  assert compiled(jnp.zeros(5)).shape == (5,)
  assert not os.path.exists(path)


def test_a_program_from_jax_s_cache_is_stored_from_its_twin_compiled_in_this_process(tmp_path):
  """Two configs of one module (two methods' evaluations): the first compiles, the second is
  JAX's cache's hit, and both are stored (the second from the first's executable), each loading
  and running on its own."""
  c = float(int.from_bytes(os.urandom(3), "little"))
  first, twin = (lambda x: jnp.tanh(x) * c), (lambda x: jnp.tanh(x) * c)
  paths = [str(tmp_path / "first.exe"), str(tmp_path / "twin.exe")]
  with CompileLog() as log:
    compiled = [executables.compile_and_save(_lower(f), p) for f, p in zip((first, twin), paths)]
  assert log.cache_hits == 1
  x = jnp.linspace(-1.0, 1.0, 5)
  for path, program in zip(paths, compiled):
    loaded = executables.load(path)
    np.testing.assert_array_equal(executables.first_call(loaded, (x,), path, "jit(f)"),
                                  program(x))


def test_a_twin_of_a_program_with_a_sort_is_stored_after_the_first_has_run(tmp_path):
  """XLA:CPU refuses to serialize a program with a sort once it has run (`LessThan` is not
  serializable): the twin is stored from the first's serialization made when it compiled (before,
  the FilFL job's RGF finish and two evaluations were marked for jit and traced in every warm
  run)."""
  c = float(int.from_bytes(os.urandom(3), "little"))
  first, twin = (lambda x: jnp.sort(x * c)), (lambda x: jnp.sort(x * c))
  paths = [str(tmp_path / "first.exe"), str(tmp_path / "twin.exe")]
  x = jnp.linspace(1.0, -1.0, 5)
  compiled = executables.compile_and_save(_lower(first), paths[0])
  want = compiled(x)  # It runs before its twin comes.
  with CompileLog() as log:
    executables.compile_and_save(_lower(twin), paths[1])
  assert log.cache_hits == 1
  assert sorted(os.listdir(tmp_path)) == ["first.exe", "twin.exe"]
  loaded = executables.load(paths[1])
  np.testing.assert_array_equal(executables.first_call(loaded, (x,), paths[1], "jit(f)"), want)


def test_a_program_xla_cannot_serialize_is_marked_for_jit(tmp_path, monkeypatch):
  def refuse(compiled):
    raise NotImplementedError("not serializable")

  monkeypatch.setattr(executables.serialize_executable, "serialize", refuse)
  path = str(tmp_path / "program.exe")
  compiled = executables.compile_and_save(_lower(_fresh(jnp.sin)), path)
  assert compiled(jnp.zeros(5)).shape == (5,)  # Still compiled, for this process.
  assert os.listdir(tmp_path) == ["program.jit"]


def test_the_folder_keeps_the_most_recently_used_files_within_its_size(tmp_path):
  for i, name in enumerate(("old", "mid", "new")):
    (tmp_path / name).write_bytes(b"x" * 100)
    os.utime(tmp_path / name, (1000 + i, 1000 + i))
  executables.evict(str(tmp_path), 250)
  assert sorted(os.listdir(tmp_path)) == ["mid", "new"]


def test_a_program_called_inside_a_trace_is_traced_with_it():
  from fedjax_sel.engine.programs import program  # pylint: disable=import-outside-toplevel
  from fedjax_sel.engine.signature import Keyed  # pylint: disable=import-outside-toplevel
  triple = program(lambda cfg, x: x * cfg.value)
  cfg = Keyed(("triple", os.getpid()), 3.0)
  assert float(triple(cfg, jnp.float32(2.0))) == 6.0  # Stored or loaded, then called.
  assert float(jax.jit(lambda x: triple(cfg, x))(jnp.float32(2.0))) == 6.0
  assert float(jax.grad(lambda x: triple(cfg, x))(jnp.float32(2.0))) == 3.0


def test_threads_calling_a_program_at_once_trace_compile_or_load_it_once():
  """Batches of a job run at once on threads (`--concurrent_batches`) share programs (two halves
  of a method's runs, methods' evaluations, DGF's and RGF's round): a second thread calling one
  with the same new arguments waits for the first's tracing and compilation, or its load from
  the store, and gets the same outputs."""
  import threading  # pylint: disable=import-outside-toplevel

  from fedjax_sel.engine.programs import Program  # pylint: disable=import-outside-toplevel
  from fedjax_sel.engine.signature import Keyed  # pylint: disable=import-outside-toplevel
  c = float(int.from_bytes(os.urandom(3), "little"))  # A program JAX's cache has not seen.
  traced = []

  def shifted(cfg, x):
    traced.append(threading.current_thread().name)
    time.sleep(0.2)  # A slow trace: the other thread calls while it runs.
    return jnp.sin(x) * cfg.value + c

  cfg = Keyed(("shifted", os.getpid(), c), 2.0)

  def at_once(prog):
    start, out = threading.Barrier(2), [None, None]

    def call(i):
      start.wait()
      out[i] = float(prog(cfg, np.float32(0.5)))

    with CompileLog() as log:
      threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
      for t in threads:
        t.start()
      for t in threads:
        t.join()
    assert out[0] == out[1] == pytest.approx(np.sin(0.5) * 2.0 + c)
    return log

  log = at_once(Program(shifted, None, ()))  # Traced, compiled and stored once.
  assert len(traced) == 1 and log.by_name["jit(shifted)"] == 1, (traced, log.by_name)
  log = at_once(Program(shifted, None, ()))  # As a new process: loaded from the store once.
  assert len(traced) == 1 and log.loaded == 1 and not log.by_name, (log.loaded, log.by_name)


class _Planted:
  """A pickle payload that creates `marker` when it is unpickled (a planted cache file)."""

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (open, (self.marker, "w"))


@pytest.fixture
def own_secret(tmp_path, monkeypatch):
  """A secret of this test's own (the store's caches forgotten before and after)."""
  monkeypatch.setenv(store_trust.SECRET_ENV, str(tmp_path / "config" / "store.key"))
  store_trust.secret.cache_clear()
  executables._trusted.cache_clear()  # pylint: disable=protected-access
  yield tmp_path / "config" / "store.key"
  store_trust.secret.cache_clear()
  executables._trusted.cache_clear()  # pylint: disable=protected-access


def test_a_planted_pickle_in_the_store_is_never_unpickled(tmp_path, own_secret):
  marker = tmp_path / "pwned"
  body = zlib.compress(pickle.dumps((_Planted(str(marker)), None, None, False)))
  path = tmp_path / "store" / "abc.exe"
  path.parent.mkdir()
  path.write_bytes(body)  # The store's format before files were sealed.
  assert executables.load(str(path)) is None
  path.write_bytes(store_trust.seal(b"a guessed secret" * 2, "abc", body))  # Sealed by another.
  assert executables.load(str(path)) is None
  assert not marker.exists()
  assert own_secret.stat().st_mode & 0o077 == 0  # The secret, made on first use, is private.


def test_a_program_moved_under_another_key_is_refused(tmp_path, own_secret):
  del own_secret
  first, second = str(tmp_path / "first.exe"), str(tmp_path / "second.exe")
  executables.compile_and_save(_lower(_fresh(jnp.sin)), first)
  executables.compile_and_save(_lower(_fresh(jnp.cos)), second)
  assert executables.load(first) is not None
  os.replace(second, first)  # Another job's program filed under this key.
  assert executables.load(first) is None  # Refused: the program compiles again.


def test_a_folder_or_file_others_may_write_is_not_trusted(tmp_path, own_secret, capsys):
  del own_secret
  path = str(tmp_path / "program.exe")
  executables.compile_and_save(_lower(_fresh(jnp.tan)), path)
  os.chmod(path, 0o666)
  assert executables.load(path) is None
  assert "may be written by other users" in capsys.readouterr().err
  os.chmod(tmp_path, 0o777)
  try:
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    assert executables.folder() is None
    assert use_persistent_cache(str(tmp_path)) is None
    assert f"{tmp_path} may be written by other users" in capsys.readouterr().err
  finally:
    os.chmod(tmp_path, 0o755)
    jax.config.update("jax_compilation_cache_dir", cache_dir())


def test_a_secret_others_may_read_is_refused(tmp_path, own_secret, capsys):
  own_secret.parent.mkdir()
  own_secret.write_bytes(b"s" * 32)
  os.chmod(own_secret, 0o644)
  assert store_trust.secret() is None
  assert "may be read or written by other users" in capsys.readouterr().err
