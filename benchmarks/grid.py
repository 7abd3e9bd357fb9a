r"""Time to a researcher's grid: 16 runs (4 client learning rates x 4 seeds), 50 rounds each,
FedAvg of the MLP on the digits, K = 10 of 100 clients a round, each contender in a fresh process,
whole-process wall time from its start to the 16 final test accuracies.

  python -m benchmarks.grid            # the table in docs/performance.md (a few minutes)
  python -m benchmarks.grid --quick    # smoke run (2 x 2 runs, 3 rounds)

Contenders, all on the digits (`DatasetSpec("digits", num_clients=100)`: the launcher's default
Dirichlet(0.5) split, 80/20 train / test per client; seed 0's split for every run, except the
launcher, which splits per seed as it always does), B = 16, one local epoch, plain SGD,
examples-weighted FedAvg, the round's clients drawn uniformly:
- `run CLI`: `python -m experiments.run --sweep=lr:... --seeds=...` (its 16 runs in one compiled
  program, advanced as two batches of 8 at once on a 2-core CPU: `--concurrent_batches`), split
  by `benchmarks.timed_launch` into import, data, set-up, compile and rounds;
- `library`: the sweep guide's script (16 runs built with `build_run`, two `RunBatch`es of 8
  advanced at once by `run_batches`), split the same way;
- `PyTorch loop`: the 16 runs one after another, each round a loop over its clients (what Flower /
  FedML users write), at 1 and 2 threads;
- `pfl-research` (0.6): its `FederatedAveraging` with a `PyTorchModel` on its `SimulatedBackend`,
  one `run` of 50 central iterations per grid point, its random user sampler (with replacement)
  and its plain mean of the cohort's updates, at 1 and 2 threads;
- `fedjax` (google/fedjax 0.0.17 on jax 0.5): `fed_avg.federated_averaging` of a haiku MLP, its
  `UniformGetClientSampler`, one run after another.
The peers run in their own environments (`--peer_python`, default `.venv-peers`, with torch and
pfl-research; `--fedjax_python`, default `.venv-fedjax`:
`python -m venv .venv-fedjax && .venv-fedjax/bin/pip install fedjax "jax<0.6" "jaxlib<0.6"`);
a peer whose environment is missing is left out of the table.
Ours run with a cold persistent compilation cache (a fresh folder) and then warm (the same job in
a new process); repetitions are interleaved over the contenders. The arithmetic limit beside them
is the grid's training FLOPs (6 x parameters per training example) at this machine's GEMM rate.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

import numpy as np
from absl import flags

from benchmarks.common import launch, markdown_table, peak_gflops, python_with, write_results

FLAGS = flags.FLAGS
flags.DEFINE_integer("reps", 2, "Interleaved repetitions of every contender (median).")
flags.DEFINE_string("peer_python", None, "Python of an environment with torch and pfl-research "
                    "(default: .venv-peers/bin/python when it exists, else this interpreter).")
flags.DEFINE_string("fedjax_python", None, "Python of an environment with google/fedjax (default: "
                    ".venv-fedjax/bin/python when it exists, else this interpreter).")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
K, N, BATCH, HIDDEN = 10, 100, 16, (200, 200)


class Grid(NamedTuple):
  """The grid's learning rates, seeds and rounds (a run per learning rate and seed)."""

  lrs: tuple[float, ...] = (0.02, 0.05, 0.1, 0.2)
  seeds: tuple[int, ...] = (0, 1, 2, 3)
  rounds: int = 50

LIBRARY = r"""
import json, sys, time
start = time.perf_counter()
import optax
import fedjax_sel as fs
from fedjax_sel.host.compilation import CompileLog
fs.use_persistent_cache()
log = CompileLog().__enter__()
t = {"import_s": time.perf_counter() - start}
LRS, SEEDS, ROUNDS, K, N, BATCH = %(grid)s
mark = time.perf_counter()
data = fs.build_dataset(fs.DatasetSpec("digits", num_clients=N), seed=0)
t["data_s"] = time.perf_counter() - mark
mark, c0 = time.perf_counter(), sum(log.snapshot().seconds.values())
model = fs.build_model("mlp", data.feature_shape, data.num_classes)
specs = [fs.build_run(model, data, optimizer=lambda lr: optax.sgd(lr),
                      local=fs.LocalHParams(batch_size=BATCH),
                      availability=fs.uniform_availability(N, N), selector=fs.random_selector(),
                      aggregator=fs.fedavg(), clients_per_round=K, seed=s,
                      lr_schedule=fs.constant_lr(lr)) for lr in LRS for s in SEEDS]
half = len(specs) // 2  # Two batches side by side, one a core (the sweep guide's run_batches).
batches = [fs.RunBatch(specs[:half]), fs.RunBatch(specs[half:])]
c1 = sum(log.snapshot().seconds.values())
t["setup_s"] = time.perf_counter() - mark - (c1 - c0)
mark = time.perf_counter()
runs = [r for b in fs.run_batches(batches, ROUNDS, eval_every=ROUNDS, progress=None) for r in b]
c2 = sum(log.snapshot().seconds.values())
t["rounds_s"] = time.perf_counter() - mark - (c2 - c1)
t["compile_s"] = c2
t["final_acc"] = [r[-1]["test_accuracy"] for r in runs]
t["total_s"] = time.perf_counter() - start
t["other_s"] = t["total_s"] - sum(v for k, v in t.items() if k.endswith("_s") and k != "total_s")
print(json.dumps(t))
"""

