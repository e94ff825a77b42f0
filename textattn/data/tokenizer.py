"""Text → int32 token ids: a Keras-style word vocabulary, or raw UTF-8 bytes.

Word tokenizer ("word"): standardisation as Keras `TextVectorization` and Deep Learning with
Python's IMDB example: lowercase, replace `<br />` with a space, delete ASCII punctuation
(`string.punctuation`, so "don't" → "dont"), split on whitespace. Id 0 is padding, id 1 is
out-of-vocabulary, ids 2.. are the training words by descending count, ties broken by the
word's code points — the order Hugging Face's `WordLevelTrainer` produces. `vocab_size`
counts the two reserved ids (Keras convention: 20000 → 19998 words).

The vocabulary is saved as a Hugging Face `tokenizer.json` (WordLevel model, the same
standardisation as `normalizers`, `WhitespaceSplit`), so `tokenizers.Tokenizer.from_file`
reproduces the ids, but for two rare cases: Python's `str.split` also splits at the separators
U+001C-U+001F, and `str.lower` writes a word-final capital sigma as "ς" where `Lowercase`
writes "σ" (training and prediction both use the Python path: they agree). Counting and encoding themselves run in plain Python (`str.translate`,
`str.split`, dict look-ups): on IMDB's 25,000 training reviews that measured about 2-3x
faster than `tokenizers`' `train_from_iterator` + `encode_batch_fast` on 2 CPU cores,
because its normalizers track per-character alignments we never use.

Subword tokenizer ("bpe", translation): Hugging Face `tokenizers` BPE trained on the training
split's standardised text, ids 0/1 as above, given special tokens next; `decode` joins the
subwords back into the standardised words.

Byte tokenizer ("byte", as Long Range Arena's text task): the UTF-8 bytes of the raw text,
id = byte + 2, vocabulary 258, no standardisation.

Both produce [N, max_len] int32 arrays: tokens left-aligned, padding 0 on the right;
truncation "pre" keeps the end of a long text, "post" keeps its start.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import re
import string
from collections.abc import Iterable, Sequence

import numpy as np

PAD_ID = 0
OOV_ID = 1
NUM_RESERVED = 2
PAD_TOKEN = "[PAD]"
OOV_TOKEN = "[UNK]"
BYTE_VOCAB_SIZE = 256 + NUM_RESERVED
TRUNCATIONS = ("pre", "post")

# Lowercasing first means "<BR />" is caught as well.
_LINE_BREAK = re.compile(r"<br\s*/?>")
_DELETE_PUNCTUATION = str.maketrans("", "", string.punctuation)
# The same standardisation in the Oniguruma syntax of `tokenizers` normalizers.
_HF_LINE_BREAK = r"<br\s*/?>"
_HF_PUNCTUATION = "[" + "".join("\\" + c for c in string.punctuation) + "]"


def vocab_size_for(config) -> int:
  """The ids a config's tokenizer uses at most: BYTE_VOCAB_SIZE for bytes, else vocab_size."""
  return BYTE_VOCAB_SIZE if config.tokenizer == "byte" else int(config.vocab_size)


def standardize(text: str) -> str:
  """Keras "lower_and_strip_punctuation" plus Deep Learning with Python's `<br />` removal."""
  return _LINE_BREAK.sub(" ", text.lower()).translate(_DELETE_PUNCTUATION)


def check_truncation(max_len: int, truncation: str) -> None:
  if truncation not in TRUNCATIONS:
    raise ValueError(f"truncation={truncation!r} is invalid; allowed: 'pre', 'post'.")
  if max_len < 1:
    raise ValueError(f"max_len={max_len} is invalid; it must be >= 1.")


