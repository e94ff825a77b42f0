"""Tokenizers: Keras-style standardisation, reserved ids, tie order, truncation sides, bytes."""

import hashlib
import pathlib

import numpy as np
import pytest

from textattn.data import tokenizer as tokenizer_lib
from textattn.data.tokenizer import ByteTokenizer, WordTokenizer

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"


def test_standardize_lowercases_strips_line_breaks_and_punctuation():
  text = "Great MOVIE!<br /><br />Don't miss it... (10/10)<BR/>end"
  assert tokenizer_lib.standardize(text).split() == [
      "great", "movie", "dont", "miss", "it", "1010", "end"]


def test_vocab_reserves_padding_and_oov_and_counts_them_in_vocab_size():
  tokenizer = WordTokenizer.train(["b b b a a c"], vocab_size=4)
  assert tokenizer.words == ["b", "a"]  # 4 ids = padding, OOV and the top 2 words.
  assert tokenizer.vocab_size == 4
  ids = tokenizer.encode(["a b c"], max_len=5, truncation="post")
  assert ids.tolist() == [[3, 2, tokenizer_lib.OOV_ID, 0, 0]]


def test_vocab_ties_are_broken_by_the_word_not_by_input_order():
  first = WordTokenizer.train(["zeta beta", "alpha gamma gamma"], vocab_size=10)
  second = WordTokenizer.train(["alpha gamma gamma", "beta zeta"], vocab_size=10)
  assert first.words == second.words == ["gamma", "alpha", "beta", "zeta"]


def test_vocab_smaller_than_requested_when_data_has_few_words():
  assert WordTokenizer.train(["one two"], vocab_size=100).vocab_size == 4


@pytest.mark.parametrize("tokenizer", [WordTokenizer([str(i) for i in range(10)]),
                                       ByteTokenizer()], ids=["word", "byte"])
def test_pre_keeps_the_end_post_keeps_the_start_and_padding_is_on_the_right(tokenizer):
  long_text = "0 1 2 3 4 5 6 7 8 9" if tokenizer.kind == "word" else "0123456789"
  offset = 2 if tokenizer.kind == "word" else ord("0") + 2
  pre = tokenizer.encode([long_text, "5"], max_len=3, truncation="pre")
  post = tokenizer.encode([long_text, "5"], max_len=3, truncation="post")
  assert (pre[0] - offset).tolist() == [7, 8, 9]
  assert (post[0] - offset).tolist() == [0, 1, 2]
  assert pre[1].tolist() == post[1].tolist() == [5 + offset, 0, 0]
  assert pre.dtype == np.int32


def test_empty_and_punctuation_only_texts_encode_to_padding():
  tokenizer = WordTokenizer(["a"])
  assert tokenizer.encode(["", "!!! ..."], 4, "pre").tolist() == [[0] * 4, [0] * 4]


def test_invalid_truncation_is_rejected():
  with pytest.raises(ValueError, match="truncation"):
    WordTokenizer(["a"]).encode(["a"], 4, "middle")


def test_json_round_trip_keeps_every_id():
  tokenizer = WordTokenizer.train(["the cat sat on the mat!", "é ü 日本"], vocab_size=50)
  restored = WordTokenizer.from_json(tokenizer.to_json())
  assert restored.words == tokenizer.words
  assert restored.fingerprint() == tokenizer.fingerprint()


def test_tokenizer_json_saved_before_loads_with_the_same_ids_and_bytes():
  """Written by textattn before the punctuation option was removed (tests/fixtures)."""
  saved = (FIXTURES / "workdir_strip" / "tokenizer.json").read_text(encoding="utf-8")
  tokenizer = WordTokenizer.from_json(saved)
  assert tokenizer.words == ["bad", "film", "good", "really"]
  assert tokenizer.encode(["Good, bad film! unknown"], 6, "post").tolist() == [[4, 2, 3, 1, 0, 0]]
  assert tokenizer.to_json() == saved


def test_tokenizer_json_of_the_removed_split_punctuation_is_refused():
  saved = (FIXTURES / "workdir_split" / "tokenizer.json").read_text(encoding="utf-8")
  with pytest.raises(ValueError, match=r"punctuation='split', an option textattn no longer has"):
    WordTokenizer.from_json(saved)


def test_fingerprint_changes_when_any_id_changes_and_keeps_its_format():
  assert WordTokenizer(["a", "b"]).fingerprint() != WordTokenizer(["b", "a"]).fingerprint()
  # Cache keys hold it: the format every existing cache entry was written under.
  assert WordTokenizer(["a", "b"]).fingerprint() == (
      "word-" + hashlib.sha256(b"a\nb").hexdigest())


def test_saved_hugging_face_tokenizer_reproduces_our_ids():
  texts = ["I loved it.<br /><br />Best film of 2009, really!", "Worst. Movie. EVER?!",
           "unseen words here", "don't   stop", "a$b+c=d ~e^f `g|h <i> \\ j *** 7/10"]
  tokenizer = WordTokenizer.train(texts[:2] + ["stop dont", texts[4]], vocab_size=40)
  hf = tokenizer.to_hf()
  ours = tokenizer.encode(texts, max_len=32, truncation="post")
  for row, text in zip(ours, texts):
    ids = hf.encode(text).ids
    assert row[:len(ids)].tolist() == ids and not row[len(ids):].any()


def test_bytes_are_utf8_plus_two_and_vocab_is_258():
  ids = ByteTokenizer().encode(["é\x00"], max_len=4, truncation="post")
  assert ids.tolist() == [[0xC3 + 2, 0xA9 + 2, 2, 0]]
  assert ByteTokenizer.vocab_size == 258


def test_pre_standardized_texts_give_the_same_vocabulary_and_ids():
  texts = ["Hello, World!<br />Again", "WORLD peace... world"]
  plain = WordTokenizer.train(texts, vocab_size=10)
  standardized = [tokenizer_lib.standardize(t) for t in texts]
  fast = WordTokenizer.train(standardized, vocab_size=10, standardized=True)
  assert fast.words == plain.words
  np.testing.assert_array_equal(fast.encode(standardized, 6, "pre", standardized=True),
                                plain.encode(texts, 6, "pre"))
