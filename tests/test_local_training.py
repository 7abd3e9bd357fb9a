"""Vectorized local training against a plain per-client loop."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_sel import keys as keylib
from fedjax_sel.client.local_training import (DROPOUT, LocalHParams, _epoch_orders,
                                              local_train, steps_per_client)
from fedjax_sel.data.federated import ClientPool, device_pool
from fedjax_sel.models import build_model
from tests.conftest import batch_norm_mlp, dropout_mlp, ragged_dataset


@functools.cache
def _reference_grad(model, prox_mu):
  """The jitted gradient of one client batch's objective (compiled once per model, not once per
  client); `key` is the step's dropout key (used by models with `train_call`)."""
  def objective(w, global_weights, xb, yb, state, key):
    if model.train_call is not None and state is None:
      logits, new_state = model.train_call(w, xb, jnp.ones(len(yb)), key)[0], None
    elif state is None:
      logits, new_state = model.apply(w, xb), None
    else:
      logits, new_state = model.train_apply({**state, "params": w}, xb, jnp.ones(len(yb)))
    mean = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, yb))
    sq = sum(jnp.sum((a - b) ** 2)
             for a, b in zip(jax.tree.leaves(w), jax.tree.leaves(global_weights)))
    return mean + 0.5 * prox_mu * sq, (mean, new_state)
  return jax.jit(jax.grad(objective, has_aux=True))


def reference_client(model, tx, hp, global_params, x, y, key, max_count):
  """One client, one Python step at a time, on its own numpy arrays (no masks, no vmap). A
  stateful model's batch statistics come from a training-mode pass over exactly the batch."""
  weights, state = (global_params["params"], global_params) if model.train_apply else (
      global_params, None)
  global_weights = weights
  opt_state = tx.init(weights)
  count = len(y)
  total_loss, total_n = 0.0, 0
  grad = _reference_grad(model, hp.prox_mu)
  orders = np.asarray(_epoch_orders(key, count, hp.num_epochs, max_count))
  step = 0
  for e in range(hp.num_epochs):
    for start in range(0, count, hp.batch_size):
      idx = orders[e][start:min(start + hp.batch_size, count)]
      # The step's dropout key: the client's key, folded with DROPOUT, then the step index.
      step_key = jax.random.fold_in(jax.random.fold_in(key, DROPOUT), step)
      step += 1
      g, (mean, state) = grad(weights, global_weights, x[idx], y[idx], state, step_key)
      updates, opt_state = tx.update(g, opt_state, weights)
      weights = optax.apply_updates(weights, updates)
      total_loss += float(mean) * len(idx)
      total_n += len(idx)
  params = weights if state is None else {**state, "params": weights}
  return params, total_loss / max(total_n, 1), total_n


def run_vectorized(model, tx_factory, hp, params, pool, clients, valid, seed=0, lr=0.05):
  clients = jnp.asarray(clients, jnp.int32)
  keys = keylib.client_keys(keylib.round_key(seed, 0, keylib.TRAIN), clients)
  fn = jax.jit(lambda p, dp: local_train(model, tx_factory, hp, p, dp, clients, jnp.asarray(valid),
                                         keys, jnp.float32(lr), max(pool.max_count, 1)))
  return fn(params, device_pool(pool)), keys


