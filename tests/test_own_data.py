"""Training on your own files (issue 26, "Your own data"): separate validation/test files,
headerless CSV/TSV named by config.source.columns, interval defaults that fit the data size, and the
HuffPost News Category config on a fixture in that format."""

import json
import pathlib
import re

import numpy as np
import pytest

from tests.test_train import final_report, run_main
from textattn import data as ip
from textattn import defaults
from textattn import run as runner
from textattn.data import file_source

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "configs"
NEWS_FIXTURE = REPO / "tests" / "fixtures" / "news_category.jsonl"


def make_config(tmp_path, dataset, **overrides):
  config = defaults.complete(defaults.classification())
  config.dataset = str(dataset)
  config.cache_dir = str(tmp_path / "cache")
  config.max_len = 8
  config.vocab_size = 200
  return defaults.set_fields(config, {k: str(v) if isinstance(v, pathlib.Path) else v
                                      for k, v in overrides.items()})


def write_tsv(path, rows, header="text\tlabel"):
  path.write_text("\n".join(([header] if header else []) + rows) + "\n", encoding="utf-8")
  return path


def rows(prefix, n, labels="ab"):
  """Row i's text starts with a word no other row (of any prefix) has."""
  return [f"{prefix}{i} shared\t{labels[i % len(labels)]}" for i in range(n)]


def split_sizes(data):
  return len(data.train), len(data.validation), len(data.test)


# ---- Separate split files -------------------------------------------------------------------


def test_split_files_are_used_whole_and_nothing_is_carved_for_them(tmp_path):
  train = write_tsv(tmp_path / "train.tsv", rows("tr", 30))
  validation = write_tsv(tmp_path / "validation.tsv", rows("va", 7))
  test = write_tsv(tmp_path / "test.tsv", rows("te", 5))
  # val_fraction is not needed (0 is allowed) when nothing is carved.
  data = ip.load_dataset(make_config(tmp_path, train, validation_file=validation,
                                     test_file=test, val_fraction=0.0), None)
  assert split_sizes(data) == (30, 7, 5)
  # The vocabulary is the training file's: held-out rows' unique first words are unknown (1).
  assert set(data.validation.inputs[:, 0].tolist()) == {1}
  assert set(data.test.inputs[:, 0].tolist()) == {1}
  assert len(set(data.train.inputs[:, 0].tolist())) == 30


@pytest.mark.parametrize("given, carved", [("validation", "test"), ("test", "validation")])
def test_a_split_without_its_own_file_is_carved_from_train_only(tmp_path, given, carved):
  train = write_tsv(tmp_path / "train.tsv", rows("tr", 40))
  held = write_tsv(tmp_path / f"{given}.tsv", rows("held", 6))
  config = make_config(tmp_path, train, val_fraction=0.1, **{f"{given}_file": held})
  data = ip.load_dataset(config, None)
  assert len(getattr(data, given)) == 6
  assert len(getattr(data, carved)) == 4 and len(data.train) == 36
  # What a run prints of it: the sizes, and which split was carved and how.
  assert ip.describe(config, data) == (
      f"Data: {train}: train 36, validation {len(data.validation)}, test {len(data.test)} "
      f"examples ({carved} carved from train: val_fraction=0.1, data_seed=0; {given}: {held}); "
      f"2 classes (a, b).")
  raw = file_source.FileSource(config).read(config.val_fraction, config.data_seed)
  assert all(t.startswith("held") for t in raw.texts[given])
  carved_texts = set(raw.texts[carved])  # from the training file, and out of train
  assert all(t.startswith("tr") for t in carved_texts)
  assert not carved_texts & set(raw.texts["train"])


def test_labels_are_normalised_across_files_and_an_unseen_test_label_is_named(tmp_path):
  train = write_tsv(tmp_path / "train.tsv", [f"tr{i} x\t{i % 2}" for i in range(20)])
  validation = write_tsv(tmp_path / "validation.tsv", ["va0 x\t1.0", "va1 x\t 0 "])
  test = write_tsv(tmp_path / "test.tsv", ["te0 x\t0", "te1 x\t1", "te2 x\t2.0"])
  config = make_config(tmp_path, train, validation_file=validation, test_file=test)
  with pytest.raises(ip.DataError, match=r"test.tsv, line 4: label '2' \(test split\) never "
                                         r"occurs in the training split \(its classes: 0, 1\)"):
    ip.load_dataset(config, None)
  write_tsv(test, ["te0 x\t0", "te1 x\t1.00"])
  data = ip.load_dataset(config, None)
  assert data.class_names == ["0", "1"]
  assert data.validation.labels.tolist() == [1, 0] and data.test.labels.tolist() == [0, 1]


