"""The launchers' tiny jobs give the records recorded before the launcher redesign, bit for bit
(`tests/golden_jobs.py` defines the jobs and says how to record them again)."""

import pytest

from tests.golden_jobs import JOBS, expected, run_job

DEFAULT = {"run_robust"}  # One composition of every kind of part; the rest: pytest -m slow.
# Record fields added after the records were made (issue 33's telemetry, issue 50's validation
# metrics): new keys, not changed values, so the recorded fields are compared and these may stand
# beside them.
ADDED = {"participation", "participations", "client_test_accuracy", "val_loss", "val_accuracy",
         "clean_val_loss", "clean_val_accuracy"}


@pytest.mark.parametrize("name", [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow)
                                  for n in JOBS])
def test_job_gives_the_recorded_metrics(name, tmp_path):
  runs = run_job(name, str(tmp_path / name))
  want = expected(name)
  assert sorted(runs) == sorted(want)
  for folder, records in want.items():
    assert len(runs[folder]) == len(records), folder
    for got, rec in zip(runs[folder], records):
      assert set(got) - set(rec) <= ADDED, (folder, rec["round"], set(got) - set(rec))
      got = {k: v for k, v in got.items() if k in rec}
      assert got == rec, (folder, rec["round"],
                          {k: (got.get(k), v) for k, v in rec.items() if got.get(k) != v})
