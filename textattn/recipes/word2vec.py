"""Token-embedding initialisation from word2vec vectors trained on the run's own text.

`config.embedding.init = "word2vec"` starts the token-embedding table from skip-gram
vectors (Mikolov et al. 2013, trained with gensim) instead of Keras' uniform(-0.05, 0.05):

- **Corpus**: the texts of the training split only (validation carved out exactly as
  `load_dataset` does) plus, when `config.word2vec.unlabeled_split` names one, a TFDS split of
  unlabelled text (IMDB's "unsupervised": 50,000 reviews of the same data set, no labels).
  Never the validation or test split, and never a label.
- **Rows**: every vocabulary word that word2vec kept (count >= `min_count`) gets its vector,
  rescaled so that the pretrained rows' standard deviation equals the random initialiser's
  (`config.word2vec.scale` = "init"; "raw" keeps word2vec's own scale); padding, [UNK] and
  words word2vec dropped keep the random initialisation.
- **Reproducible**: one worker thread (gensim's threads take batches of words in whatever order
  the OS schedules them) and a seeded initialisation, so the table depends only on the corpus
  and the settings, in any process on any run; cached in
  `cache_dir` under a key of all of them, written atomically. Only a fresh run builds it: a
  resumed run restores its parameters from the checkpoint.

Training the vectors takes minutes on a CPU (16.7 million words for IMDB's train +
unsupervised splits); a second run with the same data and settings reads the cache.
"""

from __future__ import annotations

import contextlib
import logging as std_logging
import os
import time
from typing import Any

import ml_collections
import numpy as np
from absl import logging

from textattn import data as data_lib
from textattn.checks import check_integer
from textattn.data import tokenizer as tokenizer_lib
from textattn.errors import UsageError
from textattn.recipes import vectors
from textattn.recipes.vectors import INIT_STD, rescale  # noqa: F401 -- (INIT_STD: API)

EMBEDDING_INITS = ("random", "word2vec")
SCALES = ("init", "raw")
_CACHE_VERSION = 1
# Seconds between progress lines within a word2vec epoch (an IMDB epoch takes over a minute).
PROGRESS_EVERY_S = 10.0


def default_config() -> ml_collections.ConfigDict:
  """The recipe's fields: a config that sets embedding.init="word2vec" adds them as
  `config.word2vec = word2vec.default_config()` and changes what it needs."""
  w2v = ml_collections.ConfigDict()
  # A TFDS split of unlabelled text added to the corpus ("unsupervised" for imdb_reviews);
  # "" = the training split's text only (always for local files). Labelled splits are refused.
  w2v.unlabeled_split = ""
  w2v.epochs = 5
  w2v.window = 5
  w2v.min_count = 2
  w2v.negative = 5
  w2v.seed = 0
  # "init": rescale the pretrained rows to the random initialiser's standard deviation (only
  # their directions are new); "raw": word2vec's own scale (about 10x larger).
  w2v.scale = "init"
  return w2v


def validate_config(config) -> None:
  """One sentence for a word2vec setting that cannot work, before any data is read."""
  init = config.embedding.init
  if vectors.is_vectors(init):  # a file of vectors, not this recipe (textattn/recipes/vectors.py)
    vectors.validate_config(config)
    return
  if init not in EMBEDDING_INITS:
    raise UsageError(f"config.embedding.init={init!r} is invalid; allowed: "
                     f"{', '.join(repr(i) for i in EMBEDDING_INITS)}, or 'vectors:PATH' (a "
                     f"word2vec or GloVe file).")
  if init != "word2vec":
    return
  if "word2vec" not in config:
    raise UsageError("config.embedding.init='word2vec' needs the recipe's settings: add "
                     "`config.word2vec = word2vec.default_config()` (textattn/recipes/word2vec.py) "
                     "to the config file.")
  w2v = config.word2vec
  if config.tokenizer != "word":
    raise UsageError(f"config.embedding.init='word2vec' needs config.tokenizer='word' "
                     f"(word vectors for a word vocabulary), not {config.tokenizer!r}.")
  for field, low in (("epochs", 1), ("window", 1), ("min_count", 1), ("negative", 1),
                     ("seed", 0)):
    check_integer(f"word2vec.{field}", w2v[field], low)
  if w2v.scale not in SCALES:
    raise UsageError(f"config.word2vec.scale={w2v.scale!r} is invalid; allowed: "
                     f"{', '.join(repr(s) for s in SCALES)}.")
  data_lib.check_unlabeled_split(config, "word2vec.unlabeled_split", "train")