def test_a_one_class_training_file_is_named_without_carving_advice(tmp_path):
  train = write_tsv(tmp_path / "train.tsv", rows("tr", 10, labels="a"))
  validation = write_tsv(tmp_path / "validation.tsv", rows("va", 4))
  test = write_tsv(tmp_path / "test.tsv", rows("te", 4))
  config = make_config(tmp_path, train, validation_file=validation, test_file=test)
  with pytest.raises(ip.DataError, match=r"train.tsv: the training split has only class 'a'; "
                                         r"a classifier needs at least two classes"):
    ip.load_dataset(config, None)


def test_cache_is_keyed_by_every_file(tmp_path, monkeypatch):
  train = write_tsv(tmp_path / "train.tsv", rows("tr", 30))
  validation = write_tsv(tmp_path / "validation.tsv", rows("va", 6))
  test = write_tsv(tmp_path / "test.tsv", rows("te", 6))
  config = make_config(tmp_path, train, validation_file=validation, test_file=test)
  ip.load_dataset(config, None)
  alone = make_config(tmp_path, train)
  ip.load_dataset(alone, None)  # the training file alone: its own entries, as before
  cache = pathlib.Path(config.cache_dir)
  assert len(list(cache.glob("train-word-*.npz"))) == 2

  with monkeypatch.context() as patch:  # the same files again: served from the cache
    patch.setattr(file_source.FileSource, "read", lambda *a: pytest.fail("cache not used"))
    assert split_sizes(ip.load_dataset(config, None)) == (30, 6, 6)
  write_tsv(test, rows("te", 9))  # another test file: read afresh, not a stale entry
  assert split_sizes(ip.load_dataset(config, None)) == (30, 6, 9)
  write_tsv(validation, rows("va", 3))
  assert split_sizes(ip.load_dataset(config, None)) == (30, 3, 9)
  assert len(list(cache.glob("train-word-*.npz"))) == 4


def test_a_file_changed_while_read_stops_the_run_and_caches_nothing(tmp_path, monkeypatch):
  train = write_tsv(tmp_path / "train.tsv", rows("tr", 30))
  config = make_config(tmp_path, train)
  original = file_source.FileSource.read

  def read_while_it_grows(self, *args):  # (a copy still running while the run reads it)
    raw = original(self, *args)
    with open(train, "a", encoding="utf-8") as f:
      f.write("late0 shared\tb\n")
    return raw

  monkeypatch.setattr(file_source.FileSource, "read", read_while_it_grows)
  with pytest.raises(ip.DataError, match=r"train.tsv changed while it was being read .*"
                                         r"Nothing was cached\."):
    ip.load_dataset(config, None)
  assert not list(pathlib.Path(config.cache_dir).glob("train-*"))
  monkeypatch.setattr(file_source.FileSource, "read", original)
  assert len(ip.load_dataset(config, None).train) > 0  # the finished file: read and cached
  assert list(pathlib.Path(config.cache_dir).glob("train-*"))


def test_an_unclosed_quote_in_a_tsv_is_named_not_read_into_one_text(tmp_path):
  train = write_tsv(tmp_path / "train.tsv", ['"Great film\tb', 'I loved it"\ta']
                    + rows("tr", 30))
  with pytest.raises(ip.DataError, match=re.escape(
      "train.tsv, line 2: a field holds a tab, so a quote (\") in it was never closed")):
    ip.load_dataset(make_config(tmp_path, train), None)


def test_a_column_named_twice_in_the_header_is_refused(tmp_path):
  train = write_tsv(tmp_path / "train.tsv", [f"{r}\tmore" for r in rows("tr", 30)],
                    header="text\tlabel\ttext")
  with pytest.raises(ip.DataError, match=re.escape(
      "line 1: column 'text' appears 2 times in the header (columns 1, 3); rename all but one")):
    ip.load_dataset(make_config(tmp_path, train), None)


