"""One framework's FedAvg round, timed on request: the worker process behind `benchmarks.peers`.

Run as a script by `benchmarks.peers`, one process per framework and thread setting, so that each
framework keeps its own runtime (thread pools, allocator, compiled programs) warm while the parent
interleaves repetitions. It imports neither JAX nor absl at module level: the peers run in their
own virtual environment (pfl-research pins absl-py 1.x, which this project's absl-py 2 excludes).

Protocol: the worker builds the workload, runs `--warmup` rounds, prints `ready`, then for each
line `run` on stdin runs one round and prints its wall seconds; `profile` (ours only) prints a JSON
line of where a round's time goes; `quit` (or end of input) exits.

  python benchmarks/peer_worker.py --framework=torch_loop --threads=2 --model=leaf_cnn --clients=10

Frameworks:
  ours:        fedjax_sel's round (vmapped local training, FedAvg folded in chunk by chunk, the
               chunk size picked as the `Simulator` picks it), one jitted call per round.
  torch_loop:  a PyTorch loop over clients, one SGD step per batch, FedAvg of the state dicts
               (what Flower / FedML users write).
  pfl:         pfl-research's `FederatedAveraging` with its `PyTorchModel` and `SimulatedBackend`.

Every framework trains the same arrays (seeded by `--seed`), E = 1 epoch, batch B, learning rate
0.05, plain SGD, all K clients every round.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

# (input shape NHWC, classes, what the models are)
SHAPES = {"logreg": ((28, 28, 1), 10), "mlp": ((28, 28, 1), 10), "leaf_cnn": ((28, 28, 1), 62),
          "cifar_cnn": ((32, 32, 3), 10), "resnet18": ((32, 32, 3), 10),
          "simple_cnn": ((32, 32, 3), 10)}  # pfl-research's benchmark CNN, dropout off.
FRAMEWORKS = ("ours", "torch_loop", "pfl")
LR = 0.05


def make_data(shape: tuple[int, ...], classes: int, clients: int, samples: int, seed: int):
  """`x [K*S, *shape]` float32 in [0, 1) and `y [K*S]` int labels, client k owning rows k*S..."""
  rng = np.random.default_rng(seed)
  x = rng.random((clients * samples, *shape), dtype=np.float32)
  y = rng.integers(0, classes, clients * samples).astype(np.int32)
  return x, y


def torch_net(model: str, width: int):
  """The PyTorch twin of `fedjax_sel.models.build_model(model, ...)` (same layers and sizes)."""
  import torch  # pylint: disable=import-outside-toplevel
  nn = torch.nn
  (h, w, c), classes = SHAPES[model]
  if model == "logreg":
    return nn.Sequential(nn.Flatten(), nn.Linear(h * w * c, classes))
  if model == "mlp":
    return nn.Sequential(nn.Flatten(), nn.Linear(h * w * c, 200), nn.ReLU(), nn.Linear(200, 200),
                         nn.ReLU(), nn.Linear(200, classes))
  if model == "simple_cnn":
    return nn.Sequential(nn.Conv2d(c, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * ((h - 4) // 2) ** 2, 128),
                         nn.ReLU(), nn.Linear(128, classes))
  if model in ("leaf_cnn", "cifar_cnn"):
    head = ([nn.Linear(64 * (h // 4) * (w // 4), 2048), nn.ReLU(), nn.Linear(2048, classes)]
            if model == "leaf_cnn" else
            [nn.Linear(64 * (h // 4) * (w // 4), 512), nn.ReLU(), nn.Linear(512, 128), nn.ReLU(),
             nn.Linear(128, classes)])
    return nn.Sequential(nn.Conv2d(c, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         *head)
  norm = lambda f: nn.GroupNorm(min(32, f // 2), f)

  class Block(nn.Module):
    def __init__(self, cin, f, stride):
      super().__init__()
      self.a = nn.Sequential(nn.Conv2d(cin, f, 3, stride, 1, bias=False), norm(f), nn.ReLU(),
                             nn.Conv2d(f, f, 3, 1, 1, bias=False), norm(f))
      self.skip = (nn.Sequential(nn.Conv2d(cin, f, 1, stride, bias=False), norm(f))
                   if stride != 1 or cin != f else nn.Identity())

    def forward(self, x):
      return torch.relu(self.a(x) + self.skip(x))

  layers, cin = [nn.Conv2d(c, width, 3, 1, 1, bias=False), norm(width), nn.ReLU()], width
  for stage, mult in enumerate((1, 2, 4, 8)):
    for block in range(2):
      layers.append(Block(cin, width * mult, 2 if stage > 0 and block == 0 else 1))
      cin = width * mult
  return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


def torch_fedavg(net, x, y, clients: int, samples: int, batch_size: int):
  """A runner for FedAvg rounds as a PyTorch loop over clients: `x [K*S, C, H, W]`, `y [K*S]`
  int64 tensors, client k owning rows k*S...; each call trains every client from the global state
  (one SGD step per batch) and makes their mean the new global state."""
  import torch  # pylint: disable=import-outside-toplevel
  global_state = {k: v.clone() for k, v in net.state_dict().items()}
  loss_fn = torch.nn.CrossEntropyLoss()
  s, b = samples, batch_size

  def run():
    acc = {k: torch.zeros_like(v) for k, v in global_state.items()}
    for c in range(clients):
      net.load_state_dict(global_state)
      opt = torch.optim.SGD(net.parameters(), lr=LR)
      for i in range(0, s, b):
        opt.zero_grad()
        loss_fn(net(x[c * s + i:c * s + i + b]), y[c * s + i:c * s + i + b]).backward()
        opt.step()
      for k, v in net.state_dict().items():
        acc[k] += v / clients
    global_state.update(acc)
  return run


def torch_loop_round(args):
  """A runner for one FedAvg round as a PyTorch loop over clients."""
  import torch  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(args.threads)
  x, y = make_data(*SHAPES[args.model], args.clients, args.samples, args.seed)
  return torch_fedavg(torch_net(args.model, args.width),
                      torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))),
                      torch.from_numpy(y.astype(np.int64)), args.clients, args.samples,
                      args.batch_size)


def pfl_round(args):
  """A runner for one round of pfl-research's FedAvg (its simulated backend, PyTorch model)."""
  # pylint: disable=import-outside-toplevel
  import torch
  from pfl.aggregate.simulate import SimulatedBackend
  from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
  from pfl.data.federated_dataset import FederatedDataset
  from pfl.data.sampling import get_user_sampler
  from pfl.hyperparam import NNTrainHyperParams
  from pfl.metrics import Weighted
  from pfl.model.pytorch import PyTorchModel
  torch.set_num_threads(args.threads)

  class Net(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.net = torch_net(args.model, args.width)

    def forward(self, x):
      return self.net(x)

    def loss(self, x, y, eval=False):  # pylint: disable=redefined-builtin
      self.train(not eval)
      return torch.nn.functional.cross_entropy(self(x), y)

    def metrics(self, x, y, eval=False):  # pylint: disable=redefined-builtin
      with torch.no_grad():
        return {"loss": Weighted(float(self.loss(x, y, eval)) * len(y), len(y))}

  x, y = make_data(*SHAPES[args.model], args.clients, args.samples, args.seed)
  x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
  s = args.samples
  users = {u: [torch.from_numpy(x[u * s:(u + 1) * s]),
               torch.from_numpy(y[u * s:(u + 1) * s].astype(np.int64))]
           for u in range(args.clients)}
  data = lambda: FederatedDataset.from_slices(
      users, get_user_sampler("minimize_reuse", list(range(args.clients))))
  net = Net()
  model = PyTorchModel(net, local_optimizer_create=torch.optim.SGD,
                       central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
  backend = SimulatedBackend(training_data=data(), val_data=data())
  algorithm = FederatedAveraging()
  train = NNTrainHyperParams(local_num_epochs=1, local_learning_rate=LR,
                             local_batch_size=args.batch_size)
  rounds = [0]

  def run():  # One more central iteration (pfl counts them across `run` calls) on its model.
    rounds[0] += 1
    params = NNAlgorithmParams(central_num_iterations=rounds[0], evaluation_frequency=10**9,
                               train_cohort_size=args.clients, val_cohort_size=0)
    algorithm.run(algorithm_params=params, backend=backend, model=model,
                  model_train_params=train, send_metrics_to_platform=False)
  return run


def our_model(name: str, width: int, conv_impl: str = "auto", written: str = "library"):
  """Our model `name`. `written="library"`: the library's, or for `simple_cnn` pfl-research's
  model as the model guide's `models.PatchConv` recipe writes it; `"flax"`: the network as a flax
  user writes it, with `nn.Conv` and `nn.max_pool` (`benchmarks/user_cnns.py`; the CNNs only).
  Evaluation mode, so no dropout."""
  # pylint: disable=import-outside-toplevel
  import functools

  import flax.linen as nn

  import fedjax_sel as fs
  from benchmarks.user_cnns import SimpleCNN, UserCifarCNN, flax_pool
  shape, classes = SHAPES[name]
  if written == "flax":
    modules = {"simple_cnn": lambda: SimpleCNN(classes, nn.Conv, flax_pool),
               "cifar_cnn": lambda: UserCifarCNN(classes, nn.Conv, flax_pool),
               "leaf_cnn": lambda: UserCifarCNN(classes, nn.Conv, flax_pool, hidden=(2048,))}
    if name not in modules:
      raise ValueError(f"--written=flax takes the models {sorted(modules)}, got {name!r}")
    return fs.models.from_flax(modules[name](), shape, classes, f"{name}_flax",
                               conv_impl=conv_impl)
  if name != "simple_cnn":
    return fs.build_model(name, shape, classes, width=width, conv_impl=conv_impl)
  conv = functools.partial(fs.models.PatchConv, impl=conv_impl)
  return fs.models.from_flax(SimpleCNN(classes, conv), shape, classes, "simple_cnn")


def ours_round(args):
  """A runner for one round of fedjax_sel's vectorized FedAvg (`jax.block_until_ready`-ed)."""
  # pylint: disable=import-outside-toplevel
  import jax
  import jax.numpy as jnp
  import optax

  import fedjax_sel as fs
  from benchmarks.round_throughput import make_pool
  from fedjax_sel.client.local_training import auto_chunk_size, default_memory_budget, step_cost
  from fedjax_sel.data.federated import device_pool
  fs.use_persistent_cache()  # As the launchers: a later worker loads the compiled round.
  shape, classes = SHAPES[args.model]
  k = args.clients
  pool = make_pool(k, args.samples, shape, classes, args.seed)
  model = our_model(args.model, args.width, written=args.written)
  params = model.init(jax.random.PRNGKey(args.seed))
  sgd = lambda lr: optax.sgd(lr)
  cost = step_cost(model, sgd, fs.LocalHParams(args.batch_size), params, shape)
  # XLA counts no FLOPs in oneDNN's custom calls: count the step's FLOPs on the patches lowering
  # (the same products), lowered only.
  patches = our_model(args.model, args.width, conv_impl="patches", written=args.written)
  step_flops = step_cost(patches, sgd, fs.LocalHParams(args.batch_size), params, shape,
                         bytes_from_flops=float("inf")).flops
  hp = fs.LocalHParams(batch_size=args.batch_size, num_epochs=1,
                       chunk_size=auto_chunk_size(cost, default_memory_budget(), k))
  clients = jnp.arange(k, dtype=jnp.int32)
  keys = fs.keys.client_keys(jax.random.PRNGKey(args.seed), clients)
  weights = fs.fedavg("examples").linear_weights(jnp.ones(k, bool), jnp.asarray(pool.counts))
  data = device_pool(pool)

  @jax.jit
  def one_round(p):
    return fs.local_train(model, sgd, hp, p, data, clients, jnp.ones(k, bool), keys,
                          jnp.float32(LR), pool.max_count, combine=weights).params
  state = [params]

  def run():
    state[0] = jax.block_until_ready(one_round(state[0]))

  def profile():
    """Seconds per round in GEMM and convolution kernels (XLA's dots and library fusions,
    oneDNN's custom calls) and in everything else (patch copies, pooling, elementwise updates),
    from a profiler trace of 2 rounds, and the round's FLOPs (XLA's count of a client step on the
    patches lowering, times K steps)."""
    import collections
    import glob
    import gzip
    import json
    import tempfile  # pylint: disable=import-outside-toplevel
    folder = tempfile.mkdtemp()
    with jax.profiler.trace(folder, create_perfetto_trace=True):
      run()
      run()
    trace = json.load(gzip.open(glob.glob(f"{folder}/**/*.trace.json.gz", recursive=True)[0]))
    kinds = collections.Counter()
    for e in trace["traceEvents"]:
      name = e.get("name", "")
      if e.get("ph") != "X" or name.startswith(("$", "Thunk", "Pjit", "Slinky", "while")):
        continue
      gemm = name.startswith(("dot", "ynn_fusion", "xnn_fusion", "onednn", "convolution",
                              "custom-call", "ffi_call"))
      kinds["gemm_s" if gemm else "other_s"] += e.get("dur", 0) / 2e6
    steps = -(-args.samples // args.batch_size)
    return {**kinds, "flops": step_flops * k * steps,
            "conv_impl": fs.models.resolve_conv_impl("auto")}
  run.profile = profile
  return run


RUNNERS = {"ours": ours_round, "torch_loop": torch_loop_round, "pfl": pfl_round}


def parse(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--framework", choices=FRAMEWORKS, required=True)
  p.add_argument("--model", choices=tuple(SHAPES), required=True)
  p.add_argument("--clients", type=int, required=True, help="K, clients per round.")
  p.add_argument("--threads", type=int, default=1, help="torch threads (torch_loop, pfl).")
  p.add_argument("--samples", type=int, default=64, help="S, samples per client.")
  p.add_argument("--batch_size", type=int, default=32, help="B.")
  p.add_argument("--width", type=int, default=16, help="ResNet18's first-stage channels.")
  p.add_argument("--warmup", type=int, default=2, help="Untimed rounds before `ready`.")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--written", choices=("library", "flax"), default="library",
                 help="ours: the library's model, or the CNN as a flax user writes it (nn.Conv).")
  return p.parse_args(argv)


def main(argv=None):
  args = parse(argv)
  protocol, sys.stdout = sys.stdout, sys.stderr  # The frameworks' own prints go to stderr.
  run = RUNNERS[args.framework](args)
  for _ in range(args.warmup):
    run()
  print("ready", file=protocol, flush=True)
  for line in sys.stdin:
    if line.strip() == "profile" and hasattr(run, "profile"):
      print(json.dumps(run.profile()), file=protocol, flush=True)
      continue
    if line.strip() != "run":
      break
    start = time.perf_counter()
    run()
    print(f"{time.perf_counter() - start:.6f}", file=protocol, flush=True)


if __name__ == "__main__":
  main()
