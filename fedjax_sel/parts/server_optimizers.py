"""Server optimizers: the round's aggregate as a pseudo-gradient for an optax transform
(docs/papers/beyond.md).

After the aggregator combines the clients' models into `w_agg`, a server optimizer treats
`g_t = w_t - w_agg` (the negative of the mean update Delta_t) as a gradient and steps the global
model: `w_{t+1} = w_t + update(g_t)`. Without one, `w_{t+1} = w_agg` exactly (today's FedAvg); SGD
with server learning rate 1 gives the same up to float rounding. Any aggregator composes with any
server optimizer, the robust ones included (the pseudo-gradient is then the global model minus the
robust aggregate).

Factories:
  - `server_sgd(lr)`: w - lr g.
  - `fedavgm(lr, momentum)`: Hsu et al. 2019's server momentum, v = momentum v + g, w - lr v.
  - `fedadam`, `fedyogi`, `fedadagrad`: Reddi et al., "Adaptive Federated Optimization" (ICLR
    2021), Algorithm 2 as written: m = beta1 m + (1 - beta1) Delta; v by the method's rule on
    Delta^2; w + lr m / (sqrt(v) + tau); no bias correction; m starts at 0 and v at tau^2. optax's
    own adam, yogi and adagrad differ in these details (bias correction, epsilon inside or outside
    the root, initial accumulators), so the three are written here.

Defaults: beta1 0.9 and beta2 0.99 (the paper's), tau 1e-3 (the paper's grid is 1e-5..1e-1; it
tunes tau with the learning rate per task), server lr 1.0 for SGD and momentum (FedAvg's step) and
0.01 for the adaptive ones (the middle of the paper's best values, 10^-2.5..10^-1.5; tune it).

Only the trainable weights are stepped; a model's other state (BatchNorm's running statistics) is
taken from the aggregate.

Examples:
  >>> import jax.numpy as jnp
  >>> opt = fedadam(lr=0.1, tau=0.01)
  >>> w, agg = jnp.array([1.0, 2.0]), jnp.array([0.5, 2.5])
  >>> state = opt.transform.init(w)
  >>> updates, state = opt.transform.update(w - agg, state, w)
  >>> [round(float(a), 3) for a in w + updates]  # m = 0.1 Delta, v = 0.99 tau^2 + 0.01 Delta^2.
  [0.918, 2.082]
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_sel import registry

SERVER_OPTIMIZERS = ("sgd", "momentum", "adam", "yogi", "adagrad")
DEFAULT_LR = {"sgd": 1.0, "momentum": 1.0, "adam": 0.01, "yogi": 0.01, "adagrad": 0.01}


class ServerOptimizer(NamedTuple):
  """An optax transform of the pseudo-gradient `w_t - w_agg`, and its name and settings (`spec`,
  which a resumed run's fingerprint compares)."""

  transform: optax.GradientTransformation
  spec: dict
  recipe: Any = None  # How the registry built it (`registry.Recipe`): a batch sweeps its settings.


class AdaptiveState(NamedTuple):
  """First and second moment estimates m, v (pytrees like the weights)."""

  m: optax.Updates
  v: optax.Updates


def server_sgd(lr: float = 1.0) -> ServerOptimizer:
  """w_{t+1} = w_t - lr (w_t - w_agg): with lr 1, the aggregate itself."""
  registry.check_values(ServerSGDSettings(lr=lr))
  return ServerOptimizer(optax.sgd(lr), {"name": "sgd", "lr": registry.plain(lr)})


def fedavgm(lr: float = 1.0, momentum: float = 0.9) -> ServerOptimizer:
  """FedAvgM (Hsu et al. 2019): v = momentum v + g, w_{t+1} = w_t - lr v (optax's heavy ball)."""
  registry.check_values(FedAvgMSettings(lr=lr, momentum=momentum))
  return ServerOptimizer(optax.sgd(lr, momentum=momentum),
                         {"name": "momentum", "lr": registry.plain(lr),
                          "momentum": registry.plain(momentum)})


def _adaptive(name: str, second_moment, lr: float, beta1: float, beta2: float,
              tau: float) -> ServerOptimizer:
  """Reddi et al.'s Algorithm 2 with `second_moment(v, delta_sq) -> v`."""
  registry.check_values(FedAdamSettings(lr=lr, beta1=beta1, beta2=beta2, tau=tau))

  def init(params):
    return AdaptiveState(jax.tree.map(jnp.zeros_like, params),
                         jax.tree.map(lambda p: jnp.full_like(p, tau * tau), params))

  def update(pseudo_grad, state, params=None):
    del params
    delta = jax.tree.map(jnp.negative, pseudo_grad)  # The mean client update Delta_t.
    m = jax.tree.map(lambda m_, d: beta1 * m_ + (1.0 - beta1) * d, state.m, delta)
    v = jax.tree.map(lambda v_, d: second_moment(v_, d * d), state.v, delta)
    updates = jax.tree.map(lambda m_, v_: lr * m_ / (jnp.sqrt(v_) + tau), m, v)
    return updates, AdaptiveState(m, v)

  spec = {"name": name, **{k: registry.plain(v) for k, v in
                           (("lr", lr), ("beta1", beta1), ("beta2", beta2), ("tau", tau))}}
  return ServerOptimizer(optax.GradientTransformation(init, update), spec)


def fedadam(lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99,
            tau: float = 1e-3) -> ServerOptimizer:
  """FedAdam: v = beta2 v + (1 - beta2) Delta^2."""
  return _adaptive("adam", lambda v, d2: beta2 * v + (1.0 - beta2) * d2, lr, beta1, beta2, tau)


def fedyogi(lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99,
            tau: float = 1e-3) -> ServerOptimizer:
  """FedYogi: v = v - (1 - beta2) Delta^2 sign(v - Delta^2)."""
  return _adaptive("yogi", lambda v, d2: v - (1.0 - beta2) * d2 * jnp.sign(v - d2), lr, beta1,
                   beta2, tau)


def fedadagrad(lr: float = 0.01, beta1: float = 0.9, tau: float = 1e-3) -> ServerOptimizer:
  """FedAdagrad: v = v + Delta^2 (beta2 is not used; the spec records the paper's 0.99)."""
  return _adaptive("adagrad", lambda v, d2: v + d2, lr, beta1, 0.99, tau)


def make_server_optimizer(name: str, lr: float | None = None, *, momentum: float = 0.9,
                          beta1: float = 0.9, beta2: float = 0.99,
                          tau: float = 1e-3) -> ServerOptimizer:
  """One of `SERVER_OPTIMIZERS` by name (`lr` None: its `DEFAULT_LR`)."""
  if name not in SERVER_OPTIMIZERS:
    raise ValueError(f"server_opt must be one of {SERVER_OPTIMIZERS}, got {name!r}")
  lr = DEFAULT_LR[name] if lr is None else lr
  if name == "sgd":
    return server_sgd(lr)
  if name == "momentum":
    return fedavgm(lr, momentum)
  if name == "adagrad":
    return fedadagrad(lr, beta1, tau)
  return (fedadam if name == "adam" else fedyogi)(lr, beta1, beta2, tau)


# --- Registered names (fedjax_sel.registry) ------------------------------------------------------

_LR_HELP = ("Server learning rate (eta); default 1.0 for sgd and momentum, 0.01 for adam, yogi and "
            "adagrad (tune it per task).")


@dataclasses.dataclass(frozen=True)
class ServerSGDSettings:
  """Server SGD's step size."""

  lr: float | None = registry.setting(None, _LR_HELP, flag="server_lr", within="> 0",
                                      sweep="value")

  def build(self, name: str) -> ServerOptimizer:
    return make_server_optimizer(name, self.lr, **{
        f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "lr"})


@dataclasses.dataclass(frozen=True)
class FedAvgMSettings(ServerSGDSettings):
  """FedAvgM's step size and momentum."""

  momentum: float = registry.setting(0.9, "Server momentum (beta): v = beta v + g.",
                                     flag="server_momentum", within="[0, 1]")


@dataclasses.dataclass(frozen=True)
class FedAdagradSettings(ServerSGDSettings):
  """FedAdagrad's step size, first-moment decay and adaptivity."""

  beta1: float = registry.setting(0.9, "First-moment decay (beta_1): m = beta_1 m + (1 - beta_1) "
                                  "Delta.", flag="server_beta1", within="[0, 1]")
  tau: float = registry.setting(1e-3, "Adaptivity (tau): the step is lr m / (sqrt(v) + tau), v "
                                "starts at tau^2.", flag="server_tau", within="(0, 1]")


@dataclasses.dataclass(frozen=True)
class FedAdamSettings(FedAdagradSettings):
  """FedAdam's and FedYogi's settings: FedAdagrad's and the second-moment decay."""

  beta2: float = registry.setting(0.99, "Second-moment decay (beta_2) of FedAdam's and FedYogi's "
                                  "v.", flag="server_beta2", within="[0, 1]")


def _register(name: str, settings: type, doc: str, label: str) -> None:
  def factory(s, context: registry.BuildContext) -> ServerOptimizer:
    del context
    return s.build(name)
  factory.__qualname__ = f"server_optimizer_{name}"
  registry.register("server_optimizer", name, settings, doc, label=label)(factory)


_register("sgd", ServerSGDSettings, "Server SGD on the pseudo-gradient.", "server SGD")
_register("momentum", FedAvgMSettings, "FedAvgM: server SGD with momentum (Hsu et al. 2019).",
          "FedAvgM")
_register("adam", FedAdamSettings, "FedAdam (Reddi et al. 2021, Algorithm 2).", "FedAdam")
_register("yogi", FedAdamSettings, "FedYogi (Reddi et al. 2021, Algorithm 2).", "FedYogi")
_register("adagrad", FedAdagradSettings, "FedAdagrad (Reddi et al. 2021, Algorithm 2).",
          "FedAdagrad")