@pytest.mark.parametrize("field, value, message", [
    ("validation_file", "v.tsv", (r"config.source.validation_file='v.tsv' is invalid; separate split "
                                 r"files need config.dataset to be a local file")),
    ("test_file", "t.csv", r"config.source.test_file='t.csv' is invalid; separate split files"),
    ("columns", "label,text", (r"config.source.columns='label,text' is invalid; it names the columns "
                              r"of headerless .csv/.tsv files, and config.dataset is a TFDS")),
])
def test_split_files_and_columns_are_refused_for_a_tfds_dataset(tmp_path, field, value,
                                                                 message):
  config = make_config(tmp_path, "imdb_reviews", data_dir=str(tmp_path / "tfds"),
                       **{field: value})
  with pytest.raises(ip.DataError, match=message):
    ip.validate_config(config)


def test_a_missing_split_file_and_a_needed_carve_are_one_sentence_each(tmp_path):
  train = write_tsv(tmp_path / "train.tsv", rows("tr", 20))
  with pytest.raises(ip.DataError, match=r"config.source.test_file='.*nope.tsv' is invalid \(file does "
                                         r"not exist\); give the path of an existing"):
    ip.validate_config(make_config(tmp_path, train, test_file=tmp_path / "nope.tsv"))
  test = write_tsv(tmp_path / "test.tsv", rows("te", 4))
  with pytest.raises(ip.DataError, match=r"val_fraction=0.0 is invalid; a local file needs "
                                         r"val_fraction > 0 to carve its validation split "):
    ip.validate_config(make_config(tmp_path, train, test_file=test, val_fraction=0.0))


# ---- Headerless CSV/TSV ---------------------------------------------------------------------

AG_NEWS = [  # AG News' train.csv layout: class index, title, description; no header row.
    ('"3","Wall St. Bears Claw Back Into the Black (Reuters)","Reuters - Short-sellers, '
    'Wall Street\'s dwindling band of ultra-cynics, are seeing green again."'),
    '"2","Olympics: Phelps Wins Again","Michael Phelps won his fifth gold medal."',
    ('"4","New Chip Promises Faster Phones","A chip maker said its design, ""twice as fast"", '
    'ships next year."'),
    '"1","Talks Resume in Capital","Negotiators met again on Tuesday."',
]


def write_ag_news(path, n=40):
  lines = [AG_NEWS[i % 4].replace('","', f'","n{i} ', 1) for i in range(n)]
  path.write_bytes(("\r\n".join(lines) + "\r\n").encode("utf-8"))
  return path


def test_headerless_csv_reads_every_row_by_the_named_columns(tmp_path):
  path = write_ag_news(tmp_path / "train.csv")
  config = make_config(tmp_path, path, columns="label,title,description",
                       text_fields="title,description", max_len=40)
  raw = file_source.FileSource(config).read(config.val_fraction, config.data_seed)
  assert sum(len(t) for t in raw.texts.values()) == 40  # line 1 is data, not a header
  assert raw.class_names == ["1", "2", "3", "4"]
  texts = [t for split in raw.texts.values() for t in split]
  assert "n0 Wall St. Bears Claw Back Into the Black (Reuters) Reuters - Short-sellers, Wall " \
         "Street's dwindling band of ultra-cynics, are seeing green again." in texts
  assert any('A chip maker said its design, "twice as fast", ships next year.' in t
             for t in texts)
  data = ip.load_dataset(config, None)
  assert data.class_names == ["1", "2", "3", "4"] and split_sizes(data) == (32, 4, 4)


def test_headerless_tsv_with_split_files(tmp_path):
  train = write_tsv(tmp_path / "train.tsv", [f"{i % 2}\ttr{i} x" for i in range(20)], header="")
  test = write_tsv(tmp_path / "test.tsv", ["1\tte0 x", "0\tte1 x"], header="")
  data = ip.load_dataset(make_config(tmp_path, train, columns="label,text", test_file=test),
                         None)
  assert split_sizes(data) == (18, 2, 2) and data.test.labels.tolist() == [1, 0]


def test_a_row_with_another_field_count_than_columns_names_file_and_line(tmp_path):
  path = write_ag_news(tmp_path / "train.csv", n=12)
  path.write_bytes(path.read_bytes() + b'"2","only a title"\r\n')
  config = make_config(tmp_path, path, columns="label,title,description",
                       text_fields="title,description")
  with pytest.raises(ip.DataError, match=r"train.csv, line 13: expected 3 fields \(',' *"
                                         r"-separated; config.source.columns names 3 \(label,title,"
                                         r"description\)\), found 2"):
    ip.load_dataset(config, None)


