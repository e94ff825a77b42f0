"""Input pipeline: sources, train-only vocabulary, caching, workdir reuse, batches, bad input."""

import hashlib
import itertools
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from textattn import data as ip
from textattn import defaults
from textattn.data import cache as cache_lib
from textattn.data import file_source, tfds_source
from textattn.data import tokenizer as tokenizer_lib
from textattn.tasks.classification import classifier

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
# The Kaggle file, when a checkout sits beside ../shared: checked as well, not instead.
TWEETS = pathlib.Path(__file__).resolve().parents[2] / "shared/data/disaster-tweets/train.csv"


def make_config(tmp_path, dataset="imdb_reviews", **overrides):
  config = defaults.complete(defaults.classification())
  config.dataset = str(dataset)
  config.data_dir = str(tmp_path / "tfds")
  config.cache_dir = str(tmp_path / "cache")
  config.max_len = 8
  config.vocab_size = 200
  return defaults.set_fields(config, overrides)


def write_csv(path, rows, header="text,label"):
  path.write_bytes(("\r\n".join([header] + rows) + "\r\n").encode("utf-8"))
  return path


def unique_word_rows(n):
  """Row i's text starts with a word no other row has."""
  return [f"uniq{i} shared,{'pos' if i % 2 else 'neg'}" for i in range(n)]


def fake_tfds(splits):
  """Mocks TFDS so that split -> list of (text bytes, label) examples."""
  def as_dataset(self, split, *args, **kwargs):
    del self, args, kwargs
    texts, labels = zip(*splits[str(split)])
    return tf.data.Dataset.from_tensor_slices(
        {"text": list(texts), "label": np.array(labels, np.int64)})
  return tfds.testing.mock_data(as_dataset_fn=as_dataset)


def first_tokens(split):
  return split.inputs[:, 0]


def files_under(path):
  return {p: p.read_bytes() for p in pathlib.Path(path).rglob("*") if p.is_file()}


# ---- TFDS ---------------------------------------------------------------------------------


def test_imdb_mock_gives_three_int32_splits_with_right_padding(tmp_path):
  config = make_config(tmp_path)
  with tfds.testing.mock_data(num_examples=40):
    data = ip.load_dataset(config, None)
  assert (len(data.train), len(data.validation), len(data.test)) == (36, 4, 40)
  assert data.class_names == ["neg", "pos"]
  assert 2 < data.vocab_size <= config.vocab_size
  for split in (data.train, data.validation, data.test):
    assert split.inputs.dtype == np.int32 and split.labels.dtype == np.int32
    assert split.inputs.shape == (len(split), config.max_len)
    # Left-aligned: once a row reaches padding it stays padding.
    padding = split.inputs == 0
    assert (padding[:, :-1] <= padding[:, 1:]).all()
  assert not list(pathlib.Path(config.cache_dir).glob("*"))  # Mocked TFDS is never cached.


def test_tfds_vocabulary_is_counted_on_train_after_carving_validation(tmp_path):
  train = [(f"uniq{i} shared".encode(), i % 2) for i in range(40)]
  test = [(b"testonly shared", 0)] * 3
  config = make_config(tmp_path, val_fraction=0.1)
  with fake_tfds({"train": train, "test": test}):
    data = ip.load_dataset(config, None)
  assert len(data.validation) == 4 and len(data.test) == 3
  assert (first_tokens(data.train) >= 2).all()
  assert (first_tokens(data.validation) == tokenizer_lib.OOV_ID).all()
  assert (first_tokens(data.test) == tokenizer_lib.OOV_ID).all()


def test_tfds_cache_round_trip_including_an_empty_validation_split(tmp_path, monkeypatch):
  train = [(f"uniq{i} shared".encode(), i % 2) for i in range(12)]
  config = make_config(tmp_path, val_fraction=0.0)
  (tmp_path / "tfds" / "imdb_reviews").mkdir(parents=True)
  (tmp_path / "tfds" / "imdb_reviews" / "prepared.tfrecord").write_bytes(b"x")
  monkeypatch.setattr(tfds_source.TfdsSource, "cacheable", lambda self: True)  # Mocked data is not.
  with fake_tfds({"train": train, "test": train[:3]}):
    first = ip.load_dataset(config, None)
    monkeypatch.setattr(tfds_source.TfdsSource, "read", lambda *args: pytest.fail("cache not used"))
    again = ip.load_dataset(config, None)
  assert (len(first.train), len(first.validation), len(first.test)) == (12, 0, 3)
  assert again.validation.inputs.shape == (0, config.max_len)
  np.testing.assert_array_equal(again.train.inputs, first.train.inputs)