# The peers' scripts: a preamble that times the imports and reads the exported arrays, a body that
# trains the grid (appending each run's final test accuracy to `accs`), and one ending.
_START = r"""
import json, sys, time
start = time.perf_counter()
import numpy as np
"""
_READ = r"""
t = {"import_s": time.perf_counter() - start}
mark = time.perf_counter()
blob = np.load(path)
n = int(blob["n"])
"""
_TORCH_READ = _READ + r"""
torch.set_num_threads(threads)
xs = [torch.from_numpy(blob[f"x{k}"]) for k in range(n)]
ys = [torch.from_numpy(blob[f"y{k}"].astype(np.int64)) for k in range(n)]
tx, ty = torch.from_numpy(blob["tx"]), torch.from_numpy(blob["ty"].astype(np.int64))
t["data_s"] = time.perf_counter() - mark
mark = time.perf_counter()


def mlp():
  dims = (tx.shape[1], *HIDDEN)
  return torch.nn.Sequential(*[m for a, b in zip(dims, dims[1:])
                               for m in (torch.nn.Linear(a, b), torch.nn.ReLU())],
                             torch.nn.Linear(dims[-1], 10))


def test_accuracy(net):
  with torch.no_grad():
    return float((net(tx).argmax(1) == ty).float().mean())
"""
_END = r"""
t["rounds_s"] = time.perf_counter() - mark
t["final_acc"] = accs
t["total_s"] = time.perf_counter() - start
print(json.dumps(t))
"""

TORCH = _START + r"""
import torch
threads, path, ROUNDS, K, BATCH, LRS, SEEDS, HIDDEN = %(args)s
""" + _TORCH_READ + r"""
loss_fn, accs = torch.nn.CrossEntropyLoss(), []
for lr in LRS:
  for seed in SEEDS:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    net = mlp()
    state = {k: v.clone() for k, v in net.state_dict().items()}
    for _ in range(ROUNDS):
      chosen = rng.choice(len(xs), K, replace=False)
      total = sum(len(ys[c]) for c in chosen)
      acc = {k: torch.zeros_like(v) for k, v in state.items()}
      for c in chosen:
        net.load_state_dict(state)
        opt = torch.optim.SGD(net.parameters(), lr=lr)
        order = torch.from_numpy(rng.permutation(len(ys[c])))
        for i in range(0, len(order), BATCH):
          idx = order[i:i + BATCH]
          opt.zero_grad()
          loss_fn(net(xs[c][idx]), ys[c][idx]).backward()
          opt.step()
        for k, v in net.state_dict().items():
          acc[k] += v * (len(ys[c]) / total)
      state = acc
    net.load_state_dict(state)
    accs.append(test_accuracy(net))
""" + _END

PFL = _START + r"""
import torch
from pfl.aggregate.simulate import SimulatedBackend
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.data.federated_dataset import FederatedDataset
from pfl.data.sampling import get_user_sampler
from pfl.hyperparam import NNTrainHyperParams
from pfl.metrics import Weighted
from pfl.model.pytorch import PyTorchModel
threads, path, ROUNDS, K, BATCH, LRS, SEEDS, HIDDEN = %(args)s
""" + _TORCH_READ + r"""
users = {k: [xs[k], ys[k]] for k in range(n)}


class Net(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.net = mlp()

  def forward(self, x):
    return self.net(x)

  def loss(self, x, y, eval=False):
    return torch.nn.functional.cross_entropy(self(x), y)

  def metrics(self, x, y, eval=False):
    with torch.no_grad():
      return {"loss": Weighted(float(self.loss(x, y)) * len(y), len(y))}


accs = []
for lr in LRS:
  for seed in SEEDS:
    torch.manual_seed(seed)
    np.random.seed(seed)  # pfl's random user sampler draws from numpy's global state.
    data = FederatedDataset.from_slices(users, get_user_sampler("random", list(range(n))))
    net = Net()
    model = PyTorchModel(net, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
    params = NNAlgorithmParams(central_num_iterations=ROUNDS, evaluation_frequency=10**9,
                               train_cohort_size=K, val_cohort_size=0)
    FederatedAveraging().run(
        algorithm_params=params, backend=SimulatedBackend(training_data=data, val_data=data),
        model=model, model_train_params=NNTrainHyperParams(
            local_num_epochs=1, local_learning_rate=lr, local_batch_size=BATCH),
        send_metrics_to_platform=False)
    accs.append(test_accuracy(net))
""" + _END

