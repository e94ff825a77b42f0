"""The language model's tokenizers: documents -> token ids, and back.

Every kind shares the special ids: 0 padding, 1 start of document, 2 end of document; a
document is [start] + its tokens + [end] (textattn/tasks/language_model/data.py packs them).
- bytes: the UTF-8 bytes of the raw text, id = byte + 3 (vocabulary 259); lossless.
- bpe: Hugging Face `tokenizers` byte-level BPE trained on the training split, id = its id + 3
  (it has no special tokens, so no text can spell one); lossless: decode(encode(t)) == t.
- word: the project's word tokenizer (textattn/data/tokenizer.py: lower case, ASCII punctuation
  dropped, `<br />` as a space), id = its id + 2 (3: out of vocabulary); lossy, so its runs
  report perplexity, not bits per byte.
Saved in the workdir as lm_tokenizer.json and read back from it (`from_json`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import numpy as np

from textattn.data import tokenizer as word_lib

PAD_ID, START_ID, END_ID = 0, 1, 2
NUM_SPECIAL = 3
KINDS = ("bytes", "bpe", "word")
LOSSLESS = ("bytes", "bpe")
FILE = "lm_tokenizer.json"


class ByteTokenizer:
  kind, lossless, vocab_size = "bytes", True, 256 + NUM_SPECIAL

  def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
    return [np.frombuffer(t.encode("utf-8"), np.uint8).astype(np.int32) + NUM_SPECIAL
            for t in texts]

  def decode(self, ids) -> str:
    data = bytes(int(i) - NUM_SPECIAL for i in ids if int(i) >= NUM_SPECIAL)
    return data.decode("utf-8", errors="replace")

  def fingerprint(self) -> str:
    return "lm-bytes-v1"

  def to_json(self) -> str:
    return json.dumps({"kind": "bytes"})


class BpeTokenizer:
  """Byte-level BPE with no special tokens of its own (so no text can spell one): id = its id +
  3."""
  kind, lossless = "bpe", True

  def __init__(self, hf):
    self.hf = hf

  @classmethod
  def train(cls, texts: Sequence[str], vocab_size: int) -> BpeTokenizer:
    # (tokenizers is imported here only: the bytes tokenizer, the default, never needs it)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - NUM_SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    hf.train_from_iterator(texts, trainer)
    return cls(hf)

  @property
  def vocab_size(self) -> int:
    return self.hf.get_vocab_size() + NUM_SPECIAL

  def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
    return [np.asarray(e.ids, np.int32) + NUM_SPECIAL
            for e in self.hf.encode_batch(list(texts), add_special_tokens=False)]

  def decode(self, ids) -> str:
    return self.hf.decode([int(i) - NUM_SPECIAL for i in ids if int(i) >= NUM_SPECIAL])

  def fingerprint(self) -> str:
    return "lm-bpe-" + hashlib.sha256(self.to_json().encode()).hexdigest()[:24]

  def to_json(self) -> str:
    return json.dumps({"kind": "bpe", "hf": json.loads(self.hf.to_str())})


class WordTokenizer:
  kind, lossless = "word", False

  def __init__(self, words: word_lib.WordTokenizer):
    self.words = words

  @classmethod
  def train(cls, texts: Sequence[str], vocab_size: int) -> WordTokenizer:
    return cls(word_lib.WordTokenizer.train(texts, vocab_size - 2))  # (its pad, OOV; our 3)

  @property
  def vocab_size(self) -> int:
    return self.words.vocab_size + 2

  def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
    lookup = self.words.ids.get
    return [np.asarray([lookup(w, word_lib.OOV_ID) + 2 for w in word_lib.standardize(t).split()],
                       np.int32) for t in texts]

  def decode(self, ids) -> str:
    return self.words.decode([int(i) - 2 for i in ids if int(i) >= NUM_SPECIAL])

  def fingerprint(self) -> str:
    return "lm-" + self.words.fingerprint()

  def to_json(self) -> str:
    return json.dumps({"kind": "word", "hf": json.loads(self.words.to_json())})


def train(kind: str, texts: Sequence[str], vocab_size: int):
  """The tokenizer `kind` (KINDS) of the training texts."""
  if kind == "bytes":
    return ByteTokenizer()
  return {"bpe": BpeTokenizer, "word": WordTokenizer}[kind].train(texts, vocab_size)


def from_json(text: str):
  data = json.loads(text)
  if data["kind"] == "bytes":
    return ByteTokenizer()
  if data["kind"] == "bpe":
    from tokenizers import Tokenizer  # (as in BpeTokenizer.train: only a BPE workdir needs it)
    return BpeTokenizer(Tokenizer.from_str(json.dumps(data["hf"])))
  if data["kind"] == "word":
    return WordTokenizer(word_lib.WordTokenizer.from_json(json.dumps(data["hf"])))
  raise ValueError(f"unknown tokenizer kind {data['kind']!r}")
