"""Token-embedding initialisation from a file of pretrained word vectors.

`config.embedding.init = "vectors:PATH"` starts the token-embedding table from vectors
someone else trained (GloVe, as Deep Learning with Python's chapter 11 loads, or word2vec's
GoogleNews), read with gensim's `KeyedVectors`:
- word2vec text (a "count dim" header line, then "word v1 v2 ...") or binary (the same header,
  then packed float32s; what `.bin` files hold), and GloVe `.txt` (word2vec text without the
  header, read with `no_header=True`). The format is told from the file's first bytes (a name
  ending in .bin or .bin.gz is binary whatever they look like); a `.gz` file is read compressed.
- Rows: the vector of each vocabulary word lands on its token id; a word the file has only
  with other capitals ("Paris" for the vocabulary's "paris") takes the first (most frequent)
  such entry. Padding, [UNK] and words without a vector keep the random initialisation.
- Scale: the vectors as they are ("raw", as the book does), or rescaled to the random
  initialiser's spread ("init", as the word2vec recipe's default).
- Coverage: how many vocabulary words found a vector, as a one-line summary a run prints.

The result is the (table, found) pair the word2vec recipe returns, which
step.init_train_state(pretrained_tokens=...) merges into the fresh parameters.
"""

from __future__ import annotations

import dataclasses
import gzip
import logging as std_logging
import os
import re

import numpy as np

from textattn.data import tokenizer as tokenizer_lib
from textattn.data.splits import DataError
from textattn.errors import DataConfigError, UsageError, one_line

PREFIX = "vectors:"
SCALES = ("raw", "init")
# The random initialiser's standard deviation: uniform(-0.05, 0.05) (layers.keras_embedding_init).
INIT_STD = 0.05 / np.sqrt(3.0)
FORMATS = ("word2vec_binary", "word2vec_text", "glove")
_HEADER = re.compile(rb"^\s*\d+\s+\d+\s*$")


def is_vectors(embedding_init: str) -> bool:
  return isinstance(embedding_init, str) and embedding_init.startswith(PREFIX)


def path_of(embedding_init: str) -> str:
  return os.path.expanduser(embedding_init[len(PREFIX):])


def check(embedding_init: str, tokenizer_kind: str, embed_dim: int | None = None) -> None:
  """One sentence for a vectors setting that cannot work, before any data is read: with
  `embed_dim`, also vectors of another size (read from the file's first line)."""
  path = path_of(embedding_init)
  if not path:
    raise UsageError("config.embedding.init='vectors:' names no file; give "
                     "'vectors:PATH' (a word2vec .txt/.bin or GloVe .txt file).")
  if tokenizer_kind != "word":
    raise UsageError(f"config.embedding.init={embedding_init!r} needs "
                     f"config.tokenizer='word' (word vectors for a word vocabulary), not "
                     f"{tokenizer_kind!r}.")
  if not os.path.isfile(path):
    raise DataError(f"config.embedding.init={embedding_init!r}: {path} is not a file; "
                    f"give the path of a word2vec .txt/.bin or GloVe .txt file.")
  dim = file_dim(path) if embed_dim is not None else None
  if dim is not None and dim != embed_dim:
    raise DataError(dimension_mismatch(path, dim, embed_dim))


def dimension_mismatch(path: str, dim: int, embed_dim: int) -> str:
  return (f"{path} holds {dim}-dimensional word vectors but config.model.embed_dim={embed_dim}; "
          f"set model.embed_dim={dim} to use them.")


def file_dim(path: str) -> int | None:
  """The vectors' size from the file's start: word2vec's "count dim" header, or the count of
  numbers that end each of GloVe's first two lines where they agree (a word may hold spaces or
  be a number itself); None where the start says neither (reading the file then says what is
  wrong)."""
  try:
    with _open(path) as f:
      first = f.readline(1 << 20)
      if _HEADER.match(first):
        return int(first.split()[1])
      second = f.readline(1 << 20)
  except OSError:
    return None
  counts = {_trailing_numbers(line) for line in (first, second) if line.strip()}
  return counts.pop() if len(counts) == 1 and 0 not in counts else None


def _trailing_numbers(line: bytes) -> int:
  fields, numbers = line.split(), 0
  for field in reversed(fields):
    try:
      float(field)
    except ValueError:
      break
    numbers += 1
  return numbers if numbers < len(fields) else 0  # (all numbers: the word is one too)


def validate_config(config) -> None:
  """`check` for a run's config, as its errors: a UsageError (exit 2) naming the field."""
  if config.embedding.vectors_scale not in SCALES:
    raise UsageError(f"config.embedding.vectors_scale={config.embedding.vectors_scale!r} is invalid; "
                     f"allowed: {', '.join(SCALES)}.")
  try:
    check(config.embedding.init, config.tokenizer, int(config.model.embed_dim))
  except DataError as e:
    raise DataConfigError(str(e)) from None
  except ValueError as e:
    raise UsageError(str(e)) from None


