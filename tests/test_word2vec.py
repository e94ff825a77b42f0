"""word2vec token-embedding initialisation: which text it sees, where vectors land, that it is
reproducible across processes, cached, applied only to a fresh run, and refused when misused."""

import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from tests import recipes_config
from tests.test_data import fake_tfds, make_config, write_csv
from tests.test_train import cli_args, read_metrics, run_main, write_sentiment_jsonl
from textattn import data as ip
from textattn import models, optim, train_state
from textattn import run as runner
from textattn.data import file_source
from textattn.data import tokenizer as tokenizer_lib
from textattn.recipes import word2vec

REPO = pathlib.Path(__file__).resolve().parents[1]


def marker_rows(n):
  return [f"row{i} shared words here,{'pos' if i % 2 else 'neg'}" for i in range(n)]


def test_corpus_is_the_training_split_only_never_validation_or_test(tmp_path):
  config = make_config(tmp_path, tmp_path / "data.csv", val_fraction=0.2)
  write_csv(tmp_path / "data.csv", marker_rows(50))
  texts, cacheable = ip.word2vec_texts(config, "")
  markers = {words[0] for words in texts}
  raw = file_source.FileSource(config).read(config.val_fraction, config.data_seed)
  held_out = {tokenizer_lib.standardize(t).split()[0]
              for split in ("validation", "test") for t in raw.texts[split]}
  assert len(held_out) == 20 and len(markers) == len(texts) == 30
  assert not markers & held_out
  assert cacheable


def test_tfds_corpus_adds_the_unlabeled_split_and_refuses_labelled_ones(tmp_path):
  train_rows = [(f"trainrow{i} shared".encode(), i % 2) for i in range(20)]
  splits = {"train": train_rows, "test": [(b"testrow shared", 0)] * 5,
            "unsupervised": [(f"unsuprow{i} shared".encode(), -1) for i in range(7)]
            + [(b"   ", -1)]}
  config = make_config(tmp_path, val_fraction=0.1)
  with fake_tfds(splits):
    texts, cacheable = ip.word2vec_texts(config, "unsupervised")
    markers = [words[0] for words in texts]
    assert len(markers) == 18 + 7  # train minus 2 validation rows, 7 non-empty unlabelled
    assert sum(m.startswith("unsuprow") for m in markers) == 7
    assert not any(m.startswith("testrow") for m in markers)
    assert not cacheable  # mocked TFDS data is never cached
    for split in ("test", "train"):
      with pytest.raises(ip.DataError, match=re.escape(
          f"config.word2vec.unlabeled_split={split!r} is a labelled split")):
        ip.word2vec_texts(config, split)
    with pytest.raises(ip.DataError, match=r"'nosuchsplit' is not a split of"):
      ip.word2vec_texts(config, "nosuchsplit")


class FakeVectors:
  def __init__(self, vectors):
    self._vectors = vectors
    self.key_to_index = {w: i for i, w in enumerate(vectors)}

  def __getitem__(self, word):
    return self._vectors[word]


def test_vectors_land_on_their_words_rows_and_are_rescaled_to_the_init_scale():
  tokenizer = tokenizer_lib.WordTokenizer(["alpha", "beta", "gamma"])
  vectors = FakeVectors({"gamma": np.full(4, 3.0), "alpha": np.arange(4.0), "other": np.ones(4)})
  table, found = word2vec.table_from_vectors(tokenizer, vectors, 6, 4)
  ids = {w: int(tokenizer.encode([w], 1, "pre")[0, 0]) for w in ("alpha", "beta", "gamma")}
  np.testing.assert_array_equal(table[ids["alpha"]], np.arange(4.0))
  np.testing.assert_array_equal(table[ids["gamma"]], np.full(4, 3.0))
  assert found.tolist() == [i in (ids["alpha"], ids["gamma"]) for i in range(6)]
  scaled = word2vec.rescale(table, found, "init")
  np.testing.assert_allclose(scaled[found].std(), word2vec.INIT_STD, rtol=1e-5)
  np.testing.assert_allclose(scaled[ids["alpha"]] / scaled[ids["gamma"]],
                             table[ids["alpha"]] / table[ids["gamma"]], rtol=1e-6)
  np.testing.assert_array_equal(word2vec.rescale(table, found, "raw"), table)


def test_pretrained_rows_replace_the_random_ones_and_nothing_else_changes():
  config = recipes_config.get_config()
  config.model.update(embed_dim=8, num_heads=2, ffn_dim=8, mlp_dim=4)
  model = models.build_model(config, 2, vocab_size=10)
  tx = optim.make_optimizer(config.optimizer, 10)
  rng = jax.random.key(0)
  plain = train_state.init_train_state(model, tx, rng, 6)
  table = np.arange(80, dtype=np.float32).reshape(10, 8)
  found = np.zeros(10, bool)
  found[[3, 7]] = True
  state = train_state.init_train_state(model, tx, rng, 6, None, (table, found))
  token = np.asarray(state.params["embedding"]["token"]["embedding"])
  random_token = np.asarray(plain.params["embedding"]["token"]["embedding"])
  np.testing.assert_array_equal(token[found], table[found])
  np.testing.assert_array_equal(token[~found], random_token[~found])
  rest = jax.tree_util.tree_leaves({k: v for k, v in state.params.items() if k != "embedding"})
  rest_plain = jax.tree_util.tree_leaves(
      {k: v for k, v in plain.params.items() if k != "embedding"})
  for a, b in zip(rest, rest_plain):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