def test_recopied_tfds_dir_keeps_its_cache_and_changed_bytes_do_not(tmp_path, monkeypatch):
  """The cache key holds the prepared files' contents: a copy with new modification times (a
  re-synced data dir) is served from the cache; a file whose bytes change is not."""
  train = [(f"uniq{i} shared".encode(), i % 2) for i in range(12)]
  config = make_config(tmp_path, val_fraction=0.0)
  prepared = tmp_path / "tfds" / "imdb_reviews" / "prepared.tfrecord"
  prepared.parent.mkdir(parents=True)
  prepared.write_bytes(b"records v1")
  monkeypatch.setattr(tfds_source.TfdsSource, "cacheable", lambda self: True)  # Mocked data is not.
  with fake_tfds({"train": train, "test": train[:3]}):
    ip.load_dataset(config, None)
    prepared.unlink()
    prepared.write_bytes(b"records v1")  # the same bytes, re-copied: a new mtime
    os.utime(prepared, ns=(1, 1))
    with monkeypatch.context() as patch:
      patch.setattr(tfds_source.TfdsSource, "read", lambda *args: pytest.fail("cache not used"))
      ip.load_dataset(config, None)
    prepared.write_bytes(b"records v2")  # same size, new bytes: must be read again
    with monkeypatch.context() as patch:
      patch.setattr(tfds_source.TfdsSource, "read", lambda *args: pytest.fail("cache not used"))
      with pytest.raises(pytest.fail.Exception, match="cache not used"):
        ip.load_dataset(config, None)


def test_content_digest_is_memoised_by_path_size_and_mtime(tmp_path):
  data = tmp_path / "d.bin"
  data.write_bytes(b"abc")
  memo_dir = tmp_path / "cache"
  digest = ip.content_digest(str(data), str(memo_dir), write=False)
  assert not memo_dir.exists()  # write=False (non-zero processes) writes nothing
  cache_lib._DIGESTS.clear()  # (a new process)
  assert ip.content_digest(str(data), str(memo_dir)) == digest == hashlib.sha256(b"abc").hexdigest()
  (memo_file,) = (memo_dir / "digests").iterdir()
  memo_file.write_text("f" * 64)  # a new process is served from the memo, not the file
  cache_lib._DIGESTS.clear()
  assert ip.content_digest(str(data), str(memo_dir)) == "f" * 64
  assert ip.content_digest(str(data), None) == "f" * 64  # and this process remembers it
  memo_file.write_text("garbage")  # an unreadable memo is recomputed, not trusted
  cache_lib._DIGESTS.clear()
  assert ip.content_digest(str(data), str(memo_dir)) == digest


def test_tfds_invalid_utf8_names_split_and_example(tmp_path):
  train = [(b"fine text", 0)] * 5 + [(b"bad \xff byte", 1)]
  with (fake_tfds({"train": train, "test": train}),
        pytest.raises(ip.DataError, match=r"split 'train', example 5.*invalid UTF-8")):
    ip.load_dataset(make_config(tmp_path), None)


def test_tfds_empty_texts_are_skipped_and_counted(tmp_path):
  train = [(b"some words", i % 2) for i in range(20)] + [(b"   ", 0), (b"", 1)]
  with fake_tfds({"train": train, "test": train}):
    data = ip.load_dataset(make_config(tmp_path), None)
  assert data.skipped == {"train": 2, "test": 2}
  assert len(data.train) + len(data.validation) == 20 and len(data.test) == 20


def test_tfds_not_prepared_and_offline_is_one_clear_error(tmp_path, monkeypatch):
  asked = []  # (so the test cannot pass by really being offline with the check unpatched)
  monkeypatch.setattr(tfds_source, "network_available", lambda *args: asked.append(args) or False)
  with pytest.raises(ip.DataError, match="TFDS_DATA_DIR.*--config.data_dir") as error:
    ip.load_dataset(make_config(tmp_path), None)
  assert str(tmp_path / "tfds") in str(error.value) and asked == [()]


def test_unknown_tfds_name_is_a_data_error(tmp_path):
  with pytest.raises(ip.DataError, match="no_such_dataset_xyz.*neither an existing local file"):
    ip.load_dataset(make_config(tmp_path, dataset="no_such_dataset_xyz"), None)


# ---- Local files ---------------------------------------------------------------------------


def test_csv_quoted_multiline_crlf_fields_are_read_whole(tmp_path):
  texts = ['He said ""hi"", then left', "line one\r\nline two, with comma", "plain",
           "x\ny", "café ünïcode"]
  rows = [f'{i},"{t}",{"ab"[i % 2]}' for i, t in enumerate(texts * 4)]
  path = write_csv(tmp_path / "data.csv", rows, header="id,text,label")
  config = make_config(tmp_path, dataset=path, tokenizer="byte", max_len=64,
                       truncation="post", val_fraction=0.1)
  data = ip.load_dataset(config, None)
  decoded = []
  for split in (data.train, data.validation, data.test):
    for row in split.inputs:
      decoded.append(bytes((row[row > 0] - 2).astype(np.uint8).tolist()).decode("utf-8"))
  expected = [t.replace('""', '"') for t in texts * 4]
  assert sorted(decoded) == sorted(expected)
  assert data.class_names == ["a", "b"] and data.vocab_size == 258


def test_jsonl_joins_text_fields_and_sorts_label_names(tmp_path):
  records = [{"headline": f"head{i}", "short_description": None if i % 3 else f"desc{i}",
              "category": ["POLITICS", "WELLNESS", "ARTS"][i % 3]} for i in range(30)]
  path = tmp_path / "news.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n", encoding="utf-8")
  config = make_config(tmp_path, dataset=path, text_fields="headline,short_description",
                       label_field="category", val_fraction=0.2, vocab_size=1000)
  workdir = tmp_path / "work"
  data = ip.load_dataset(config, str(workdir))
  assert data.class_names == ["ARTS", "POLITICS", "WELLNESS"]
  assert (len(data.train), len(data.validation), len(data.test)) == (18, 6, 6)
  tokenizer, class_names = ip.load_tokenizer(str(workdir))
  assert class_names == data.class_names
  both = tokenizer.encode(["head0 desc0"], config.max_len, "post")[0]
  assert both[0] > 1 and both[1] > 1 and both[2] == 0
  all_inputs = np.concatenate([data.train.inputs, data.validation.inputs, data.test.inputs])
  assert any((row == both).all() for row in all_inputs)