FEDJAX = _START + r"""
import fedjax
import haiku as hk
import jax
path, ROUNDS, K, BATCH, LRS, SEEDS, HIDDEN = %(args)s
""" + _READ + r"""
fd = fedjax.InMemoryFederatedData({str(k).encode(): {"x": blob[f"x{k}"], "y": blob[f"y{k}"]}
                                   for k in range(n)})
test = fedjax.ClientDataset({"x": blob["tx"], "y": blob["ty"]})
t["data_s"] = time.perf_counter() - mark
mark = time.perf_counter()


def forward(batch):
  layers = [m for h in HIDDEN for m in (hk.Linear(h), jax.nn.relu)]
  return hk.Sequential([*layers, hk.Linear(10)])(batch["x"])


model = fedjax.create_model_from_haiku(
    transformed_forward_pass=hk.transform(forward),
    sample_batch={"x": blob["tx"][:1], "y": blob["ty"][:1]},
    train_loss=lambda b, p: fedjax.metrics.unreduced_cross_entropy_loss(b["y"], p),
    eval_metrics={"accuracy": fedjax.metrics.Accuracy()})
grad_fn = fedjax.model_grad(model)
accs = []
for lr in LRS:
  for seed in SEEDS:
    algorithm = fedjax.algorithms.fed_avg.federated_averaging(
        grad_fn, fedjax.optimizers.sgd(lr), fedjax.optimizers.sgd(1.0),
        fedjax.ShuffleRepeatBatchHParams(batch_size=BATCH, num_epochs=1))
    state = algorithm.init(model.init(jax.random.PRNGKey(seed)))
    sampler = fedjax.client_samplers.UniformGetClientSampler(fd, K, seed)
    for _ in range(ROUNDS):
      state, _ = algorithm.apply(state, sampler.sample())
    batches = test.padded_batch(fedjax.PaddedBatchHParams(batch_size=512))
    accs.append(float(fedjax.evaluate_model(model, state.params, batches)["accuracy"]))
""" + _END

def grid_flops(data, grid: Grid) -> float:
  """Training FLOPs of the grid: 6 x parameters per example trained (forward and backward)."""
  dims = (int(np.prod(data.feature_shape)), *HIDDEN, data.num_classes)
  params = sum(a * b + b for a, b in zip(dims, dims[1:]))
  per_client = float(np.mean(np.asarray(data.train.counts)))
  return 6.0 * params * per_client * K * grid.rounds * len(grid.lrs) * len(grid.seeds)


def export(data, path: str) -> None:
  """The clients' training arrays and the pooled test set, for the PyTorch loop."""
  test_x = np.asarray(data.test.x, np.float32)
  arrays = {"n": np.array(data.num_clients), "tx": test_x.reshape(len(test_x), -1),
            "ty": np.asarray(data.test.y)}
  for k in range(data.num_clients):
    x, y = data.train.client(k)
    arrays[f"x{k}"], arrays[f"y{k}"] = x.reshape(len(y), -1).astype(np.float32), y
  np.savez(path, **arrays)


