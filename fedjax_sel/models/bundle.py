"""The model bundle the engine uses without knowing the architecture.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> model = build_model("logreg", input_shape=(8, 8, 1), num_classes=10)
  >>> params = model.init(jax.random.PRNGKey(0))
  >>> model.apply(params, jnp.zeros((3, 8, 8, 1))).shape
  (3, 10)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_sel import registry
from fedjax_sel.models import modules
from fedjax_sel.models.conv import CONV_IMPLS, resolve_conv_impl
from fedjax_sel.models.fast_ops import fast_ops

Params = Any
MODELS = ("logreg", "mlp", "leaf_cnn", "cifar_cnn", "resnet18", "char_lstm", "word_lstm")
CONV_MODELS = ("leaf_cnn", "cifar_cnn", "resnet18")  # The ones `conv_impl` applies to.


class Model(NamedTuple):
  """init(key) -> params; apply(params, x [B, ...]) -> logits [B, C] (evaluation mode).

  A model with state besides its weights (BatchNorm's running statistics) has `train_apply`:
  `(params, x [B, ...], mask [B]) -> (logits, params with the state updated over the examples where
  mask is 1)`, and its params are the flax variables `{"params": weights, "batch_stats": ...}`.
  Everything that averages models (aggregators, FilFL's candidate averages) then averages the
  statistics with the same weights as the weights; only `trainable(model, params)` is optimized.

  `loss`, when set, is the per-example loss `(logits [B, C], labels [B]) -> [B]` that local
  training minimizes and every loss statistic reports (F_k, FilFL's public loss, FedALIGN's and
  FedSRC's comparisons); by default it is the softmax cross-entropy. Accuracy and predictive
  entropy always read the logits as softmax scores.

  A model with training-time randomness (dropout) has `train_call`: `(params, x, mask, key) ->
  (logits, params)`, training mode with the PRNG key of one client's local step (local training
  derives it from the seed, round, client id and step, so runs repeat bit for bit); it replaces
  `train_apply` in training (a stateful one updates its state as `train_apply` does).
  """

  init: Callable[[jax.Array], Params]
  """`init(key) -> params`: fresh weights (and state) from a PRNG key."""
  apply: Callable[[Params, jax.Array], jax.Array]
  """`apply(params, x [B, ...]) -> logits [B, C]`, evaluation mode."""
  num_classes: int
  """C, the number of classes (the logits' width)."""
  name: str
  """The model's name in records and the compiled program's signature."""
  train_apply: Callable[[Params, jax.Array, jax.Array], tuple[jax.Array, Params]] | None = None
  """`train_apply(params, x, mask) -> (logits, params)`: training mode with state (BatchNorm)."""
  loss: Callable[[jax.Array, jax.Array], jax.Array] | None = None
  """`loss(logits [B, C], labels [B]) -> [B]`; None: softmax cross-entropy."""
  train_call: Callable[..., tuple[jax.Array, Params]] | None = None
  """`train_call(params, x, mask, key) -> (logits, params)`: training mode with randomness."""


def logits_loss(model: Model, logits: jax.Array, y: jax.Array) -> jax.Array:
  """The model's per-example loss `[B]` of `logits [B, C]` against labels `y [B]`."""
  if model.loss is not None:
    return model.loss(logits, y)
  return optax.softmax_cross_entropy_with_integer_labels(logits, y)


def param_shapes(model: Model) -> Params:
  """The shapes and dtypes of the model's parameters (`jax.ShapeDtypeStruct` leaves): nothing is
  computed or compiled, the initializer's key included."""
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0)))


def model_bytes(params) -> float:
  """Bytes of one copy of the model (what a client downloads or uploads)."""
  return float(sum(np.prod(a.shape) * np.dtype(a.dtype).itemsize
                   for a in jax.tree.leaves(params)))


def trainable(model: Model, params: Params) -> Params:
  """The part of `params` that local training optimizes (all of it for stateless models)."""
  return params["params"] if model.train_apply is not None else params


def with_trainable(model: Model, params: Params, weights: Params) -> Params:
  """`params` with its trainable part replaced by `weights`."""
  return {**params, "params": weights} if model.train_apply is not None else weights


def train_losses(model: Model, params: Params, x: jax.Array, y: jax.Array,
                 mask: jax.Array, key: jax.Array | None = None) -> tuple[jax.Array, Params]:
  """Training-mode per-example losses `[B]` and the params with their state updated over the
  examples where `mask` is 1 (the params themselves for stateless models); `key`, the step's
  PRNG key, feeds a model's training-time randomness (`train_call`)."""
  if model.train_call is not None:
    if key is None:
      raise ValueError(f"model {model.name!r} draws randomness in training (dropout): pass the "
                       "step's key")
    logits, new_params = model.train_call(params, x, mask, key)
    return logits_loss(model, logits, y), new_params
  if model.train_apply is None:
    return per_example_loss(model, params, x, y), params
  logits, new_params = model.train_apply(params, x, mask)
  return logits_loss(model, logits, y), new_params