def test_file_vocabulary_is_counted_on_train_only(tmp_path):
  path = write_csv(tmp_path / "d.csv", unique_word_rows(50))
  data = ip.load_dataset(make_config(tmp_path, dataset=path, val_fraction=0.2), None)
  assert (len(data.train), len(data.validation), len(data.test)) == (30, 10, 10)
  assert (first_tokens(data.train) >= 2).all()
  assert (first_tokens(data.validation) == tokenizer_lib.OOV_ID).all()
  assert (first_tokens(data.test) == tokenizer_lib.OOV_ID).all()


def test_carving_is_deterministic_in_data_seed(tmp_path):
  """Every load carves afresh (a new cache dir each time, so none is served from the cache):
  the same data_seed gives the same train / validation / test rows, another seed other ones,
  and the three splits always partition the file's rows."""
  path = write_csv(tmp_path / "d.csv", unique_word_rows(50))
  loads = itertools.count()

  def carve(seed):
    config = make_config(tmp_path, dataset=path, data_seed=seed, tokenizer="byte", max_len=32,
                         truncation="post", cache_dir=str(tmp_path / f"cache{next(loads)}"))
    data = ip.load_dataset(config, None)
    return [sorted(bytes((row[row > 0] - 2).tolist()).decode().split()[0] for row in split.inputs)
            for split in (data.train, data.validation, data.test)]
  first = carve(0)
  assert carve(0) == first
  assert carve(1)[1] != first[1]
  for train, validation, test in (first, carve(1), carve(7)):
    assert (len(train), len(validation), len(test)) == (40, 5, 5)
    assert sorted(train + validation + test) == sorted(f"uniq{i}" for i in range(50))
  assert len(list(tmp_path.glob("cache*/*.npz"))) == 5  # every load carved and encoded itself


@pytest.mark.parametrize("truncation, kept", [("pre", ["w7", "w8", "w9"]),
                                              ("post", ["w0", "w1", "w2"])])
def test_truncation_side_end_to_end(tmp_path, truncation, kept):
  text = " ".join(f"w{i}" for i in range(10))
  path = write_csv(tmp_path / "d.csv", [f"{text},{i % 2}" for i in range(20)])
  workdir = tmp_path / truncation
  config = make_config(tmp_path, dataset=path, max_len=3, truncation=truncation)
  data = ip.load_dataset(config, str(workdir))
  tokenizer, _ = ip.load_tokenizer(str(workdir))
  assert [tokenizer.words[i - 2] for i in data.train.inputs[0]] == kept


def test_disaster_tweets_format_csv(tmp_path):
  """tests/fixtures/disaster_tweets.csv: the Kaggle file's format (id,keyword,location,text,
  target; CRLF; empty keyword and location fields; quoted fields with commas, doubled quotes
  and line breaks, LF and CRLF, inside), 36 rows written for this test, one of them blank."""
  path = FIXTURES / "disaster_tweets.csv"
  config = make_config(tmp_path, dataset=path, label_field="target", max_len=32,
                       vocab_size=500, val_fraction=0.15)
  data = ip.load_dataset(config, None)
  assert data.class_names == ["0", "1"] and data.skipped == {"file": 1}
  assert (len(data.train), len(data.validation), len(data.test)) == (25, 5, 5)
  labels = np.concatenate([data.train.labels, data.validation.labels, data.test.labels])
  assert labels.sum() == 19
  raw = file_source.FileSource(config).read(config.val_fraction, config.data_seed)
  texts = [t for split in ip.SPLITS for t in raw.texts[split]]
  assert "Two buildings on fire downtown,\nfirefighters from four stations responding" in texts
  assert ("Cyclone makes landfall tonight.\r\nFishermen told to stay in port.\r\nShelters open"
          in texts)
  assert ('Bridge collapse on the motorway: "we heard a roar and then dust everywhere"'
          in texts)


