"""What a source's read() returns (`Raw`: texts and label ids of every split) and the steps
both sources share: decoding and joining text fields, label ids, skipping empty texts (counted
and logged) and the deterministic carve of held-out splits."""

from __future__ import annotations

import csv
import dataclasses
import decimal
import io
import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

import ml_collections
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


def source_config():
  """config.source, an opt-in part (config.complete): the fields of a data source whose names
  are not the defaults, and a local file's separate validation and test files."""
  part = ml_collections.ConfigDict()
  part.text_fields = "text"  # comma-separated text field(s) (TFDS features, file columns), joined
  part.label_field = "label"  # the label field
  part.columns = ""  # headerless .csv/.tsv: the column names ("label,title,text"); "" = header
  part.validation_file = ""  # local files: the validation split's file; "" = carved from dataset
  part.test_file = ""  # local files: the test split's file; "" = carved from dataset
  # The text field(s) of validation_file / test_file where their header names them otherwise
  # ("content" where the training file has "sentence"); "" = text_fields
  part.validation_text_fields = ""
  part.test_text_fields = ""
  return part


def text_fields(config, split: str = "train") -> list[str]:
  """The text fields of a split's file: config.source.text_fields, or for a validation or test
  file its own <split>_text_fields where set."""
  own = str(config.source[f"{split}_text_fields"]) if split != "train" else ""
  return [f.strip() for f in (own or str(config.source.text_fields)).split(",") if f.strip()]


def not_a_file(path: str) -> str | None:
  """What is wrong with `path` as a data file ("is a directory, not a data file" or "file does
  not exist"), or None when it is a file."""
  if os.path.isfile(path):
    return None
  return "is a directory, not a data file" if os.path.isdir(path) else "file does not exist"


def decode(value: bytes | str, where: str) -> str:
  if isinstance(value, str):
    return value
  try:
    return value.decode("utf-8")
  except UnicodeDecodeError as e:
    raise DataError(f"{where}: invalid UTF-8 ({e.reason} at byte {e.start}).") from None


def json_records(path: str, text: str) -> Iterator[tuple[int, dict]]:
  """(line number, object) for each non-blank line of a JSON-lines text; a line that is not a
  JSON object is one DataError naming the file and line. Lines end at "\n" only: str.splitlines
  would also end them at U+2028, U+0085 and the like inside strings."""
  for number, line in enumerate(text.split("\n"), start=1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise DataError(f"{path}, line {number}: invalid JSON ({e.msg} at column {e.colno}).") \
          from None
    if not isinstance(record, dict):
      raise DataError(f"{path}, line {number}: expected a JSON object, found "
                      f"{type(record).__name__}.")
    yield number, record


def check_unique_columns(path: str, header: Sequence[str], used: Sequence[str]) -> None:
  """A DataError when a column the run reads (`used`) is named more than once in `header`:
  which of them is meant would be a guess (training and prediction must read the same one)."""
  for name in dict.fromkeys(used):
    where = [i + 1 for i, column in enumerate(header) if column == name]
    if len(where) > 1:
      raise DataError(f"{path}, line 1: column {name!r} appears {len(where)} times in the "
                      f"header (columns {', '.join(map(str, where))}); rename all but one.")


def delimited_records(path: str, text: str, delimiter: str, columns: Sequence[str] = (),
                      used: Sequence[str] = (), hint: str = "", skip_blank: bool = False
                      ) -> Iterator[tuple[int, dict[str, str]]]:
  """(first line, {column: value}) for each non-blank row of a .csv/.tsv file's `text`, read
  one way for training and prediction: the first row is the header (names stripped) unless
  `columns` (config.source.columns) names the columns of a headerless file; quoted fields may
  span lines; CRLF is fine. Malformed input is one DataError naming the line: bad quoting, a
  row with more or fewer fields than the header, a tab inside a TSV field, a `used` column
  missing (`hint`: what to set, in parentheses) or named twice. skip_blank: rows of only
  whitespace are skipped too (otherwise, as a row of blank fields, they keep their place)."""
  csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))
  reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
  try:
    if columns:
      header = list(columns)
      which = f"config.source.columns names {len(header)} ({','.join(header)})"
    else:
      header = next(reader, None)
      if header is None:
        raise DataError(f"{path}: the file is empty (expected a header row, or "
                        f"config.source.columns naming the columns of a file without one).")
      header = [name.strip() for name in header]
      which = f"the header has {len(header)}"
    missing = [name for name in dict.fromkeys(used) if name not in header]
    if missing:
      raise DataError(f"{path}, line 1: column(s) {missing} not found; "
                      f"{'config.source.columns is' if columns else 'the header has'} {header}"
                      f"{f' ({hint})' if hint else ''}.")
    check_unique_columns(path, header, used)
    line = reader.line_num + 1
    for values in reader:
      if any(value.strip() for value in values) if skip_blank else values:  # ([]: blank line)
        if len(values) != len(header):
          raise DataError(f"{path}, line {line}: expected {len(header)} fields "
                          f"({delimiter!r}-separated; {which}), found {len(values)}.")
        check_no_tab_in_tsv_fields(values, delimiter, f"{path}, line {line}")
        yield line, dict(zip(header, values))
      line = reader.line_num + 1
  except csv.Error as e:
    raise DataError(f"{path}, line {reader.line_num}: malformed CSV ({e}).") from None


