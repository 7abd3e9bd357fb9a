"""The selection benchmark (`experiments/bench.py`, run as a process: its flags are its own): a
quick leaderboard, read again identically when rerun, recomputed identically from scratch
(slow), and its refusals."""

import csv
import json
import os
import re
import subprocess
import sys

import pytest

from tests.hang_guard import HANG_GUARD_S

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = ["--quick", "--selectors=random,md", "--scenarios=label_skew,diurnal"]


def _bench(out, *extra):
  return subprocess.run([sys.executable, "-m", "experiments.bench", *ARGS, *extra,
                         f"--out_dir={out}"], cwd=REPO, capture_output=True, text=True,
                        timeout=HANG_GUARD_S, check=False)


def bench_spec():
  with open(os.path.join(REPO, "experiments", "bench_scenarios.json"), encoding="utf-8") as f:
    return json.load(f)


def bench_numeric():
  """The leaderboard CSV's numeric columns (read from the source: importing experiments.bench
  would define its flags in this test process)."""
  text = open(os.path.join(REPO, "experiments", "bench.py"), encoding="utf-8").read()
  block = text.split("NUMERIC_COLUMNS = (", 1)[1].split(")", 1)[0]
  return set(re.findall(r'"(\w+)"', block))


def _rows(out):
  with open(os.path.join(out, "leaderboard.csv"), encoding="utf-8") as f:
    return list(csv.DictReader(f))


@pytest.mark.xdist_group("bench")
def test_quick_leaderboard_and_rerun(tmp_path):
  out = str(tmp_path / "b")
  proc = _bench(out)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  rows = _rows(out)
  # A smoke run: random in every scenario, every other selector in one (md in the first).
  assert [(r["scenario"], r["selector"]) for r in rows] == [
      ("label_skew", "random"), ("label_skew", "md"), ("diurnal", "random")]
  assert all(r["seeds"] == "2" and r["final_acc_n"] == "2" and r["smoke_run"] == "True"
             for r in rows)
  assert set(rows[0]) == {"scenario", "selector", "rank", "seeds", "final_acc", "last_k_acc",
                          "rounds_to_target", "sim_s_to_target", "worst10_client_acc", "jain",
                          "selection_samples", "stragglers", "vs_random", *bench_numeric()}
  for r in rows:  # The numbers beside the text: the text is their rounding.
    assert r["final_acc"].startswith(f"{float(r['final_acc_mean']):.4f} [")
  assert [r["vs_random_verdict"] in ("better", "tie", "worse") for r in rows] == [
      False, True, False]  # Random itself has none.
  assert all(r["rank"] == (r["rank_best"] if r["rank_best"] == r["rank_worst"]
                           else f"{r['rank_best']}-{r['rank_worst']}") for r in rows)
  table = open(os.path.join(out, "leaderboard.md"), encoding="utf-8").read()
  assert table.startswith("**SMOKE RUN (--quick)")
  assert len([line for line in table.splitlines() if line.startswith("| ")]) == 4
  assert "Command: `python -m experiments.bench --quick" in table and "Machine: " in table
  assert os.path.exists(os.path.join(out, "leaderboard_ranks.png"))
  assert os.path.exists(os.path.join(out, "participation.png"))
  assert os.path.exists(os.path.join(out, "time_to_target.png"))
  with open(os.path.join(out, "timing.csv"), encoding="utf-8") as f:
    timing = list(csv.DictReader(f))
  assert [(r["scenario"], r["selector"], r["processes"]) for r in timing] == [
      (s, m, "1") for s, m in (("label_skew", "random"), ("label_skew", "md"),
                               ("diurnal", "random"))]
  # Run again: every job finished, so each is read back, and the leaderboard is the same.
  again = _bench(out)
  assert again.returncode == 0, again.stdout + again.stderr
  assert _rows(out) == rows
  log = open(os.path.join(out, "label_skew", "md", "bench.log"), encoding="utf-8").read()
  assert "nothing to compute" in log
  with open(os.path.join(out, "label_skew", "md", "timing.json"), encoding="utf-8") as f:
    assert len(json.load(f)) == 1  # The rerun trained nothing and added no timing.


@pytest.mark.slow
def test_fresh_rerun_gives_the_same_leaderboard(tmp_path):
  assert _bench(str(tmp_path / "a")).returncode == 0
  assert _bench(str(tmp_path / "b")).returncode == 0
  assert _rows(str(tmp_path / "a")) == _rows(str(tmp_path / "b"))


@pytest.mark.parametrize("flag,needle", [("--selectors=nope", "--selectors: unknown"),
                                         ("--scenarios=nope", "--scenarios: unknown")])
def test_refuses_unknown_names_before_any_job(tmp_path, flag, needle):
  proc = subprocess.run([sys.executable, "-m", "experiments.bench", "--quick", flag,
                         f"--out_dir={tmp_path}"], cwd=REPO, capture_output=True, text=True,
                        timeout=HANG_GUARD_S, check=False)
  assert proc.returncode == 1 and needle in proc.stderr
  assert not os.listdir(tmp_path)