@pytest.mark.parametrize("name", ["disaster_tweets.csv", "headerless.tsv"])
def test_prediction_reads_a_file_as_training_does(tmp_path, name):
  # One reader (raw.delimited_records) for both: a prediction file in the training format gives
  # the texts and labels training read, in file order, at the same line numbers.
  if name == "headerless.tsv":
    path = tmp_path / name
    path.write_bytes(b'pos\tA "quoted"\ttitle one\r\nneg\t"two\r\nlines"\tt2\r\n\r\n'
                     b'pos\t\tonly a title\r\nneg\tfour\t\r\n')
    fields = {"source.columns": "label,body,title", "text_fields": "title,body"}
  else:
    path, fields = FIXTURES / name, {"text_fields": "keyword,text", "label_field": "target"}
  config = make_config(tmp_path, dataset=path, val_fraction=0.25, **fields)
  config.source.test_file = str(path)
  raw = file_source.FileSource(config).read(config.val_fraction, config.data_seed)
  texts, labels = classifier.read_texts(str(path), config, with_labels=True)
  kept = [i for i, text in enumerate(texts) if text.strip()]  # (training skips blank texts)
  assert [texts[i] for i in kept] == raw.texts["test"] and len(kept) >= 4
  assert [labels[i] for i in kept] == [raw.class_names[j] for j in raw.labels["test"]]
  if name == "headerless.tsv":  # (a record's first line, across its quoted line break)
    records = classifier._records(str(path), path.read_text("utf-8"), ".tsv",
                                  str(config.source.columns))
    assert [line for line, _ in records] == [1, 2, 5, 6]
    assert texts == ["title one A \"quoted\"", "t2 two\r\nlines", "only a title ", " four"]


def test_disaster_tweets_csv(tmp_path):
  if not TWEETS.exists():
    pytest.skip(f"{TWEETS} is absent (the fixture test above covers its format)")
  config = make_config(tmp_path, dataset=TWEETS, label_field="target", max_len=32,
                       vocab_size=5000)
  data = ip.load_dataset(config, None)
  assert data.class_names == ["0", "1"]
  assert len(data.train) + len(data.validation) + len(data.test) + sum(
      data.skipped.values()) == 7613
  labels = np.concatenate([data.train.labels, data.validation.labels, data.test.labels])
  assert labels.sum() == 3271


# ---- Cache and workdir ---------------------------------------------------------------------


def test_second_load_uses_the_cache_without_reading_or_tokenizing(tmp_path, monkeypatch):
  path = write_csv(tmp_path / "d.csv", unique_word_rows(40))
  config = make_config(tmp_path, dataset=path)
  first = ip.load_dataset(config, str(tmp_path / "work1"))

  def fail(*args, **kwargs):
    raise AssertionError("cache not used")
  with monkeypatch.context() as patch:
    patch.setattr(file_source.FileSource, "read", fail)
    patch.setattr(tokenizer_lib.WordTokenizer, "encode", fail)
    patch.setattr(tokenizer_lib.WordTokenizer, "train", fail)
    again = ip.load_dataset(config, str(tmp_path / "work1"))
    fresh_workdir = ip.load_dataset(config, str(tmp_path / "work2"))  # Vocab from the cache.
  for data in (again, fresh_workdir):
    np.testing.assert_array_equal(data.train.inputs, first.train.inputs)
    np.testing.assert_array_equal(data.test.labels, first.test.labels)
  assert (tmp_path / "work2" / ip.TOKENIZER_FILE).read_bytes() == (
      tmp_path / "work1" / ip.TOKENIZER_FILE).read_bytes()

  config.max_len = 4  # Changes the arrays: a cache miss must re-read.
  with monkeypatch.context() as patch:
    patch.setattr(file_source.FileSource, "read", fail)
    with pytest.raises(AssertionError, match="cache not used"):
      ip.load_dataset(config, None)


def test_changed_file_is_not_served_from_a_stale_cache(tmp_path):
  path = write_csv(tmp_path / "d.csv", unique_word_rows(40))
  config = make_config(tmp_path, dataset=path)
  before = ip.load_dataset(config, None)
  write_csv(path, unique_word_rows(60))
  assert len(ip.load_dataset(config, None).train) != len(before.train)


def test_moved_file_with_the_same_content_uses_the_cache(tmp_path, monkeypatch):
  path = write_csv(tmp_path / "d.csv", unique_word_rows(40))
  config = make_config(tmp_path, dataset=path)
  first = ip.load_dataset(config, None)
  moved = tmp_path / "elsewhere" / "d.csv"
  moved.parent.mkdir()
  moved.write_bytes(path.read_bytes())
  config.dataset = str(moved)
  monkeypatch.setattr(file_source.FileSource, "read", lambda *args: pytest.fail("cache not used"))
  np.testing.assert_array_equal(ip.load_dataset(config, None).train.inputs, first.train.inputs)


def test_corrupt_cache_entry_is_rebuilt(tmp_path):
  path = write_csv(tmp_path / "d.csv", unique_word_rows(40))
  config = make_config(tmp_path, dataset=path)
  first = ip.load_dataset(config, None)
  entries = [p for p in pathlib.Path(config.cache_dir).rglob("*") if p.is_file()]
  assert len(entries) == 3  # vocabulary, arrays, the data file's digest memo
  for entry in entries:
    entry.write_bytes(entry.read_bytes()[:50])  # Truncated, as after a crash mid-copy.
  cache_lib._DIGESTS.clear()  # (read by a new process)
  again = ip.load_dataset(config, None)
  np.testing.assert_array_equal(again.train.inputs, first.train.inputs)
  assert all(entry.stat().st_size > 50 for entry in entries)