class WordTokenizer:
  """Word-level vocabulary: ids 0 = padding, 1 = out-of-vocabulary, 2.. = `words`; `ids` maps
  each word to its id (read it, never change it: the fingerprint hashes `words`)."""

  kind = "word"

  def __init__(self, words: Sequence[str]):
    self.words = list(words)
    self.ids = {word: i + NUM_RESERVED for i, word in enumerate(self.words)}
    if len(self.ids) != len(self.words):
      raise ValueError("The vocabulary contains duplicate words.")

  @classmethod
  def train(cls, texts: Iterable[str], vocab_size: int, *,
            standardized: bool = False) -> WordTokenizer:
    """The top `vocab_size - 2` words of `texts` (the training split only).

    standardized=True: `texts` already went through `standardize` (saves a pass when the same
    texts are encoded next).
    """
    if vocab_size <= NUM_RESERVED:
      raise ValueError(f"vocab_size={vocab_size} is invalid; it must be > {NUM_RESERVED}.")
    counts = collections.Counter()
    for text in texts:
      counts.update((text if standardized else standardize(text)).split())
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return cls([word for word, _ in itertools.islice(ranked, vocab_size - NUM_RESERVED)])

  @property
  def vocab_size(self) -> int:
    return len(self.words) + NUM_RESERVED

  def fingerprint(self) -> str:
    """Changes whenever any id would change."""
    digest = hashlib.sha256("\n".join(self.words).encode("utf-8", "surrogatepass"))
    return f"word-{digest.hexdigest()}"  # the key of every cache entry written so far

  def encode(self, texts: Sequence[str], max_len: int, truncation: str, *,
             standardized: bool = False) -> np.ndarray:
    check_truncation(max_len, truncation)
    out = np.zeros((len(texts), max_len), np.int32)
    lookup = self.ids.get
    keep_end = truncation == "pre"
    for row, text in enumerate(texts):
      tokens = (text if standardized else standardize(text)).split()
      tokens = tokens[-max_len:] if keep_end else tokens[:max_len]
      if tokens:
        out[row, :len(tokens)] = [lookup(token, OOV_ID) for token in tokens]
    return out

  def token_id(self, token: str) -> int:
    return self.ids.get(token, OOV_ID)

  def decode(self, ids: Sequence[int]) -> str:
    """Words of the ids (0 skipped, 1 as [UNK])."""
    return " ".join(self.words[i - NUM_RESERVED] if i >= NUM_RESERVED else OOV_TOKEN
                    for i in map(int, ids) if i != PAD_ID)

  def to_hf(self):
    """The equivalent Hugging Face `tokenizers.Tokenizer`."""
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel
    vocab = {PAD_TOKEN: PAD_ID, OOV_TOKEN: OOV_ID, **self.ids}
    hf = Tokenizer(WordLevel(vocab=vocab, unk_token=OOV_TOKEN))
    hf.normalizer = normalizers.Sequence([
        normalizers.Lowercase(), normalizers.Replace(Regex(_HF_LINE_BREAK), " "),
        normalizers.Replace(Regex(_HF_PUNCTUATION), "")])
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return hf

  def to_json(self) -> str:
    return self.to_hf().to_str(pretty=True)

  @classmethod
  def from_json(cls, text: str) -> WordTokenizer:
    """Reads `to_json` output (a Hugging Face tokenizer.json with a WordLevel model)."""
    data = json.loads(text)
    vocabulary = data["model"]  # (the tokenizer's model: its vocabulary)
    if (data.get("pre_tokenizer") or {}).get("type") == "Sequence":
      # What the removed punctuation="split" option saved: its ids would differ from ours.
      raise ValueError("it keeps punctuation marks as tokens (punctuation='split', an option "
                       "textattn no longer has)")
    if vocabulary.get("type") != "WordLevel":
      raise ValueError(f"expected a WordLevel model, found {vocabulary.get('type')!r}")
    by_id = sorted(vocabulary["vocab"].items(), key=lambda item: item[1])
    ids = [i for _, i in by_id]
    if ids != list(range(len(ids))) or len(ids) < NUM_RESERVED:
      raise ValueError("vocabulary ids are not 0..n-1")
    if [w for w, _ in by_id[:NUM_RESERVED]] != [PAD_TOKEN, OOV_TOKEN]:
      raise ValueError(f"ids 0 and 1 must be {PAD_TOKEN} and {OOV_TOKEN}")
    return cls([word for word, _ in by_id[NUM_RESERVED:]])


class BpeTokenizer:
  """Byte-pair-encoding subwords (HF `tokenizers`' BPE model and trainer) of standardised text."""

  kind = "bpe"
  _SUFFIX = "</w>"  # marks a word's last subword, so decode restores the spaces

  def __init__(self, hf):
    self.hf = hf

  @classmethod
  def train(cls, texts: Iterable[str], vocab_size: int, specials: Sequence[str] = (), *,
            standardized: bool = False) -> BpeTokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    if vocab_size <= NUM_RESERVED + len(specials):
      raise ValueError(f"vocab_size={vocab_size} is invalid; it must be > "
                       f"{NUM_RESERVED + len(specials)}.")
    hf = Tokenizer(models.BPE(unk_token=OOV_TOKEN, end_of_word_suffix=cls._SUFFIX))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.decoder = decoders.BPEDecoder(suffix=cls._SUFFIX)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  special_tokens=[PAD_TOKEN, OOV_TOKEN, *specials],
                                  end_of_word_suffix=cls._SUFFIX)
    hf.train_from_iterator((t if standardized else standardize(t) for t in texts), trainer)
    return cls(hf)

  @property
  def vocab_size(self) -> int:
    return self.hf.get_vocab_size()

  def token_id(self, token: str) -> int:
    return self.hf.token_to_id(token)

  def fingerprint(self) -> str:
    return "bpe-" + hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

  def encode(self, texts: Sequence[str], max_len: int, truncation: str, *,
             standardized: bool = False) -> np.ndarray:
    check_truncation(max_len, truncation)
    out = np.zeros((len(texts), max_len), np.int32)
    texts = [t if standardized else standardize(t) for t in texts]
    for row, encoding in enumerate(self.hf.encode_batch(texts, add_special_tokens=False)):
      ids = encoding.ids[-max_len:] if truncation == "pre" else encoding.ids[:max_len]
      out[row, :len(ids)] = ids
    return out

  def decode(self, ids: Sequence[int]) -> str:
    return self.hf.decode([int(i) for i in ids], skip_special_tokens=True)

  def to_json(self) -> str:
    return self.hf.to_str(pretty=True)

  @classmethod
  def from_json(cls, text: str) -> BpeTokenizer:
    from tokenizers import Tokenizer
    return cls(Tokenizer.from_str(text))


def from_json(text: str):
  """A saved word or BPE tokenizer (its tokenizer.json's model type decides)."""
  if json.loads(text).get("model", {}).get("type") == "BPE":
    return BpeTokenizer.from_json(text)
  return WordTokenizer.from_json(text)


class ByteTokenizer:
  """UTF-8 bytes of the raw text, id = byte + 2 (0 = padding; 1 is unused)."""

  kind = "byte"
  vocab_size = BYTE_VOCAB_SIZE

  def fingerprint(self) -> str:
    return "byte-v1"

  def encode(self, texts: Sequence[str], max_len: int, truncation: str, *,
             standardized: bool = False) -> np.ndarray:
    del standardized  # Bytes are never standardised.
    check_truncation(max_len, truncation)
    out = np.zeros((len(texts), max_len), np.int32)
    keep_end = truncation == "pre"
    for row, text in enumerate(texts):
      data = text.encode("utf-8")
      data = data[-max_len:] if keep_end else data[:max_len]
      out[row, :len(data)] = np.frombuffer(data, np.uint8).astype(np.int32) + NUM_RESERVED
    return out