def test_columns_given_for_a_file_with_a_header_row_is_named(tmp_path):
  path = write_tsv(tmp_path / "d.tsv", rows("r", 20))  # has the header "text\tlabel"
  with pytest.raises(ip.DataError, match=r"d.tsv, line 1: the label column holds 'label', its "
                                         r"own name: the file has a header row, so leave "
                                         r"config.source.columns empty"):
    ip.load_dataset(make_config(tmp_path, path, columns="text,label"), None)


@pytest.mark.parametrize("columns, dataset, message", [
    ("title,description", "d.csv", (r"config.source.columns='title,description' is invalid; it lacks "
                                   r"\['text', 'label'\]")),
    ("text,label,text", "d.csv", (r"config.source.columns='text,label,text' is invalid; each column "
                                 r"name must differ")),
    ("text,label", "d.jsonl", (r"config.source.columns='text,label' is invalid for .*d.jsonl: it names "
                              r"the columns of headerless .csv/.tsv files")),
])
def test_bad_columns_are_one_sentence(tmp_path, columns, dataset, message):
  path = tmp_path / dataset
  path.write_text("x\n", encoding="utf-8")
  with pytest.raises(ip.DataError, match=message):
    ip.validate_config(make_config(tmp_path, path, columns=columns))


def test_headerless_cache_entries_differ_from_a_header_reading_of_the_same_bytes(tmp_path):
  path = write_tsv(tmp_path / "d.tsv", [f"tr{i} x\t{'ab'[i % 2]}" for i in range(30)],
                   header="first row\tb")
  headed = make_config(tmp_path, path, text_fields="first row", label_field="b")
  headless = make_config(tmp_path, path, columns="text,label")
  assert split_sizes(ip.load_dataset(headed, None)) == (24, 3, 3)
  data = ip.load_dataset(headless, None)  # the header line is an example now
  assert sum(split_sizes(data)) == 31


# ---- Interval defaults ----------------------------------------------------------------------


def intervals(config, steps_per_epoch):
  schedule = runner.schedule(config, steps_per_epoch)
  return schedule.total_steps, schedule.eval_every, schedule.checkpoint_every


def test_default_intervals_evaluate_several_times_per_epoch_of_any_size():
  config = defaults.complete(defaults.classification())
  assert intervals(config, 175) == (350, 43, 43)  # ~7,000 rows at batch 32: 4 per epoch
  assert intervals(config, 625) == (1250, 156, 156)  # ~25,000 rows
  assert intervals(config, 2) == (4, 1, 1)  # at least every step
  config.evals_per_epoch = 1  # what 0 meant before evals_per_epoch: once per epoch
  assert intervals(config, 175) == (350, 175, 175)


def test_explicit_intervals_resolve_as_before():
  config = defaults.complete(defaults.classification())
  config.update(eval_every_steps=10, checkpoint_every_steps=30)
  assert intervals(config, 175) == (350, 10, 30)
  config.checkpoint_every_steps = 0  # automatic, rounded to the eval grid under "best"
  assert intervals(config, 175) == (350, 10, 40)
  config.final_params = "last"
  assert intervals(config, 175) == (350, 10, 43)
  config.update(final_params="best", eval_every_steps=0, checkpoint_every_steps=30)
  with pytest.raises(ValueError, match=r"config.checkpoint_every_steps=30 must be a multiple "
                                       r"of the evaluation interval \(43 steps"):
    intervals(config, 175)
  config.update(checkpoint_every_steps=0, evals_per_epoch=0)
  with pytest.raises(ValueError, match=r"config.evals_per_epoch=0 is invalid"):
    intervals(config, 175)


# Every shipped config's (total steps, eval interval, checkpoint interval) at a fixed epoch
# length: IMDB's 703 steps of 32 (22,500 training reviews); the news config at 2,510 steps of 64
# (200,853 lines less 20%). A change here changes a documented result's training or an old
# workdir's resume grid: it must be deliberate.
SHIPPED = {
    "imdb_causal": (703, (1406, 350, 350)),
    "imdb_fastformer": (703, (1406, 350, 350)),
    "imdb_softmax": (703, (2109, 350, 350)),
    "imdb_keras_example": (781, (1562, 781, 781)),  # all 25,000 (val_fraction=0): per epoch
    "imdb_keras_fast": (781, (781, 781, 781)),
    "lra_text_softmax": (703, (20000, 1000, 1000)),
    "lra_text_additive": (703, (20000, 1000, 1000)),
    "lra_text_causal": (703, (20000, 1000, 1000)),
    "news_category_fastformer": (2510, (7530, 627, 627)),
}


