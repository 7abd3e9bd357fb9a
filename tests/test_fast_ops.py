"""A user's nn.Conv / nn.max_pool model runs on the fast lowerings and computes what it says."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from fedjax_sel.models import from_flax, onednn, train_losses
from fedjax_sel.models.fast_ops import fast_ops

IMPLS = ["patches", pytest.param("onednn", marks=pytest.mark.skipif(
    onednn.unavailable_reason() is not None, reason=f"{onednn.unavailable_reason()}"))]


class UserCNN(nn.Module):
  """As a flax user writes it: nn.Conv (VALID, SAME, strided), nn.max_pool, a conv in a jit,
  BatchNorm and dropout."""

  @nn.compact
  def __call__(self, x, train=False, mask=None):
    del mask
    x = nn.relu(nn.Conv(8, (3, 3), padding="VALID")(x))                # 12 -> 10
    x = nn.max_pool(x, (2, 2), strides=(2, 2), padding="SAME")          # 10 -> 5
    x = nn.Conv(8, (3, 3), strides=(2, 2))(x)                           # 5 -> 3
    x = nn.BatchNorm(use_running_average=not train)(x)
    conv = nn.Conv(6, (2, 2), padding="SAME")
    x = jax.jit(lambda z: nn.relu(z))(conv(x))
    x = nn.Dropout(0.3, deterministic=not train)(x)
    return nn.Dense(5)(x.reshape((x.shape[0], -1)))


class Unplain(nn.Module):
  """Operations the lowering leaves as written: a dilated and a grouped conv, a 3x3 pool."""

  @nn.compact
  def __call__(self, x):
    x = nn.Conv(4, (3, 3), kernel_dilation=(2, 2))(x)
    x = nn.Conv(4, (3, 3), feature_group_count=2)(x)
    x = nn.max_pool(x, (3, 3), strides=(3, 3))
    return nn.Dense(5)(x.reshape((x.shape[0], -1)))


def _grads_of(model, params, x, y, keys):
  """Per-client (vmapped) training losses and their gradients, compiled."""
  def loss(p, xb, yb, key):
    losses, new = train_losses(model, p, xb, yb, jnp.ones(yb.shape), key)
    return jnp.mean(losses), new
  fn = jax.jit(jax.vmap(jax.value_and_grad(loss, has_aux=True)))
  return fn, (params, x, y, keys)


def _clients(model, count=3):
  """`count` clients' params (distinct) and batches."""
  params = model.init(jax.random.PRNGKey(0))
  stacked = jax.tree.map(lambda a: jnp.stack([a * (1 + 0.1 * i) for i in range(count)]), params)
  x = jax.random.normal(jax.random.PRNGKey(1), (count, 4, 12, 12, 3))
  y = jax.random.randint(jax.random.PRNGKey(2), (count, 4), 0, 5)
  keys = jax.random.split(jax.random.PRNGKey(3), count)
  return stacked, x, y, keys


@pytest.mark.parametrize("impl", IMPLS)
def test_nn_conv_model_trains_on_the_fast_lowering_with_its_own_values(impl):
  wrap = lambda conv_impl: from_flax(UserCNN(), (12, 12, 3), 5, "user_cnn", stateful=True,
                                     stochastic=True, conv_impl=conv_impl)
  fast, written = wrap(impl), wrap("lax")
  args = _clients(written)
  fn_fast, _ = _grads_of(fast, *args)
  fn_written, _ = _grads_of(written, *args)
  got, want = fn_fast(*args), fn_written(*args)
  # Values, updated BatchNorm statistics and gradients: the module's, to float rounding.
  chex.assert_trees_all_close(got, want, atol=2e-5, rtol=2e-4)
  # No XLA convolution, no select_and_scatter (max pooling's slow gradient) is left.
  hlo = fn_fast.lower(*args).as_text()
  assert "convolution" not in hlo and "select_and_scatter" not in hlo
  written_hlo = fn_written.lower(*args).as_text()
  assert "convolution" in written_hlo and "select_and_scatter" in written_hlo
  # Evaluation mode too.
  x = args[1][0]
  params = jax.tree.map(lambda a: a[0], args[0])
  chex.assert_trees_all_close(fast.apply(params, x), written.apply(params, x), atol=2e-5,
                              rtol=2e-4)


def test_operations_it_cannot_lower_stay_as_written():
  fast = from_flax(Unplain(), (12, 12, 3), 5, "unplain", conv_impl="patches")
  written = from_flax(Unplain(), (12, 12, 3), 5, "unplain", conv_impl="lax")
  params = fast.init(jax.random.PRNGKey(0))
  x = jax.random.normal(jax.random.PRNGKey(1), (4, 12, 12, 3))
  assert str(jax.make_jaxpr(fast.apply)(params, x)) == str(
      jax.make_jaxpr(written.apply)(params, x))
  chex.assert_trees_all_equal(fast.apply(params, x), written.apply(params, x))


def test_a_model_without_convolutions_compiles_the_same_program():
  module = nn.Sequential([nn.Dense(7), nn.relu, nn.Dense(3)])
  fast = from_flax(module, (5,), 3, "mlp", conv_impl="auto")
  written = from_flax(module, (5,), 3, "mlp", conv_impl="lax")
  params = fast.init(jax.random.PRNGKey(0))
  x = jnp.ones((2, 5))
  grad = lambda m: jax.jit(jax.grad(lambda p: jnp.sum(m.apply(p, x))))
  assert grad(fast).lower(params).as_text() == grad(written).lower(params).as_text()


def test_an_unknown_lowering_is_refused_naming_the_accepted_ones():
  with pytest.raises(ValueError, match="conv impl must be one of .*'patches'.*got 'cudnn'"):
    fast_ops(lambda x: x, "cudnn")
  with pytest.raises(ValueError, match="got 'cudnn'"):
    from_flax(nn.Dense(3), (4,), 3, "linear", conv_impl="cudnn")


def test_an_accelerator_keeps_its_own_convolutions(monkeypatch):
  """`conv_impl="auto"` replaces nothing off a CPU (cuDNN's convolution is the fast one there)."""
  module = nn.Sequential([nn.Conv(4, (3, 3)), lambda z: z.reshape((z.shape[0], -1))])
  user = from_flax(module, (12, 12, 3), 5, "user_conv")
  params = user.init(jax.random.PRNGKey(0))
  x = jnp.ones((2, 12, 12, 3))
  # A new function each time: JAX keeps the traces of one it has seen.
  ops = lambda: {e.primitive.name for e in jax.make_jaxpr(lambda p: user.apply(p, x))(params).eqns}
  assert "conv_general_dilated" not in ops()  # On this CPU: replaced.
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert "conv_general_dilated" in ops()
