"""What a source's read() returns (`Raw`: texts and label ids of every split) and the steps
both sources share: decoding and joining text fields, label ids, skipping empty texts (counted
and logged) and the deterministic carve of held-out splits."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import logging

from textattn.data.splits import DataError

_SHOW_SKIPPED = 5


@dataclasses.dataclass
class Raw:
  """Texts and labels of every split; labels index `class_names`."""
  texts: dict[str, list[str]]
  labels: dict[str, np.ndarray]
  class_names: list[str]
  skipped: dict[str, int]


def text_fields(config) -> list[str]:
  return [f.strip() for f in str(config.text_fields).split(",") if f.strip()]


def decode(value: bytes | str, where: str) -> str:
  if isinstance(value, str):
    return value
  try:
    return value.decode("utf-8")
  except UnicodeDecodeError as e:
    raise DataError(f"{where}: invalid UTF-8 ({e.reason} at byte {e.start}).") from None


def join_fields(values: Sequence[str]) -> str:
  return values[0] if len(values) == 1 else " ".join(values)


def label_string(value: Any) -> str:
  if isinstance(value, bytes):
    value = value.decode("utf-8", "replace")
  return str(value).strip()


def index_labels(labels: dict[str, list[str]]) -> tuple[list[str], dict[str, np.ndarray]]:
  """Label ids in the sorted order of the distinct label strings."""
  class_names = sorted({label for values in labels.values() for label in values})
  index = {name: i for i, name in enumerate(class_names)}
  return class_names, {split: np.array([index[v] for v in values], np.int32)
                       for split, values in labels.items()}


def keep_nonempty(texts: list[str], where: str, row_name, skipped: dict, key: str) -> list[int]:
  """Indices of non-blank texts; blank ones are counted in `skipped[key]` and logged."""
  empty = [i for i, text in enumerate(texts) if not text.strip()]
  if empty:
    skipped[key] = len(empty)
    shown = ", ".join(row_name(i) for i in empty[:_SHOW_SKIPPED])
    logging.warning("%s: skipped %d example(s) with an empty text (%s%s).", where, len(empty),
                    shown, ", ..." if len(empty) > _SHOW_SKIPPED else "")
    empty_set = set(empty)
    return [i for i in range(len(texts)) if i not in empty_set]
  return list(range(len(texts)))


def check_not_empty(texts: list[str], where: str) -> None:
  if not texts:
    raise DataError(f"{where}: no examples (after skipping empty texts).")


def carve(n: int, fraction: float, seed: int, parts: int, where: str) -> list[np.ndarray]:
  """Deterministic split of range(n): [rest, part 1, ..., part `parts`], each sorted.

  With parts=2 the order is train, validation, test. fraction=0 gives empty held-out parts.
  """
  size = round(n * fraction)
  names = ["validation", "test"][:parts]
  if (size == 0 and fraction > 0) or n - parts * size <= 0:
    raise DataError(f"{where}: {n} example(s) are too few to carve {' and '.join(names)} "
                    f"splits of val_fraction={fraction} each and keep a train split; use more "
                    f"data or change --config.val_fraction.")
  permutation = np.random.default_rng(seed).permutation(n)
  held_out = [np.sort(permutation[i * size:(i + 1) * size]) for i in range(parts)]
  return [np.sort(permutation[parts * size:])] + held_out

