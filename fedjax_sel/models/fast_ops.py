"""A model's convolutions and 2x2 max pools moved onto the library's fast lowerings, as written.

Why: a flax user writes `nn.Conv` and `nn.max_pool`. Under `vmap` over clients, XLA:CPU runs
`lax.conv` with a per-client kernel as a grouped convolution whose gradient is slow, and
`reduce_window`'s gradient is a `select_and_scatter`; pfl-research's `simple_cnn` written that way
trained 17x slower than the same network written with `PatchConv` and `max_pool_2x2`
(docs/performance.md). On a CPU, `fast_ops(fn)` traces `fn` to a jaxpr and evaluates it with

- every 2-D NHWC/HWIO convolution without dilation or groups (what `nn.Conv` emits) replaced by
  `conv.conv2d` on the resolved lowering (oneDNN's kernels or the patches), and
- every 2x2, stride-2, unpadded max pool of an even-sized NHWC input (`nn.max_pool(x, (2, 2),
  strides=(2, 2))`, either padding) replaced by `max_pool_2x2` (same values, the fast gradient),

at the top level and inside nested `jax.jit` calls. Everything else is bound as traced, and a
function with nothing to replace is called as it is (its program unchanged). Operations inside
other control flow (`lax.scan`, `lax.cond`, `jax.checkpoint`, a custom derivative rule) keep their
lowering.

The values equal the module's to float rounding (the kernels sum in another order), and max
pooling's gradient is shared among tied maxima instead of going to the first (`pooling.py`).

Examples:
  >>> import flax.linen as nn, jax, jax.numpy as jnp
  >>> conv = nn.Conv(4, (3, 3))
  >>> params = conv.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 2)))
  >>> fast = fast_ops(conv.apply, "patches")
  >>> x = jnp.ones((5, 8, 8, 2))
  >>> ops = lambda f: {e.primitive.name for e in jax.make_jaxpr(f)(params, x).eqns}
  >>> "conv_general_dilated" in ops(conv.apply), "conv_general_dilated" in ops(fast)
  (True, False)
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.extend as jex
import numpy as np

from fedjax_sel.models import pooling
from fedjax_sel.models.conv import CONV_IMPLS, conv2d, resolve_conv_impl

_NHWC_HWIO = ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))  # lhs, rhs and out specs of nn.Conv.
_CALLS = ("jit", "pjit", "closed_call", "core_call")  # Primitives whose body is evaluated inline.


def _conv_rule(eqn, impl: str):
  """`conv2d` for a convolution eqn that `nn.Conv` would emit, else None."""
  p = eqn.params
  x, kernel = (v.aval for v in eqn.invars)
  numbers = p["dimension_numbers"]
  plain = (x.ndim == 4 and kernel.ndim == 4
           and (numbers.lhs_spec, numbers.rhs_spec, numbers.out_spec) == _NHWC_HWIO
           and tuple(p["lhs_dilation"]) == (1, 1) and tuple(p["rhs_dilation"]) == (1, 1)
           and p["feature_group_count"] == 1 and p["batch_group_count"] == 1
           and min(min(pair) for pair in p["padding"]) >= 0
           and x.dtype == np.float32 and kernel.dtype == np.float32
           and p["preferred_element_type"] in (None, np.float32))
  if not plain:
    return None
  strides, pads = tuple(p["window_strides"]), tuple(tuple(pair) for pair in p["padding"])
  return lambda x, kernel: [conv2d(x, kernel, strides, pads, impl)]


def _pool_rule(eqn):
  """`max_pool_2x2` for a 2x2, stride-2 unpadded max pool of an even NHWC input, else None."""
  p = eqn.params
  x = eqn.invars[0].aval
  plain = (x.ndim == 4 and x.shape[1] % 2 == 0 and x.shape[2] % 2 == 0
           and np.issubdtype(x.dtype, np.floating)
           and tuple(p["window_dimensions"]) == (1, 2, 2, 1)
           and tuple(p["window_strides"]) == (1, 2, 2, 1)
           and all(tuple(pair) == (0, 0) for pair in p["padding"])
           and set(p["base_dilation"]) == {1} and set(p["window_dilation"]) == {1})
  return (lambda x: [pooling.max_pool_2x2(x)]) if plain else None


def _rule(eqn, impl: str):
  name = eqn.primitive.name
  if name == "conv_general_dilated":
    return _conv_rule(eqn, impl)
  if name == "reduce_window_max":
    return _pool_rule(eqn)
  return None


def _body(eqn) -> jex.core.ClosedJaxpr | None:
  body = eqn.params.get("jaxpr") if eqn.primitive.name in _CALLS else None
  return body if isinstance(body, jex.core.ClosedJaxpr) else None


def _replaces(jaxpr: jex.core.Jaxpr) -> bool:
  """Whether evaluating `jaxpr` would replace an operation."""
  for eqn in jaxpr.eqns:
    body = _body(eqn)
    if _rule(eqn, "lax") is not None or (body is not None and _replaces(body.jaxpr)):
      return True
  return False


def _evaluate(jaxpr: jex.core.Jaxpr, consts, args, impl: str) -> list:
  """`jaxpr` applied to `args`, with the replacements (a custom interpreter: each eqn is bound
  under the caller's transformations, as `jax.core.eval_jaxpr` does)."""
  env = {}
  read = lambda v: v.val if isinstance(v, jex.core.Literal) else env[v]
  env.update(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, args))
  for eqn in jaxpr.eqns:
    values = [read(v) for v in eqn.invars]
    rule, body = _rule(eqn, impl), _body(eqn)
    if rule is not None:
      outs = rule(*values)
    elif body is not None and _replaces(body.jaxpr):
      outs = _evaluate(body.jaxpr, body.consts, values, impl)
    else:
      with eqn.ctx.manager:  # The eqn's context (e.g. its compute placement), as traced.
        outs = eqn.primitive.bind(*values, **eqn.primitive.get_bind_params(eqn.params))
      outs = outs if eqn.primitive.multiple_results else [outs]
    env.update((v, out) for v, out in zip(eqn.outvars, outs)
               if not isinstance(v, jex.core.DropVar))
  return [read(v) for v in jaxpr.outvars]


def fast_ops(fn: Callable, conv_impl: str = "auto") -> Callable:
  """`fn` (positional array arguments, a pytree out) with its plain convolutions and 2x2 max pools
  on the fast lowerings (see the module's docstring).

  Args:
    fn: the function, e.g. a flax module's `apply`.
    conv_impl: the convolutions' lowering (`conv.CONV_IMPLS`); "auto" is, on a CPU, what
      `resolve_conv_impl` says (when a call first has something to replace) and, on an
      accelerator, nothing replaced; "lax" returns `fn` itself (nothing replaced, the max pools
      included).

  Raises:
    ValueError: for an unknown `conv_impl`.

  Returns:
    A function with `fn`'s signature and outputs.
  """
  if conv_impl not in CONV_IMPLS:
    raise ValueError(f"conv impl must be one of {CONV_IMPLS}, got {conv_impl!r}")
  if conv_impl == "lax":
    return fn

  @functools.wraps(fn)
  def replaced(*args):
    if conv_impl == "auto" and jax.default_backend() != "cpu":
      return fn(*args)  # An accelerator's own convolution (cuDNN's) is its fast one.
    closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
    if not _replaces(closed.jaxpr):
      return fn(*args)
    impl = resolve_conv_impl(conv_impl)  # Here, so a model without convolutions never asks.
    outs = _evaluate(closed.jaxpr, closed.consts, jax.tree.leaves(args), impl)
    return jax.tree.unflatten(jax.tree.structure(shapes), outs)

  return replaced