def test_a_workdir_vocabulary_counted_on_other_training_data_is_refused_not_reused(tmp_path):
  # A start after one that stopped before its first checkpoint, on other data or another carve:
  # reusing the vocabulary leaked held-out words into it (ids of words the run never trained
  # on); rebuilding it would change the workdir's ids. Refused; the same data reuses it.
  path = write_csv(tmp_path / "d.csv", [f"alpha beta,{i % 2}" for i in range(20)])
  workdir = str(tmp_path / "work")
  ip.load_dataset(make_config(tmp_path, dataset=path), workdir)
  saved = (tmp_path / "work" / ip.TOKENIZER_FILE).read_bytes()
  again = ip.load_dataset(make_config(tmp_path, dataset=path, cache_dir=str(tmp_path / "c2")),
                          workdir)
  assert again.train.inputs[0, :2].tolist() == [2, 3] or again.train.inputs[0, :2].tolist() == [
      3, 2]
  for changed in (make_config(tmp_path, dataset=path, data_seed=1),
                  make_config(tmp_path, dataset=path, val_fraction=0.2)):
    with pytest.raises(ip.DataError, match=r"holds a vocabulary counted on other training data"):
      ip.load_dataset(changed, workdir)
  write_csv(path, [f"gamma gamma delta alpha,{i % 2}" for i in range(20)])
  with pytest.raises(ip.DataError, match=r"use a new --workdir"):
    ip.load_dataset(make_config(tmp_path, dataset=path, cache_dir=str(tmp_path / "c3")), workdir)
  assert (tmp_path / "work" / ip.TOKENIZER_FILE).read_bytes() == saved  # (left as it was)


def test_write_false_leaves_workdir_and_cache_untouched(tmp_path):
  path = write_csv(tmp_path / "d.csv", unique_word_rows(40))
  config = make_config(tmp_path, dataset=path)
  workdir = tmp_path / "work"
  on_process_1 = ip.load_dataset(config, str(workdir), write=False)
  assert not workdir.exists() and not os.path.exists(config.cache_dir)
  on_process_0 = ip.load_dataset(config, str(workdir))
  np.testing.assert_array_equal(on_process_1.train.inputs, on_process_0.train.inputs)


def test_workdir_created_with_another_tokenizer_is_refused(tmp_path):
  path = write_csv(tmp_path / "d.csv", unique_word_rows(40))
  workdir = str(tmp_path / "work")
  ip.load_dataset(make_config(tmp_path, dataset=path), workdir)
  with pytest.raises(ip.DataError, match="tokenizer='word'.*config.tokenizer='byte'"):
    ip.load_dataset(make_config(tmp_path, dataset=path, tokenizer="byte"), workdir)
  with pytest.raises(ip.DataError, match="vocab_size=200.*config.vocab_size=300"):
    ip.load_dataset(make_config(tmp_path, dataset=path, vocab_size=300), workdir)


def test_workdir_saved_before_is_read_with_the_same_ids_and_one_saved_with_split_is_refused(
    tmp_path):
  """tests/fixtures/workdir_*: written by textattn before the punctuation option was removed.
  The default ("strip") one must keep working; one of the removed "split" option holds ids the
  word tokenizer no longer produces, so it is refused in one sentence rather than misread."""
  config = make_config(tmp_path, dataset="reviews.csv", vocab_size=10, max_len=16)
  tokenizer, class_names = ip.load_tokenizer(str(FIXTURES / "workdir_strip"), config)
  assert class_names == ["neg", "pos"] and tokenizer.words == ["bad", "film", "good", "really"]
  assert tokenizer.encode(["Good, bad film! unknown"], 6, "post").tolist() == [[4, 2, 3, 1, 0, 0]]
  with pytest.raises(ip.DataError, match=r"workdir_split was created with punctuation='split', "
                     r"an option textattn no longer has; use a new workdir\.$"):
    ip.load_tokenizer(str(FIXTURES / "workdir_split"), config)


def test_workdir_files_keep_their_format(tmp_path):
  path = write_csv(tmp_path / "d.csv", unique_word_rows(40))
  config = make_config(tmp_path, dataset=path)
  ip.load_dataset(config, str(tmp_path / "work"))
  info = json.loads((tmp_path / "work" / ip.DATA_INFO_FILE).read_text(encoding="utf-8"))
  counted_on = info.pop("counted_on")
  assert info == {"tokenizer": "word", "vocab_size": 35, "config_vocab_size": 200,
                  "class_names": ["neg", "pos"], "punctuation": "strip", "dataset": str(path),
                  "max_len": 8, "truncation": "pre"}
  assert counted_on["source"][0] == "file" and counted_on["data_seed"] == 0


def test_cache_keys_of_the_default_settings_never_change(tmp_path):
  """The cache file names a fixed file gets under the default data settings, as textattn wrote
  them before the data package was split and the punctuation option removed: a change orphans
  every existing cache (bump cache._CACHE_VERSION when it must)."""
  path = write_csv(tmp_path / "d.csv", unique_word_rows(40))
  config = make_config(tmp_path, dataset=path)
  ip.load_dataset(config, None)
  config.tokenizer = "byte"
  ip.load_dataset(config, None)
  assert sorted(p.name for p in pathlib.Path(config.cache_dir).glob("*.*")) == [
      "d-byte-8pre-e25d52b1be6cb699ea5fdadc.npz", "d-vocab200-d599c6aebe0119b4032f3f47.json",
      "d-word-8pre-19d06be0348bc3f43346a751.npz"]
  assert os.path.basename(ip.source_cache_path(config, "mlm", {"seed": 0}, ".npz")) == (
      "d-mlm-f9233b9eeb993d73d1a3e0f3.npz")


