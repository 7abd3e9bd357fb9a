r"""Time to a researcher's grid: 16 runs (4 client learning rates x 4 seeds), 50 rounds each,
FedAvg of the MLP on the digits, K = 10 of 100 clients a round, each contender in a fresh process,
whole-process wall time from its start to the 16 final test accuracies.

  python -m benchmarks.grid            # the table in docs/performance.md (a few minutes)
  python -m benchmarks.grid --quick    # smoke run (2 x 2 runs, 3 rounds)

Contenders, all on the digits (`DatasetSpec("digits", num_clients=100)`: the launcher's default
Dirichlet(0.5) split, 80/20 train / test per client; seed 0's split for every run, except the
launcher, which splits per seed as it always does), B = 16, one local epoch, plain SGD,
examples-weighted FedAvg, the round's clients drawn uniformly:
- `run CLI`: `python -m experiments.run --sweep=lr:... --seeds=...` (its 16 runs batched in one
  compiled program), split by `benchmarks.timed_launch` into import, data, set-up, compile and
  rounds;
- `library`: the sweep guide's script (16 `Simulator`s, one `RunBatch`, `run_batch`), split the
  same way;
- `PyTorch loop` (where torch is installed: `pip install -e '.[peers]'`): the 16 runs one after
  another, each round a loop over its clients (what Flower / FedML users write), at 1 and 2
  threads.
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
from absl import app, flags

from benchmarks.common import markdown_table, peak_gflops, write_results

FLAGS = flags.FLAGS
flags.DEFINE_integer("reps", 2, "Interleaved repetitions of every contender (median).")

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
log = CompileLog().__enter__()
t = {"import_s": time.perf_counter() - start}
LRS, SEEDS, ROUNDS, K, N, BATCH = %(grid)s
mark = time.perf_counter()
data = fs.build_dataset(fs.DatasetSpec("digits", num_clients=N), seed=0)
t["data_s"] = time.perf_counter() - mark
mark, c0 = time.perf_counter(), sum(log.snapshot().seconds.values())
model = fs.build_model("mlp", data.feature_shape, data.num_classes)
sims = [fs.Simulator(model, data, optimizer=lambda lr: optax.sgd(lr),
                     local=fs.LocalHParams(batch_size=BATCH),
                     availability=fs.uniform_availability(N, N), selector=fs.random_selector(K),
                     aggregator=fs.fedavg(), clients_per_round=K, seed=s,
                     lr_schedule=fs.constant_lr(lr)) for lr in LRS for s in SEEDS]
batch = fs.RunBatch(sims)
c1 = sum(log.snapshot().seconds.values())
t["setup_s"] = time.perf_counter() - mark - (c1 - c0)
mark = time.perf_counter()
runs = fs.run_batch(batch, ROUNDS, eval_every=ROUNDS, progress=None)
c2 = sum(log.snapshot().seconds.values())
t["rounds_s"] = time.perf_counter() - mark - (c2 - c1)
t["compile_s"] = c2
t["final_acc"] = [r[-1]["test_accuracy"] for r in runs]
t["total_s"] = time.perf_counter() - start
t["other_s"] = t["total_s"] - sum(v for k, v in t.items() if k.endswith("_s") and k != "total_s")
print(json.dumps(t))
"""

TORCH = r"""
import json, sys, time
start = time.perf_counter()
import numpy as np
import torch
threads, path, ROUNDS, K, BATCH, LRS, SEEDS, HIDDEN = %(args)s
torch.set_num_threads(threads)
t = {"import_s": time.perf_counter() - start}
mark = time.perf_counter()
blob = np.load(path)
xs = [torch.from_numpy(blob[f"x{k}"]) for k in range(int(blob["n"]))]
ys = [torch.from_numpy(blob[f"y{k}"].astype(np.int64)) for k in range(int(blob["n"]))]
tx, ty = torch.from_numpy(blob["tx"]), torch.from_numpy(blob["ty"].astype(np.int64))
t["data_s"] = time.perf_counter() - mark
mark = time.perf_counter()
nn, loss_fn, accs = torch.nn, torch.nn.CrossEntropyLoss(), []
for lr in LRS:
  for seed in SEEDS:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    dims = (xs[0].shape[1], *HIDDEN)
    net = nn.Sequential(*[m for a, b in zip(dims, dims[1:]) for m in (nn.Linear(a, b), nn.ReLU())],
                        nn.Linear(dims[-1], 10))
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
    with torch.no_grad():
      accs.append(float((net(tx).argmax(1) == ty).float().mean()))
t["rounds_s"] = time.perf_counter() - mark
t["final_acc"] = accs
t["total_s"] = time.perf_counter() - start
print(json.dumps(t))
"""


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


def run_script(source: str, env: dict) -> dict:
  wall, proc = _process([sys.executable, "-c", source], env)
  return {**json.loads(proc.stdout.strip().splitlines()[-1]), "wall_s": wall}


def main(argv):
  del argv
  grid = Grid((0.05, 0.1), (0, 1), 3) if FLAGS.quick else Grid()
  import fedjax_sel as fs  # pylint: disable=import-outside-toplevel
  data = fs.build_dataset(fs.DatasetSpec("digits", num_clients=N), seed=0)
  peak = peak_gflops()
  flops = grid_flops(data, grid)
  values = repr((grid.lrs, grid.seeds, grid.rounds, K, N, BATCH))
  has_torch = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True
                             ).returncode == 0
  reps = 1 if FLAGS.quick else FLAGS.reps
  times: dict[str, list[dict]] = {}
  with tempfile.TemporaryDirectory() as tmp:
    export(data, os.path.join(tmp, "grid.npz"))
    for rep in range(reps):
      contenders = ["run CLI", "library"] + (["PyTorch loop"] if has_torch else [])
      for name in contenders[rep % len(contenders):] + contenders[:rep % len(contenders)]:
        if name == "PyTorch loop":
          for threads in (1, 2):
            args = repr((threads, os.path.join(tmp, "grid.npz"), grid.rounds, K, BATCH, grid.lrs,
                         grid.seeds, HIDDEN))
            times.setdefault(f"PyTorch loop, {threads} thr", []).append(
                run_script(TORCH % {"args": args}, dict(os.environ)))
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
  best_peer = min((r["wall_s"] for r in rows if r["contender"].startswith("PyTorch")),
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
  app.run(main)