@pytest.mark.parametrize("hp,opt", [
    (LocalHParams(batch_size=4, num_epochs=2), "sgd"),
    (LocalHParams(batch_size=5, num_epochs=1, chunk_size=3), "momentum"),
    (LocalHParams(batch_size=8, num_epochs=3, prox_mu=0.5, chunk_size=2), "sgd"),
    # Micro-batches (the padded rows past a client's last example not computed): the same steps.
    (LocalHParams(batch_size=8, num_epochs=2, micro_batch=2), "sgd"),
    (LocalHParams(batch_size=8, num_epochs=1, prox_mu=0.5, chunk_size=3, micro_batch=4),
     "momentum"),
])
def test_vmapped_training_equals_per_client_loop(hp, opt, model=None):
  data = ragged_dataset([23, 5, 40, 1, 17, 9, 31, 12, 3, 28])
  model = model or build_model("mlp", data.feature_shape, data.num_classes, hidden=(16,))
  params = model.init(jax.random.PRNGKey(1))
  tx_factory = (lambda lr: optax.sgd(lr)) if opt == "sgd" else (lambda lr: optax.sgd(lr, 0.9))
  clients = [2, 7, 3, 0, 5, 9, 4]
  valid = [True, True, True, True, True, False, True]
  res, keys = run_vectorized(model, tx_factory, hp, params, data.train, clients, valid)
  for slot, (k, ok) in enumerate(zip(clients, valid)):
    got = jax.tree.map(lambda a: a[slot], res.params)
    if not ok:
      chex.assert_trees_all_close(got, params)
      assert float(res.samples[slot]) == 0
      continue
    x, y = data.train.client(k)
    want, loss, n = reference_client(model, tx_factory(jnp.float32(0.05)), hp, params, x, y,
                                     keys[slot], max(data.train.max_count, 1))
    chex.assert_trees_all_close(got, want, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(float(res.train_loss[slot]), loss, rtol=1e-4, atol=1e-6)
    assert float(res.samples[slot]) == n


@pytest.mark.parametrize("hp", [LocalHParams(batch_size=4, num_epochs=2),
                                LocalHParams(batch_size=7, num_epochs=1, prox_mu=0.5,
                                             chunk_size=3)])
def test_batch_norm_training_equals_per_client_loop_with_statistics(hp):
  """Each client's running statistics follow its own batches (the partial last batch of an epoch
  counts only its real examples, never the padding), and the weights match the loop's."""
  model = batch_norm_mlp()
  test_vmapped_training_equals_per_client_loop(hp, "momentum", model)
  data = ragged_dataset([23, 5, 40])
  params = model.init(jax.random.PRNGKey(1))
  res, _ = run_vectorized(model, lambda lr: optax.sgd(lr), hp, params, data.train, [0, 1, 2],
                          [True, False, True])
  moved = res.params["batch_stats"]["BatchNorm_0"]["mean"]
  start = params["batch_stats"]["BatchNorm_0"]["mean"]
  assert not np.allclose(moved[0], start) and np.allclose(moved[1], start)


@pytest.mark.parametrize("hp", [LocalHParams(batch_size=4, num_epochs=2),
                                LocalHParams(batch_size=5, num_epochs=1, chunk_size=3)])
def test_dropout_training_equals_per_client_loop_with_the_same_keys(hp):
  """A model with dropout: each client step's mask comes from (seed, round, client, step), so
  the vmapped chunks equal the plain loop drawing the same keys; and the keys are used (a rate
  of 0.5 trains to other weights than the same module at rate 0)."""
  test_vmapped_training_equals_per_client_loop(hp, "sgd", dropout_mlp())
  data = ragged_dataset([23, 5, 40])
  params = dropout_mlp().init(jax.random.PRNGKey(1))
  on, _ = run_vectorized(dropout_mlp(), lambda lr: optax.sgd(lr), hp, params, data.train,
                         [0, 2], [True, True])
  off, _ = run_vectorized(dropout_mlp(rate=0.0), lambda lr: optax.sgd(lr), hp, params,
                          data.train, [0, 2], [True, True])
  assert not np.allclose(on.params["Dense_1"]["kernel"], off.params["Dense_1"]["kernel"])


def test_micro_batches_are_refused_when_they_do_not_divide_b_or_the_model_keeps_state():
  import fedjax_sel as fs  # pylint: disable=import-outside-toplevel
  data = ragged_dataset([23, 5, 40, 1, 17, 9, 31, 12, 3, 28])
  build = lambda model, local: fs.build_run(
      model, data, lambda lr: optax.sgd(lr), local, fs.uniform_availability(10, 5),
      fs.random_selector(), fs.fedavg(), 3, 0)
  mlp = build_model("mlp", data.feature_shape, data.num_classes, hidden=(8,))
  with pytest.raises(ValueError, match=r"micro_batch must divide batch_size \(8\), got 3"):
    build(mlp, LocalHParams(batch_size=8, micro_batch=3))
  with pytest.raises(ValueError, match="keeps state"):
    build(batch_norm_mlp(), LocalHParams(batch_size=8, micro_batch=4))


def test_update_unchanged_by_padding_and_company():
  """A client's update does not depend on the pool's padding, other slots or chunking."""
  data = ragged_dataset([23, 5, 40, 12])
  model = build_model("logreg", data.feature_shape, data.num_classes)
  params = model.init(jax.random.PRNGKey(0))
  tx = lambda lr: optax.sgd(lr)
  hp = LocalHParams(batch_size=4, num_epochs=2)
  alone, _ = run_vectorized(model, tx, hp, params, data.train, [0], [True])
  # A much larger client in the pool (max_count grows 5x) and in the same chunk, invalid slots too.
  big_x = np.random.default_rng(3).normal(size=(200, 6)).astype(np.float32)
  xs = [data.train.client(k)[0] for k in range(4)] + [big_x]
  ys = [data.train.client(k)[1] for k in range(4)] + [np.zeros(200, np.int32)]
  padded_pool = ClientPool.from_client_arrays(xs, ys)
  crowd, _ = run_vectorized(model, tx, hp, params, padded_pool, [4, 0, 2, 0],
                            [True, True, True, False])
  chex.assert_trees_all_close(jax.tree.map(lambda a: a[0], alone.params),
                              jax.tree.map(lambda a: a[1], crowd.params), atol=1e-6)
  hp_chunked = hp._replace(chunk_size=1)
  chunked, _ = run_vectorized(model, tx, hp_chunked, params, padded_pool, [4, 0], [True, True])
  chex.assert_trees_all_close(jax.tree.map(lambda a: a[0], alone.params),
                              jax.tree.map(lambda a: a[1], chunked.params), atol=1e-6)


def test_fedprox_mu_zero_equals_fedavg_and_mu_pulls_towards_global():
  data = ragged_dataset([30, 20, 25])
  model = build_model("mlp", data.feature_shape, data.num_classes, hidden=(8,))
  params = model.init(jax.random.PRNGKey(0))
  tx = lambda lr: optax.sgd(lr)
  base = LocalHParams(batch_size=5, num_epochs=3)
  plain, _ = run_vectorized(model, tx, base, params, data.train, [0, 1, 2], [True] * 3, lr=0.3)
  prox0, _ = run_vectorized(model, tx, base._replace(prox_mu=0.0), params, data.train, [0, 1, 2],
                            [True] * 3, lr=0.3)
  prox, _ = run_vectorized(model, tx, base._replace(prox_mu=5.0), params, data.train, [0, 1, 2],
                           [True] * 3, lr=0.3)
  chex.assert_trees_all_close(plain.params, prox0.params)
  dist = lambda r: float(optax.tree.norm(jax.tree.map(lambda a, g: a - g, r.params, params)))
  assert dist(prox) < dist(plain)


def test_fixed_steps_mode_counts_and_masks_empty_clients():
  data = ragged_dataset([10, 3, 7])
  xs = [data.train.client(k)[0] for k in range(3)] + [np.zeros((0, 6), np.float32)]
  ys = [data.train.client(k)[1] for k in range(3)] + [np.zeros((0,), np.int32)]
  pool = ClientPool.from_client_arrays(xs, ys)
  model = build_model("logreg", data.feature_shape, data.num_classes)
  params = model.init(jax.random.PRNGKey(0))
  hp = LocalHParams(batch_size=4, num_steps=5)
  res, _ = run_vectorized(model, lambda lr: optax.sgd(lr), hp, params, pool, [0, 3, 1],
                          [True, True, True])
  assert res.steps.tolist() == [5, 0, 5]
  assert res.samples.tolist() == [20.0, 0.0, 20.0]
  chex.assert_trees_all_close(jax.tree.map(lambda a: a[1], res.params), params)
  assert steps_per_client(jnp.array([9, 0, 4]),
                          LocalHParams(batch_size=4, num_epochs=2)).tolist() == [6, 0, 2]


def test_chunk_size_follows_memory_budget_and_step_cost():
  from fedjax_sel.client.local_training import StepCost, auto_chunk_size, step_cost  # pylint: disable=import-outside-toplevel
  hp = LocalHParams(batch_size=8)
  sgd = lambda lr: optax.sgd(lr)
  costs = {}
  for name in ("logreg", "mlp"):
    model = build_model(name, (28, 28, 1), 10)
    costs[name] = step_cost(model, sgd, hp, model.init(jax.random.PRNGKey(0)), (28, 28, 1))
  # One more client costs at least its own parameters (4 bytes each; XLA may reuse gradient
  # buffers).
  assert costs["logreg"].bytes >= 4 * 7850 and costs["mlp"].bytes >= 4 * 199210
  # A step's FLOPs: at least forward + weight gradient, 2 * 2 * B * (weights), at most 5x that.
  for name, weights in (("logreg", 7840), ("mlp", 784 * 200 + 200 * 200 + 200 * 10)):
    assert 4 * 8 * weights <= costs[name].flops <= 5 * 4 * 8 * weights
  momentum = lambda lr: optax.sgd(lr, 0.9)
  model = build_model("mlp", (28, 28, 1), 10)
  assert step_cost(model, momentum, hp, model.init(jax.random.PRNGKey(0)),
                   (28, 28, 1)).bytes > costs["mlp"].bytes  # Momentum state is per client too.
  mlp = costs["mlp"]
  assert auto_chunk_size(mlp, 10 * mlp.bytes, 100, platform="gpu") == 10
  assert auto_chunk_size(mlp, 10 * mlp.bytes, 4, platform="gpu") == 4
  assert auto_chunk_size(mlp, 1, 100, platform="gpu") == 1
  # CPU: a few clients per chunk, one when a step is tiny; the memory budget still caps it.
  assert auto_chunk_size(StepCost(mlp.bytes, 1e9), 10 * mlp.bytes, 100, platform="cpu") == 4
  assert auto_chunk_size(StepCost(mlp.bytes, 1e9), 2 * mlp.bytes, 100, platform="cpu") == 2
  assert auto_chunk_size(StepCost(mlp.bytes, 1e5), 10 * mlp.bytes, 100, platform="cpu") == 1
  # CPU: under the cap, the size that pads the slots least (10 slots: chunks of 2, not 3 or 4).
  assert auto_chunk_size(StepCost(mlp.bytes, 1e9), 10 * mlp.bytes, 10, platform="cpu") == 2
  # Accelerators: the fewest chunks, evened out (10 slots under a cap of 7: 2 chunks of 5).
  assert auto_chunk_size(mlp, 7 * mlp.bytes, 10, platform="gpu") == 5
  assert auto_chunk_size(mlp, 7 * mlp.bytes, 13, platform="gpu") == 7


def test_size_sorted_chunks_layout():
  from fedjax_sel.client.chunking import size_sorted_chunks  # pylint: disable=import-outside-toplevel
  sizes = jnp.array([3, 9, 1, 5, 7, 5])
  layout = size_sorted_chunks(sizes, chunk_size=3, multiple=2)  # Rounded up to 4 per chunk.
  assert (layout.size, layout.num_chunks) == (4, 2)
  arranged = layout.arrange(sizes, fill=-1)
  assert arranged.tolist() == [[9, 7, 5, 5], [3, 1, -1, -1]]
  assert layout.arrange(jnp.arange(6), fill=0).tolist()[0] == [1, 4, 3, 5]  # Stable on ties.
  assert layout.unarrange(layout.arrange(jnp.arange(6) * 10, fill=0)).tolist() == [0, 10, 20, 30,
                                                                                  40, 50]
  assert size_sorted_chunks(sizes, None).num_chunks == 1