# (The byte tokenizer below: its vocabulary is not counted on the data, so a workdir may meet
# other data; a word vocabulary's workdir refuses it, test_a_workdir_vocabulary_counted_on_...)
def test_label_outside_the_workdir_label_set_is_an_error(tmp_path):
  path = write_csv(tmp_path / "d.csv", [f"text {i},{'ab'[i % 2]}" for i in range(20)])
  workdir = str(tmp_path / "work")
  ip.load_dataset(make_config(tmp_path, dataset=path, tokenizer="byte"), workdir)
  write_csv(path, [f"text {i},{'abc'[i % 3]}" for i in range(20)])
  with pytest.raises(ip.DataError, match=r"\['c'\].*outside the label set \['a', 'b'\]"):
    ip.load_dataset(make_config(tmp_path, dataset=path, tokenizer="byte"), workdir)


def test_workdir_label_order_is_kept_when_the_data_lacks_a_class(tmp_path):
  path = write_csv(tmp_path / "d.csv", [f"text {i},{'abc'[i % 3]}" for i in range(30)])
  workdir = str(tmp_path / "work")
  ip.load_dataset(make_config(tmp_path, dataset=path, tokenizer="byte"), workdir)
  write_csv(path, [f"text {i},{'bc'[i % 2]}" for i in range(30)])
  data = ip.load_dataset(make_config(tmp_path, dataset=path, tokenizer="byte"), workdir)
  assert data.class_names == ["a", "b", "c"]
  assert set(np.concatenate([data.train.labels, data.test.labels]).tolist()) == {1, 2}


def test_an_error_leaves_existing_cache_and_workdir_intact(tmp_path):
  path = write_csv(tmp_path / "d.csv", unique_word_rows(40))
  config = make_config(tmp_path, dataset=path, tokenizer="byte")  # (reaches the file's error)
  workdir = tmp_path / "work"
  ip.load_dataset(config, str(workdir))
  before = {**files_under(workdir), **files_under(config.cache_dir)}
  path.write_bytes(path.read_bytes() + b"bad \xff row,neg\r\n")
  with pytest.raises(ip.DataError, match="invalid UTF-8"):
    ip.load_dataset(config, str(workdir))
  after = {**files_under(workdir), **files_under(config.cache_dir)}
  assert {p: after.get(p) for p in before} == before  # every entry there, byte for byte
  added = set(after) - set(before)  # only the new bytes' digest memo, nothing derived from them
  assert len(added) == 1 and all(p.parent.name == "digests" for p in added)


# ---- Bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize("name, content, fields, message", [
    ("missing_column.csv", b"body,label\r\nhello,a\r\n", {},
     r"missing_column.csv, line 1: column\(s\) \['text'\] not found"),
    ("bad_utf8.csv", b"text,label\r\nok,a\r\nbad \xff,b\r\n", {},
     r"bad_utf8.csv, line 3: invalid UTF-8"),
    ("empty_label.csv", b"text,label\r\nok,a\r\nfine,\r\n", {},
     r"empty_label.csv, line 3: the label column 'label' is empty"),
    ("field_count.csv", b"text,label\r\nok,a\r\n\"multi\r\nline\",b\r\nx,y,z\r\n", {},
     r"field_count.csv, line 5: expected 2 fields"),
    ("empty.csv", b"", {}, r"empty.csv: the file is empty"),
    ("header_only.csv", b"text,label\r\n", {}, r"header_only.csv: no examples"),
    ("too_few.csv", b"text,label\r\na,x\r\nb,y\r\nc,x\r\n", {},
     r"too_few.csv: 3 example\(s\) are too few"),
    ("missing_field.jsonl", b'{"text": "a", "label": 1}\n{"label": 2}\n', {},
     r"missing_field.jsonl, line 2: field\(s\) \['text'\] missing"),
    ("bad_json.jsonl", b'{"text": "a", "label": 1}\n{"text": \n', {},
     r"bad_json.jsonl, line 2: invalid JSON"),
    ("null_label.jsonl", b'{"text": "a", "label": null}\n', {},
     r"null_label.jsonl, line 1: label field 'label' is None"),
    ("surrogate.jsonl", b'{"text": "a \\ud800", "label": 1}\n', {},
     r"surrogate.jsonl, line 1: field 'text' is not valid UTF-8"),
    ("wrong_label_field.csv", b"text,label\r\nok,a\r\n", {"label_field": "target"},
     r"column\(s\) \['target'\]"),
    ("data.txt", b"text,label\r\n", {}, r"unsupported file type '.txt'"),
])
def test_bad_input_is_one_clear_data_error(tmp_path, name, content, fields, message):
  path = tmp_path / name
  path.write_bytes(content)
  with pytest.raises(ip.DataError, match=message):
    ip.load_dataset(make_config(tmp_path, dataset=path, **fields), None)


def test_local_file_needs_a_positive_val_fraction(tmp_path):
  path = write_csv(tmp_path / "d.csv", unique_word_rows(20))
  with pytest.raises(ip.DataError, match="config.val_fraction=0.0.*local file"):
    ip.load_dataset(make_config(tmp_path, dataset=path, val_fraction=0.0), None)