class ExampleMetrics(NamedTuple):
  """Per-example `[B]` loss (the model's, cross-entropy by default), correctness and predictive
  entropy (nats)."""

  loss: jax.Array
  correct: jax.Array
  entropy: jax.Array


def per_example_loss(model: Model, params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
  """The model's loss of each example, `[B]` (softmax cross-entropy unless `model.loss`)."""
  return logits_loss(model, model.apply(params, x), y)


def example_metrics(model: Model, params: Params, x: jax.Array, y: jax.Array) -> ExampleMetrics:
  logits = model.apply(params, x)
  logp = jax.nn.log_softmax(logits)
  if model.loss is not None:
    loss = model.loss(logits, y)
  else:
    loss = -jnp.take_along_axis(logp, y[:, None].astype(jnp.int32), axis=1)[:, 0]
  correct = (jnp.argmax(logits, axis=-1) == y).astype(jnp.float32)
  entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
  return ExampleMetrics(loss, correct, entropy)


def masked_mean_loss(model: Model, params: Params, x: jax.Array, y: jax.Array,
                     mask: jax.Array) -> jax.Array:
  """Mean per-example loss over the examples where `mask` is 1 (0 when none are)."""
  losses = per_example_loss(model, params, x, y)
  return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def from_flax(module: nn.Module, input_shape: tuple[int, ...], num_classes: int, name: str,
              input_dtype=jnp.float32, stateful: bool = False,
              loss: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
              stochastic: bool = False, conv_impl: str = "auto") -> Model:
  """Wraps a flax module whose `__call__(x)` returns logits.

  With `stateful`, the module takes `__call__(x, train, mask)` and keeps a `batch_stats`
  collection; the model's params are then all its variables (see `Model`). With `stochastic`,
  the module draws randomness in training, as flax's `nn.Dropout(rate,
  deterministic=not train)` does: it takes `__call__(x, train=False)` (with `stateful`,
  `__call__(x, train=False, mask=None)`), and training passes `rngs={"dropout": key}` with each
  client step's key; evaluation calls it with `train=False`. `loss` is the per-example loss
  `(logits [B, C], labels [B]) -> [B]` (default: softmax cross-entropy).

  The module's plain 2-D convolutions and 2x2 max pools (`nn.Conv`, `nn.max_pool`) run on the
  lowering `conv_impl` (`conv.CONV_IMPLS`, `fast_ops.fast_ops`): by default, on a CPU, oneDNN's
  kernels on a single device where installed, else the patches, as the library's own CNNs, and
  as written on an accelerator; "lax" runs them as written (XLA's convolution and
  `reduce_window`).

  Examples:
    >>> import flax.linen as nn
    >>> model = from_flax(nn.Dense(3), (4,), 3, "linear")
    >>> params = model.init(jax.random.PRNGKey(0))
    >>> model.apply(params, jnp.ones((2, 4))).shape
    (2, 3)
  """
  dummy = np.zeros((1, *input_shape), input_dtype)
  fast = functools.partial(fast_ops, conv_impl=conv_impl)

  if not stateful:
    def train_call(params, x, mask, key):
      del mask
      return module.apply({"params": params}, x.astype(input_dtype), train=True,
                          rngs={"dropout": key}), params

    return Model(lambda key: module.init(key, dummy)["params"],
                 fast(lambda params, x: module.apply({"params": params}, x.astype(input_dtype))),
                 num_classes, name, loss=loss, train_call=fast(train_call) if stochastic else None)

  def train_apply(params, x, mask, key=None):
    rngs = {} if key is None else {"rngs": {"dropout": key}}
    logits, updates = module.apply(params, x.astype(input_dtype), train=True, mask=mask,
                                   mutable=["batch_stats"], **rngs)
    return logits, {**params, **updates}

  train_apply = fast(train_apply)
  return Model(lambda key: dict(module.init(key, dummy)),
               fast(lambda params, x: module.apply(params, x.astype(input_dtype))),
               num_classes, name, train_apply, loss, train_apply if stochastic else None)


class ModelOptions(NamedTuple):
  """The size and lowering options a named model may read."""

  conv_impl: str
  hidden: tuple[int, ...]
  norm: str
  width: int


class NamedModel(NamedTuple):
  """A named model: `make(input_shape, num_classes, options, name) -> Model` and
  `accepts(feature shape, is character text) -> bool`, the inputs it takes."""

  make: Callable[[tuple[int, ...], int, ModelOptions, str], Model]
  accepts: Callable[[tuple[int, ...], bool], bool]


def _flax(module_of, dtype=jnp.float32, stateful=lambda o: False):
  def make(input_shape, num_classes, options, name):
    # "lax": the library's modules are written on their lowering already (PatchConv's impl).
    return from_flax(module_of(num_classes, options), input_shape, num_classes, name, dtype,
                     stateful=stateful(options), conv_impl="lax")
  return make


_NAMED = {  # One entry per model: how it is built and which inputs it takes.
    "logreg": NamedModel(_flax(lambda c, o: modules.LogisticRegression(c)),
                         lambda shape, text: not text),
    "mlp": NamedModel(_flax(lambda c, o: modules.MLP(c, tuple(o.hidden))),
                      lambda shape, text: not text),
    "leaf_cnn": NamedModel(_flax(lambda c, o: modules.LeafCNN(c, conv_impl=o.conv_impl)),
                           lambda shape, text: shape == (28, 28, 1)),
    "cifar_cnn": NamedModel(_flax(lambda c, o: modules.CifarCNN(c, conv_impl=o.conv_impl)),
                            lambda shape, text: len(shape) == 3 and min(shape[:2]) >= 12),
    "resnet18": NamedModel(_flax(lambda c, o: modules.ResNet18(c, o.width, o.conv_impl, o.norm),
                                 stateful=lambda o: o.norm == "batch"),
                           lambda shape, text: len(shape) == 3),
    "char_lstm": NamedModel(_flax(lambda c, o: modules.CharLSTM(c), jnp.int32),
                            lambda shape, text: text),
    "word_lstm": NamedModel(_flax(lambda c, o: modules.WordLSTM(c), jnp.int32),
                            lambda shape, text: text),
}
assert tuple(_NAMED) == MODELS


def accepts(name: str, feature_shape: tuple[int, ...], text: bool) -> bool:
  """Whether model `name` takes features of `feature_shape` (`text`: character windows)."""
  return _NAMED[name].accepts(tuple(feature_shape), text)


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, *,
                conv_impl: str = "auto", hidden: tuple[int, ...] = (200, 200),
                norm: str = "group", width: int = 64) -> Model:
  """Builds one of `MODELS` for inputs of `input_shape` (without the batch axis).

  `norm` ("group" or "batch") and `width` (channels of the first stage) apply to resnet18;
  `conv_impl` (`conv.CONV_IMPLS`) to the convolutional models, resolved here (`resolve_conv_impl`:
  "auto" is oneDNN's kernels on a single CPU device where installed, else the patches).
  """
  if conv_impl not in CONV_IMPLS:
    raise ValueError(f"conv impl must be one of {CONV_IMPLS}, got {conv_impl!r}")
  if name in CONV_MODELS:
    conv_impl = resolve_conv_impl(conv_impl)
  if norm not in modules.NORMS:
    raise ValueError(f"norm must be one of {modules.NORMS}, got {norm!r}")
  if width < 2:
    raise ValueError(f"resnet width must be >= 2, got {width}")
  if name in _NAMED:
    options = ModelOptions(conv_impl, tuple(hidden), norm, width)
    return _NAMED[name].make(tuple(input_shape), num_classes, options, name)
  raise ValueError(f"unknown model {name!r}; accepted: {', '.join(MODELS)}")


