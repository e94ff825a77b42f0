"""A pretrained model's own tokenizer (its tokenizer.json, Hugging Face `tokenizers`) behind the
interface of textattn.data.tokenizer: `encode(texts, max_len, truncation)` -> int32
[N, max_len], tokens left-aligned, padding (id 0) after them.

Id 0 is padding everywhere in textattn (batches, masks, explanations). A model that pads with
another id (RoBERTa: <pad> = 1, <s> = 0) has its padding id and id 0 swapped: here in the ids
(`to_ours`, its own inverse) and in the rows of its word-embedding table when its weights are
read (hf.read_weights), so the model computes the same function on the same text. BERT's
padding id is 0: nothing changes.

The ids must be the ones the weights were trained with, so the text is not standardised first
(the tokenizer's own normaliser does what it needs, e.g. BERT's lowercasing and accent
stripping), and the special tokens its post-processor adds ([CLS] ... [SEP]) are kept. Only HTML
line breaks ("<br />", IMDB has about four a review) become spaces, as the word tokenizer's
standardisation does: BERT's tokenizer would spend four tokens of max_len on each. A
tokenizer.json that enables its own truncation or padding (all-MiniLM-L6-v2's truncates and
pads to 128) has both switched off: length is the run's config.max_len, which counts the
special tokens, and "pre" truncation keeps the end of a text, "post" its start, as for every
textattn tokenizer.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np

from textattn.data.tokenizer import check_truncation
from textattn.errors import UsageError

DIRECTIONS = {"pre": "left", "post": "right"}  # textattn's truncation -> tokenizers' direction
_LINE_BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)
_TEXT_RULES = "line breaks as spaces"  # in the fingerprint: encoded arrays change with it


def swap_ids(ids, pad_id: int):
  """ids with pad_id and 0 exchanged (its own inverse); works on ints and NumPy arrays."""
  ids = np.asarray(ids)
  return np.where(ids == pad_id, 0, np.where(ids == 0, pad_id, ids)).astype(ids.dtype)


class PretrainedTokenizer:
  """A `tokenizers.Tokenizer` with no truncation or padding of its own. `model_pad_id`: the
  model's padding id (config.json's pad_token_id), which the ids handed out exchange with 0."""

  kind = "pretrained"
  pad_id = 0  # in the ids this class hands out, as everywhere in textattn

  def __init__(self, hf, model_pad_id: int):
    hf.no_truncation()
    hf.no_padding()
    self.hf = hf
    self.model_pad_id = int(model_pad_id)
    self._json = hf.to_str(pretty=True)  # before encode() sets a truncation on it

  @classmethod
  def from_file(cls, path, model_pad_id: int) -> PretrainedTokenizer:
    from tokenizers import Tokenizer
    return cls(Tokenizer.from_file(str(path)), model_pad_id)

  @classmethod
  def from_json(cls, text: str, model_pad_id: int) -> PretrainedTokenizer:
    """Reads `to_json` output (what a workdir keeps, so a resumed run or predict needs no
    model directory)."""
    from tokenizers import Tokenizer
    return cls(Tokenizer.from_str(text), model_pad_id)

  def to_ours(self, ids):
    """The tokenizer's ids <-> textattn's (padding id and 0 exchanged; its own inverse)."""
    return swap_ids(ids, self.model_pad_id)

  @property
  def vocab_size(self) -> int:
    return self.hf.get_vocab_size()

  def fingerprint(self) -> str:
    """Changes whenever any id would change."""
    # (BERT's padding id is 0: its fingerprint, and so its caches, are as before the swap.)
    swap = f"\npadding id {self.model_pad_id} as 0" if self.model_pad_id else ""
    digest = hashlib.sha256(f"{_TEXT_RULES}{swap}\n{self._json}".encode()).hexdigest()
    return f"pretrained-{digest}"

  def encode(self, texts: Sequence[str], max_len: int, truncation: str, *,
             standardized: bool = False) -> np.ndarray:
    if standardized:
      raise ValueError("A pretrained tokenizer needs the raw text: standardising it first "
                       "(lowercase, no punctuation) would change its ids.")
    check_truncation(max_len, truncation)
    added = self.special_tokens()
    if max_len <= added:
      raise UsageError(f"config.max_len={max_len} leaves no room for a token beside the "
                       f"{added} special tokens the pretrained tokenizer adds; use a larger "
                       f"max_len.")
    self.hf.enable_truncation(max_len, direction=DIRECTIONS[truncation])
    try:
      encodings = self.hf.encode_batch(self._clean(texts))
    finally:
      self.hf.no_truncation()
    out = np.full((len(encodings), max_len), self.pad_id, np.int32)
    for row, encoding in enumerate(encodings):
      out[row, :len(encoding.ids)] = self.to_ours(np.asarray(encoding.ids, np.int32))
    return out

  def special_tokens(self) -> int:
    """How many tokens the post-processor adds to one text ([CLS] and [SEP]: 2)."""
    return self.hf.num_special_tokens_to_add(False)

  def lengths(self, texts: Sequence[str]) -> np.ndarray:
    """Tokens of each text before truncation, the special tokens included (as max_len counts)."""
    return np.array([len(e.ids) for e in self.hf.encode_batch(self._clean(texts))], np.int64)

  @staticmethod
  def _clean(texts: Sequence[str]) -> list[str]:
    return [_LINE_BREAK.sub(" ", text) for text in texts]

  def tokens(self, ids: Sequence[int]) -> list[str]:
    """The token strings of `ids` ("[CLS]", "film", "##ing", ...), padding left out."""
    return [self.hf.id_to_token(int(self.to_ours(i))) for i in ids if int(i) != self.pad_id]

  def token_id(self, token: str) -> int | None:
    found = self.hf.token_to_id(token)
    return None if found is None else int(self.to_ours(found))

  def decode(self, ids: Sequence[int]) -> str:
    """The text of `ids`, special tokens and padding skipped."""
    return self.hf.decode([int(self.to_ours(i)) for i in ids if int(i) != self.pad_id],
                          skip_special_tokens=True)

  def to_json(self) -> str:
    return self._json