def test_missing_file_is_named(tmp_path):
  with pytest.raises(ip.DataError, match=r"nope.csv: file does not exist"):
    ip.load_dataset(make_config(tmp_path, dataset=tmp_path / "nope.csv"), None)


def test_empty_texts_are_skipped_counted_and_never_encoded(tmp_path):
  rows = unique_word_rows(30) + ['"  ",pos', '"",neg']
  data = ip.load_dataset(make_config(tmp_path, dataset=write_csv(tmp_path / "d.csv", rows)),
                         None)
  assert data.skipped == {"file": 2}
  assert len(data.train) + len(data.validation) + len(data.test) == 30


@pytest.mark.parametrize("field, value", [("layout.truncation", "middle"), ("tokenizer", "bpe"),
                                          ("layout.padding", "pre"), ("max_len", 0),
                                          ("vocab_size", 2),
                                          ("val_fraction", 0.5), ("val_fraction", -0.1)])
def test_bad_config_names_the_field(tmp_path, field, value):
  config = defaults.set_fields(make_config(tmp_path), {field: value})
  with pytest.raises(ip.DataError, match=f"config.{field}="):
    ip.load_dataset(config, None)


def test_pad_before_right_aligns_each_row_keeping_its_tokens_in_order():
  left = np.array([[5, 6, 7, 0, 0], [9, 0, 0, 0, 0], [1, 2, 3, 4, 8], [0, 0, 0, 0, 0]], np.int32)
  right = ip.pad_before(left)
  np.testing.assert_array_equal(right, [[0, 0, 5, 6, 7], [0, 0, 0, 0, 9], [1, 2, 3, 4, 8],
                                        [0, 0, 0, 0, 0]])
  assert right.dtype == np.int32


def test_before_as_token_padding_gives_keras_layout_from_the_same_cache(tmp_path):
  config = make_config(tmp_path, max_len=12)
  with tfds.testing.mock_data(num_examples=20):
    after = ip.load_dataset(config, None)
    config.layout.padding = "before_as_token"
    before = ip.load_dataset(config, None)
  for a, b in ((after.train, before.train), (after.test, before.test)):
    np.testing.assert_array_equal(b.labels, a.labels)
    np.testing.assert_array_equal(b.inputs, ip.pad_before(a.inputs))
    assert (b.inputs == 0).any()  # Some rows are padded: the check is not vacuous.
    padding = b.inputs == 0  # Padding first: once a row reaches a token, no more padding.
    assert (padding[:, 1:] <= padding[:, :-1]).all()


# ---- Batches -------------------------------------------------------------------------------


def numbered_split(n, max_len=3):
  """Row i holds i everywhere, so every batch row names its example."""
  return ip.Split(np.repeat(np.arange(n, dtype=np.int32)[:, None], max_len, 1),
                  np.arange(n, dtype=np.int32))


def take(iterator, count):
  return [next(iterator)["labels"].tolist() for _ in range(count)]


def test_train_epochs_are_full_batch_permutations_drawn_from_seed_and_epoch():
  iterator = ip.TrainIterator(numbered_split(23), global_batch_size=5, seed=7)
  assert iterator.steps_per_epoch == 4
  epochs = [list(itertools.chain.from_iterable(take(iterator, 4))) for _ in range(3)]
  for epoch in epochs:
    assert len(epoch) == 20 and len(set(epoch)) == 20  # Remainder of 3 dropped, no repeats.
  assert epochs[0] != epochs[1]
  again = ip.TrainIterator(numbered_split(23), global_batch_size=5, seed=7)
  assert list(itertools.chain.from_iterable(take(again, 4))) == epochs[0]
  other_seed = ip.TrainIterator(numbered_split(23), global_batch_size=5, seed=8)
  assert list(itertools.chain.from_iterable(take(other_seed, 4))) != epochs[0]


@pytest.mark.parametrize("stop_after", [0, 3, 4, 5, 9])  # 4 steps per epoch: 4 and 9 cross.
def test_resuming_from_state_continues_with_the_next_batch(stop_after):
  split = numbered_split(18)
  never_stopped = ip.TrainIterator(split, 4, seed=3)
  expected = take(never_stopped, stop_after + 6)[stop_after:]
  interrupted = ip.TrainIterator(split, 4, seed=3)
  take(interrupted, stop_after)
  state = json.loads(json.dumps(interrupted.get_state()))  # As saved with a checkpoint.
  assert set(state) == {"epoch", "index"}
  resumed = ip.TrainIterator(split, 4, seed=3)
  resumed.set_state({k: np.int64(v) for k, v in state.items()})  # Orbax restores numpy.
  assert take(resumed, 6) == expected


def test_two_processes_see_each_global_batch_once_in_order():
  split = numbered_split(30)
  single = ip.TrainIterator(split, 8, seed=1)
  p0 = ip.TrainIterator(split, 8, seed=1, process_index=0, process_count=2)
  p1 = ip.TrainIterator(split, 8, seed=1, process_index=1, process_count=2)
  for _ in range(7):  # Across an epoch boundary (3 steps per epoch).
    local0, local1 = next(p0), next(p1)
    assert local0["inputs"].shape == (4, 3)
    assert local0["labels"].tolist() + local1["labels"].tolist() == next(single)["labels"].tolist()