# --- Registered names (fedjax_sel.registry): each model's own options, as settings whose flags are
# `build_model`'s keywords.

def _conv_impl_setting():
  return registry.setting("auto", "Convolution lowering: auto (oneDNN's CPU kernels on a single "
                          "CPU device where the onednn extra is installed, else patches), "
                          "patches (shifted slices and a matmul), lax (XLA's convolution) or "
                          "onednn.", flag="conv_impl", choices=CONV_IMPLS)


@dataclasses.dataclass(frozen=True)
class MLPSettings:
  hidden: tuple[int, ...] = registry.setting((200, 200), "Hidden layer widths (e.g. 200,100 for "
                                             "FedSRC's MNIST MLP 784-200-100-10, 64 for its "
                                             "FEMNIST MLP).", flag="hidden")

  def check(self, context: registry.BuildContext) -> None:
    del context
    if not self.hidden or min(self.hidden) < 1:
      raise registry.SettingError("hidden", f"widths must be >= 1, got "
                                  f"{','.join(map(str, self.hidden))}")


@dataclasses.dataclass(frozen=True)
class ConvSettings:
  conv_impl: str = _conv_impl_setting()


@dataclasses.dataclass(frozen=True)
class ResNetSettings:
  norm: str = registry.setting("group", "Normalization layers: group (GroupNorm) or batch "
                               "(BatchNorm; each client keeps running statistics during local "
                               "training, averaged like the weights).", flag="norm",
                               choices=modules.NORMS)
  resnet_width: int = registry.setting(64, "Channels of ResNet18's first stage (64 in the paper; "
                                       "smaller for quick CPU runs).", flag="resnet_width",
                                       within=">= 2")
  conv_impl: str = _conv_impl_setting()


_SETTINGS = {"mlp": MLPSettings, "leaf_cnn": ConvSettings, "cifar_cnn": ConvSettings,
             "resnet18": ResNetSettings}


def _register(name: str) -> None:
  settings = _SETTINGS.get(name, registry.NoSettings)

  def factory(s, context: registry.BuildContext) -> Model:
    data = context.data
    keywords = {"resnet_width": "width"}
    options = {keywords.get(f.name, f.name): getattr(s, f.name) for f in dataclasses.fields(s)}
    return build_model(name, data.feature_shape, data.num_classes, **options)
  factory.__qualname__ = f"model_{name}"
  registry.register("model", name, settings, f"The {name} model.")(factory)


for _name in MODELS:
  _register(_name)
