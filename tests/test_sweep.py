"""textattn.sweep: the paired summary that decides pre-registered comparisons, and a sweep run."""

import json
import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp
import pytest
from scipy import stats

from tests.test_train import REPO, write_sentiment_jsonl
from textattn import checkpointing
from textattn import sweep as vs
from textattn import sweep_summary as summary


def _write(path, rows):
  with open(path, "w") as f:
    f.writelines(json.dumps({"variant": v, "seed": s, "val_best": a}) + "\n" for v, s, a in rows)


def test_paired_summary_pairs_by_seed_and_reports_missing(tmp_path):
  # Written out of order, split over two files, with an errored run that must not count.
  _write(tmp_path / "a.jsonl", [("base", 12, 0.890), ("bigram", 10, 0.900), ("base", 10, 0.880)])
  _write(tmp_path / "b.jsonl", [("bigram", 12, 0.893), ("bigram", 11, 0.899), ("base", 11, 0.894)])
  with open(tmp_path / "b.jsonl", "a") as f:
    f.write(json.dumps({"variant": "base", "seed": 13, "error": "boom"}) + "\n")
  table = summary.read_sweep_lines([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")])
  r = summary.paired_summary(table, "base", "bigram", list(range(10, 14)))
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
  _write(tmp_path / "cpu.jsonl", [("base", 10, 0.89)])
  _write(tmp_path / "gpu.jsonl", [("base", 10, 0.90)])
  with pytest.raises(SystemExit, match="seed 10 appears twice"):
    summary.read_sweep_lines([str(tmp_path / "cpu.jsonl"), str(tmp_path / "gpu.jsonl")])


def test_plain_summary_keeps_separate_sweeps_apart(tmp_path, capsys):
  """Different sweep files reuse variant names ("base", seed 0): listing them all, as the
  module's docstring does, summarises each file on its own instead of refusing."""
  import argparse
  _write(tmp_path / "round1.jsonl", [("base", 0, 0.89), ("base", 1, 0.87)])
  _write(tmp_path / "round2.jsonl", [("base", 0, 0.80)])
  vs.summarize(argparse.Namespace(files=[str(tmp_path / "round1.jsonl"),
                                         str(tmp_path / "round2.jsonl")], paired="", seeds=""))
  out = capsys.readouterr().out
  assert "n=2  mean 0.8800" in out and "n=1  mean 0.8000" in out


def test_export_sweep_and_paired_summary_end_to_end(tmp_path):
  # The command a researcher runs: export train/validation (never test), train two variants
  # on one seed through the same loop as textattn.main, then the paired summary.
  data = tmp_path / "reviews.jsonl"
  write_sentiment_jsonl(data, n=240)
  config = tmp_path / "tiny.py"
  config.write_text(
      "from textattn import defaults\n\n\ndef get_config():\n"
      "  config = defaults.classification()\n"
      f"  config.dataset = {str(data)!r}\n  config.cache_dir = {str(tmp_path / 'cache')!r}\n"
      "  config.vocab_size, config.max_len, config.batch_size = 64, 16, 8\n"
      "  config.num_train_steps, config.eval_every_steps = 12, 6\n"
      "  config.model.update(embed_dim=8, num_heads=2, ffn_dim=8, mlp_dim=4)\n"
      "  return config\n")
  run = lambda *args: subprocess.run([sys.executable, "-m", "textattn.sweep", *args], cwd=REPO,
                                     capture_output=True, text=True, check=False)
  export = run("export", f"--config={config}", f"--out={tmp_path / 'data.npz'}")
  assert export.returncode == 0, export.stderr[-2000:]
  with np.load(tmp_path / "data.npz") as f:
    assert "test_inputs" not in f.files and "val_inputs" in f.files
  out = tmp_path / "sweep.jsonl"
  done = run("sweep", f"--data={tmp_path / 'data.npz'}", f"--config={config}", "--seeds=3",
             "--variant=base", "--variant=wide:model.ffn_dim=16", f"--out={out}")
  assert done.returncode == 0, done.stderr[-2000:]
  lines = [json.loads(line) for line in out.read_text().splitlines()]
  assert [(r["variant"], r["seed"]) for r in lines] == [("base", 3), ("wide", 3)]
  for r in lines:
    assert [step for step, _ in r["curve"]] == [6, 12] and 0 <= r["val_best"] <= 1, r
  summary = run("summarize", str(out), "--paired=base,wide", "--seeds=3-3")
  assert summary.returncode == 0 and "paired over 1 seeds" in summary.stdout, summary.stdout


def test_a_sweep_runs_any_registered_task_through_the_registry(tmp_path):
  # No export: each run reads the task's own data and reports its Job's selection metric (the
  # toy plugin task here; translation and the language model the same way).
  config = str(REPO / "tests" / "toy_task_config.py")
  out = tmp_path / "toy.jsonl"
  done = subprocess.run(
      [sys.executable, "-m", "textattn.sweep", "sweep", f"--config={config}",
       "--plugin=tests.toy_task", "--seeds=3", "--variant=base", f"--out={out}"],
      cwd=REPO, capture_output=True, text=True, check=False, timeout=600)
  assert done.returncode == 0, done.stderr[-2000:]
  [line] = [json.loads(row) for row in out.read_text().splitlines()]
  assert line["variant"] == "base" and line["seed"] == 3, line
  assert line["metric"] == "val/accuracy" and line["higher_is_better"] is True
  assert [step for step, _ in line["curve"]] == [10, 20, 30, 40, 50, 60]
  assert line["val_best"] == max(value for _, value in line["curve"])
  # The same (config, seed) in this process gives the same curve: runs are reproducible.
  from tests import toy_task  # noqa: F401 -- registers the task
  again = vs.run_task(config, {}, 3)
  assert again["curve"] == [tuple(point) for point in line["curve"]]


def test_a_sweep_run_again_on_its_out_file_resumes(tmp_path, monkeypatch, capsys):
  # A killed sweep reran every job and appended them twice (summarize then refused), and a
  # torn last line was glued to the next append; now the finished runs are skipped.
  import argparse
  import types

  from textattn.errors import DataError
  launched = []

  def fake_run(command, **_):
    seed = int(next(a for a in command if a.startswith("--seed=")).split("=")[1])
    overrides = json.loads(next(a for a in command if a.startswith("--overrides="))[12:])
    launched.append((overrides.get("model.pooling", "mean"), seed))
    return types.SimpleNamespace(returncode=0, stderr="", stdout=json.dumps(
        {"val_best": 0.5 + seed / 100}) + "\n")
  monkeypatch.setattr(vs.subprocess, "run", fake_run)
  out = tmp_path / "sweep.jsonl"
  args = argparse.Namespace(variant=["base", "max:model.pooling='max'"], seeds="0,1", jobs=1,
                            out=str(out), data="d.npz", config="configs/imdb_keras_fast.py",
                            encoder="", plugin=[])
  with open(out, "w") as f:  # seed 0 of base finished, then a kill while writing the next
    f.write(json.dumps({"variant": "base", "seed": 0, "overrides": {}, "val_best": 0.7})
            + "\n" + '{"variant": "max", "se')
  vs.sweep(args)
  assert sorted(launched) == [("max", 0), ("max", 1), ("mean", 1)]
  assert "already holds 1 finished run(s); running 3" in capsys.readouterr().out
  table = summary.read_sweep_lines([str(out)])
  assert table == {"base": {0: 0.7, 1: 0.51}, "max": {0: 0.5, 1: 0.51}}
  launched.clear()
  vs.sweep(args)  # all done: nothing runs
  assert launched == []
  args.variant = ["base:model.pooling='max'"]  # the name, now another run: refused
  with pytest.raises(DataError, match=r"sweep.jsonl:1: variant 'base' ran with overrides \{\}"):
    vs.sweep(args)
  with open(out, "a") as f:
    f.write("not json\n")
  with pytest.raises(DataError, match=r"sweep.jsonl:5: not a sweep result line"):
    summary.read_sweep_lines([str(out)])
  args.out = str(tmp_path / "no_such_dir" / "sweep.jsonl")
  with pytest.raises(DataError, match=r"no_such_dir/sweep.jsonl: cannot be written"):
    vs.sweep(args)


@pytest.mark.parametrize("higher_is_better", [True, False], ids=["accuracy", "loss"])
def test_a_sweeps_best_step_is_the_checkpoint_managers(tmp_path, higher_is_better):
  # Tied validation values: the manager keeps, and a run reports from, the latest of them; the
  # sweep once named the first.
  sign = 1 if higher_is_better else -1
  curve = [(10, sign * 0.5), (20, sign * 0.8), (30, sign * 0.8), (40, sign * 0.7)]
  manager = checkpointing.checkpoint_manager(str(tmp_path), keep=1, metric="m",
                                             higher_is_better=higher_is_better)
  for step, value in curve:
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave({"w": np.zeros(2)})),
                 metrics={"m": value})
  manager.wait_until_finished()
  assert summary.best_of(curve, higher_is_better) == (manager.best_step(), sign * 0.8)
  manager.close()


