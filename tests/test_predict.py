"""textattn.predict / textattn.load: a trained workdir used on new text."""

import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import textattn
from tests.test_train import REPO, tiny_config, write_sentiment_jsonl
from textattn import compare
from textattn import run as runner
from textattn.data import file_source
from textattn.errors import DataError


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("predict")
  data = write_sentiment_jsonl(tmp / "reviews.jsonl")
  config = tiny_config(data, tmp / "cache", num_train_steps=60, eval_every_steps=20,
                       checkpoint_every_steps=20)
  report = runner.train_and_evaluate(config, str(tmp / "run"))
  return tmp, config, report


def test_predictions_are_the_training_runs_test_predictions(trained):
  tmp, config, report = trained
  raw = file_source.FileSource(config).read(config.val_fraction, config.data_seed)
  model = textattn.load(str(tmp / "run"))
  assert model.step == report["test/params_from_step"]  # "best": what the report used
  probabilities = model.predict_proba(raw.texts["test"])
  labels, expected = compare.load_predictions(str(tmp / "run"))
  np.testing.assert_allclose(probabilities, expected, rtol=1e-6, atol=1e-7)
  accuracy = np.mean(probabilities.argmax(-1) == labels)
  assert accuracy == pytest.approx(report["test/accuracy"])
  rows = model.predict(raw.texts["test"][:3])
  assert [r["label"] for r in rows] == [model.class_names[i] for i in expected[:3].argmax(-1)]
  assert set(rows[0]["probabilities"]) == {"neg", "pos"}


def test_evaluate_a_labelled_file_and_empty_or_long_texts(trained):
  tmp, config, _ = trained
  model = textattn.load(str(tmp / "run"), checkpoint="last")
  metrics = model.evaluate(str(tmp / "reviews.jsonl"))
  assert metrics["eval/count"] == 480 and metrics["eval/accuracy"] > 0.8, metrics
  assert metrics["eval/skipped_blank"] == 0
  # Blank texts are left out (training leaves them out; predict gives them no label), counted.
  with_blanks = tmp / "with_blanks.jsonl"
  with_blanks.write_text((tmp / "reviews.jsonl").read_text()
                         + '{"text": " ", "label": "pos"}\n{"text": "", "label": "neg"}\n')
  again = model.evaluate(str(with_blanks))
  assert again == {**metrics, "eval/skipped_blank": 2}
  assert "eval/f1_weighted" in metrics and "eval/recall_pos" in metrics
  empty, blank, long = model.predict(["", " \t", "good " * 100])
  # A blank text gets no prediction (training skips them: no class was learnt for "nothing").
  assert empty == {"text": "", "label": None, "probabilities": None, "tokens": 0,
                   "truncated": False}
  assert blank["label"] is None and blank["probabilities"] is None
  assert long["tokens"] == config.max_len and long["truncated"]