def test_length_grouped_epochs_visit_each_row_once_in_batches_of_similar_length():
  split = numbered_split(70)
  lengths = np.random.default_rng(0).integers(1, 40, 70)
  seen_widths = []

  def grouped(**kwargs):
    return ip.TrainIterator(split, 5, seed=2, lengths=lengths, length_pool=3,
                            trim=lambda batch, width: {**batch, "width": width}, **kwargs)

  iterator = grouped()
  epochs = []
  for _ in range(2):
    rows = []
    for _ in range(iterator.steps_per_epoch):
      batch = next(iterator)
      rows += batch["labels"].tolist()
      assert batch["width"] == lengths[batch["labels"]].max()  # the global batch's longest
      seen_widths.append(np.ptp(lengths[batch["labels"]]))
    assert len(rows) == 70 and len(set(rows)) == 70
    epochs.append(rows)
  assert epochs[0] != epochs[1]
  # Sorted pools of 15 rows: a batch's spread is far below a random batch's (~30).
  assert np.mean(seen_widths) < 12, seen_widths
  again = grouped()
  take(again, 5)
  resumed = grouped()
  resumed.set_state(again.get_state())
  assert take(resumed, 20) == [r.tolist() for r in np.reshape(epochs[0] + epochs[1], (28, 5))[5:25]]
  p1 = grouped(process_index=1, process_count=5)  # every process gets the global width
  assert next(p1)["width"] == next(grouped())["width"]


@pytest.mark.parametrize("batch_size, process_count", [(1, 1), (4, 1), (7, 1), (10, 1),
                                                       (64, 1), (4, 2), (6, 2), (8, 4)])
def test_eval_yields_every_example_exactly_once(batch_size, process_count):
  split = numbered_split(10)
  per_process = [list(ip.eval_batches(split, batch_size, p, process_count))
                 for p in range(process_count)]
  assert len({len(batches) for batches in per_process}) == 1  # Same count on every host.
  seen = []
  for step in range(len(per_process[0])):
    for batches in per_process:
      batch = batches[step]
      assert batch["inputs"].shape == (batch_size // process_count, 3)
      assert batch["weights"].dtype == np.float32
      seen += batch["labels"][batch["weights"] == 1].tolist()
  assert seen == list(range(10))
  assert sum(b["weights"].sum() for batches in per_process for b in batches) == 10


def test_eval_padding_rows_are_real_examples_with_zero_weight():
  # Ids and labels start at 1 and 7, so a copy of example 0 differs from an all-zero row (a
  # fully padded row, which the padding must not be: it would be masked out everywhere).
  split = ip.Split(numbered_split(5).inputs + 1, np.arange(7, 12, dtype=np.int32))
  batch = list(ip.eval_batches(split, 4))[-1]
  assert batch["weights"].tolist() == [1, 0, 0, 0]
  assert batch["inputs"].tolist() == [[5, 5, 5]] + [[1, 1, 1]] * 3  # Copies of example 0.
  assert batch["labels"].tolist() == [11, 7, 7, 7]


def test_batch_size_errors():
  with pytest.raises(ip.DataError, match="not divisible by the process count 2"):
    ip.TrainIterator(numbered_split(10), 5, seed=0, process_index=0, process_count=2)
  with pytest.raises(ip.DataError, match="fewer than one global batch"):
    ip.TrainIterator(numbered_split(3), 4, seed=0)
  with pytest.raises(ip.DataError, match="not divisible"):
    ip.eval_batches(numbered_split(3), 3, process_index=1, process_count=2)
  with pytest.raises(ip.DataError, match="iterator state"):
    ip.TrainIterator(numbered_split(10), 5, seed=0).set_state({"epoch": 0, "index": 2})


def test_reading_tfds_imports_tensorflow_without_its_start_up_lines():
  # TensorFlow's C++ start-up printed an absl warning and a oneDNN INFO line, twice, on every
  # TFDS read, whatever TF_CPP_MIN_LOG_LEVEL said.
  env = {k: v for k, v in os.environ.items()
         if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")}
  code = ("from textattn.data import tfds_source; tfds_source._keep_tensorflow_off_accelerators();"
          " import tensorflow as tf; tf.constant(1.0) + 1.0")
  done = subprocess.run([sys.executable, "-c", code], cwd=FIXTURES.parents[1], env=env, capture_output=True,
                        text=True, timeout=120, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "oneDNN" not in done.stderr and "InitializeLog" not in done.stderr, done.stderr


def test_tfds_string_labels_are_checked_as_a_local_files_are():
  # (a label seen only in test became a class of its own, shifting the training ids)
  source = tfds_source.TfdsSource.__new__(tfds_source.TfdsSource)
  source.description = "TFDS 'toy'"
  names, ids = source._label_ids({"train": ["pos", "neg", "pos"], "test": ["neg"]}, [])
  assert names == ["neg", "pos"] and ids["train"].tolist() == [1, 0, 1]
  with pytest.raises(ip.DataError, match="example 0: label 'neutral' .test split. never occurs"):
    source._label_ids({"train": ["pos", "neg"], "test": ["neutral", "pos"]}, [])
  with pytest.raises(ip.DataError, match="every label is 'pos'"):
    source._label_ids({"train": ["pos", "pos"], "test": ["pos"]}, [])
