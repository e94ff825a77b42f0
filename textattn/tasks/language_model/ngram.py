"""A byte n-gram language model with interpolated Kneser-Ney smoothing, in NumPy: the reference
row of the language model's report.

Symbols: the 256 byte values, END (256, predicted after a document's last byte) and START (257,
context only): each document is seen as START * (order - 1), its UTF-8 bytes, END, so its first
byte is conditioned on nothing but the start. Interpolated Kneser-Ney (Chen & Goodman 1999,
one discount per order, D = n1 / (n1 + 2 n2)): the highest order uses raw counts, the lower ones
continuation counts (distinct left extensions), and the unigram level is interpolated with the
uniform distribution over the 257 predicted symbols, so every probability is > 0 and each
conditional distribution sums to 1:

  P_k(w | h) = max(c_k(h w) - D_k, 0) / c_k(h) + D_k N1+(h .) / c_k(h) * P_{k-1}(w | h'),
  P_k(w | h) = P_{k-1}(w | h')  where the context h was never seen.

N-grams are int64 keys (9 bits a symbol, so order <= 7), counted with np.unique.
"""

from __future__ import annotations

import lzma
from collections.abc import Sequence

import numpy as np

END, START = 256, 257
VOCAB = 257  # predicted symbols: bytes and END
_BITS = 9
MAX_ORDER = 7


def _symbols(documents: Sequence[bytes], order: int) -> tuple[np.ndarray, np.ndarray]:
  """(stream int64, targets bool): each document as START * (order - 1) + bytes + END, end to
  end; targets marks the positions that are predicted (every one but the START padding)."""
  pieces, pad = [], np.full(order - 1, START, np.int64)
  for document in documents:
    pieces += [pad, np.frombuffer(document, np.uint8).astype(np.int64), np.array([END])]
  stream = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
  return stream, stream != START


def _keys(stream: np.ndarray, positions: np.ndarray, length: int) -> np.ndarray:
  """The int64 key of the `length` symbols ending at each of `positions`."""
  key = np.zeros(len(positions), np.int64)
  for back in range(length - 1, -1, -1):
    key = (key << _BITS) | stream[positions - back]
  return key


def _discount(counts: np.ndarray) -> float:
  n1, n2 = np.sum(counts == 1), np.sum(counts == 2)
  return float(n1 / (n1 + 2 * n2)) if n1 + 2 * n2 else 0.5


class KneserNey:
  """fit on training documents (bytes); `log2_probs(documents)` of test documents."""

  def __init__(self, order: int = 5):
    if not 1 <= order <= MAX_ORDER:
      raise ValueError(f"order={order} must be 1..{MAX_ORDER}.")
    self.order = order

  def fit(self, documents: Sequence[bytes]) -> KneserNey:
    stream, targets = _symbols(documents, self.order)
    top = _keys(stream, np.flatnonzero(targets), self.order)
    grams, counts = np.unique(top, return_counts=True)
    # Per order k = order..1: (n-gram keys, their counts, sorted context keys, each context's
    # total count and number of distinct followers, the discount).
    self.levels = {}
    for k in range(self.order, 0, -1):
      contexts = grams >> _BITS
      context_keys, first, types = np.unique(contexts, return_index=True, return_counts=True)
      totals = np.add.reduceat(counts, first) if len(counts) else counts
      self.levels[k] = (grams, counts, context_keys, totals, types, _discount(counts))
      if k > 1:  # continuation counts of the (k-1)-grams: distinct left extensions
        suffixes = grams & ((1 << (_BITS * (k - 1))) - 1)
        grams, counts = np.unique(suffixes, return_counts=True)
    return self

  def _probs(self, histories: np.ndarray, symbols: np.ndarray) -> np.ndarray:
    """P(symbol | history) float64 for histories int64 [M, order - 1] (oldest first)."""
    p = np.full(len(symbols), 1.0 / VOCAB)
    for k in range(1, self.order + 1):
      grams, counts, context_keys, totals, types, discount = self.levels[k]
      context = np.zeros(len(symbols), np.int64)
      for column in range(self.order - k, self.order - 1):
        context = (context << _BITS) | histories[:, column]
      gram = (context << _BITS) | symbols
      count = _lookup(grams, counts, gram)
      total = _lookup(context_keys, totals, context)
      distinct = _lookup(context_keys, types, context)
      seen = total > 0
      safe = np.where(seen, total, 1)
      p = np.where(seen, np.maximum(count - discount, 0) / safe
                   + discount * distinct / safe * p, p)
    return p

  def distribution(self, history: bytes | Sequence[int]) -> np.ndarray:
    """P(. | history) over the 257 symbols (bytes, then END); the history's last order - 1
    symbols count, START-padded (a document's start: b"")."""
    symbols = [START] * (self.order - 1) + list(history)
    context = np.asarray(symbols[len(symbols) - (self.order - 1):], np.int64)
    histories = np.broadcast_to(context, (VOCAB, self.order - 1))
    return self._probs(histories, np.arange(VOCAB, dtype=np.int64))

  def log2_likelihood(self, documents: Sequence[bytes], chunk: int = 1 << 20) -> float:
    """Total log2 P of the documents' bytes and ENDs (each from its own start)."""
    stream, targets = _symbols(documents, self.order)
    positions = np.flatnonzero(targets)
    total = 0.0
    for begin in range(0, len(positions), chunk):
      at = positions[begin:begin + chunk]
      histories = np.stack([stream[at - back] for back in range(self.order - 1, 0, -1)], axis=1) \
          if self.order > 1 else np.zeros((len(at), 0), np.int64)
      total += float(np.sum(np.log2(self._probs(histories, stream[at]))))
    return total


def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
  """values[i] where keys[i] == query (keys sorted), else 0."""
  if len(keys) == 0:
    return np.zeros(len(query), np.float64)
  index = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
  return np.where(keys[index] == query, values[index], 0).astype(np.float64)


def bits_per_byte(train: Sequence[str], test: Sequence[str], order: int) -> float:
  """The test documents' total -log2 P under a KN model of the training documents, per byte."""
  encoded = [t.encode("utf-8") for t in test]
  model = KneserNey(order).fit([t.encode("utf-8") for t in train])
  return -model.log2_likelihood(encoded) / max(sum(len(e) for e in encoded), 1)


def xz_bits_per_byte(test: Sequence[str]) -> float:
  """xz -9e (lzma preset 9 | EXTREME) compressed size of the test documents, one a line, in
  bits per byte of their text (the newlines not counted, as bits per byte counts no [end])."""
  encoded = [t.encode("utf-8") for t in test]
  compressed = lzma.compress(b"\n".join(encoded), preset=9 | lzma.PRESET_EXTREME)
  return 8.0 * len(compressed) / max(sum(len(e) for e in encoded), 1)

