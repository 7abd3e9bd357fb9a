"""Models: the patches convolution equals flax's nn.Conv; every bundle runs and trains."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from fedjax_sel.models import PatchConv, build_model, masked_mean_loss
from fedjax_sel.models.pooling import max_pool_2x2


@pytest.mark.parametrize("kernel,strides,padding", [((5, 5), (1, 1), "SAME"),
                                                    ((3, 3), (2, 2), "SAME"),
                                                    ((3, 3), (1, 1), "VALID"),
                                                    ((1, 1), (2, 2), "SAME")])
def test_patch_conv_equals_flax_conv(kernel, strides, padding):
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 9, 10, 4))
  ref = nn.Conv(6, kernel, strides, padding)
  params = ref.init(jax.random.PRNGKey(1), x)
  want = ref.apply(params, x)
  for impl in ("patches", "lax"):
    got = PatchConv(6, kernel, strides, padding, impl=impl).apply(params, x)
    chex.assert_trees_all_close(got, want, atol=1e-5, rtol=1e-5)
  # Gradients agree too, also under vmap over per-client kernels.
  kernels = jnp.stack([params["params"]["kernel"] * (1 + 0.1 * i) for i in range(3)])
  def loss(mod, k):
    return jnp.sum(mod.apply({"params": {"kernel": k, "bias": params["params"]["bias"]}}, x) ** 2)
  g_ref = jax.vmap(jax.grad(lambda k: loss(ref, k)))(kernels)
  g_got = jax.vmap(jax.grad(lambda k: loss(PatchConv(6, kernel, strides, padding), k)))(kernels)
  chex.assert_trees_all_close(g_got, g_ref, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("shape", [(2, 8, 6, 3), (1, 7, 5, 2)])
def test_max_pool_2x2_equals_flax_max_pool(shape):
  x = jax.random.normal(jax.random.PRNGKey(0), shape)  # No ties: gradients agree exactly.
  want = lambda a: nn.max_pool(a, (2, 2), strides=(2, 2), padding="SAME")
  chex.assert_trees_all_equal(max_pool_2x2(x), want(x))
  w = jax.random.normal(jax.random.PRNGKey(1), want(x).shape)
  grad = lambda f: jax.grad(lambda a: jnp.sum(f(a) * w))(x)
  chex.assert_trees_all_equal(grad(max_pool_2x2), grad(want))


@pytest.mark.parametrize("name,shape,classes", [
    ("logreg", (8, 8, 1), 10), ("mlp", (60,), 10),
    # The presets' tests train these end to end in the default suite.
    pytest.param("leaf_cnn", (28, 28, 1), 62, marks=pytest.mark.slow),
    pytest.param("cifar_cnn", (32, 32, 3), 10, marks=pytest.mark.slow),
    pytest.param("resnet18", (32, 32, 3), 10, marks=pytest.mark.slow),
    pytest.param("char_lstm", (80,), 81, marks=pytest.mark.slow)])
def test_models_run_and_reduce_loss(name, shape, classes):
  model = build_model(name, shape, classes)
  params = model.init(jax.random.PRNGKey(0))
  if name == "char_lstm":
    x = jax.random.randint(jax.random.PRNGKey(1), (4, *shape), 0, classes)
  else:
    x = jax.random.normal(jax.random.PRNGKey(1), (4, *shape))
  y = jnp.arange(4) % classes
  assert model.apply(params, x).shape == (4, classes)
  mask = jnp.ones(4)
  loss_fn = jax.jit(lambda p: masked_mean_loss(model, p, x, y, mask))
  loss0, g = jax.jit(jax.value_and_grad(loss_fn))(params)
  stepped = jax.tree.map(lambda p, gi: p - 0.01 * gi, params, g)
  assert loss_fn(stepped) < loss0


def test_param_counts():
  count = lambda m, s, c: sum(a.size for a in jax.tree.leaves(build_model(m, s, c).init(
      jax.random.PRNGKey(0))))
  assert count("leaf_cnn", (28, 28, 1), 62) == 6_603_710  # LEAF's FEMNIST CNN.
  assert count("char_lstm", (80,), 81) == 818_137


def test_unknown_model():
  with pytest.raises(ValueError, match="accepted"):
    build_model("vgg", (8,), 2)


@pytest.mark.slow  # Covered by faster tests in the default suite; `pytest -m slow`.
def test_narrow_resnet18_structure_and_gradients():
  from fedjax_sel.models.bundle import from_flax  # pylint: disable=import-outside-toplevel
  from fedjax_sel.models.modules import ResNet18  # pylint: disable=import-outside-toplevel
  model = from_flax(ResNet18(10, width=4), (16, 16, 3), 10, "resnet18")
  params = model.init(jax.random.PRNGKey(0))
  blocks = [k for k in params if k.startswith("_Block")]
  assert len(blocks) == 8  # Four stages of two basic blocks.
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 16, 16, 3))
  g = jax.jit(jax.grad(lambda p: masked_mean_loss(model, p, x, jnp.array([1, 2]), jnp.ones(2))))(
      params)
  assert all(bool(jnp.isfinite(a).all()) for a in jax.tree.leaves(g))


def test_a_models_own_loss_is_what_training_minimizes_and_statistics_report():
  """Twice the cross-entropy at half the learning rate takes the same SGD steps as the default
  loss; evaluation reports twice the loss and the same accuracy."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel

  import fedjax_sel as fs  # pylint: disable=import-outside-toplevel

  data = fs.build_dataset(fs.DatasetSpec("digits", num_clients=6), seed=0)
  double = lambda logits, y: 2.0 * optax.softmax_cross_entropy_with_integer_labels(logits, y)
  model = build_model("logreg", data.feature_shape, data.num_classes)
  models = [model, model._replace(loss=double)]
  runs = []
  for model, lr in zip(models, (0.1, 0.05)):
    sim = fs.Simulator(model, data, optimizer=optax.sgd, local=fs.LocalHParams(batch_size=8),
                       availability=fs.uniform_availability(6, 6), selector=fs.random_selector(),
                       aggregator=fs.fedavg(), clients_per_round=3, seed=0,
                       lr_schedule=fs.constant_lr(lr))
    runs.append(fs.run(sim, rounds=2, progress=None))
  default, own = runs
  assert [r["selected"] for r in own] == [r["selected"] for r in default]
  np.testing.assert_allclose(own[-1]["test_loss"], 2 * default[-1]["test_loss"], rtol=1e-5)
  np.testing.assert_allclose(own[-1]["test_accuracy"], default[-1]["test_accuracy"], rtol=1e-6)
