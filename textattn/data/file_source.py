"""The local-file source: a .csv / .tsv / .jsonl (or .json holding JSON lines) file, one split
carved into test, validation (`val_fraction` each) and train. Text = the `text_fields` joined
with " "; label ids follow the sorted distinct label values (as strings). CSV and TSV files
need a header row; quoted fields may span lines; CRLF line endings are fine.

Labels: surrounding whitespace is stripped and numeric spellings of one value are one class
(1, 1.0 and " 1 " are class "1"; raw.label_string). A missing label (empty, NaN, None, null),
a training split with one class, or a validation/test label that never occurs in the training
split is a DataError naming the file, the line and the value."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator

from textattn.data import raw as raw_lib
from textattn.data.cache import cache_dir, content_digest
from textattn.data.splits import DataError

LOCAL_FORMATS = {".csv": ",", ".tsv": "\t", ".jsonl": None, ".json": None}


def is_local_file(dataset: str) -> bool:
  # TFDS names may contain "/" ("imdb_reviews/plain_text:1.0.0"), so a path is recognised
  # by its extension or by existing.
  return os.path.splitext(dataset)[1].lower() in LOCAL_FORMATS or os.path.isfile(dataset)


class FileSource:
  """A local .csv / .tsv / .jsonl file, carved into train / validation / test."""

  def __init__(self, config):
    self.path = config.dataset
    self.text_fields = raw_lib.text_fields(config)
    self.label_field = config.label_field
    self.description = self.path
    self.cache_dir = cache_dir(config)

  def identity(self, write: bool = True) -> list | None:
    """The file's content (sha256; memoised in the cache dir if `write`), not its path or
    modification time: a copy or a moved file keeps its cache. None: no such file."""
    if not os.path.isfile(self.path):
      return None
    return ["file", content_digest(self.path, self.cache_dir, write), self.text_fields,
            self.label_field]

  def cacheable(self) -> bool:
    return True

  def read(self, val_fraction: float, data_seed: int) -> raw_lib.Raw:
    path = self.path
    extension = os.path.splitext(path)[1].lower()
    if extension not in LOCAL_FORMATS:
      raise DataError(f"{path}: unsupported file type {extension!r}; use .csv, .tsv or "
                      f".jsonl (JSON lines).")
    if not os.path.isfile(path):
      raise DataError(f"{path}: file does not exist (config.dataset must be a TFDS name or the "
                      f"path of a .csv/.tsv/.jsonl file).")
    with open(path, "rb") as f:
      data = f.read()
    try:
      text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
      line = data.count(b"\n", 0, e.start) + 1
      raise DataError(f"{path}, line {line}: invalid UTF-8 ({e.reason} at byte offset "
                      f"{e.start}).") from None
    delimiter = LOCAL_FORMATS[extension]
    if delimiter is None:
      rows = self._jsonl_rows(text)
    else:
      rows = self._csv_rows(text, delimiter)
    texts, label_strings, lines = [], [], []
    for line, fields, label in rows:
      texts.append(raw_lib.join_fields(fields))
      label_strings.append(label)
      lines.append(line)
    skipped = {}
    keep = raw_lib.keep_nonempty(texts, path, lambda i: f"line {lines[i]}", skipped, "file")
    texts = [texts[i] for i in keep]
    label_strings = [label_strings[i] for i in keep]
    raw_lib.check_not_empty(texts, path)
    class_names, labels = raw_lib.index_labels({"file": label_strings})
    labels = labels["file"]
    train, validation, test = raw_lib.carve(len(texts), val_fraction, data_seed, 2, path)
    raw_lib.check_classes(
        {"train": labels[train], "validation": labels[validation], "test": labels[test]},
        class_names, path, lambda row: f"line {lines[keep[row]]}",
        {"train": train, "validation": validation, "test": test})
    return raw_lib.Raw(
        texts={"train": [texts[i] for i in train],
               "validation": [texts[i] for i in validation],
               "test": [texts[i] for i in test]},
        labels={"train": labels[train], "validation": labels[validation],
                "test": labels[test]},
        class_names=class_names, skipped=skipped)

  def _csv_rows(self, text: str, delimiter: str) -> Iterator[tuple[int, list[str], str]]:
    """(first line, text field values, label) per record; handles quoted newlines and CRLF."""
    path = self.path
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
      header = next(reader, None)
      if header is None:
        raise DataError(f"{path}: the file is empty (expected a header row).")
      header = [name.strip() for name in header]
      missing = [f for f in self.text_fields + [self.label_field] if f not in header]
      if missing:
        raise DataError(f"{path}, line 1: column(s) {missing} not found; the header has "
                        f"{header} (set --config.text_fields / --config.label_field).")
      text_columns = [header.index(f) for f in self.text_fields]
      label_column = header.index(self.label_field)
      line = reader.line_num + 1
      for record in reader:
        if record:  # csv yields [] for a blank line.
          if len(record) != len(header):
            raise DataError(f"{path}, line {line}: expected {len(header)} fields "
                            f"({delimiter!r}-separated), found {len(record)}.")
          label = raw_lib.label_string(record[label_column])
          if label is None:
            value = record[label_column].strip()
            raise DataError(f"{path}, line {line}: the label column {self.label_field!r} "
                            f"is {f'{value!r}, a missing value' if value else 'empty'}; every "
                            f"row needs a label (a class name or a number).")
          yield line, [record[c] for c in text_columns], label
        line = reader.line_num + 1
    except csv.Error as e:
      raise DataError(f"{path}, line {reader.line_num}: malformed CSV ({e}).") from None

  def _jsonl_rows(self, text: str) -> Iterator[tuple[int, list[str], str]]:
    path = self.path
    # Split on "\n" only: str.splitlines would also split on U+2028 inside JSON strings.
    for number, line in enumerate(text.split("\n"), start=1):
      line = line.strip()
      if not line:
        continue
      where = f"{path}, line {number}"
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise DataError(f"{where}: invalid JSON ({e.msg} at column {e.colno}).") from None
      if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, found {type(record).__name__}.")
      missing = [f for f in self.text_fields + [self.label_field] if f not in record]
      if missing:
        raise DataError(f"{where}: field(s) {missing} missing; the record has "
                        f"{sorted(record)} (set --config.text_fields / --config.label_field).")
      fields = []
      for field in self.text_fields:
        value = record[field]
        if value is None:
          value = ""
        if not isinstance(value, str):
          raise DataError(f"{where}: field {field!r} must be a string, found "
                          f"{type(value).__name__}.")
        try:
          value.encode("utf-8")
        except UnicodeEncodeError:
          raise DataError(f"{where}: field {field!r} is not valid UTF-8 (a lone surrogate "
                          f"escape).") from None
        fields.append(value)
      label = record[self.label_field]
      name = None if isinstance(label, (list, dict)) else raw_lib.label_string(label)
      if name is None:
        raise DataError(f"{where}: label field {self.label_field!r} is {label!r}; it must be "
                        f"a non-empty string or a number (not a missing value such as null, "
                        f"NaN or '').")
      yield number, fields, name