def vector_settings(config) -> dict[str, Any]:
  """What the vectors depend on besides the corpus (their cache key; `scale` is applied after)."""
  w2v = config.word2vec
  return {"dim": int(config.model.embed_dim), "epochs": int(w2v.epochs),
          "window": int(w2v.window), "min_count": int(w2v.min_count),
          "negative": int(w2v.negative), "unlabeled_split": str(w2v.unlabeled_split),
          "seed": int(w2v.seed)}


def train_vectors(texts: list[list[str]], settings: dict[str, Any], *, progress: bool = False,
                  partial_path: str | None = None):
  """gensim KeyedVectors from standardised, whitespace-split texts; deterministic.

  progress: a line every PROGRESS_EVERY_S seconds within each epoch (from gensim's progress
  reports, which change nothing it computes; its other INFO lines stay silenced) and one per
  epoch with the time left.
  partial_path: after each epoch the model is saved there (atomically), and a build finds it
  and goes on from the next epoch, so an interrupted build (Ctrl-C, a kill) loses at most one
  epoch. One epoch per `train` call with the learning rate of that stretch of gensim's linear
  decay gives bit-identically the vectors of one 5-epoch call (tests/test_word2vec.py)."""
  # Only runs that ask for word2vec import gensim.
  from gensim.models import Word2Vec

  gensim_logger = std_logging.getLogger("gensim")
  level = gensim_logger.level
  gensim_logger.setLevel(std_logging.WARNING)
  epochs = settings["epochs"]
  try:
    model, done = _resume(partial_path, epochs)
    if model is None:
      model = Word2Vec(vector_size=settings["dim"], window=settings["window"],
                       min_count=settings["min_count"], sg=1, negative=settings["negative"],
                       epochs=epochs, seed=settings["seed"], workers=1)
      model.build_vocab(texts)
    elif progress:
      print(f"word2vec: resuming after epoch {done}/{epochs} ({partial_path}).", flush=True)
    start_time = time.perf_counter()
    # The whole build's learning-rate range (train() overwrites model.alpha / min_alpha).
    high, low = getattr(model, "textattn_alphas", (model.alpha, model.min_alpha))
    model.textattn_alphas = (high, low)
    for epoch in range(done, epochs):
      with _epoch_progress(f"word2vec: epoch {epoch + 1}/{epochs}" if progress else None):
        model.train(texts, total_examples=model.corpus_count, epochs=1,
                    start_alpha=high - (high - low) * epoch / epochs,
                    end_alpha=high - (high - low) * (epoch + 1) / epochs,
                    report_delay=PROGRESS_EVERY_S)
      if partial_path:
        _save_partial(model, partial_path, epoch + 1)
      if progress:
        elapsed = time.perf_counter() - start_time
        left = elapsed / (epoch + 1 - done) * (epochs - epoch - 1)
        print(f"word2vec: epoch {epoch + 1}/{epochs} done ({elapsed:.0f} s, ETA {left:.0f} s)",
              flush=True)
  finally:
    gensim_logger.setLevel(level)
  return model.wv


class _ProgressLines(std_logging.Handler):
  """Prints gensim's "EPOCH i - PROGRESS: at P% examples" reports as `prefix: P% (S s)`, at most
  one per PROGRESS_EVERY_S / 2 seconds (gensim's first report comes after 1 s, the next ones
  every report_delay)."""

  def __init__(self, prefix: str):
    super().__init__(std_logging.INFO)
    self.prefix, self.start = prefix, time.perf_counter()
    self.last = self.start

  def emit(self, record: std_logging.LogRecord) -> None:
    now = time.perf_counter()
    if "PROGRESS" not in str(record.msg) or now - self.last < PROGRESS_EVERY_S / 2:
      return
    self.last = now
    print(f"{self.prefix}: {record.args[1]:.0f}% ({now - self.start:.0f} s)", flush=True)


@contextlib.contextmanager
def _epoch_progress(prefix: str | None):
  """While a `train` call runs: gensim's progress reports (and only those) as lines starting
  with `prefix`; None = silent."""
  if prefix is None:
    yield
    return
  logger = std_logging.getLogger("gensim.models.word2vec")
  handler, before = _ProgressLines(prefix), (logger.level, logger.propagate)
  logger.setLevel(std_logging.INFO)
  logger.propagate = False  # its other INFO lines reach no other handler
  logger.addHandler(handler)
  try:
    yield
  finally:
    logger.removeHandler(handler)
    logger.setLevel(before[0])
    logger.propagate = before[1]


