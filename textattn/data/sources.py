"""The config's data source (a local file or a TFDS dataset) and what the pretraining recipes
take from it: unlabelled text, and cache paths keyed by the source's content."""

from __future__ import annotations

import os
from typing import Any

from textattn.data import tokenizer as tokenizer_lib
from textattn.data.cache import Cache, cache_dir, key, slug
from textattn.data.file_source import FileSource, is_local_file
from textattn.data.tfds_source import TfdsSource
from textattn.errors import UsageError


def source(config) -> FileSource | TfdsSource:
  return FileSource(config) if is_local_file(config.dataset) else TfdsSource(config)


def source_cache_path(config, what: str, key_parts: dict[str, Any], extension: str,
                      write: bool = True) -> str | None:
  """A path in cache_dir for something derived from the config's data source (not yet read),
  its train/validation carve and `key_parts`; None when the source has no identity yet (TFDS
  data not prepared, or a file that does not exist), so nothing is cached. `write`: False
  where nothing may be written to the cache dir (non-zero processes)."""
  identity = source(config).identity(write)
  if identity is None:
    return None
  path_key = key({**Cache(config, identity, writable=False).source_key(), "what": what,
                  **key_parts})
  return os.path.join(cache_dir(config), f"{slug(config)}-{what}-{path_key}{extension}")


def pretraining_texts(config, unlabeled_split: str,
                      field: str = "word2vec.unlabeled_split") -> tuple[list[str], bool]:
  """The raw texts a model may be pretrained on without labels: the training split (validation
  carved out exactly as load_dataset does) plus TFDS split `unlabeled_split` if not "" (TFDS
  only: the callers' config checks refuse it for a local file). Never the validation or test
  split. Also whether the texts came from the source's own files (False for mocked TFDS data),
  i.e. whether what is derived from them may be cached. `field`: the config field naming the
  split, for error messages."""
  data_source = source(config)
  raw = data_source.read(config.val_fraction, config.data_seed)
  texts = list(raw.texts["train"])
  if unlabeled_split:
    texts.extend(data_source.read_unlabeled(unlabeled_split, field))
  return texts, data_source.cacheable()


def word2vec_texts(config, unlabeled_split: str) -> tuple[list[list[str]], bool]:
  """pretraining_texts, standardised and split into words (the word2vec recipe's corpus)."""
  texts, cacheable = pretraining_texts(config, unlabeled_split)
  return [tokenizer_lib.standardize(text).split() for text in texts], cacheable


def check_unlabeled_split(config, field: str, purpose: str) -> None:
  """One sentence if config.<field> names a TFDS split of unlabelled text while config.dataset
  is a local file (which has none)."""
  section, _, name = field.partition(".")
  split = config[section][name]
  if split and is_local_file(config.dataset):
    raise UsageError(f"config.{field}={split!r} names a TFDS split, but config.dataset is a "
                     f"local file; set it to '' ({purpose} on the training split's text only).")