def token_table(config, tokenizer, vocab_size: int, announce: bool):
  """(table, found) of config.embedding.init = "vectors:PATH" for the run's word
  tokenizer, what step.init_train_state(pretrained_tokens=...) takes; `announce`: print the
  coverage line."""
  table, found, coverage = table_from_file(path_of(config.embedding.init), tokenizer,
                                           vocab_size, int(config.model.embed_dim),
                                           config.embedding.vectors_scale)
  if announce:
    print(coverage.summary(), flush=True)
  return table, found


def _open(path: str):
  return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def detect_format(path: str) -> str:
  """word2vec_binary, word2vec_text or glove, from the file's first bytes: a "count dim" header
  is word2vec's; after it, a .bin name or bytes that are not text (a NUL, invalid UTF-8) mean
  binary."""
  try:
    with _open(path) as f:
      first = f.readline(1 << 16)
      if not _HEADER.match(first):
        return "glove"
      sample = f.read(1 << 14)
  except OSError as e:
    raise DataError(f"The word-vector file {path} cannot be read ({one_line(e, 160)}).") from e
  if b"\0" in sample or path.endswith((".bin", ".bin.gz")):
    return "word2vec_binary"
  try:
    sample.decode("utf-8")
  except UnicodeDecodeError as e:
    if e.start < len(sample) - 3:  # (not just a character cut by the sample's end)
      return "word2vec_binary"
  return "word2vec_text"


def read_vectors(path: str):
  """(gensim KeyedVectors, format) of the file (`detect_format`); DataError if unreadable."""
  from gensim.models import KeyedVectors  # only runs that ask for vectors import gensim
  file_format = detect_format(path)
  gensim_logger = std_logging.getLogger("gensim")
  level = gensim_logger.level
  gensim_logger.setLevel(std_logging.WARNING)  # its per-file INFO lines
  try:
    keyed = KeyedVectors.load_word2vec_format(
        path, binary=file_format == "word2vec_binary", no_header=file_format == "glove")
  except (ValueError, EOFError, UnicodeDecodeError, OSError) as e:
    raise DataError(f"The word-vector file {path} cannot be read as "
                    f"{file_format.replace('_', ' ')} vectors ({one_line(e, 160)}).") from e
  finally:
    gensim_logger.setLevel(level)
  return keyed, file_format


@dataclasses.dataclass
class Coverage:
  """How much of the vocabulary the file covers."""
  path: str
  file_format: str
  file_words: int  # vectors in the file
  dim: int
  words: int  # vocabulary words (the reserved ids 0 and 1 not counted)
  found: int  # vocabulary words with a vector
  by_case: int  # of those, found only with other capitals

  def summary(self) -> str:
    share = self.found / self.words if self.words else 0.0
    case = f"; {self.by_case:,} matched ignoring case" if self.by_case else ""
    return (f"vectors: {self.found:,} of {self.words:,} vocabulary words ({share:.1%}) start "
            f"from a vector of {os.path.basename(self.path)} ({self.file_words:,} "
            f"{self.file_format.replace('_', ' ')} vectors, {self.dim} dimensions{case}); the "
            f"other rows keep the random initialisation.")


def table_from_file(path: str, tokenizer: tokenizer_lib.WordTokenizer, vocab_size: int,
                    embed_dim: int, scale: str = "raw") -> tuple[np.ndarray, np.ndarray, Coverage]:
  """(table float32 [vocab_size, embed_dim], found bool [vocab_size], coverage): row id(w) holds
  the file's vector of w where `found`, zeros elsewhere (the caller keeps its random rows)."""
  if scale not in SCALES:
    raise ValueError(f"scale={scale!r} is invalid; allowed: {', '.join(SCALES)}.")
  vectors, file_format = read_vectors(path)
  dim = int(vectors.vector_size)
  if dim != embed_dim:
    raise DataError(dimension_mismatch(path, dim, embed_dim))
  by_lower: dict[str, str] = {}
  for key in vectors.index_to_key:  # file order: the most frequent spelling first
    by_lower.setdefault(str(key).lower(), key)
  table = np.zeros((vocab_size, dim), np.float32)
  found = np.zeros(vocab_size, bool)
  by_case = 0
  for index, word in enumerate(tokenizer.words):
    row = index + tokenizer_lib.NUM_RESERVED
    key = word if word in vectors.key_to_index else by_lower.get(word.lower())
    if key is None or row >= vocab_size:
      continue
    table[row] = vectors[key]
    found[row] = True
    by_case += key != word
  if scale == "init":
    table = rescale(table, found, "init")
  coverage = Coverage(path=path, file_format=file_format, file_words=len(vectors.index_to_key),
                      dim=dim, words=len(tokenizer.words), found=int(found.sum()),
                      by_case=by_case)
  return table, found, coverage


def rescale(table: np.ndarray, found: np.ndarray, scale: str) -> np.ndarray:
  if scale == "raw" or not found.any():
    return table
  std = float(table[found].std())
  return table * np.float32(INIT_STD / std) if std > 0 else table