def check_no_tab_in_tsv_fields(values: Sequence[str], delimiter: str, where: str) -> None:
  """In a .tsv a field can hold a tab only inside quotes, so one that does is nearly always a
  quote opened and never closed, which joined the lines after it into this field: a DataError."""
  if delimiter == "\t" and any("\t" in value for value in values):
    raise DataError(f"{where}: a field holds a tab, so a quote (\") in it was never closed and "
                    f"the lines after it were read into it; close or remove that quote (TSV "
                    f"fields hold no tabs).")


def text_value(value: Any, where: str, field: str) -> str:
  """A JSON record's text field as a string (null: ""); anything else is a DataError."""
  if value is None:
    return ""
  if not isinstance(value, str):
    raise DataError(f"{where}: field {field!r} must be a string, found {type(value).__name__}.")
  return value


def join_fields(values: Sequence[str]) -> str:
  return values[0] if len(values) == 1 else " ".join(values)


# Spellings of "no label" as pandas, R and JSON exports write them (compared lower-case).
MISSING_LABELS = ("", "nan", "none", "null")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def label_string(value: Any) -> str | None:
  """The canonical class name of a label value, or None for a missing one (None, NaN, "",
  "NaN", "None", "null"). Surrounding whitespace is stripped, and numeric spellings of one
  value are one class: 1, 1.0, "1", " 1.0 ", "1e0" -> "1"; "0.50" -> "0.5"."""
  if value is None:
    return None
  if isinstance(value, bytes):
    value = value.decode("utf-8", "replace")
  if isinstance(value, (bool, np.bool_)):
    return str(bool(value))
  if isinstance(value, (float, np.floating)) and not math.isfinite(value):
    return None if math.isnan(value) else str(float(value))
  text = str(value).strip()
  if text.lower() in MISSING_LABELS:
    return None
  if _NUMBER.fullmatch(text):
    number = decimal.Decimal(text)  # exact: 12345678901234567891 stays itself
    if abs(number.adjusted()) <= 40:  # (not 1e999999: kept as written)
      if number == number.to_integral_value():
        return str(int(number))
      return format(number.normalize(), "f")
  return text


def index_labels(labels: dict[str, list[str]]) -> tuple[list[str], dict[str, np.ndarray]]:
  """Label ids in the sorted order of the distinct label strings."""
  class_names = sorted({label for values in labels.values() for label in values})
  index = {name: i for i, name in enumerate(class_names)}
  return class_names, {split: np.array([index[v] for v in values], np.int32)
                       for split, values in labels.items()}


def check_classes(labels: dict[str, np.ndarray], class_names: list[str],
                  where: str | dict[str, str], row_name, carved: str = "validation and test"
                  ) -> None:
  """DataError unless the training split has at least two classes and every label of the
  held-out splits occurs in it (a class never trained on cannot be predicted; a test report
  on it is meaningless). `where`: the file (or a dict: each split's file); `row_name(split, i)`
  names the row the split's i-th example came from (e.g. "line 12"); `carved`: the held-out
  splits carved from the training data ("" = none)."""
  where_of = where if isinstance(where, dict) else {s: where for s in labels}
  trained = np.unique(labels["train"])
  if len(trained) < 2:
    every = len(class_names) == 1
    after = f" (after carving {carved})" if carved and not every else ""
    what = "every label is" if every else "the training split has only class"
    only = class_names[int(trained[0])] if len(trained) else None
    raise DataError(
        f"{where_of['train']}: {what} {only!r}{after}; a classifier needs at least two classes "
        f"in training (check config.source.label_field"
        f"{', or use more data or another config.data_seed' if after else ''}).")
  known = set(trained.tolist())
  for split in ("validation", "test"):
    unseen = [i for i, label in enumerate(labels[split].tolist()) if label not in known]
    if unseen:
      first = unseen[0]
      name = class_names[int(labels[split][first])]
      raise DataError(
          f"{where_of[split]}, {row_name(split, first)}: label {name!r} ({split} split) "
          f"never occurs in the training split (its classes: "
          f"{', '.join(class_names[i] for i in sorted(known))}); a class needs training "
          f"examples: add some, or remove its {len(unseen)} {split} row(s).")


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


def carve(n: int, fraction: float, seed: int, parts: int, where: str,
          names: Sequence[str] = ("validation", "test")) -> list[np.ndarray]:
  """Deterministic split of range(n): [rest, part 1, ..., part `parts`], each sorted.

  With parts=2 the order is train, validation, test. fraction=0 gives empty held-out parts.
  `names`: the parts' names, for the error message.
  """
  size = round(n * fraction)
  names = list(names)[:parts]
  if (size == 0 and fraction > 0) or n - parts * size <= 0:
    raise DataError(f"{where}: {n} example(s) are too few to carve {' and '.join(names)} "
                    f"splits of val_fraction={fraction} each and keep a train split; use more "
                    f"data or change --config.val_fraction.")
  permutation = np.random.default_rng(seed).permutation(n)
  held_out = [np.sort(permutation[i * size:(i + 1) * size]) for i in range(parts)]
  return [np.sort(permutation[parts * size:])] + held_out

