r"""FedAvg round throughput beside the peers: a PyTorch per-client loop and pfl-research.

  python -m benchmarks.peers                     # LEAF CNN, CIFAR CNN, ResNet18; K = 10 and 100
  python -m benchmarks.peers --quick             # LEAF CNN, K = 4 (seconds)
  python -m benchmarks.peers --peer_python=.venv-peers/bin/python

One worker process per framework and thread setting (`benchmarks/peer_worker.py`), each started
and warmed up in turn; then the repetitions are interleaved (one round of each worker, again and
again), so a busy spell of the machine falls on every framework alike. PyTorch runs at 1 thread
and at all cores, in the loop and under pfl; each is reported and the faster setting is the one
compared. Samples/s are medians over the repetitions.

The peers need their own virtual environment, because pfl-research's dependency dp-accounting
pins absl-py 1.x and this project needs absl-py 2:

  python -m venv .venv-peers && .venv-peers/bin/pip install torch==2.13.0 pfl==0.6.0

(`pip install -e '.[peers]'` adds torch alone to this project's environment, enough for the
PyTorch loop.) Without a torch-capable `--peer_python` the peer columns are left empty.

Our round uses the library's default convolution lowering (`conv_impl="auto"`: oneDNN's kernels
where the `onednn` extra is installed, else the patches; the table says which). A profiler trace
splits its time into GEMM and convolution kernels (XLA's dots, oneDNN's custom calls) and
everything else, and gives those kernels' FLOP rate against the machine's peak (a 2048^3 float32
GEMM).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from absl import flags

from benchmarks.common import launch, markdown_table, peak_gflops, python_with, write_results

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["leaf_cnn", "cifar_cnn", "resnet18"], "Models to run.")
flags.DEFINE_list("clients", ["10", "100"], "K values.")
flags.DEFINE_integer("reps", 5, "Interleaved timed rounds per worker.")
flags.DEFINE_integer("width", 16, "ResNet18's first-stage channels (64 in the paper; narrowed "
                     "so a K = 100 round fits this benchmark's time on a 2-core CPU).")
flags.DEFINE_enum("written", "library", ["library", "flax"], "Our models: the library's (for "
                  "simple_cnn, written with models.PatchConv), or the CNNs as a flax user writes "
                  "them, with nn.Conv and nn.max_pool (results: peers_flax).")
flags.DEFINE_string("peer_python", None, "Python of an environment with torch and pfl (default: "
                    ".venv-peers/bin/python when it exists, else this interpreter).")

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_worker.py")


class Worker:
  """A `peer_worker.py` process kept warm; `round()` times one more round in it."""

  def __init__(self, python: str, framework: str, model: str, clients: int, threads: int,
               width: int, written: str = "library"):
    self.label = framework if framework == "ours" else f"{framework} ({threads} thr)"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(WORKER)), os.environ.get("PYTHONPATH", "")]))
    self.proc = subprocess.Popen(
        [python, WORKER, f"--framework={framework}", f"--model={model}", f"--clients={clients}",
         f"--threads={threads}", f"--width={width}", f"--written={written}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = self.proc.stdout.readline().strip()
    if line != "ready":
      raise RuntimeError(f"{self.label} worker failed:\n{self.proc.stderr.read()[-3000:]}")

  def ask(self, command: str) -> str:
    self.proc.stdin.write(command + "\n")
    self.proc.stdin.flush()
    return self.proc.stdout.readline().strip()

  def round(self) -> float:
    return float(self.ask("run"))

  def close(self):
    self.proc.stdin.close()
    self.proc.wait(timeout=60)


def peer_python() -> str | None:
  """The interpreter for the peers, or None when none there can import torch."""
  return python_with("torch", FLAGS.peer_python, ".venv-peers/bin/python")


def measure(model: str, clients: int, python: str | None, peers: list[str],
            reps: int) -> tuple[dict, dict]:
  """One table row (samples/s per framework, ratios) and our round's time split; `peers` are the
  frameworks `python` runs."""
  samples = clients * 64
  threads = sorted({1, os.cpu_count() or 1})
  workers = [Worker(sys.executable, "ours", model, clients, 1, FLAGS.width, FLAGS.written)]
  workers += [Worker(python, f, model, clients, t, FLAGS.width) for f in peers for t in threads]
  times = {w.label: [] for w in workers}
  for _ in range(reps):
    for w in workers:
      times[w.label].append(w.round())
  split = json.loads(workers[0].ask("profile"))
  for w in workers:
    w.close()
  rate = {label: samples / statistics.median(ts) for label, ts in times.items()}
  best = lambda f: max((v for k, v in rate.items() if k.startswith(f + " ")), default=None)
  row = {"model": model, "K": clients, "ours": rate["ours"],
         **{label: v for label, v in rate.items() if label != "ours"},
         "torch_best": best("torch_loop"), "pfl_best": best("pfl")}
  peers_best = max((v for v in (row["torch_best"], row["pfl_best"]) if v), default=None)
  row["vs_best_peer"] = None if peers_best is None else rate["ours"] / peers_best
  return row, split


def main(argv):
  del argv
  python = peer_python()
  if python is None:
    print("No torch in this or a peers environment: peer columns left empty (see --help).")
  peers = []
  if python is not None:
    peers = ["torch_loop"] + (["pfl"] if python_with("pfl", python, python) else [])
  models, ks = (["leaf_cnn"], [4]) if FLAGS.quick else (FLAGS.models,
                                                        [int(k) for k in FLAGS.clients])
  reps = 2 if FLAGS.quick else FLAGS.reps
  peak = peak_gflops()
  rows, splits = [], []
  for model in models:
    for k in ks:
      row, split = measure(model, k, python, peers, reps)
      time_s = split.get("gemm_s", 0.0) + split.get("other_s", 0.0)
      splits.append({"model": model, "K": k, "gemm_share": split.get("gemm_s", 0.0) / time_s,
                     "gemm_gflops": split["flops"] / split["gemm_s"] / 1e9,
                     "round_gflops": row["ours"] * split["flops"] / (k * 64) / 1e9,
                     "conv_impl": split["conv_impl"]})
      print(row, splits[-1], flush=True)
      rows.append(row)
  thr = os.cpu_count() or 1
  columns = [("model", "model"), ("K", "K"), ("ours", "ours"),
             ("torch_loop (1 thr)", "PyTorch loop, 1 thread"),
             (f"torch_loop ({thr} thr)", f"PyTorch loop, {thr} threads"),
             ("pfl (1 thr)", "pfl, 1 thread"), (f"pfl ({thr} thr)", f"pfl, {thr} threads"),
             ("vs_best_peer", "ours / best peer")]
  impl = ", ".join(sorted({split["conv_impl"] for split in splits}))
  ours = ("the library's models" if FLAGS.written == "library" else
          "our models as flax users write them, with nn.Conv and nn.max_pool")
  table = ("Training samples/s (S = 64 samples per client, B = 32, E = 1, FedAvg over all K; "
           f"{ours}; our convolutions: {impl})\n\n"
           + markdown_table(rows, columns))
  table += f"\n\nPeak float32 GEMM rate of this machine: {peak:.0f} GFLOP/s."
  table += ("\n\nWhere our round's time goes (profiler trace; kernels = XLA's dots and library "
            "fusions, oneDNN's convolutions)\n\n" + markdown_table(splits, [
                ("model", "model"), ("K", "K"), ("gemm_share", "share of op time in kernels"),
                ("gemm_gflops", "kernel GFLOP/s"), ("round_gflops", "round GFLOP/s")]))
  name = "peers" if FLAGS.written == "library" else "peers_flax"
  write_results(name, rows, table, {"time_split": splits, "peak_gflops": peak, "conv_impl": impl,
                                    "peer_python": python, "width": FLAGS.width,
                                    "written": FLAGS.written})


if __name__ == "__main__":
  launch(main)
