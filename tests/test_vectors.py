"""Pretrained word vectors from a file (textattn/recipes/vectors.py): each format is read, each
vector lands on its word's token id, coverage is counted, and what cannot work is refused in
one sentence. The files are written here, a few words each."""

import gzip

import numpy as np
import pytest

from textattn.data import tokenizer as tokenizer_lib
from textattn.data.splits import DataError
from textattn.recipes import vectors

WORDS = ["the", "movie", "paris", "zzzunknown"]  # vocabulary: ids 2.. in this order
FILE_VECTORS = {  # the file's words, in file order; "Paris" only capitalised, then "PARIS"
    "the": [0.5, -1.0, 2.0],
    "movie": [1.5, 0.25, -0.75],
    "Paris": [3.0, 3.0, -3.0],
    "PARIS": [9.0, 9.0, 9.0],
    "film": [7.0, 7.0, 7.0],
}
VOCAB_SIZE = len(WORDS) + tokenizer_lib.NUM_RESERVED


def text_lines(header: bool) -> str:
  lines = [f"{len(FILE_VECTORS)} 3"] if header else []
  lines += [f"{w} {' '.join(repr(x) for x in v)}" for w, v in FILE_VECTORS.items()]
  return "\n".join(lines) + "\n"


def write_binary(path) -> None:
  """word2vec's binary format: the text header, then "word " and packed float32s per entry."""
  with open(path, "wb") as f:
    f.write(f"{len(FILE_VECTORS)} 3\n".encode())
    f.writelines(word.encode() + b" " + np.asarray(vector, "<f4").tobytes() + b"\n"
                 for word, vector in FILE_VECTORS.items())


def write(tmp_path, kind: str):
  if kind == "glove":
    path = tmp_path / "glove.6B.3d.txt"
    path.write_text(text_lines(header=False))
  elif kind == "word2vec_text":
    path = tmp_path / "vectors.txt"
    path.write_text(text_lines(header=True))
  elif kind == "word2vec_binary":
    path = tmp_path / "vectors.bin"
    write_binary(path)
  else:  # gzipped GloVe
    path = tmp_path / "glove.txt.gz"
    with gzip.open(path, "wt") as f:
      f.write(text_lines(header=False))
  return str(path)


@pytest.mark.parametrize("kind", ["glove", "word2vec_text", "word2vec_binary", "glove_gz"])
def test_each_format_puts_every_vector_on_its_words_row(tmp_path, kind):
  path = write(tmp_path, kind)
  assert vectors.detect_format(path) == ("glove" if kind == "glove_gz" else kind)
  tokenizer = tokenizer_lib.WordTokenizer(WORDS)
  table, found, coverage = vectors.table_from_file(path, tokenizer, VOCAB_SIZE, 3)
  ids = {w: tokenizer.token_id(w) for w in WORDS}
  np.testing.assert_array_equal(table[ids["the"]], FILE_VECTORS["the"])
  np.testing.assert_array_equal(table[ids["movie"]], FILE_VECTORS["movie"])
  # "paris" is in the file only capitalised: the first spelling (the most frequent) wins.
  np.testing.assert_array_equal(table[ids["paris"]], FILE_VECTORS["Paris"])
  expected_found = np.zeros(VOCAB_SIZE, bool)
  expected_found[[ids["the"], ids["movie"], ids["paris"]]] = True
  np.testing.assert_array_equal(found, expected_found)  # never padding, [UNK] or a missing word
  assert table.dtype == np.float32 and table.shape == (VOCAB_SIZE, 3)
  assert not table[~found].any()
  assert (coverage.found, coverage.words, coverage.by_case, coverage.file_words) == (3, 4, 1, 5)
  assert coverage.summary().startswith("vectors: 3 of 4 vocabulary words (75.0%) start from a "
                                       "vector of ")
  assert "1 matched ignoring case" in coverage.summary()


def test_init_scale_matches_the_random_initialisers_spread(tmp_path):
  path = write(tmp_path, "glove")
  tokenizer = tokenizer_lib.WordTokenizer(WORDS)
  raw, found, _ = vectors.table_from_file(path, tokenizer, VOCAB_SIZE, 3)
  scaled, _, _ = vectors.table_from_file(path, tokenizer, VOCAB_SIZE, 3, scale="init")
  assert raw[found].std() > 1.0
  np.testing.assert_allclose(scaled[found].std(), 0.05 / np.sqrt(3.0), rtol=1e-5)


def assert_one_sentence(error, *fragments):
  message = str(error.value)
  assert "\n" not in message and message.endswith("."), message
  for fragment in fragments:
    assert fragment in message, message


def test_a_dimension_other_than_embed_dim_is_refused_in_one_sentence(tmp_path):
  path = write(tmp_path, "glove")
  with pytest.raises(DataError) as error:
    vectors.table_from_file(path, tokenizer_lib.WordTokenizer(WORDS), VOCAB_SIZE, 32)
  assert_one_sentence(error, "3-dimensional", "config.model.embed_dim=32",
                      "model.embed_dim=3")


def test_settings_that_cannot_work_are_refused_before_reading(tmp_path):
  with pytest.raises(DataError) as error:
    vectors.check(f"vectors:{tmp_path}/missing.txt", "word")
  assert_one_sentence(error, "missing.txt is not a file")
  path = write(tmp_path, "glove")
  with pytest.raises(ValueError) as error:
    vectors.check(f"vectors:{path}", "byte")
  assert_one_sentence(error, "config.tokenizer='word'")
  with pytest.raises(ValueError) as error:
    vectors.check("vectors:", "word")
  assert_one_sentence(error, "names no file")
  vectors.check(f"vectors:{path}", "word")


@pytest.mark.parametrize("kind", ["glove", "word2vec_text", "word2vec_binary", "glove_gz"])
def test_a_dimension_other_than_embed_dim_is_refused_from_the_first_line(tmp_path, kind):
  # (at the config's validation, before the data and the whole file are read)
  path = write(tmp_path, kind)
  vectors.check(f"vectors:{path}", "word", 3)
  with pytest.raises(DataError) as error:
    vectors.check(f"vectors:{path}", "word", 32)
  assert_one_sentence(error, "3-dimensional", "config.model.embed_dim=32", "model.embed_dim=3")


def test_a_file_that_is_not_vectors_is_refused_in_one_sentence(tmp_path):
  path = tmp_path / "notes.txt"
  path.write_text("this is a sentence, not a vector file\nnor is this\n")
  with pytest.raises(DataError) as error:
    vectors.table_from_file(str(path), tokenizer_lib.WordTokenizer(WORDS), VOCAB_SIZE, 3)
  assert_one_sentence(error, "notes.txt cannot be read as glove vectors")