_TRAIN = """
import sys, numpy as np
from textattn.recipes import word2vec
rng = np.random.default_rng(0)
# 60,000 words: several of gensim's 10,000-word jobs per epoch, so the order in which threads
# take them could matter.
texts = [[f"w{k}" for k in rng.zipf(1.3, 40) % 500] for _ in range(1500)]
wv = word2vec.train_vectors(texts, dict(dim=8, window=3, min_count=1, negative=3,
                                            epochs=2, seed=0))
np.save(sys.argv[1], np.stack([wv[w] for w in sorted(wv.key_to_index)]))
"""


def test_vectors_are_identical_across_processes(tmp_path):
  # Two fresh runs must start from the same table. gensim with two worker threads gave
  # different vectors for this corpus (max difference 0.06); one thread and a fixed seed do not.
  outputs = []
  for hash_seed in ("1", "2"):  # Python's string hashing differs between the two processes.
    out = tmp_path / f"v{hash_seed}.npy"
    subprocess.run([sys.executable, "-c", _TRAIN, str(out)], cwd=REPO, check=True,
                   env={"PYTHONHASHSEED": hash_seed, "PATH": "/usr/bin:/bin",
                        "PYTHONPATH": str(REPO)}, timeout=120)
    outputs.append(np.load(out))
  np.testing.assert_array_equal(outputs[0], outputs[1])
  assert np.abs(outputs[0]).max() > 0


@pytest.mark.parametrize("field,value,message", [
    ("embedding.init", "glove", "config.embedding.init='glove' is invalid"),
    ("word2vec.epochs", 0, "config.word2vec.epochs=0 is invalid"),
    ("word2vec.scale", "big", "config.word2vec.scale='big' is invalid"),
    ("tokenizer", "byte", "config.embedding.init='word2vec' needs config.tokenizer='word'"),
    ("dataset", "reviews.csv", "config.word2vec.unlabeled_split='unsupervised' names a TFDS"),
])
def test_bad_word2vec_settings_are_one_clear_sentence(field, value, message, tmp_path):
  config = recipes_config.get_config()
  config.embedding.init = "word2vec"
  config.word2vec.unlabeled_split = "unsupervised"
  if field == "dataset":  # (a local file that exists: the recipe, not the path, is refused)
    value = str(tmp_path / value)
    pathlib.Path(value).write_text("text,label\nfine,a\n")
  section, _, name = field.rpartition(".")
  (config[section] if section else config)[name] = value
  with pytest.raises(ValueError, match=re.escape(message)):
    runner.validate(config, 1)


def test_a_word2vec_run_trains_and_a_resume_does_not_rebuild_or_reapply_the_vectors(tmp_path):
  data = write_sentiment_jsonl(tmp_path / "reviews.jsonl", n=240)
  args = cli_args(data, tmp_path / "cache", num_train_steps=10,
                  **{"embedding.init": "word2vec", "word2vec.epochs": 2})
  first = run_main(args, tmp_path / "run")
  assert first.returncode == 0, first.stderr[-3000:]
  assert "Training word2vec" in first.stdout and "word2vec: epoch 2/2 done" in first.stdout
  assert re.search(r"word2vec: \d+ of \d+ token-embedding rows", first.stdout)
  assert len(list((tmp_path / "cache").glob("*word2vec16-*.npz"))) == 1
  report = read_metrics(tmp_path / "run")[-1]
  assert report["test/params_from_step"] == 10 and np.isfinite(report["test/loss"])
  # A resumed run restores its parameters: it neither rebuilds nor re-applies the vectors.
  (tmp_path / "cache").rename(tmp_path / "cache-moved")
  again = run_main(args, tmp_path / "run")
  assert again.returncode == 0, again.stdout[-2000:]
  # (not "word2vec" anywhere: the data line names the file, whose directory is this test's)
  assert "Training word2vec" not in again.stdout and "token-embedding rows" not in again.stdout


