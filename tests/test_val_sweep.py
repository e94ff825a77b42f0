"""The sweep summary that decides pre-registered comparisons (experiments/val_sweep.py)."""

import importlib.util
import json
import os

import numpy as np
import pytest
from scipy import stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _val_sweep():
  spec = importlib.util.spec_from_file_location(
      "val_sweep", os.path.join(ROOT, "experiments", "val_sweep.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _write(path, rows):
  with open(path, "w") as f:
    f.writelines(json.dumps({"variant": v, "seed": s, "val_best": a}) + "\n" for v, s, a in rows)


def test_paired_summary_pairs_by_seed_and_reports_missing(tmp_path):
  vs = _val_sweep()
  # Written out of order, split over two files, with an errored run that must not count.
  _write(tmp_path / "a.jsonl", [("base", 12, 0.890), ("bigram", 10, 0.900), ("base", 10, 0.880)])
  _write(tmp_path / "b.jsonl", [("bigram", 12, 0.893), ("bigram", 11, 0.899), ("base", 11, 0.894)])
  with open(tmp_path / "b.jsonl", "a") as f:
    f.write(json.dumps({"variant": "base", "seed": 13, "error": "boom"}) + "\n")
  table = vs.read_sweep_lines([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")])
  r = vs.paired_summary(table, "base", "bigram", list(range(10, 14)))
  d = np.array([0.900 - 0.880, 0.899 - 0.894, 0.893 - 0.890])  # seeds 10, 11, 12
  assert r["n"] == 3 and r["seeds"] == [10, 11, 12]
  assert r["missing"] == {"base": [13], "bigram": [13]}
  assert r["mean_base"] == pytest.approx(np.mean([0.880, 0.894, 0.890]))
  assert r["mean_diff"] == pytest.approx(d.mean())
  assert r["se_diff"] == pytest.approx(d.std(ddof=1) / np.sqrt(3))
  half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
  assert r["ci95"] == pytest.approx((d.mean() - half, d.mean() + half))
  assert (r["other_better"], r["base_better"], r["ties"]) == (3, 0, 0)


def test_a_run_counted_twice_is_refused(tmp_path):
  vs = _val_sweep()
  _write(tmp_path / "cpu.jsonl", [("base", 10, 0.89)])
  _write(tmp_path / "gpu.jsonl", [("base", 10, 0.90)])
  with pytest.raises(SystemExit, match="seed 10 appears twice"):
    vs.read_sweep_lines([str(tmp_path / "cpu.jsonl"), str(tmp_path / "gpu.jsonl")])


def test_plain_summary_keeps_separate_sweeps_apart(tmp_path, capsys):
  """Different sweep files reuse variant names ("base", seed 0): listing them all, as the
  module's docstring does, summarises each file on its own instead of refusing."""
  import argparse
  vs = _val_sweep()
  _write(tmp_path / "round1.jsonl", [("base", 0, 0.89), ("base", 1, 0.87)])
  _write(tmp_path / "round2.jsonl", [("base", 0, 0.80)])
  vs.summarize(argparse.Namespace(files=[str(tmp_path / "round1.jsonl"),
                                         str(tmp_path / "round2.jsonl")], paired="", seeds=""))
  out = capsys.readouterr().out
  assert "n=2  mean 0.8800" in out and "n=1  mean 0.8000" in out