@pytest.mark.parametrize("tokenizer", ["word", "ngram"])
def test_a_sweep_cuts_exported_rows_as_encoding_at_the_shorter_length_does(tmp_path, tokenizer):
  # (an n-gram row keeps its first ids, the most frequent features: the sweep once kept its
  # last ones, the rarest, as for a word row under "pre" truncation)
  from tests.test_data import make_config, write_csv
  from textattn import data as data_lib
  rows = [f"the film {'good great fine' if i % 2 else 'bad awful dull'} plot {i} ends,"
          f"{'pos' if i % 2 else 'neg'}" for i in range(40)]
  path = write_csv(tmp_path / "d.csv", rows)

  def encoded(max_len):
    config = make_config(tmp_path, dataset=path, tokenizer=tokenizer, max_len=max_len)
    return config, data_lib.load_dataset(config, None).train.inputs
  config, long = encoded(12)
  _, short = encoded(4)
  np.testing.assert_array_equal(vs.shorten(long, 4, config.layout.truncation, tokenizer), short)


def test_sweep_flags_and_its_out_are_checked_before_any_run(tmp_path):
  import argparse

  from textattn.errors import DataError, UsageError
  assert summary.parse_seeds("0-2,7", "--seeds") == [0, 1, 2, 7]
  for bad in ("abc", "2-0", "1,,2", "-1"):
    with pytest.raises(UsageError, match="must be seeds as 0,1,2 or a range 0-4"):
      summary.parse_seeds(bad, "--seeds")
  args = argparse.Namespace(variant=["x:model.no_such_field=1"], seeds="0", jobs=1,
                            out=str(tmp_path / "out.jsonl"), plugin=[], data="", encoder="",
                            config="configs/imdb_keras_fast.py")
  with pytest.raises(UsageError, match="unknown config field 'model.no_such_field'"):
    # (each run once failed with it, its traceback in --out, and the sweep exited 0)
    vs.sweep(args)
  with pytest.raises(UsageError, match="--jobs=0 must be >= 1"):
    vs.sweep(argparse.Namespace(**{**vars(args), "jobs": 0}))
  # One sweep at a time on an --out (two once ran the same runs and wrote them twice).
  with summary.held(args.out), pytest.raises(UsageError, match="in use by another sweep"), \
       summary.held(args.out):
    pass
  with summary.held(args.out):  # (released)
    pass
  (tmp_path / "latin1.jsonl").write_bytes(b"caf\xe9\n")
  with pytest.raises(DataError, match="cannot be read as a sweep file"):
    summary.read_sweep_lines([str(tmp_path / "latin1.jsonl")])