def test_every_shipped_config_has_its_intervals_pinned():
  # The baseline (10-epoch, one eval per epoch) and translation configs are not pinned yet.
  assert set(SHIPPED) <= {p.stem for p in CONFIG_DIR.glob("*.py")}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_configs_resolve_to_their_intervals(name):
  steps_per_epoch, expected = SHIPPED[name]
  assert intervals(defaults.complete(defaults.load(str(CONFIG_DIR / f"{name}.py"))), steps_per_epoch) == expected


@pytest.mark.parametrize("name", ["imdb_softmax", "imdb_fastformer", "imdb_causal"])
def test_imdb_intervals_do_not_leak_into_a_users_small_file(name):
  config = defaults.complete(defaults.load(str(CONFIG_DIR / f"{name}.py")))
  config.dataset = "imdb_reviews/plain_text:1.0.0"  # the same data set: its 350 steps
  assert intervals(config, 703)[1:] == (350, 350)
  config.dataset = "mine.csv"  # ~6,300 training rows: 4 evaluations per epoch of them
  assert intervals(config, 197)[1:] == (49, 49)


# ---- HuffPost News Category -----------------------------------------------------------------


def test_news_category_config_trains_end_to_end_on_a_fixture_in_that_format(tmp_path):
  lines = [json.loads(line) for line in NEWS_FIXTURE.read_text(encoding="utf-8").splitlines()]
  categories = sorted({line["category"] for line in lines})
  assert len(lines) >= 50 and len(categories) >= 5
  assert all({"category", "headline", "short_description"} <= set(line) for line in lines)

  path = CONFIG_DIR / "news_category_fastformer.py"
  config = defaults.complete(defaults.load(str(path)))
  config.update(dataset=str(NEWS_FIXTURE), cache_dir=str(tmp_path / "cache"))
  runner.validate(config, 1)
  ip.validate_config(config)
  data = ip.load_dataset(config, None)
  assert data.class_names == categories
  assert split_sizes(data) == (48, 6, 6)

  workdir = tmp_path / "run"
  result = run_main([f"--config={path}", f"--config.dataset={NEWS_FIXTURE}",
                     f"--config.cache_dir={tmp_path / 'cache'}", "--config.num_train_steps=2",
                     "--config.batch_size=8", "--config.platform.eval_batch_size=16"], workdir)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  [data_line] = [line for line in result.stdout.splitlines() if line.startswith("Data: ")]
  assert "train 48, validation 6, test 6 examples (validation and test carved from train: " in (
      data_line)
  report = final_report(workdir)
  assert 0.0 <= report["test/f1_weighted"] <= 1.0 and report["test/params_from_step"] in (1, 2)
  info = json.loads((workdir / ip.DATA_INFO_FILE).read_text(encoding="utf-8"))
  assert info["class_names"] == categories
  assert np.isfinite(report["test/loss"])


# ---- A split file whose text column has another name -----------------------------------------


def test_each_split_file_keeps_its_header_with_its_own_text_fields(tmp_path):
  train = write_tsv(tmp_path / "train.tsv", rows("tr", 30), header="sentence\tlabel")
  validation = write_tsv(tmp_path / "validation.tsv", rows("va", 7), header="content\tlabel")
  test = write_tsv(tmp_path / "test.tsv", rows("te", 5), header="sentence\tlabel")
  config = make_config(tmp_path, train, validation_file=validation, test_file=test,
                       text_fields="sentence", validation_text_fields="content")
  data = ip.load_dataset(config, None)
  assert split_sizes(data) == (30, 7, 5)
  raw = file_source.FileSource(config).read(config.val_fraction, config.data_seed)
  assert raw.texts["validation"][0] == "va0 shared" and raw.texts["test"][0] == "te0 shared"
  # Without the option the file's own header is named, and the option that fixes it.
  config.source.validation_text_fields = ""
  with pytest.raises(ip.DataError, match=r"validation.tsv, line 1: column\(s\) \['sentence'\] "
                     r"not found; the header has \['content', 'label'\] \(set "
                     r"--config.source.validation_text_fields"):
    ip.load_dataset(config, None)


