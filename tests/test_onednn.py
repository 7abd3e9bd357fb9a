"""oneDNN's convolutions (`conv_impl="onednn"`) against XLA's, and how the lowering is chosen."""

import os
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from fedjax_sel.client.local_training import LocalHParams
from fedjax_sel.models import PatchConv, build_model, from_flax, onednn, resolve_conv_impl
from fedjax_sel.models.conv import spatial_pads
from tests import test_local_training
from tests.test_launchers import REPO
from tests.hang_guard import HANG_GUARD_S

needs_onednn = pytest.mark.skipif(onednn.unavailable_reason() is not None,
                                  reason=f"oneDNN unavailable: {onednn.unavailable_reason()}")


def lax_conv(x, kernel, strides, padding):
  return jax.lax.conv_general_dilated(x, kernel, strides, padding,
                                      dimension_numbers=("NHWC", "HWIO", "NHWC"))


def onednn_conv(x, kernel, strides, padding):
  pads = spatial_pads(x.shape, kernel.shape[:2], strides, padding)
  return onednn.conv(x, kernel, strides, pads)


@needs_onednn
@pytest.mark.parametrize("x_shape,kernel_shape,strides,padding", [
    ((4, 28, 28, 1), (5, 5, 1, 32), (1, 1), "SAME"),   # The LEAF CNN's first layer.
    ((3, 14, 14, 32), (5, 5, 32, 64), (1, 1), "SAME"),  # Its second.
    ((2, 9, 9, 8), (3, 3, 8, 16), (2, 2), "SAME"),     # ResNet's strided 3x3, odd size.
    ((2, 16, 16, 8), (1, 1, 8, 16), (2, 2), "VALID"),  # Its 1x1 shortcut.
])
def test_onednn_conv_and_gradients_equal_xla_for_one_two_and_nested_groups(
    x_shape, kernel_shape, strides, padding):
  """Forward and both gradients, plain, vmapped over 3 clients (each its own kernel) and vmapped
  over 2 runs of 3 clients, against `lax.conv_general_dilated`."""
  kx, kw, kg = jax.random.split(jax.random.PRNGKey(0), 3)
  x = jax.random.normal(kx, (2, 3, *x_shape))
  kernel = 0.1 * jax.random.normal(kw, (2, 3, *kernel_shape))
  y_shape = lax_conv(x[0, 0], kernel[0, 0], strides, padding).shape
  cotangent = jax.random.normal(kg, (2, 3, *y_shape))

  def value_and_grads(conv):
    def one(x, kernel, g):
      y, pullback = jax.vjp(lambda a, b: conv(a, b, strides, padding), x, kernel)
      return (y, *pullback(g))
    return one

  want = jax.vmap(jax.vmap(value_and_grads(lax_conv)))(x, kernel, cotangent)
  ours = value_and_grads(onednn_conv)
  cases = [(ours, lambda a: a[0, 0]), (jax.vmap(ours), lambda a: a[0]),
           (jax.vmap(jax.vmap(ours)), lambda a: a)]
  for fn, part in cases:
    got = jax.jit(fn)(part(x), part(kernel), part(cotangent))
    for g, w in zip(got, want):  # Sums of thousands of terms: tolerance relative to the largest.
      w = np.asarray(part(w))
      np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5 * np.abs(w).max())


class _TinyCNN(nn.Module):
  """Two convolutions (one strided) and a dense layer on 6 features read as a 2 x 3 image."""

  impl: str

  @nn.compact
  def __call__(self, x):
    x = x.reshape(x.shape[0], 2, 3, 1)
    x = nn.relu(PatchConv(4, (3, 3), impl=self.impl)(x))
    x = PatchConv(3, (2, 2), strides=(2, 2), impl=self.impl)(x)
    return nn.Dense(4)(x.reshape(x.shape[0], -1))


@needs_onednn
def test_vmapped_onednn_training_equals_per_client_loop():
  """Chunks of clients (oneDNN groups) train as each client alone does, step by step."""
  model = from_flax(_TinyCNN("onednn"), (6,), 4, "tiny_cnn")
  test_local_training.test_vmapped_training_equals_per_client_loop(
      LocalHParams(batch_size=5, chunk_size=3), "sgd", model=model)


def test_auto_is_onednn_on_one_cpu_where_available_else_patches(monkeypatch):
  if onednn.unavailable_reason() is None:
    assert resolve_conv_impl("auto") == "onednn"
  monkeypatch.setattr(onednn, "unavailable_reason", lambda: "no compiler; pip install ...")
  assert resolve_conv_impl("auto") == "patches"
  assert resolve_conv_impl("lax") == "lax"
  with pytest.raises(ValueError, match="'onednn' is unavailable: no compiler"):
    build_model("leaf_cnn", (28, 28, 1), 62, conv_impl="onednn")
  with pytest.raises(ValueError, match="conv impl must be one of"):
    build_model("mlp", (6,), 4, conv_impl="cudnn")


def test_launcher_asking_for_unavailable_onednn_names_the_flag_and_the_extra(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "experiments.run", "--model=resnet18",
                         "--conv_impl=onednn", "--rounds=1", f"--out_dir={tmp_path}"],
                        cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S,
                        env={**os.environ, "CXX": "/nonexistent/g++"})
  assert proc.returncode != 0
  assert "--conv_impl=onednn" in proc.stderr and "fedjax_sel[onednn]" in proc.stderr
  assert "[   1/" not in proc.stdout


def test_a_corrupt_cached_library_is_rebuilt_with_a_warning(tmp_path):
  """A truncated library in the cache (it used to kill every convolutional run with a bus error)
  is found by its digest and rebuilt, with one line saying so; the convolution then works."""
  script = ("from fedjax_sel.models import onednn; import jax.numpy as jnp; "
            "r = onednn.unavailable_reason(); assert r is None, r; "
            "print(float(onednn.conv(jnp.ones((1, 4, 4, 1)), jnp.ones((3, 3, 1, 1)), (1, 1), "
            "((1, 1), (1, 1)))[0, 1, 1, 0]))")
  env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
  first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=HANG_GUARD_S, check=False)
  if first.returncode and "unavailable" in (first.stdout + first.stderr).lower():
    pytest.skip("oneDNN is not installed here")
  assert first.returncode == 0 and first.stdout.strip() == "9.0", first.stderr
  [library] = (tmp_path / "fedjax_sel" / "onednn").glob("onednn_conv-*.so")
  library.write_bytes(library.read_bytes()[:4096])  # Truncated, as a full disk leaves it.
  second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=HANG_GUARD_S, check=False)
  assert second.returncode == 0 and second.stdout.strip() == "9.0", second.stderr
  assert "is not the library built there (truncated or replaced): rebuilding it" in second.stderr
