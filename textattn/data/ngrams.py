"""N-gram features for the bag-of-n-grams baselines (config.tokenizer="ngram").

Text is standardised and split into words exactly as the word tokenizer does; every run of 1 to
`order` consecutive words of a text is an n-gram (never across texts). The feature vocabulary
is the `vocab_size - 2` most frequent n-grams of the **training split only** (ties broken by
the n-gram's key, so it is deterministic), as Keras `TextVectorization(ngrams=order,
max_tokens=...)` chooses it; id 0 is padding, id 1 stands for every n-gram outside the
vocabulary (Keras' OOV index), ids 2.. follow descending training count.

A text becomes one row of int32 feature ids, sorted ascending (most frequent first):
- `counts=False` (multi-hot, NB features): each distinct id once;
- `counts=True` (counts, TF-IDF): an id repeated as often as its n-gram occurs.
A row holds at most `max_len` ids; a text with more keeps its lowest ids: the out-of-vocabulary
id 1 (counts: every such occurrence) and its most frequent features, dropping the rarest. (Ranking
id 1 last instead, so a long review keeps its known features first, scored 88.74 ± 0.44 against
89.02 ± 0.39 with `imdb_tfidf_bigram.py`, seeds 0-2, test loss higher on each: not adopted;
experiments/ngram_oov_order/.) Rows are padded with 0 on the right. Everything is computed
with vectorised numpy over the whole split (IMDB's 25,000 reviews in seconds), never a dense
[texts, vocabulary] array.

An n-gram's key packs its order and word ids into one int64: ((order * 2^20 + w1) * 2^20 +
w2) * 2^20 + w3 (missing words 0), exact for up to 2^20 - 1 words and order <= 3. Word ids come
from the training split's full word vocabulary (every word seen in training; unseen words are
id 1, so an n-gram containing one is out of vocabulary unless that n-gram was trained).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import ml_collections
import numpy as np

from textattn.data import tokenizer as tokenizer_lib


def default_config():
  """config.ngrams, an opt-in part (config.complete): the n-gram features of tokenizer="ngram"
  and how the bag baseline (model.architecture="bag") weighs them."""
  part = ml_collections.ConfigDict()
  part.order = 2  # the features are the n-grams of 1..order words
  part.counts = False  # True keeps repeats (counts, TF-IDF), False each once
  part.weighting = "none"  # none | tfidf (Keras' idf) | nb (NBSVM-style ratios)
  return part

MAX_ORDER = 3
_WORD_BITS = 20
_MAX_WORDS = (1 << _WORD_BITS) - 1 - tokenizer_lib.NUM_RESERVED


def _word_ids(words: tokenizer_lib.WordTokenizer, texts: Sequence[str],
              standardized: bool) -> tuple[np.ndarray, np.ndarray]:
  """(flat int64 word ids of all texts, int64 offsets [N + 1])."""
  lookup = words.ids.get
  rows, lengths = [], np.zeros(len(texts), np.int64)
  for i, text in enumerate(texts):
    tokens = (text if standardized else tokenizer_lib.standardize(text)).split()
    lengths[i] = len(tokens)
    rows.append([lookup(token, tokenizer_lib.OOV_ID) for token in tokens])
  flat = np.fromiter((w for row in rows for w in row), np.int64, int(lengths.sum()))
  offsets = np.zeros(len(texts) + 1, np.int64)
  np.cumsum(lengths, out=offsets[1:])
  return flat, offsets


def ngram_keys(flat: np.ndarray, offsets: np.ndarray, order: int) -> tuple[np.ndarray, np.ndarray]:
  """(int64 keys of every n-gram of orders 1..order, the text index of each)."""
  text_of = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
  position = np.arange(len(flat)) - offsets[:-1][text_of]
  keys, texts = [], []
  for n in range(1, order + 1):
    ends = np.nonzero(position >= n - 1)[0]  # n-grams end at a position with n-1 words before
    key = np.full(len(ends), n, np.int64)
    for j in range(n):
      key = (key << _WORD_BITS) + flat[ends - (n - 1) + j]
    key <<= _WORD_BITS * (MAX_ORDER - n)
    keys.append(key)
    texts.append(text_of[ends])
  return np.concatenate(keys), np.concatenate(texts)


class NgramTokenizer:
  """Texts -> sorted n-gram feature ids (see the module docstring)."""

  kind = "ngram"

  def __init__(self, words: Sequence[str], keys: np.ndarray, order: int, counts: bool):
    if not 1 <= order <= MAX_ORDER:
      raise ValueError(f"ngram order {order} is invalid; allowed: 1 to {MAX_ORDER}.")
    self.words = tokenizer_lib.WordTokenizer(words)
    self.keys = np.asarray(keys, np.int64)  # by id - 2 (descending training count)
    self.order = int(order)
    self.counts = bool(counts)
    self._sorted = np.argsort(self.keys, kind="stable")
    self._sorted_keys = self.keys[self._sorted]

  @classmethod
  def train(cls, texts: Sequence[str], vocab_size: int, order: int, counts: bool, *,
            standardized: bool = False) -> NgramTokenizer:
    """The `vocab_size - 2` most frequent n-grams of `texts` (the training split only)."""
    if vocab_size <= tokenizer_lib.NUM_RESERVED:
      raise ValueError(f"vocab_size={vocab_size} is invalid; it must be > "
                       f"{tokenizer_lib.NUM_RESERVED}.")
    words = tokenizer_lib.WordTokenizer.train(texts, _MAX_WORDS + tokenizer_lib.NUM_RESERVED,
                                              standardized=standardized).words
    flat, offsets = _word_ids(tokenizer_lib.WordTokenizer(words), texts, standardized)
    keys, _ = ngram_keys(flat, offsets, order)
    unique, count = np.unique(keys, return_counts=True)
    ranked = np.lexsort((unique, -count))[:vocab_size - tokenizer_lib.NUM_RESERVED]
    return cls(words, unique[ranked], order, counts)

  @property
  def vocab_size(self) -> int:
    return len(self.keys) + tokenizer_lib.NUM_RESERVED

  def fingerprint(self) -> str:
    digest = hashlib.sha256("\n".join(self.words.words).encode("utf-8", "surrogatepass"))
    digest.update(self.keys.tobytes())
    return f"ngram{self.order}{'c' if self.counts else 'b'}-{digest.hexdigest()}"

  def ids(self, keys: np.ndarray) -> np.ndarray:
    """Feature ids of n-gram keys: 2.. in the vocabulary, 1 outside it."""
    if not len(self.keys):
      return np.full(keys.shape, tokenizer_lib.OOV_ID, np.int64)
    at = np.minimum(np.searchsorted(self._sorted_keys, keys), len(self.keys) - 1)
    found = self._sorted_keys[at] == keys
    return np.where(found, self._sorted[at] + tokenizer_lib.NUM_RESERVED, tokenizer_lib.OOV_ID)

  def _features(self, texts: Sequence[str], standardized: bool):
    """(row, id, rank within the row) of every feature of every text, rows ascending."""
    flat, offsets = _word_ids(self.words, texts, standardized)
    keys, text_of = ngram_keys(flat, offsets, self.order)
    width = np.int64(self.vocab_size)
    combined = text_of * width + self.ids(keys)
    combined = np.sort(combined) if self.counts else np.unique(combined)
    row, ids = np.divmod(combined, width)
    return row, ids, np.arange(len(row)) - np.searchsorted(row, row, side="left")

  def encode(self, texts: Sequence[str], max_len: int, truncation: str = "post", *,
             standardized: bool = False) -> np.ndarray:
    """int32 [N, max_len]: each text's feature ids, ascending, padded with 0. `truncation` is
    accepted for the common tokenizer signature; a row over max_len drops its highest ids."""
    tokenizer_lib.check_truncation(max_len, truncation)
    row, ids, rank = self._features(texts, standardized)
    keep = rank < max_len
    out = np.zeros((len(texts), max_len), np.int32)
    out[row[keep], rank[keep]] = ids[keep]
    return out

  def feature_counts(self, texts: Sequence[str]) -> np.ndarray:
    """Features per text before truncation to max_len: int64 [N]."""
    row, _, _ = self._features(texts, standardized=False)
    return np.bincount(row, minlength=len(texts)).astype(np.int64)

  def to_json(self) -> str:
    return json.dumps({"kind": self.kind, "order": self.order, "counts": self.counts,
                       "words": self.words.words, "keys": self.keys.tolist()},
                      ensure_ascii=False)

  @classmethod
  def from_json(cls, text: str) -> NgramTokenizer:
    data = json.loads(text)
    if data.get("kind") != cls.kind:
      raise ValueError(f"expected an n-gram vocabulary, found kind {data.get('kind')!r}")
    return cls(data["words"], np.asarray(data["keys"], np.int64), data["order"], data["counts"])

  def describe(self, feature_id: int) -> str:
    """The n-gram of a feature id, as words ("not good"); "[PAD]" / "[UNK]" for 0 / 1."""
    if feature_id < tokenizer_lib.NUM_RESERVED:
      return (tokenizer_lib.PAD_TOKEN, tokenizer_lib.OOV_TOKEN)[feature_id]
    key = int(self.keys[feature_id - tokenizer_lib.NUM_RESERVED])
    mask = (1 << _WORD_BITS) - 1
    ids = [(key >> (_WORD_BITS * (MAX_ORDER - 1 - j))) & mask for j in range(MAX_ORDER)]
    n = key >> (_WORD_BITS * MAX_ORDER)
    names = [self.words.words[i - tokenizer_lib.NUM_RESERVED]
             if i >= tokenizer_lib.NUM_RESERVED else tokenizer_lib.OOV_TOKEN for i in ids[:n]]
    return " ".join(names)


def tokenizer_from_json(text: str):
  """A saved word or n-gram vocabulary (WordTokenizer.to_json / NgramTokenizer.to_json)."""
  data = json.loads(text)
  if isinstance(data, dict) and data.get("kind") == NgramTokenizer.kind:
    return NgramTokenizer.from_json(text)
  return tokenizer_lib.WordTokenizer.from_json(text)