def _process(argv: list[str], env: dict) -> tuple[float, dict]:
  start = time.perf_counter()
  proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
  wall = time.perf_counter() - start
  if proc.returncode:
    raise RuntimeError(f"{argv[:4]} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
  return wall, proc


def run_cli(grid: Grid, cache: str, out: str) -> dict:
  timing = os.path.join(out, "timing.json")
  argv = [sys.executable, "-m", "benchmarks.timed_launch", timing, "experiments.run",
          f"--out_dir={out}/job", "--overwrite", "--model=mlp", f"--num_clients={N}",
          f"--num_available={N}", f"--clients_per_round={K}", f"--rounds={grid.rounds}",
          f"--eval_every={grid.rounds}", f"--batch_size={BATCH}", "--local_epochs=1",
          "--sweep=lr:" + ",".join(map(str, grid.lrs)),
          "--seeds=" + ",".join(map(str, grid.seeds))]
  wall, _ = _process(argv, dict(os.environ, FEDJAX_SEL_CACHE_DIR=cache))
  with open(timing, encoding="utf-8") as f:
    return {**json.load(f), "wall_s": wall}


def run_script(source: str, env: dict, python: str = sys.executable) -> dict:
  wall, proc = _process([python, "-c", source], env)
  return {**json.loads(proc.stdout.strip().splitlines()[-1]), "wall_s": wall}


def main(argv):
  del argv
  grid = Grid((0.05, 0.1), (0, 1), 3) if FLAGS.quick else Grid()
  import fedjax_sel as fs  # pylint: disable=import-outside-toplevel
  data = fs.build_dataset(fs.DatasetSpec("digits", num_clients=N), seed=0)
  peak = peak_gflops()
  flops = grid_flops(data, grid)
  values = repr((grid.lrs, grid.seeds, grid.rounds, K, N, BATCH))
  torch_python = python_with("torch", FLAGS.peer_python, ".venv-peers/bin/python")
  pfl_python = python_with("pfl", FLAGS.peer_python, ".venv-peers/bin/python")
  fedjax_python = python_with("fedjax", FLAGS.fedjax_python, ".venv-fedjax/bin/python")
  reps = 1 if FLAGS.quick else FLAGS.reps
  times: dict[str, list[dict]] = {}
  with tempfile.TemporaryDirectory() as tmp:
    npz = os.path.join(tmp, "grid.npz")
    export(data, npz)
    peer_args = repr((npz, grid.rounds, K, BATCH, grid.lrs, grid.seeds, HIDDEN))
    peers = {"PyTorch loop": (torch_python, TORCH), "pfl-research": (pfl_python, PFL),
             "fedjax": (fedjax_python, FEDJAX)}
    contenders = ["run CLI", "library"] + [name for name, (python, _) in peers.items() if python]
    for rep in range(reps):
      for name in contenders[rep % len(contenders):] + contenders[:rep % len(contenders)]:
        if name in peers:
          python, source = peers[name]
          for threads in ((None,) if name == "fedjax" else (1, 2)):
            args = peer_args if threads is None else f"({threads}, *{peer_args})"
            label = name if threads is None else f"{name}, {threads} thr"
            times.setdefault(label, []).append(
                run_script(source % {"args": args}, dict(os.environ), python))
          print(f"rep {rep}: {name} done", flush=True)
          continue
        cache = os.path.join(tmp, f"cache_{name}_{rep}".replace(" ", "_"))
        for temperature in ("cold", "warm"):  # A fresh cache folder, then the same one again.
          if name == "run CLI":
            result = run_cli(grid, cache, os.path.join(tmp, "cli"))
          else:
            result = run_script(LIBRARY % {"grid": values},
                                dict(os.environ, FEDJAX_SEL_CACHE_DIR=cache))
          times.setdefault(f"{name}, {temperature} cache", []).append(result)
        print(f"rep {rep}: {name} done", flush=True)
  rows = []
  for name, results in times.items():
    med = lambda key, rs=results: statistics.median(r.get(key, 0.0) for r in rs)
    acc = results[0].get("final_acc")
    rows.append({"contender": name, "wall_s": med("wall_s"), "import_s": med("import_s"),
                 "data_s": med("data_s"), "setup_s": med("setup_s"),
                 "compile_s": med("compile_s"), "rounds_s": med("rounds_s"),
                 "mean_final_acc": float(np.mean(acc)) if acc else None})
  best_peer = min((r["wall_s"] for r in rows if not r["contender"].startswith(("run", "library"))),
                  default=None)
  for r in rows:
    r["vs_best_peer"] = best_peer / r["wall_s"] if best_peer else None
  limit = flops / (peak * 1e9)
  table = (f"{len(grid.lrs) * len(grid.seeds)} runs x {grid.rounds} rounds, K = {K} of {N}, "
           f"MLP {HIDDEN}, B = {BATCH}; arithmetic limit {limit:.2f} s ({flops / 1e9:.1f} GFLOP "
           f"at the {peak:.0f} GFLOP/s GEMM peak); medians of {reps} interleaved repetitions\n\n")
  table += markdown_table(rows, [("contender", "contender"), ("wall_s", "whole process s"),
                                 ("import_s", "import s"), ("data_s", "data s"),
                                 ("setup_s", "build s"), ("compile_s", "compile s"),
                                 ("rounds_s", "rounds s"), ("mean_final_acc", "mean final acc"),
                                 ("vs_best_peer", "speed-up vs best peer")])
  write_results("grid", rows, table, {"grid_gflop": flops / 1e9, "arithmetic_limit_s": limit,
                                      "peak_gflops": peak})


if __name__ == "__main__":
  launch(main)
