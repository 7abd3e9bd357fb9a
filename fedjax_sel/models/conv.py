"""A 2-D convolution as shifted slices + one matmul, with `flax.linen.Conv`'s parameters.

Why: `vmap` over clients turns `lax.conv` with a per-client kernel into a grouped convolution whose
gradient is ~6x slower on XLA:CPU, and `lax.conv` inside a `lax.scan` is ~7x slower again (measured
in docs/performance.md). The patches formulation is only slices and a dot, which vmaps into a
batched matmul on every backend. `impl="lax"` keeps the native convolution (better on GPU);
`impl="onednn"` calls oneDNN's CPU kernels (`onednn.py`; 1.2-1.4x the patches on the LEAF CNN);
`impl="auto"` picks oneDNN on a single CPU device where it is installed, else the patches.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> conv = PatchConv(features=4, kernel_size=(3, 3))
  >>> params = conv.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 2)))
  >>> conv.apply(params, jnp.zeros((5, 8, 8, 2))).shape
  (5, 8, 8, 4)
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_sel.models import onednn

CONV_IMPLS = ("auto", "patches", "lax", "onednn")


def resolve_conv_impl(impl: str) -> str:
  """The lowering `impl` stands for on this process's devices: "auto" is "onednn" on a single CPU
  device where `onednn.unavailable_reason()` is None, else "patches"; the others are themselves.

  Raises:
    ValueError: for an unknown `impl`, or "onednn" where it is unavailable (saying why).
  """
  if impl not in CONV_IMPLS:
    raise ValueError(f"conv impl must be one of {CONV_IMPLS}, got {impl!r}")
  if impl == "onednn" and onednn.unavailable_reason() is not None:
    raise ValueError(f"conv impl 'onednn' is unavailable: {onednn.unavailable_reason()}")
  if impl != "auto":
    return impl
  single_cpu = jax.default_backend() == "cpu" and jax.device_count() == 1
  return "onednn" if single_cpu and onednn.unavailable_reason() is None else "patches"


def _same_pads(size: int, k: int, stride: int) -> tuple[int, int]:
  out = -(-size // stride)
  total = max((out - 1) * stride + k - size, 0)
  return total // 2, total - total // 2


def spatial_pads(x_shape: tuple[int, ...], kernel_size: tuple[int, int],
                 strides: tuple[int, int], padding: str) -> tuple[tuple[int, int], ...]:
  """`((top, bottom), (left, right))` zero padding of `padding` ("SAME" or "VALID") for an NHWC
  input of shape `x_shape`."""
  if padding == "SAME":
    return tuple(_same_pads(size, k, s)
                 for size, k, s in zip(x_shape[-3:-1], kernel_size, strides))
  if padding == "VALID":
    return ((0, 0), (0, 0))
  raise ValueError(f"padding must be SAME or VALID, got {padding!r}")


Pads = tuple[tuple[int, int], tuple[int, int]]


def extract_patches(x: jax.Array, kernel_size: tuple[int, int], strides: tuple[int, int],
                    padding: str | Pads) -> jax.Array:
  """`[B, H, W, C] -> [B, Ho, Wo, kh*kw*C]`, patch features ordered (kh, kw, C) like a kernel;
  `padding` is "SAME", "VALID" or `((top, bottom), (left, right))`."""
  kh, kw = kernel_size
  sh, sw = strides
  pads = (spatial_pads(x.shape, kernel_size, strides, padding) if isinstance(padding, str)
          else padding)
  x = jnp.pad(x, ((0, 0), *pads, (0, 0)))
  ho = (x.shape[1] - kh) // sh + 1
  wo = (x.shape[2] - kw) // sw + 1
  cols = [x[:, i:i + (ho - 1) * sh + 1:sh, j:j + (wo - 1) * sw + 1:sw, :]
          for i in range(kh) for j in range(kw)]
  return jnp.concatenate(cols, axis=-1)


def conv2d(x: jax.Array, kernel: jax.Array, strides: tuple[int, int], pads: Pads,
           impl: str) -> jax.Array:
  """`lax.conv_general_dilated(x, kernel, strides, pads, ("NHWC", "HWIO", "NHWC"))` on the
  lowering `impl` ("patches", "onednn" or "lax"; resolve "auto" first with `resolve_conv_impl`)."""
  kh, kw, cin, features = kernel.shape
  if impl == "patches":
    return extract_patches(x, (kh, kw), strides, pads) @ kernel.reshape(kh * kw * cin, features)
  if impl == "onednn":
    return onednn.conv(x, kernel, strides, pads)
  return jax.lax.conv_general_dilated(x, kernel, strides, pads,
                                      dimension_numbers=("NHWC", "HWIO", "NHWC"))


class PatchConv(nn.Module):
  """Drop-in for `nn.Conv` (NHWC, params `kernel [kh, kw, Cin, F]`, `bias [F]`); `impl` is the
  lowering (`CONV_IMPLS`), by default "auto" as in the library's own models, so a user's module
  gets the fast path the library's CNNs get."""

  features: int
  kernel_size: tuple[int, int]
  strides: tuple[int, int] = (1, 1)
  padding: str = "SAME"
  use_bias: bool = True
  impl: str = "auto"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    impl = resolve_conv_impl(self.impl)
    kh, kw = self.kernel_size
    cin = x.shape[-1]
    kernel = self.param("kernel", nn.initializers.lecun_normal(), (kh, kw, cin, self.features))
    y = conv2d(x, kernel, self.strides,
               spatial_pads(x.shape, self.kernel_size, self.strides, self.padding), impl)
    if self.use_bias:
      y = y + self.param("bias", nn.initializers.zeros_init(), (self.features,))
    return y
