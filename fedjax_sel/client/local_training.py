"""Local training of K clients at once: `vmap` over stacked params, no per-client Python loop.

Clients are sorted by their number of local steps and processed in chunks (`lax.map` over chunks,
`vmap` inside a chunk); a chunk loops only up to its own largest client's step count, so the
padding cost stays bounded on skewed client sizes, and chunking bounds memory. Clients with fewer
steps are masked (their params and optimizer state stay put), never looped over.

Batches: `num_epochs` epochs of a fresh per-client shuffle each (the last batch of an epoch may be
partial and is masked), or, with `num_steps`, that many batches drawn uniformly with replacement.
The loss of a batch is the mean over its real examples; FedProx adds `(mu / 2) ||w - w_t||^2`.
Models with state (BatchNorm) run in training mode: each client's running statistics start from
the global model's and are updated over the real examples of each of its batches; only the
weights are optimized (and pulled towards w_t by FedProx).

Examples:
  >>> hp = LocalHParams(batch_size=10, num_epochs=2)
  >>> steps_per_client(jnp.array([25, 0, 10]), hp).tolist()
  [6, 0, 2]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_sel.client.chunking import size_sorted_chunks
from fedjax_sel.client.compiled_cost import flops, planned_bytes
from fedjax_sel.data.federated import ClientPool, rows_with_replacement
from fedjax_sel.models.bundle import Model, train_losses, trainable, with_trainable

# Folded into a client's key, then the step index: the key of its training-time randomness
# (dropout) at that step, apart from the keys that draw its batches.
DROPOUT = 2**31 - 1

Params = Any
# Builds the client optimizer for this round's learning rate (a traced scalar).
OptimizerFactory = Callable[[jax.Array], optax.GradientTransformation]


class LocalHParams(NamedTuple):
  """Static local-training settings.

  Attributes:
    batch_size: B.
    num_epochs: E, used when `num_steps` is None.
    num_steps: a fixed number of local steps for every client instead of epochs.
    prox_mu: FedProx coefficient (0 = FedAvg).
    chunk_size: clients per vmapped chunk; None = all slots in one chunk (the `Simulator` replaces
      None by `auto_chunk_size`: what fits `memory_budget_bytes`, and a few clients on CPU).
    memory_budget_bytes: memory the simulator may give one chunk of local training; None =
      `default_memory_budget()`.
    micro_batch: compute each step's batch this many rows at a time (a divisor of B), leaving
      out the micro-batches past a client's last real example: a client's partial last batch
      then costs its rows rounded up to a micro-batch instead of B. The step's gradient is the
      same mean over its real examples, summed in another order (equal to float rounding, not
      bit for bit; tested). None = whole batches. Not for models with state (BatchNorm's
      statistics would be a micro-batch's).
  """

  batch_size: int
  num_epochs: int = 1
  num_steps: int | None = None
  prox_mu: float = 0.0
  chunk_size: int | None = None
  memory_budget_bytes: int | None = None
  micro_batch: int | None = None


class LocalResult(NamedTuple):
  """Outputs for K client slots.

  Attributes:
    params: stacked `[K, ...]` local models (the global model for invalid slots).
    train_loss: `[K]` mean per-sample training loss over local training (0 for invalid slots).
    samples: `[K]` training samples processed.
    steps: `[K]` local steps taken.
    train_loss_sq: `[K]` mean squared per-sample training loss over local training (Oort's
      statistical utility reads it).
  """

  params: Params
  train_loss: jax.Array
  samples: jax.Array
  steps: jax.Array
  train_loss_sq: jax.Array | None = None


def steps_per_client(counts: jax.Array, hp: LocalHParams) -> jax.Array:
  """Local steps of clients holding `counts` examples (0 for empty clients)."""
  if hp.num_steps is not None:
    return jnp.where(counts > 0, hp.num_steps, 0).astype(jnp.int32)
  return (hp.num_epochs * (-(-counts // hp.batch_size))).astype(jnp.int32)


def samples_per_client(counts: jax.Array, hp: LocalHParams) -> jax.Array:
  """Training samples clients holding `counts` examples process (`LocalResult.samples`, known
  before they train): every example each epoch, or B per local step.

  Example:
    >>> samples_per_client(jnp.array([0, 5, 12]), LocalHParams(batch_size=4, num_epochs=2)).tolist()
    [0.0, 10.0, 24.0]
  """
  counts = jnp.asarray(counts)
  if hp.num_steps is not None:
    return jnp.where(counts > 0, hp.num_steps * hp.batch_size, 0).astype(jnp.float32)
  return (hp.num_epochs * counts).astype(jnp.float32)


def _epoch_orders(key: jax.Array, count: jax.Array, num_epochs: int, max_count: int) -> jax.Array:
  """`[E, max_count]`: per epoch, a uniform permutation of `range(count)` in the first `count`
  positions (positions past `count` hold padding indices, always masked)."""
  def one(e):
    u = jax.random.uniform(jax.random.fold_in(key, e), (max_count,))
    return jnp.argsort(jnp.where(jnp.arange(max_count) < count, u, 2.0))
  return jax.vmap(one)(jnp.arange(num_epochs))


def local_train(model: Model, optimizer: OptimizerFactory, hp: LocalHParams, global_params: Params,
                pool: ClientPool, clients: jax.Array, valid: jax.Array, keys: jax.Array,
                learning_rate: jax.Array, max_count: int, client_sharding=None,
                combine: jax.Array | None = None, prox_mu: jax.Array | None = None) -> LocalResult:
  """Trains the clients `clients [K]` (slots with `valid [K]` False are no-ops) from the global
  model.

  Args:
    model: the model bundle.
    optimizer: learning rate -> optax transformation (any optax optimizer).
    hp: static local hyperparameters.
    global_params: the round's global model w_t (unstacked).
    pool: the training pool (device arrays).
    clients: `[K]` int client ids.
    valid: `[K]` bool, which slots are real.
    keys: `[K]` per-client PRNG keys (derived from seed, round and client id).
    learning_rate: this round's client learning rate.
    max_count: static size of the largest client (`pool.max_count` on the host).
    client_sharding: optional `NamedSharding` of a leading clients axis, for several devices.
    combine: optional `[K]` weights; then the chunks are folded into `sum_k combine_k w^k` as they
      finish (a linear aggregate, e.g. FedAvg) and the K local models are never held at once.
    prox_mu: optional traced FedProx coefficient used instead of `hp.prox_mu`; given, the
      proximal term is on whatever its value (so runs with different mu, 0 included, share one
      compiled program).

  Returns:
    A `LocalResult` over the K slots, in the order given; with `combine`, its `params` is the
    weighted sum (unstacked) instead of the stacked local models.
  """
  multiple = client_sharding.mesh.size if client_sharding is not None else 1
  counts_all = jnp.where(valid, pool.counts[clients], 0)
  steps_all = steps_per_client(counts_all, hp)
  layout = size_sorted_chunks(steps_all, hp.chunk_size, multiple)
  size = layout.size
  tx = optimizer(learning_rate)
  total_rows = pool.x.shape[0]
  global_weights = trainable(model, global_params)
  mu = hp.prox_mu if prox_mu is None else prox_mu
  proximal = prox_mu is not None or bool(hp.prox_mu)

  def loss_fn(weights, params, xb, yb, mask, key):
    losses, new_params = train_losses(model, with_trainable(model, params, weights), xb, yb, mask,
                                      key)
    mean = jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    if proximal:  # FedAvg skips the term: its value and gradient are passes over every weight.
      mean += 0.5 * mu * sum(jnp.sum((p - g) ** 2) for p, g in
                                     zip(jax.tree.leaves(weights), jax.tree.leaves(global_weights)))
    return mean, (jnp.sum(losses * mask), jnp.sum(losses * losses * mask), new_params)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def micro_grads(weights, p, rows, mask, key):
    """(loss sum, squared-loss sum, gradient of the step's mean loss) over the step's real rows
    (a prefix of the batch), `hp.micro_batch` rows at a time: the micro-batches past the real rows
    are not computed."""
    b = hp.micro_batch
    real = jnp.sum(mask)

    def sums(w, m):
      r = jax.lax.dynamic_slice(rows, (m * b,), (b,))
      mk = jax.lax.dynamic_slice(mask, (m * b,), (b,))
      losses, _ = train_losses(model, with_trainable(model, p, w), pool.x[r], pool.y[r], mk,
                               jax.random.fold_in(key, m))
      return jnp.sum(losses * mk), jnp.sum(losses * losses * mk)

    def body(m, acc):
      g_sum, loss_sum, sq_sum = acc
      (loss, sq), g = jax.value_and_grad(sums, has_aux=True)(weights, m)
      return jax.tree.map(jnp.add, g_sum, g), loss_sum + loss, sq_sum + sq

    zeros = jax.tree.map(jnp.zeros_like, weights)
    count = (real.astype(jnp.int32) + b - 1) // b
    g_sum, loss_sum, sq_sum = jax.lax.fori_loop(0, count, body, (zeros, 0.0, 0.0))
    grads = jax.tree.map(lambda g: g / jnp.maximum(real, 1.0), g_sum)
    if proximal:
      grads = jax.tree.map(lambda g, w, w0: g + mu * (w - w0), grads, weights, global_weights)
    return loss_sum, sq_sum, grads

  def start_params():
    params = jax.tree.map(lambda g: jnp.broadcast_to(g, (size, *g.shape)), global_params)
    if client_sharding is not None:
      params = jax.lax.with_sharding_constraint(params, client_sharding)
    return params

  def run_chunk(chunk):
    """A chunk's training; a chunk of empty slots (FilFL's train-all round past its K clients)
    skips it all (no shuffles, no optimizer state): what its zero steps would return."""
    zeros = jnp.zeros((size,), jnp.float32)
    return jax.lax.cond(jnp.max(chunk[2]) > 0, lambda: train_chunk(chunk),
                        lambda: (start_params(), zeros, zeros, zeros))

  def train_chunk(chunk):
    cl, count, steps, key = chunk
    offset = pool.offsets[cl]
    spe = jnp.maximum(-(-count // hp.batch_size), 1)
    if hp.num_steps is None:
      orders = jax.vmap(lambda k, c: _epoch_orders(k, c, hp.num_epochs,
                                                   max(max_count, 1)))(key, count)
    else:
      orders = jnp.zeros((size, 1, 1), jnp.int32)
    params = start_params()
    opt_state = jax.vmap(tx.init)(trainable(model, params))

    def one_step(s, p, o, k, order, c, off, n_steps, per_epoch):
      active = s < n_steps
      pos = jnp.arange(hp.batch_size)
      if hp.num_steps is None:
        j = s % per_epoch
        idx = jnp.take(order[s // per_epoch], j * hp.batch_size + pos, mode="clip")
        rows = jnp.clip(off + idx, 0, total_rows - 1)
        mask = (j * hp.batch_size + pos < c) & active
      else:
        u = jax.random.uniform(jax.random.fold_in(k, s), (hp.batch_size,))
        rows = rows_with_replacement(u, off, c, total_rows)
        mask = jnp.broadcast_to(active & (c > 0), (hp.batch_size,))
      mask = mask.astype(jnp.float32)
      weights = trainable(model, p)
      step_key = jax.random.fold_in(jax.random.fold_in(k, DROPOUT), s)  # Dropout's, if any.
      if hp.micro_batch is None:
        (_, (loss_sum, sq_sum, stepped)), grads = grad_fn(weights, p, pool.x[rows],
                                                           pool.y[rows], mask, step_key)
      else:  # A stateless model (`checks.check_run`): its params are its weights.
        loss_sum, sq_sum, grads = micro_grads(weights, p, rows, mask, step_key)
        stepped = p
      updates, o_new = tx.update(grads, o, weights)
      p_new = with_trainable(model, stepped, optax.apply_updates(weights, updates))
      keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(active, a, b), new, old)
      return keep(p_new, p), keep(o_new, o), loss_sum, sq_sum, jnp.sum(mask)

    def body(s, carry):
      p, o, loss_acc, sq_acc, n_acc = carry
      p, o, loss_sum, sq_sum, n = jax.vmap(one_step, in_axes=(None, 0, 0, 0, 0, 0, 0, 0, 0))(
          s, p, o, key, orders, count, offset, steps, spe)
      return p, o, loss_acc + loss_sum, sq_acc + sq_sum, n_acc + n

    zeros = jnp.zeros((size,), jnp.float32)
    p, _, loss_acc, sq_acc, n_acc = jax.lax.fori_loop(0, jnp.max(steps), body,
                                                      (params, opt_state, zeros, zeros, zeros))
    return p, loss_acc / jnp.maximum(n_acc, 1.0), sq_acc / jnp.maximum(n_acc, 1.0), n_acc

  chunks = tuple(layout.arrange(a, 0) for a in (clients, counts_all, steps_all, keys))
  if combine is None:
    params, loss, loss_sq, samples = jax.lax.map(run_chunk, chunks)
    return LocalResult(jax.tree.map(layout.unarrange, params), layout.unarrange(loss),
                       layout.unarrange(samples), steps_all, layout.unarrange(loss_sq))

  def fold(acc, chunk_and_weights):
    chunk, w = chunk_and_weights
    p, loss, loss_sq, samples = run_chunk(chunk)
    return (jax.tree.map(lambda a, q: a + jnp.tensordot(w, q, axes=1), acc, p),
            (loss, loss_sq, samples))

  zeros = jax.tree.map(jnp.zeros_like, global_params)
  total, (loss, loss_sq, samples) = jax.lax.scan(fold, zeros,
                                                 (chunks, layout.arrange(combine, 0.0)))
  return LocalResult(total, layout.unarrange(loss), layout.unarrange(samples), steps_all,
                     layout.unarrange(loss_sq))


# CPU defaults, from chunk sweeps at K = 100 on a 2-core x86_64 machine (docs/performance.md):
# XLA:CPU runs a vmapped chunk's per-client GEMMs as batched dots, which beat plain ones only when
# each client's step does real work; a few clients per chunk also keep the working set in cache.
# Logistic regression (1 MFLOP per client step): a bare loop of 200 client steps took 7.8 ms at 1
# client per chunk against 11.5-12.8 ms at 2-16 (full-round sweeps are noise-level on this model:
# chunk 1 was 1.4x chunk 4 in two runs and 0.85x in the published one); the MLP (29 MFLOP), CIFAR
# and LEAF CNNs (3.3 GFLOP) were fastest at 2-4 (MLP 2.4-2.6x chunk 100).
CPU_CHUNK_SIZE = 4
CPU_TINY_STEP_FLOPS = 1e7


class StepCost(NamedTuple):
  """What one more vmapped client costs in a local training step, from XLA's compiled analyses.

  Attributes:
    bytes: memory (parameters, optimizer state, gradients, activations).
    flops: floating-point operations of one client's step.
  """

  bytes: int
  flops: float


def default_memory_budget() -> int:
  """1 GiB on CPU, a quarter of the first device's memory on accelerators (wide vmaps keep them
  busy)."""
  device = jax.devices()[0]
  if device.platform == "cpu":
    return 2**30
  stats = device.memory_stats() or {}
  return int(stats.get("bytes_limit", 16 * 2**30)) // 4


def step_cost(model: Model, optimizer: OptimizerFactory, hp: LocalHParams, params: Params,
              feature_shape: tuple[int, ...], bytes_from_flops: float = 0.0) -> StepCost:
  """Memory one more vmapped client costs (the step compiled for 2 clients minus for 1) and the
  FLOPs of one client's step (XLA's count on the lowered step: nothing compiles for it). With
  `bytes_from_flops`, a step of fewer FLOPs is not compiled to measure its memory (bytes 0): on
  CPU, where such a tiny step runs one client per chunk anyway (`auto_chunk_size`)."""
  tx = optimizer(np.float32(0.1))  # A host number: building the optimizer compiles nothing.

  def client_step(p, o, x, y):
    mask = jnp.ones(y.shape, jnp.float32)
    loss = lambda w: jnp.mean(train_losses(model, with_trainable(model, p, w), x, y, mask,
                                           jax.random.PRNGKey(0))[0])
    w = trainable(model, p)
    u, o = tx.update(jax.grad(loss)(w), o, w)
    return with_trainable(model, p, optax.apply_updates(w, u)), o

  def lowered(c):
    spec = lambda a: jax.ShapeDtypeStruct((c, *a.shape), a.dtype)
    ps = jax.tree.map(spec, params)
    os_ = jax.tree.map(spec, jax.eval_shape(tx.init, trainable(model, params)))
    x = jax.ShapeDtypeStruct((c, hp.batch_size, *feature_shape), jnp.float32)
    y = jax.ShapeDtypeStruct((c, hp.batch_size), jnp.int32)
    return jax.jit(jax.vmap(client_step)).lower(ps, os_, x, y)

  one = lowered(1)
  step_flops = flops(one)
  if step_flops < bytes_from_flops:
    return StepCost(0, step_flops)
  return StepCost(max(planned_bytes(lowered(2).compile()) - planned_bytes(one.compile()), 1),
                  step_flops)


def auto_chunk_size(cost: StepCost, budget_bytes: int, num_slots: int,
                    platform: str | None = None) -> int:
  """Clients per vmapped chunk. The cap: the largest chunk that fits `budget_bytes` (at least 1, at
  most `num_slots`); on CPU (`platform`, default the first device's) at most `CPU_CHUNK_SIZE`, and
  1 when a client's step is below `CPU_TINY_STEP_FLOPS`. Under the cap: on CPU, where a chunk's
  time grows with its size, the size that pads `num_slots` least (padded slots compute like real
  ones), the largest on ties; on accelerators, the fewest chunks, evened out.

  Examples:
    >>> auto_chunk_size(StepCost(bytes=2**20, flops=3e7), 2**30, 100, platform="gpu")
    100
    >>> auto_chunk_size(StepCost(bytes=2**20, flops=3e7), 2**30, 100, platform="cpu")
    4
    >>> auto_chunk_size(StepCost(bytes=2**20, flops=3e7), 2**30, 10,
    ...                 platform="cpu")  # Not 4: 12 slots.
    2
  """
  cap = int(max(1, min(num_slots, budget_bytes // max(cost.bytes, 1))))
  if (platform or jax.devices()[0].platform) != "cpu":
    return -(-num_slots // -(-num_slots // cap))
  cap = min(cap, 1 if cost.flops < CPU_TINY_STEP_FLOPS else CPU_CHUNK_SIZE)
  return min(range(1, cap + 1), key=lambda c: (-(-num_slots // c) * c, -c))
