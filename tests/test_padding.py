"""`benchmarks/padding_rows.py`: computed and useful training rows, by hand and against a job's own
count of the samples it trained."""

import json
import subprocess
import sys

from benchmarks.padding_rows import cohort_rows, job_rows
from tests.hang_guard import HANG_GUARD_S


def test_rows_of_a_cohort_by_hand():
  # Steps [2, 1, 0, 3] at B = 4, sorted [3, 2 | 1, 0] in chunks of 2: 2 x 3 x 4 + 2 x 1 x 4 rows.
  assert cohort_rows([5, 3, 0, 9], 4, batch_size=4, chunk_size=2) == (32, 17)
  assert cohort_rows([5, 3, 0, 9], 4, batch_size=4) == (48, 17)  # One chunk of 4 slots.
  # Two epochs: steps [4, 2] and an empty slot, one client a chunk: (4 + 2) x 4 rows.
  assert cohort_rows([5, 3], 3, batch_size=4, num_epochs=2, chunk_size=1) == (24, 16)
  assert cohort_rows([5, 3], 2, batch_size=4, chunk_size=1, num_steps=3) == (24, 24)


def test_useful_rows_of_a_job_are_the_samples_its_records_count(tmp_path):
  subprocess.run([sys.executable, "-m", "experiments.run", f"--out_dir={tmp_path}",
                  "--model=logreg", "--num_clients=12", "--num_available=8",
                  "--clients_per_round=4", "--rounds=3", "--seeds=0,1", "--batch_size=8"],
                 check=True, capture_output=True, timeout=HANG_GUARD_S)
  (row,) = job_rows(str(tmp_path))
  trained = sum(json.loads(line)["cost"]["train_samples"]
                for seed in (0, 1) for line in (tmp_path / f"seed{seed}" / "metrics.jsonl")
                .read_text().splitlines())
  assert row["useful_rows"] == trained
  assert row["computed_rows"] >= row["useful_rows"] and row["computed_rows"] % 8 == 0
