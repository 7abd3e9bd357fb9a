"""Server optimizers against the papers' formulas written out in numpy, and in the round."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjax_sel as fs
from fedjax_sel.host import checkpoint
from fedjax_sel.parts import server_optimizers as so
from fedjax_sel.parts.aggregators import coordinate_median
from tests.conftest import ragged_dataset


def reddi_algorithm2(method, w0, aggregates, lr, beta1, beta2, tau):
  """Reddi et al. 2021, Algorithm 2, line by line: Delta_t = aggregate - x_t; m_t = beta1 m +
  (1 - beta1) Delta_t; v_t by the method; x_{t+1} = x_t + lr m_t / (sqrt(v_t) + tau); m_{-1} = 0,
  v_{-1} = tau^2."""
  x, m, v = np.array(w0, np.float64), np.zeros_like(w0, np.float64), np.full_like(w0, tau ** 2,
                                                                                   np.float64)
  for agg in aggregates:
    delta = np.asarray(agg, np.float64) - x
    m = beta1 * m + (1 - beta1) * delta
    if method == "adagrad":
      v = v + delta ** 2
    elif method == "yogi":
      v = v - (1 - beta2) * delta ** 2 * np.sign(v - delta ** 2)
    else:
      v = beta2 * v + (1 - beta2) * delta ** 2
    x = x + lr * m / (np.sqrt(v) + tau)
  return x


def run_transform(opt, w0, aggregates):
  """The optax transform stepped as the round steps it (pseudo-gradient w_t - aggregate)."""
  w = jnp.asarray(w0, jnp.float32)
  state = opt.transform.init(w)
  for agg in aggregates:
    updates, state = opt.transform.update(w - jnp.asarray(agg, jnp.float32), state, w)
    w = w + updates
  return np.asarray(w)


W0 = np.array([0.5, -1.0, 2.0, 0.0])
# Round 2's aggregate is closer to w_1 in some coordinates than Delta_1 was: Yogi's sign flips.
AGGREGATES = [np.array([0.7, -1.5, 2.0, 0.3]), np.array([0.6, -1.2, 1.9, 0.31])]


@pytest.mark.parametrize("method,factory", [("adam", so.fedadam), ("yogi", so.fedyogi),
                                            ("adagrad", so.fedadagrad)])
def test_adaptive_server_optimizers_equal_algorithm2_over_two_rounds(method, factory):
  kw = dict(lr=0.05, beta1=0.9, tau=0.01)
  if method != "adagrad":
    kw["beta2"] = 0.99
  want = reddi_algorithm2(method, W0, AGGREGATES, 0.05, 0.9, 0.99, 0.01)
  np.testing.assert_allclose(run_transform(factory(**kw), W0, AGGREGATES), want, rtol=1e-5,
                             atol=1e-6)


def test_fedavgm_is_hsu_et_al_heavy_ball():
  """v_t = beta v_{t-1} + (w_t - aggregate_t); w_{t+1} = w_t - lr v_t (Hsu et al. 2019)."""
  w, v = W0.copy(), np.zeros_like(W0)
  for agg in AGGREGATES:
    v = 0.9 * v + (w - agg)
    w = w - 0.7 * v
  np.testing.assert_allclose(run_transform(so.fedavgm(0.7, 0.9), W0, AGGREGATES), w, rtol=1e-6)


def _sim(**kw):
  data = ragged_dataset([20, 12, 9, 15, 30, 11])
  model = fs.build_model("mlp", data.feature_shape, data.num_classes, hidden=(8,))
  return fs.Simulator(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=4),
                      fs.uniform_availability(6, 4), fs.random_selector(),
                      kw.pop("aggregator", fs.fedavg()), 3, 0, lr_schedule=fs.constant_lr(0.1),
                      **kw)


@pytest.mark.parametrize("aggregator", [fs.fedavg(), coordinate_median()], ids=["fedavg", "median"])
def test_server_sgd_with_lr_1_is_the_round_without_a_server_optimizer(aggregator):
  plain, with_sgd = _sim(aggregator=aggregator), _sim(aggregator=aggregator,
                                                      server_optimizer=so.server_sgd(1.0))
  a, b = plain.init(), with_sgd.init()
  for _ in range(3):
    (a, ma), (b, mb) = plain.step(a), with_sgd.step(b)
    assert np.asarray(ma["selected"]).tolist() == np.asarray(mb["selected"]).tolist()
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), a.params,
               b.params)


def test_fedadam_in_the_round_steps_from_the_aggregate_as_algorithm2():
  """Two rounds of the engine with FedAdam over a robust aggregate: each round's new global model
  is Algorithm 2's step from the plain round's aggregate at the same global model."""
  opt = so.fedadam(lr=0.05, tau=0.01)
  sim, plain = _sim(server_optimizer=opt, aggregator=coordinate_median()), _sim(
      aggregator=coordinate_median())
  state = sim.init()
  flat = lambda tree: np.concatenate([np.ravel(a) for a in jax.tree.leaves(tree)])
  w0 = flat(state.params)
  aggregates = []
  for _ in range(2):
    # The aggregate the round forms at this global model (the plain round, same seed and round).
    agg, _ = plain.step(state._replace(server_state=()))
    aggregates.append(flat(agg.params))
    state, _ = sim.step(state)
    want = reddi_algorithm2("adam", w0, aggregates, 0.05, 0.9, 0.99, 0.01)
    np.testing.assert_allclose(flat(state.params), want, rtol=1e-4, atol=1e-6)


def test_server_state_is_checkpointed_and_fingerprinted(tmp_path):
  full = fs.run(_sim(server_optimizer=so.fedyogi()), 4, str(tmp_path / "full"), progress=None)
  fs.run(_sim(server_optimizer=so.fedyogi()), 2, str(tmp_path / "cut"), checkpoint_every=2,
         progress=None)
  resumed = fs.run(_sim(server_optimizer=so.fedyogi()), 4, str(tmp_path / "cut"), resume=True,
                   progress=None)
  strip = lambda recs: [{k: v for k, v in r.items() if k != "wall_s"} for r in recs]
  assert strip(resumed) == strip(full)
  with pytest.raises(checkpoint.CheckpointError, match="server_optimizer"):
    fs.run(_sim(server_optimizer=so.fedadam()), 4, str(tmp_path / "cut"), resume=True,
           progress=None)


@pytest.mark.parametrize("call,needle", [
    (lambda: so.fedadam(lr=float("nan")), "lr must be > 0, got nan"),
    (lambda: so.fedyogi(tau=0.0), r"tau must be in \(0, 1\], got 0.0"),
    (lambda: so.fedavgm(momentum=1.5), r"momentum must be in \[0, 1\], got 1.5"),
    (lambda: so.make_server_optimizer("lamb"), "server_opt must be one of"),
    (lambda: _sim(server_optimizer=optax.adam(0.1)), "ServerOptimizer"),
])
def test_bad_server_settings_are_refused_naming_them(call, needle):
  with pytest.raises((ValueError, TypeError), match=needle):
    call()