def test_text_fields_of_a_split_without_a_file_are_refused_in_one_sentence(tmp_path):
  train = write_tsv(tmp_path / "train.tsv", rows("tr", 30))
  config = make_config(tmp_path, train, test_text_fields="content")
  with pytest.raises(ip.DataError, match="config.source.test_text_fields='content' names the text "
                     "fields of config.source.test_file, which is not set"):
    ip.validate_config(config)


# ---- A model that collapsed to one class --------------------------------------------------------


def test_an_evaluation_whose_predictions_are_one_class_says_so_and_what_to_try():
  from textattn.tasks import classification
  names = ["business", "sports", "tech", "world"]
  collapsed = {"count": 8, "loss_sum": 8 * np.log(4), "correct": 2,
               "confusion": np.array([[0, 0, 2, 0], [0, 0, 2, 0], [0, 0, 2, 0], [0, 0, 2, 0]])}
  warning = classification.collapse_warning(collapsed, names, "val")
  assert warning == (
      "Warning: all 8 validation examples are predicted 'tech': the model has collapsed to one "
      "class; its loss 1.3863 is near ln 4 = 1.3863, what a uniform guess scores; try a lower "
      "optimizer.learning_rate, another seed, or on a small data set the n-gram baseline "
      "(configs/imdb_nbsvm.py).")
  # Two classes predicted at a learnt loss, or a split whose examples are all of the one class:
  # nothing to say.
  mixed = dict(collapsed, loss_sum=8 * 0.9,
               confusion=np.array([[2, 0, 0, 0], [0, 0, 2, 0], [0, 0, 2, 0], [0, 0, 2, 0]]))
  one_truth = dict(collapsed, confusion=np.array([[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 8, 0],
                                                  [0, 0, 0, 0]]))
  assert classification.collapse_warning(mixed, names, "val") is None
  assert classification.collapse_warning(one_truth, names, "test") is None


def test_an_evaluation_at_a_uniform_guess_loss_and_chance_accuracy_says_so():
  # Seen on IMDB with additive attention swapped into MiniLM (seed 1, step 175): validation
  # accuracy 0.4860 at loss 0.6935 = ln 2, predictions of both classes, so no one-class warning.
  from textattn.tasks import classification
  names = ["neg", "pos"]
  at_chance = {"count": 2500, "loss_sum": 2500 * 0.6935, "correct": 1215,
               "confusion": np.array([[615, 645], [640, 600]])}
  warning = classification.collapse_warning(at_chance, names, "val")
  assert warning == (
      "Warning: the validation loss 0.6935 is near ln 2 = 0.6931, what a uniform guess scores, "
      "and the accuracy 0.4860 is no better than always predicting the most frequent class "
      "(0.5040): the model has learnt nothing yet; if later evaluations say the same, try a lower "
      "optimizer.learning_rate, another seed, or on a small data set the n-gram baseline "
      "(configs/imdb_nbsvm.py).")
  # The same loss with a better-than-majority accuracy (small logits, mostly right), or a chance
  # accuracy at a loss the model has learnt to lower: nothing to say.
  unsure_but_right = dict(at_chance, confusion=np.array([[900, 360], [390, 850]]))
  lower_loss = dict(at_chance, loss_sum=2500 * 0.64)
  assert classification.collapse_warning(unsure_but_right, names, "val") is None
  assert classification.collapse_warning(lower_loss, names, "test") is None


# ---- Caches ----------------------------------------------------------------------------------


def test_every_cache_is_under_one_root_that_honours_xdg_cache_home(tmp_path, monkeypatch):
  from textattn.attention import native
  from textattn.data import cache
  config = defaults.complete(defaults.classification())
  for name in ("TEXTATTN_CACHE", "TEXTATTN_NATIVE_CACHE", "XDG_CACHE_HOME"):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert cache.cache_dir(config) == str(tmp_path / "home" / ".cache" / "textattn")  # as before
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert cache.cache_dir(config) == str(tmp_path / "xdg" / "textattn")
  assert native.cache_dir() == tmp_path / "xdg" / "textattn" / "native"
  monkeypatch.setenv("TEXTATTN_CACHE", str(tmp_path / "mine"))
  assert cache.cache_dir(config) == str(tmp_path / "mine")
  assert native.cache_dir() == tmp_path / "mine" / "native"
  config.cache_dir = str(tmp_path / "configured")  # the config's own setting wins
  assert cache.cache_dir(config) == str(tmp_path / "configured")