def test_the_second_build_reads_the_cache_and_gets_the_same_table(tmp_path, monkeypatch):
  data = write_sentiment_jsonl(tmp_path / "reviews.jsonl", n=120)
  config = recipes_config.get_config()
  config.update(dataset=data, cache_dir=str(tmp_path / "cache"), vocab_size=40, max_len=8)
  config.model.embed_dim = 8
  config.embedding.init = "word2vec"
  config.word2vec.epochs = 1
  loaded = ip.load_dataset(config, None)
  first = word2vec.pretrained_token_table(config, loaded.tokenizer, loaded.vocab_size)

  def no_training(*args, **kwargs):
    raise AssertionError("word2vec was trained again instead of read from the cache")
  monkeypatch.setattr(word2vec, "train_vectors", no_training)
  second = word2vec.pretrained_token_table(config, loaded.tokenizer, loaded.vocab_size)
  for a, b in zip(first, second):
    np.testing.assert_array_equal(a, b)
  assert first[1][2:].any()
  config.word2vec.window = 2  # Other settings: another cache entry, so it must train.
  with pytest.raises(AssertionError, match="trained again"):
    word2vec.pretrained_token_table(config, loaded.tokenizer, loaded.vocab_size)


def test_mocked_imdb_with_the_unsupervised_split_builds_a_table(tmp_path):
  config = make_config(tmp_path, val_fraction=0.1, vocab_size=50)
  config.word2vec = word2vec.default_config()
  config.model.embed_dim = 8
  config.embedding.init = "word2vec"
  config.word2vec.update(unlabeled_split="unsupervised", epochs=1, min_count=1)
  with tfds.testing.mock_data(num_examples=30):
    data = ip.load_dataset(config, None)
    table, found = word2vec.pretrained_token_table(config, data.tokenizer, data.vocab_size)
  assert table.shape == (data.vocab_size, 8) and found[2:].any() and not found[:2].any()
  assert not list(pathlib.Path(config.cache_dir).glob("*word2vec*"))  # mocked: not cached


def test_an_interrupted_build_resumes_from_its_last_epoch_to_the_same_vectors(tmp_path,
                                                                               monkeypatch):
  from gensim.models import Word2Vec
  rng = np.random.default_rng(0)
  texts = [[f"w{k}" for k in rng.zipf(1.3, 30) % 300] for _ in range(600)]
  settings = {"dim": 8, "window": 3, "min_count": 1, "negative": 3, "epochs": 3, "seed": 0}
  straight = word2vec.train_vectors(texts, settings)
  # gensim's own one-call training: the per-epoch calls reproduce it bit for bit.
  one_call = Word2Vec(texts, vector_size=8, window=3, min_count=1, sg=1, negative=3, epochs=3,
                      seed=0, workers=1).wv
  np.testing.assert_array_equal(straight.vectors, one_call.vectors)

  partial = str(tmp_path / "w2v.npz.partial")
  original, calls = Word2Vec.train, []

  def interrupted(self, *args, **kwargs):
    calls.append(1)
    if len(calls) == 2:  # Ctrl-C during the second epoch
      raise KeyboardInterrupt
    return original(self, *args, **kwargs)

  monkeypatch.setattr(Word2Vec, "train", interrupted)
  with pytest.raises(KeyboardInterrupt):
    word2vec.train_vectors(texts, settings, partial_path=partial)
  monkeypatch.setattr(Word2Vec, "train", original)
  assert Word2Vec.load(partial).textattn_epochs_done == 1
  resumed = word2vec.train_vectors(texts, settings, partial_path=partial, progress=True)
  np.testing.assert_array_equal(resumed.vectors, straight.vectors)


def test_each_epoch_reports_its_progress_and_the_vectors_do_not_change(monkeypatch, capsys,
                                                                       caplog):
  # A new user once watched 65-91 s of silence inside each IMDB epoch: gensim's progress
  # reports (here one per job: its clock runs 1 s per reading, the spacing is 0) become lines
  # within the epoch; reporting changes nothing gensim computes.
  import gensim.models.word2vec as gensim_word2vec
  rng = np.random.default_rng(0)
  texts = [[f"w{k}" for k in rng.zipf(1.3, 60) % 300] for _ in range(600)]
  settings = {"dim": 8, "window": 3, "min_count": 1, "negative": 3, "epochs": 2, "seed": 0}
  quiet = word2vec.train_vectors(texts, settings)
  assert capsys.readouterr().out == ""
  clock = iter(range(10**6))
  monkeypatch.setattr(gensim_word2vec, "default_timer", lambda: float(next(clock)))
  monkeypatch.setattr(word2vec, "PROGRESS_EVERY_S", 0.0)
  with caplog.at_level("INFO"):
    talking = word2vec.train_vectors(texts, settings, progress=True)
  np.testing.assert_array_equal(talking.vectors, quiet.vectors)
  lines = capsys.readouterr().out.splitlines()
  for epoch in (1, 2):
    within = [line for line in lines if re.fullmatch(rf"word2vec: epoch {epoch}/2: \d+% \(\d+ s\)",
                                                    line)]
    assert within, lines  # before the epoch's own "done" line
    assert lines.index(within[-1]) < lines.index(next(
        line for line in lines if line.startswith(f"word2vec: epoch {epoch}/2 done")))
  assert not [r for r in caplog.records if r.name.startswith("gensim")]  # its lines: silent
