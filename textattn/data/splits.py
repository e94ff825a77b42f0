"""What `load_dataset` returns (`Split`, `Dataset`), the two padding layouts, and `DataError`,
the one exception the package raises for bad data or a bad data setting."""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections
import numpy as np

from textattn.errors import DataError  # noqa: F401 -- re-exported: textattn.data.DataError

SPLITS = ("train", "validation", "test")

# config.layout.padding: "after_masked" (textattn's: tokens first, padding after, masked out of
# attention and pooling) or "before_as_token" (the Keras seed's: pad_sequences puts padding
# before the tokens and its model never masks it, so id 0 is embedded, attended to and averaged
# like any token; the model then takes no padding mask, models.Classifier.mask_padding).
PADDINGS = ("after_masked", "before_as_token")


def layout_config():
  """config.layout, an opt-in part (config.complete): where an example's tokens sit in its row."""
  part = ml_collections.ConfigDict()
  part.truncation = "pre"  # pre drops tokens from the start (Keras' default), post from the end
  # after_masked: padding after the tokens, masked; before_as_token: the Keras seed's layout
  # (padding first, attended to and pooled like a token)
  part.padding = "after_masked"
  return part


@dataclasses.dataclass
class Split:
  inputs: np.ndarray  # int32 [N, max_len], 0 = padding; tokens left-aligned (right-aligned
  #                     with config.layout.padding="before_as_token").
  labels: np.ndarray  # int32 [N]

  def __len__(self) -> int:
    return len(self.labels)


@dataclasses.dataclass
class Dataset:
  train: Split
  validation: Split
  test: Split
  class_names: list[str]
  vocab_size: int  # Ids in use: <= config.vocab_size for "word", 258 for "byte".
  # Examples skipped (empty text) per source split, e.g. {"train": 3}.
  skipped: dict[str, int] = dataclasses.field(default_factory=dict)
  tokenizer: Any = None  # The run's WordTokenizer or ByteTokenizer (ids -> the arrays above).


def pads_before(config) -> bool:
  """Whether the config asks for the Keras seed's layout (config.layout.padding="before_as_token")."""
  return config.layout.padding == "before_as_token"


def pad_before(inputs: np.ndarray) -> np.ndarray:
  """Left-aligned rows (tokens, then 0s) -> right-aligned (0s, then the same tokens), the layout
  of Keras' pad_sequences(padding="pre"). Token ids are never 0, so a row's token count is its
  number of non-zero ids."""
  length = inputs.shape[1]
  shift = length - np.count_nonzero(inputs, axis=1)
  source = np.arange(length)[None, :] - shift[:, None]
  rows = np.arange(inputs.shape[0])[:, None]
  return np.where(source >= 0, inputs[rows, np.maximum(source, 0)], 0).astype(inputs.dtype)
