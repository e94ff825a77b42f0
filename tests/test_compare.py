"""Paired comparison of two runs' test predictions (textattn.compare)."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from textattn import compare


def one_hot_probabilities(predictions, num_classes=2):
  return np.eye(num_classes, dtype=np.float32)[predictions]


def test_mcnemar_exact_p_matches_the_binomial_tail():
  # b=10, c=2: 2 * (C(12,0) + C(12,1) + C(12,2)) / 2^12
  assert compare.mcnemar_exact_p(10, 2) == pytest.approx(2 * (1 + 12 + 66) / 4096)
  assert compare.mcnemar_exact_p(2, 10) == compare.mcnemar_exact_p(10, 2)
  assert compare.mcnemar_exact_p(5, 5) == 1.0
  assert compare.mcnemar_exact_p(0, 0) == 1.0
  assert compare.mcnemar_exact_p(0, 20) == pytest.approx(2 / 2 ** 20)
  for only_a, only_b in [(40, 62), (1500, 1600), (4000, 4150)]:  # (log-space sum vs integers)
    n = only_a + only_b
    exact = 2 * sum(math.comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2 ** n
    assert compare.mcnemar_exact_p(only_a, only_b) == pytest.approx(min(1.0, exact), rel=1e-8)


def test_compare_counts_discordant_examples_and_the_paired_interval():
  labels = np.array([0, 1, 0, 1, 0, 1, 0, 1])
  a = np.array([0, 1, 0, 1, 1, 0, 1, 1])  # right on 0,1,2,3,7
  b = np.array([0, 1, 0, 0, 0, 1, 0, 1])  # right on 0,1,2,4,5,6,7
  result = compare.compare(labels, one_hot_probabilities(a), labels, one_hot_probabilities(b))
  assert (result.count, result.only_a_right, result.only_b_right) == (8, 1, 3)
  assert (result.accuracy_a, result.accuracy_b) == (5 / 8, 7 / 8)
  assert result.difference == pytest.approx(2 / 8)
  per_example = np.array([0, 0, 0, -1, 1, 1, 1, 0], np.float64)
  half_width = 1.96 * per_example.std(ddof=1) / math.sqrt(8)
  assert result.ci95 == pytest.approx((0.25 - half_width, 0.25 + half_width))
  assert result.mcnemar_p == pytest.approx(compare.mcnemar_exact_p(1, 3))


def test_runs_on_different_examples_are_refused():
  labels = np.array([0, 1, 0, 1])
  with pytest.raises(compare.CompareError, match="same test examples.*labels differ"):
    compare.compare(labels, one_hot_probabilities(labels), labels[::-1],
                    one_hot_probabilities(labels))
  with pytest.raises(compare.CompareError, match="4 and 3 examples"):
    compare.compare(labels, one_hot_probabilities(labels), labels[:3],
                    one_hot_probabilities(labels[:3]))


def test_runs_whose_configs_say_their_test_splits_differ_are_refused(tmp_path):
  # Equal labels do not prove equal examples: a test split carved from a local file by another
  # seed can hold other reviews with the same label sequence (a file sorted by label).
  import json

  def workdir(name, **fields):
    config = {"dataset": "reviews.csv", "val_fraction": 0.1, "data_seed": 0,
              "source": {"test_file": ""}, **fields}
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps(config))
    return str(tmp_path / name)

  base = workdir("base")
  compare.check_same_test_split(base, workdir("other_model", model={"attention": "additive"}))
  with pytest.raises(compare.CompareError, match=r"config.data_seed is 0 in .*base and 1 in"):
    compare.check_same_test_split(base, workdir("seed", data_seed=1))
  with pytest.raises(compare.CompareError, match=r"config.val_fraction is 0.1 in .* and 0.2"):
    compare.check_same_test_split(base, workdir("fraction", val_fraction=0.2))
  # A given test file (or a TFDS test split) is not carved: the seed does not change it.
  given = {"source": {"test_file": "test.csv"}}
  compare.check_same_test_split(workdir("file_a", **given),
                                workdir("file_b", data_seed=1, **given))
  compare.check_same_test_split(workdir("tfds_a", dataset="imdb_reviews"),
                                workdir("tfds_b", dataset="imdb_reviews", data_seed=1))
  with pytest.raises(compare.CompareError, match=r"config.dataset is 'reviews.csv'"):
    compare.check_same_test_split(base, workdir("tfds_c", dataset="imdb_reviews"))
  compare.check_same_test_split(base, str(tmp_path))  # (no config.json: an ensemble's output)


def run_cli(*args):
  return subprocess.run([sys.executable, "-m", "textattn.compare", *map(str, args)],
                        check=False, capture_output=True, text=True, timeout=60)


def test_cli_reads_what_training_writes_and_refuses_bad_input_in_one_line(tmp_path):
  labels = np.array([0, 1, 1, 0, 1])
  for name, predictions in (("a", [0, 1, 0, 1, 1]), ("b", [0, 1, 1, 0, 1])):
    os.makedirs(tmp_path / name)
    compare.write_predictions(str(tmp_path / name), labels,
                            one_hot_probabilities(np.array(predictions)), ["neg", "pos"], 7)
  ok = run_cli(tmp_path / "a", tmp_path / "b")
  assert ok.returncode == 0, ok.stderr
  assert "A " in ok.stdout and "accuracy 0.6000" in ok.stdout and "accuracy 1.0000" in ok.stdout
  assert "B - A: +40.00 points" in ok.stdout and "only A right: 0; only B right: 2" in ok.stdout

  missing = run_cli(tmp_path / "a", tmp_path / "nowhere")
  assert missing.returncode == 2 and missing.stdout == ""
  assert missing.stderr.count("\n") == 1 and "does not exist" in missing.stderr

  os.makedirs(tmp_path / "c")
  compare.write_predictions(str(tmp_path / "c"), labels[:4],
                          one_hot_probabilities(labels[:4]), ["neg", "pos"], 7)
  mismatched = run_cli(tmp_path / "a", tmp_path / "c")
  assert mismatched.returncode == 2 and "not evaluated on the same test examples" in mismatched.stderr
  assert run_cli(tmp_path / "a").returncode == 2  # usage


def test_a_finished_run_of_another_task_is_named_as_such(tmp_path):
  # (it was told it had not finished: no test_predictions.npz)
  (tmp_path / "config.json").write_text('{"task": "language_model"}')
  with pytest.raises(compare.CompareError, match="is a language_model run: compare pairs"):
    compare.load_predictions(str(tmp_path))
  with pytest.raises(compare.CompareError, match="does not exist: give the workdir of a run"):
    compare.load_predictions(str(tmp_path / "missing"))
