"""Importing the package changes no global JAX setting and writes nothing; its version is one
value, `fedjax_sel/version.py`, which the package metadata reads."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_import_changes_no_jax_setting_and_creates_no_folder(tmp_path):
  env = {**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
  env.pop("FEDJAX_SEL_CACHE_DIR", None)
  script = ("import jax; a = dict(jax.config.values); import fedjax_sel; "
            "assert a == dict(jax.config.values)")
  proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                        text=True, check=False)
  assert proc.returncode == 0, proc.stderr
  assert not list(tmp_path.iterdir())


def test_the_version_is_one_value():
  import fedjax_sel  # pylint: disable=import-outside-toplevel
  from fedjax_sel import version  # pylint: disable=import-outside-toplevel
  assert fedjax_sel.__version__ == version.__version__
  with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
    text = f.read()
  assert 'dynamic = ["version"]' in text
  assert 'version = {attr = "fedjax_sel.version.__version__"}' in text