def test_help_names_every_scenario_of_the_file():
  proc = subprocess.run([sys.executable, "-m", "experiments.bench", "--help"], cwd=REPO,
                        capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
  named = re.search(r"--scenarios: .*?the default file's: (.*?)\)\.", " ".join(proc.stdout.split()))
  assert named and named[1].split(", ") == list(bench_spec()["scenarios"])


@pytest.mark.slow
def test_a_killed_scenario_resumes_to_the_same_leaderboard(tmp_path):
  """One job stopped after its first round (as a kill leaves it: its folder, manifest and
  checkpoint) is resumed by the benchmark, and the leaderboard equals an uninterrupted one's."""
  whole, killed = str(tmp_path / "whole"), str(tmp_path / "killed")
  assert _bench(whole).returncode == 0
  spec = bench_spec()
  folder = os.path.join(killed, "label_skew", "md")
  first = subprocess.run([sys.executable, "-m", "experiments.run", *spec["common"],
                          *spec["scenarios"]["label_skew"], "--selector=md", *spec["quick"],
                          "--rounds=1",
                          f"--out_dir={folder}"], cwd=REPO, capture_output=True, text=True,
                         timeout=HANG_GUARD_S, check=False)
  assert first.returncode == 0, first.stderr
  assert _bench(killed).returncode == 0
  assert "resuming" in open(os.path.join(folder, "bench.log"), encoding="utf-8").read()
  assert _rows(killed) == _rows(whole)


@pytest.mark.xdist_group("bench")
def test_a_tuned_selector_is_ranked_at_its_best_validation_setting(tmp_path):
  """--tune: Oort's job sweeps its exploration (one batch), and its leaderboard row is the setting
  whose final validation accuracy is best (mean over seeds), read back from the job's records;
  tuning.md lists every setting with the chosen one marked."""
  out = tmp_path / "tuned"
  proc = subprocess.run([sys.executable, "-m", "experiments.bench", "--quick", "--tune",
                         "--selectors=random,oort", "--scenarios=label_skew",
                         f"--out_dir={out}"], cwd=REPO, capture_output=True, text=True,
                        timeout=HANG_GUARD_S, check=False)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  job = out / "label_skew" / "oort"
  runs = json.loads((job / "job.json").read_text(encoding="utf-8"))["runs"]
  final_val = {}
  for run in runs:
    with open(job / run["folder"] / "metrics.jsonl", encoding="utf-8") as f:
      last = [json.loads(line) for line in f][-1]
    final_val.setdefault(run["swept"]["oort_exploration"], []).append(last["val_accuracy"])
  assert sorted(final_val) == [0.1, 0.5, 0.9]
  best = max(final_val, key=lambda v: sum(final_val[v]) / len(final_val[v]))
  rows = {r["selector"]: r for r in _rows(out)}
  assert rows["oort"]["setting"] == f"oort_exploration={best:g}" and rows["random"]["setting"] == ""
  tuning = (out / "tuning.md").read_text(encoding="utf-8")
  assert f"| label_skew | oort | oort_exploration={best:g} |" in tuning
  assert tuning.count("| yes |") == 1
  log = (job / "bench.log").read_text(encoding="utf-8")  # 3 settings x 2 seeds in one program:
  assert "(6 runs)" in log or "2 batches at a time" in log and "(3 runs)" in log  # Or 2 halves.
  assert "compiled programs" not in log
  # Random, tuned or not, trains on the same rows as the tuned selector: the tenth held out too.
  plan = json.loads((out / "plan.json").read_text(encoding="utf-8"))
  flags = {job["label"]: job["flags"] for job in plan}
  assert all("--val_fraction=0.1" in f for f in flags.values()), flags


def test_a_scenario_whose_files_are_missing_is_skipped_naming_the_file(tmp_path):
  """A scenario's `needs` (under --data_dir, or absolute) that are not there: one line naming the
  first missing file, and no job; with no scenario left, a usage error."""
  spec = {"common": [], "quick": [], "target": 0.5,
          "needs": {"field": ["train.sqlite"], "absolute": [str(tmp_path / "nothing.gz")]},
          "scenarios": {"field": ["--dataset=emnist"], "absolute": ["--dataset=fashion_mnist"]}}
  (tmp_path / "data").mkdir()
  (tmp_path / "data" / "other.sqlite").write_text("", encoding="utf-8")
  path = tmp_path / "scenarios.json"
  path.write_text(json.dumps(spec), encoding="utf-8")
  proc = subprocess.run([sys.executable, "-m", "experiments.bench", f"--scenarios_file={path}",
                         f"--data_dir={tmp_path / 'data'}", "--selectors=random",
                         f"--out_dir={tmp_path / 'out'}"], cwd=REPO, capture_output=True,
                        text=True, timeout=HANG_GUARD_S, check=False)
  assert proc.stdout.splitlines() == [
      f"== field: skipped, no {tmp_path / 'data' / 'train.sqlite'} (--data_dir)",
      f"== absolute: skipped, no {tmp_path / 'nothing.gz'}"], proc.stdout
  assert proc.returncode == 1 and "no scenario could run" in proc.stderr
  assert not (tmp_path / "out").exists()


def test_the_worker_drops_its_programs_past_the_memory_map_bound():
  """The benchmark's worker keeps its compiled programs while the process holds few memory maps,
  and drops the engine's programs and JAX's caches past the bound (XLA:CPU maps each program's
  code; Linux allows 65,530 maps)."""
  from experiments import bench_worker  # pylint: disable=import-outside-toplevel
  from fedjax_sel.engine import programs  # pylint: disable=import-outside-toplevel
  if not bench_worker.memory_maps():
    pytest.skip("no /proc/self/maps: not Linux")
  assert not bench_worker.release_programs(limit=10**9)
  assert bench_worker.release_programs(limit=0)
  assert programs.program.cache_info().currsize == 0