def test_cli_writes_json_lines_and_refuses_bad_requests_in_one_line(trained, tmp_path):
  tmp, _, _ = trained
  texts = tmp_path / "texts.txt"
  texts.write_bytes(b"what a good film\nbad \xff\xfe bytes here\n\n")
  run = lambda *args: subprocess.run([sys.executable, "-m", "textattn.predict",
                                      f"--workdir={tmp / 'run'}", *args], cwd=REPO,
                                     capture_output=True, text=True, check=False)
  done = run(f"--input={texts}", f"--output={tmp_path / 'out.jsonl'}")
  assert done.returncode == 0, done.stderr[-2000:]
  rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
  assert [r["text"] for r in rows] == ["what a good film", "bad \ufffd\ufffd bytes here", ""]
  assert "1 line(s) are not valid UTF-8" in done.stderr
  assert rows[2]["label"] is None and "1 blank text(s)" in done.stderr  # (the empty line)
  # A training run's save in flight (Orbax's temporary step directory) is left alone: readers
  # once ran Orbax's start-up clean-up, which deleted it (and could print a thread's traceback
  # when they exited quickly, as the --checkpoint=999 error below does).
  in_flight = tmp / "run" / "checkpoints" / "80.orbax-checkpoint-tmp-1764640000"
  in_flight.mkdir()
  (in_flight / "part").write_text("written by the training run")
  one = run("--text=a good one", "--text=awful")
  assert one.returncode == 0 and len(one.stdout.splitlines()) == 2
  assert (in_flight / "part").read_text() == "written by the training run"
  shutil.rmtree(in_flight)
  broken = tmp_path / "broken.jsonl"
  broken.write_text('{"text": "fine"}\n{"text": \n[1, 2]\n')
  empty = tmp_path / "empty.txt"  # (an empty .txt once gave one blank row, exit 0)
  empty.write_text("")
  other = tmp_path / "other.jsonl"
  other.write_text('{"text": "fine"}\n{"body": "no text field"}\n')
  for args, message in [(["--text=x", "--checkpoint=999"], "--checkpoint='999' is not available"),
                        ([], "give the texts with --text=STR"),
                        ([f"--input={broken}"], "line 2: invalid JSON"),
                        ([f"--input={other}"], "line 2: field(s) ['text'] not found"),
                        # (refused before the model loads, not after every text is predicted)
                        ([f"--input={texts}", f"--output={tmp_path}"], "is a directory; give"),
                        # (they were overwritten: the input by its predictions, the run's files)
                        ([f"--input={texts}", f"--output={texts}"], "is the --input file"),
                        (["--text=x", f"--output={tmp / 'run' / 'config.json'}"],
                         "is inside the --workdir"),
                        (["--text=x", f"--explain={texts}"], "is a file; give a folder"),
                        ([f"--input={empty}"], "holds no text to predict")]:
    bad = run(*args)
    assert bad.returncode != 0 and message in bad.stderr, bad.stderr[-2000:]
    assert "Traceback" not in bad.stderr
  assert json.loads((tmp / "run" / "config.json").read_text())  # (untouched)


@pytest.mark.parametrize("name, content, message", [
    ("comma.csv", "text,label\nHello, world,pos\n",
     "line 2: expected 2 fields (','-separated; the header has 2)"),
    ("quote.csv", 'text,label\n"abc"def,pos\n', "line 2: malformed CSV"),
    ("twice.tsv", "text\tlabel\ttext\na\tpos\tb\n", "column 'text' appears 2 times"),
    ("stray.tsv", 'text\tlabel\n"Great film\tpos\nI loved it"\tneg\n',
     "line 2: a field holds a tab, so a quote"),
    ("list.jsonl", '{"text": ["a", "b"]}\n', "line 1: field 'text' must be a string, found list"),
    ("zero.jsonl", '{"text": 0}\n', "line 1: field 'text' must be a string, found int"),
], ids=["extra_field", "bad_quote", "duplicate_column", "unclosed_tsv_quote", "json_list",
         "json_number"])
def test_a_file_to_predict_is_read_as_strictly_as_training_reads_it(trained, tmp_path, name,
                                                                     content, message):
  # Training refuses each of these in one line; prediction once read them silently otherwise
  # ("Hello" as the text and "world" as the label; the last "text" column; "['a', 'b']").
  tmp, _, _ = trained
  path = tmp_path / name
  path.write_text(content, encoding="utf-8")
  with pytest.raises(DataError, match=re.escape(message)):
    textattn.load(str(tmp / "run")).read_texts(str(path))


def test_check_output_judges_the_file_it_would_replace(tmp_path):
  # atomic_write replaces a symlink itself, not its target: a link pointing into the workdir (or
  # at the input) is a fine --output; a file in a folder whose name only starts alike too.
  from textattn.predict import check_output
  workdir, elsewhere = tmp_path / "wd", tmp_path / "out"
  workdir.mkdir()
  elsewhere.mkdir()
  (workdir / "pred.jsonl").write_text("")
  (elsewhere / "latest.jsonl").symlink_to(workdir / "pred.jsonl")
  check_output(str(elsewhere / "latest.jsonl"), str(workdir), (str(workdir / "pred.jsonl"),))
  check_output(str(tmp_path / "wdx" / "p.jsonl"), str(workdir))
  with pytest.raises(DataError, match="inside the --workdir"):
    check_output(str(workdir / "sub" / ".." / "p.jsonl"), str(workdir))
  with pytest.raises(DataError, match="is the --input file"):
    check_output(str(elsewhere / ".." / "out" / "latest.jsonl"), "",
                 (str(elsewhere / "latest.jsonl"),))
