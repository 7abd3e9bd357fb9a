"""oneDNN's CPU convolution kernels inside compiled programs: the `onednn` convolution lowering.

On CPU, XLA's own convolution under `vmap` is slow (a grouped convolution) and our shifted-slice
patches pay for copying every input 25 times; PyTorch's speed on convolutions comes from oneDNN.
This module compiles a small C++ file (`onednn_conv.cc`: forward, input-gradient and
kernel-gradient handlers) against oneDNN and XLA's FFI headers, once per machine into the user's
cache folder (`$XDG_CACHE_HOME/fedjax_sel/onednn` or `~/.cache/fedjax_sel/onednn`), and calls the
handlers from jitted code with `jax.ffi.ffi_call`. Leading dimensions (a vmapped chunk of clients,
a batch of runs) become groups, each convolved with its own kernel.

It needs the `onednn` extra (`pip install 'fedjax_sel[onednn]'`: oneDNN 3.2, built with GNU
OpenMP, and its headers) and a C++ compiler (`g++`, or `$CXX`). `unavailable_reason()` says what
is missing; `conv_impl="auto"` (`build_model`'s default) uses this lowering on a single CPU device
when it is available and the patches otherwise. oneDNN's OpenMP threads wait passively between
calls (`OMP_WAIT_POLICY=PASSIVE` unless set), so they leave the cores to XLA's own threads.

Examples:
  >>> import jax.numpy as jnp
  >>> if unavailable_reason() is None:  # The extra and a compiler are there.
  ...   y = conv(jnp.ones((2, 8, 8, 3)), jnp.ones((3, 3, 3, 4)), (1, 1), ((1, 1), (1, 1)))
  ...   assert y.shape == (2, 8, 8, 4) and float(y[0, 4, 4, 0]) == 27.0
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata

import jax
import jax.numpy as jnp
import numpy as np

SOURCE = pathlib.Path(__file__).with_name("onednn_conv.cc")
PACKAGES = ("onednn-cpu-gomp", "onednn-devel-cpu-gomp")
INSTALL_HINT = ("pip install 'fedjax_sel[onednn]' (oneDNN 3.2 and its headers) and a C++ "
                "compiler (g++, or $CXX)")
_HANDLERS = {"fedjax_sel_conv_fwd": "FedjaxSelConvForward",
             "fedjax_sel_conv_bwd_data": "FedjaxSelConvBackwardData",
             "fedjax_sel_conv_bwd_weights": "FedjaxSelConvBackwardWeights"}


class Unavailable(RuntimeError):
  """oneDNN, its headers or a compiler is missing, or the handlers failed to build."""


def _package_file(package: str, predicate) -> pathlib.Path:
  try:
    files = metadata.files(package) or []
  except metadata.PackageNotFoundError as e:
    raise Unavailable(f"the package {package} is not installed") from e
  for f in files:
    if predicate(f):
      return pathlib.Path(f.locate())
  raise Unavailable(f"the package {package} has no such file")


def _cache_folder() -> pathlib.Path:
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  folder = pathlib.Path(base) / "fedjax_sel" / "onednn"
  try:
    folder.mkdir(parents=True, exist_ok=True)
  except OSError:  # A read-only home: build in the temporary folder instead.
    folder = pathlib.Path(tempfile.gettempdir()) / f"fedjax_sel_onednn_{os.getuid()}"
    folder.mkdir(parents=True, exist_ok=True)
  return folder


def build() -> pathlib.Path:
  """The compiled handlers' shared library, built on first use (about 6 s) and then reused; its
  name digests the source, jaxlib's and oneDNN's versions and the compiler.

  Raises:
    Unavailable: naming what is missing, or with the compiler's error.
  """
  compiler = shutil.which(os.environ.get("CXX", "g++"))
  if compiler is None:
    raise Unavailable(f"no C++ compiler ({os.environ.get('CXX', 'g++')}) on the PATH")
  header = _package_file(PACKAGES[1], lambda f: f.name == "dnnl.hpp" and "oneapi" in f.parts)
  library = _package_file(PACKAGES[0], lambda f: f.name == "libdnnl.so")
  source = SOURCE.read_text(encoding="utf-8")
  key = hashlib.sha256("\n".join([source, jax.lib.__version__, metadata.version(PACKAGES[0]),
                                  compiler]).encode()).hexdigest()[:16]
  folder = _cache_folder()
  out = folder / f"onednn_conv-{key}.so"
  digest = out.with_suffix(".sha256")
  with open(folder / ".build.lock", "w", encoding="utf-8") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # Concurrent processes (test workers) build it once.
    if out.exists() and not _intact(out, digest):
      if digest.exists():  # Without a digest it predates them: rebuilt without a word.
        sys.stderr.write(f"warning: {out} is not the library built there (truncated or "
                         "replaced): rebuilding it\n")
      out.unlink()
    if not out.exists():
      partial = out.with_suffix(f".{os.getpid()}.tmp")
      cmd = [compiler, "-O2", "-w", "-std=c++17", "-shared", "-fPIC", str(SOURCE),
             "-o", str(partial), f"-I{jax.ffi.include_dir()}", f"-I{header.parents[2]}",
             f"-L{library.parent}", "-ldnnl", f"-Wl,-rpath,{library.parent}"]
      proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
      if proc.returncode:
        errors = [line for line in proc.stderr.splitlines() if "error" in line] or [proc.stderr]
        raise Unavailable(f"building {SOURCE.name} with {compiler} failed: " +
                          "\n".join(errors)[:2000])
      digest.write_text(_sha256(partial), encoding="utf-8")
      os.replace(partial, out)
  return out


def _sha256(path: pathlib.Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def _intact(library: pathlib.Path, digest: pathlib.Path) -> bool:
  """Whether the cached library is the one built there (its digest recorded beside it)."""
  try:
    return digest.read_text(encoding="utf-8").strip() == _sha256(library)
  except OSError:
    return False


@functools.cache
def unavailable_reason() -> str | None:
  """None when the handlers are built, loaded and registered with JAX; else what is missing and
  how to install it."""
  try:
    path = build()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # Read when libgomp loads, just below.
    lib = ctypes.CDLL(str(path))
  except (Unavailable, OSError) as e:
    return f"{e}; {INSTALL_HINT}"
  try:
    handlers = {target: getattr(lib, symbol) for target, symbol in _HANDLERS.items()}
  except AttributeError as e:  # A library of another build: the portable lowering instead.
    return f"{path} lacks the convolution handlers ({e}); {INSTALL_HINT}"
  for target, handler in handlers.items():
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(handler), platform="cpu")
  return None


def _call(target: str, shape, a, b, strides, pads):
  (pt, pb), (pl, pr) = pads
  attrs = {k: np.int64(v) for k, v in zip(("sh", "sw", "pt", "pb", "pl", "pr"),
                                          (*strides, pt, pb, pl, pr))}
  # broadcast_all: a vmapped axis becomes a leading group dimension of both operands.
  return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(shape, jnp.float32),
                          vmap_method="broadcast_all")(a, b, **attrs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def conv(x: jax.Array, kernel: jax.Array, strides: tuple[int, int],
         pads: tuple[tuple[int, int], tuple[int, int]]) -> jax.Array:
  """`lax.conv_general_dilated(x, kernel, strides, pads, ("NHWC", "HWIO", "NHWC"))` in float32
  on oneDNN's kernels, with gradients for both operands.

  Args:
    x: `[N, H, W, C]` activations.
    kernel: `[KH, KW, C, O]` kernel.
    strides: `(sh, sw)`.
    pads: `((top, bottom), (left, right))` zero padding.

  Raises:
    Unavailable: where `unavailable_reason()` is not None.
  """
  reason = unavailable_reason()
  if reason is not None:
    raise Unavailable(reason)
  (kh, kw), (sh, sw), ((pt, pb), (pl, pr)) = kernel.shape[:2], strides, pads
  oh = (x.shape[-3] + pt + pb - kh) // sh + 1
  ow = (x.shape[-2] + pl + pr - kw) // sw + 1
  return _call("fedjax_sel_conv_fwd", (*x.shape[:-3], oh, ow, kernel.shape[-1]),
               x.astype(jnp.float32), kernel.astype(jnp.float32), strides, pads)


def _forward(x, kernel, strides, pads):
  return conv(x, kernel, strides, pads), (x, kernel)


def _backward(strides, pads, residuals, dy):
  x, kernel = residuals
  dx = _call("fedjax_sel_conv_bwd_data", x.shape, dy, kernel, strides, pads)
  dkernel = _call("fedjax_sel_conv_bwd_weights", kernel.shape, x, dy, strides, pads)
  return dx.astype(x.dtype), dkernel.astype(kernel.dtype)


conv.defvjp(_forward, _backward)
