"""What a launcher writes after its runs: the summary file, figure paths and titles.

  >>> from experiments import config, report
  >>> report.setup_title(config.JobConfig(), "FedAvg")
  'digits, N = 50, K = 10, mlp, 30 rounds, FedAvg'
"""

from __future__ import annotations

import os

from experiments import config as cfglib


def figure_path(cfg: cfglib.JobConfig, name: str) -> str:
  """`<out_dir>/<name>.<--figure_format>`."""
  return os.path.join(cfg.output.out_dir, f"{name}.{cfg.output.figure_format}")


def setup_title(cfg: cfglib.JobConfig, detail: str = "", with_k: bool = True) -> str:
  """A figure's title: the data, model, N, K (`with_k`) and rounds, and a launcher's `detail`."""
  k = f", K = {cfg.engine.clients_per_round}" if with_k else ""
  parts = [f"{cfg.data.dataset}, N = {cfg.data.num_clients}{k}", cfg.model.model,
           f"{cfg.engine.rounds} rounds"]
  return ", ".join(parts + ([detail] if detail else []))


def write_summary(cfg: cfglib.JobConfig, text: str) -> None:
  """Prints `text` and writes it to `<out_dir>/summary.md`."""
  print(text)
  with open(os.path.join(cfg.output.out_dir, "summary.md"), "w", encoding="utf-8") as f:
    f.write(text + "\n")