def _resume(partial_path: str | None, epochs: int):
  """(model, epochs done) from a partial build at partial_path, or (None, 0)."""
  from gensim.models import Word2Vec
  if not partial_path or not os.path.exists(partial_path):
    return None, 0
  try:
    model = Word2Vec.load(partial_path)
    done = int(model.textattn_epochs_done)
    if not 0 < done < epochs:
      raise ValueError(f"{done} epochs done of {epochs}")
    return model, done
  except Exception as e:  # noqa: BLE001 -- a damaged partial build costs a fresh one
    logging.warning("Ignoring the partial word2vec build %s (%s).", partial_path, e)
    return None, 0


def _save_partial(model, path: str, done: int) -> None:
  model.textattn_epochs_done = done
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    model.save(tmp, separately=[])  # one file, so the rename below is atomic
    os.replace(tmp, path)
  except OSError as e:  # a read-only or full cache dir must not stop the build
    logging.warning("Could not save the partial word2vec build %s (%s).", path, e)
    if os.path.exists(tmp):
      os.remove(tmp)


def table_from_vectors(tokenizer: tokenizer_lib.WordTokenizer, vectors,
                       vocab_size: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
  """(table float32 [vocab_size, dim], found bool [vocab_size]): row id(w) = vector of w."""
  table = np.zeros((vocab_size, dim), np.float32)
  found = np.zeros(vocab_size, bool)
  for index, word in enumerate(tokenizer.words):
    row = index + tokenizer_lib.NUM_RESERVED
    if word in vectors.key_to_index:
      table[row] = vectors[word]
      found[row] = True
  return table, found


def _gensim_version() -> str:
  from importlib import metadata
  try:
    return metadata.version("gensim")
  except metadata.PackageNotFoundError:
    return "missing"


def _load(path: str, vocab_size: int, dim: int):
  def read(path):
    with np.load(path, allow_pickle=False) as archive:
      table, found = archive["table"], archive["found"]
    if table.shape != (vocab_size, dim) or found.shape != (vocab_size,):
      raise ValueError("shapes do not match the configuration")
    return table.astype(np.float32), found.astype(bool)
  return data_lib.read_cache(path, "word2vec", read)


def pretrained_token_table(config, tokenizer, vocab_size: int, *,
                           write: bool = True) -> tuple[np.ndarray, np.ndarray]:
  """(table [vocab_size, embed_dim] float32, found bool [vocab_size]) for the run's word
  tokenizer; rows where `found` is False are to keep their random initialisation."""
  validate_config(config)
  dim = int(config.model.embed_dim)
  key_settings = vector_settings(config)
  path = data_lib.source_cache_path(
      config, f"word2vec{dim}", {"tokenizer": tokenizer.fingerprint(), "settings": key_settings,
                                 "gensim": _gensim_version(), "word2vec_version": _CACHE_VERSION}, ".npz", write=write)
  cached = _load(path, vocab_size, dim) if path else None
  if cached is not None:
    table, found = cached
    logging.info("Loaded word2vec vectors from %s.", path)
  else:
    texts, cacheable = data_lib.word2vec_texts(config, key_settings["unlabeled_split"])
    print(f"Training word2vec ({dim} dimensions, {key_settings['epochs']} epochs, one thread) on "
          f"{len(texts):,} texts ({sum(map(len, texts)):,} words) for the token-embedding "
          f"initialisation; it is cached for later runs.", flush=True)
    partial = f"{path}.partial" if (write and cacheable and path) else None
    vectors = train_vectors(texts, key_settings, progress=True, partial_path=partial)
    table, found = table_from_vectors(tokenizer, vectors, vocab_size, dim)
    if partial:
      try:
        data_lib.atomic_write(path, lambda f: np.savez(f, table=table, found=found), "wb")
        if os.path.exists(partial):
          os.remove(partial)
      except OSError as e:  # A read-only or full cache dir must not stop training.
        logging.warning("Could not write word2vec cache %s (%s).", path, e)
  print(f"word2vec: {int(found.sum()):,} of {vocab_size:,} token-embedding rows start from "
        f"word vectors (scale: {config.word2vec.scale}).", flush=True)
  return rescale(table, found, config.word2vec.scale), found
