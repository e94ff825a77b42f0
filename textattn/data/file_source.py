"""The local-file source: a .csv / .tsv / .jsonl (or .json holding JSON lines) training file,
plus optional `validation_file` / `test_file` in the same formats. A split without its own file
is carved from the training file (`val_fraction` each, `data_seed` decides which rows). Text =
the `text_fields` joined with " " (a split file's own `validation_text_fields` /
`test_text_fields` where its header names them otherwise); label ids follow the sorted distinct label values (as
strings) of all the files. A CSV/TSV file's first row is its header, unless `columns` names the
columns of headerless files ("label,title,description"); quoted fields may span lines; CRLF
line endings are fine.

Labels: surrounding whitespace is stripped and numeric spellings of one value are one class
(1, 1.0 and " 1 " are class "1"; raw.label_string). A missing label (empty, NaN, None, null),
a training split with one class, or a validation/test label that never occurs in the training
split is a DataError naming the file, the line and the value."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from textattn.data import raw as raw_lib
from textattn.data.cache import cache_dir, content_digest
from textattn.data.splits import DataError

LOCAL_FORMATS = {".csv": ",", ".tsv": "\t", ".jsonl": None, ".json": None}
HELD_OUT = ("validation", "test")


def is_local_file(dataset: str) -> bool:
  # TFDS names may contain "/" ("imdb_reviews/plain_text:1.0.0"), so a path is recognised
  # by its extension or by existing.
  return os.path.splitext(dataset)[1].lower() in LOCAL_FORMATS or os.path.isfile(dataset)


def split_files(config) -> dict[str, str]:
  """{"validation": path, "test": path} for the held-out splits the config gives a file of
  (config.source.validation_file / config.source.test_file; configs older than them have none)."""
  return {split: str(config.source[f"{split}_file"] or "") for split in HELD_OUT
          if str(config.source[f"{split}_file"] or "").strip()}


def column_names(config) -> list[str]:
  """config.source.columns as a list: the columns of headerless CSV/TSV files; [] = a header row."""
  return [name.strip() for name in str(config.source.columns or "").split(",")
          if name.strip()]


class FileSource:
  """Local files: a training file carved into train / validation / test, except the held-out
  splits given their own files."""

  def __init__(self, config):
    self.path = config.dataset
    self.split_files = split_files(config)
    self.columns = column_names(config)
    self.text_fields = raw_lib.text_fields(config)
    # Each split file's own text fields where the config names them (else text_fields).
    self.own_fields = {split: raw_lib.text_fields(config, split) for split in self.split_files
                       if str(config.source[f"{split}_text_fields"]).strip()}
    self.label_field = config.source.label_field
    self.description = ", ".join([self.path] + list(self.split_files.values()))
    self.cache_dir = cache_dir(config)

  def identity(self, write: bool = True) -> list | None:
    """The files' content (sha256; memoised in the cache dir if `write`), not their paths or
    modification times: a copy or a moved file keeps its cache. None: a file is missing.
    Without split files or columns it is what it was before they existed (same cache keys)."""
    if not all(os.path.isfile(p) for p in [self.path, *self.split_files.values()]):
      return None
    identity = ["file", content_digest(self.path, self.cache_dir, write), self.text_fields,
                self.label_field]
    for split, path in self.split_files.items():
      identity.append([f"{split}_file", content_digest(path, self.cache_dir, write)])
      if split in self.own_fields:  # (only then: other entries keep their keys)
        identity.append([f"{split}_text_fields", self.own_fields[split]])
    if self.columns:
      identity.append(["columns", self.columns])
    return identity

  def cacheable(self) -> bool:
    return True

  def read(self, val_fraction: float, data_seed: int) -> raw_lib.Raw:
    skipped = {}
    files = {"train": self.path, **self.split_files}
    read = {split: self._read_file(path, skipped, "file" if split == "train" else
                                   f"{split}_file", self.own_fields.get(split, self.text_fields))
            for split, path in files.items()}
    class_names, labels = raw_lib.index_labels({s: r[1] for s, r in read.items()})
    carved = [s for s in HELD_OUT if s not in self.split_files]
    parts = (raw_lib.carve(len(read["train"][0]), val_fraction, data_seed, len(carved),
                           self.path, names=carved)
             if carved else [np.arange(len(read["train"][0]))])
    # rows[split]: indices into the texts of the file the split comes from.
    rows = {"train": parts[0], **dict(zip(carved, parts[1:])),
            **{s: np.arange(len(read[s][0])) for s in self.split_files}}
    source = {s: "train" if s in carved else s for s in ("train", *HELD_OUT)}
    split_labels = {s: labels[source[s]][rows[s]] for s in source}
    raw_lib.check_classes(
        split_labels, class_names, {s: files[source[s]] for s in source},
        lambda split, i: f"line {read[source[split]][2][rows[split][i]]}",
        " and ".join(carved))
    return raw_lib.Raw(
        texts={s: [read[source[s]][0][i] for i in rows[s]] for s in source},
        labels=split_labels, class_names=class_names, skipped=skipped)

  def _read_file(self, path: str, skipped: dict, key: str, text_fields: list[str]
                 ) -> tuple[list[str], list[str], list[int]]:
    """(texts, label strings, line numbers) of one file's non-empty examples, its text from
    `text_fields`; empty texts are counted in skipped[key]."""
    extension = os.path.splitext(path)[1].lower()
    if extension not in LOCAL_FORMATS:
      raise DataError(f"{path}: unsupported file type {extension!r}; use .csv, .tsv or "
                      f".jsonl (JSON lines).")
    problem = raw_lib.not_a_file(path)
    if problem:  # (a directory is called one: "does not exist" would send the user looking)
      raise DataError(f"{path}: {problem} (config.{'dataset' if key == 'file' else key} must "
                      f"be {'a TFDS name or ' if key == 'file' else ''}the path of a "
                      f".csv/.tsv/.jsonl file).")
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
      rows = self._jsonl_rows(path, text, text_fields)
    else:
      rows = self._csv_rows(path, text, delimiter, text_fields)
    texts, label_strings, lines = [], [], []
    for line, fields, label in rows:
      texts.append(raw_lib.join_fields(fields))
      label_strings.append(label)
      lines.append(line)
    keep = raw_lib.keep_nonempty(texts, path, lambda i: f"line {lines[i]}", skipped, key)
    texts = [texts[i] for i in keep]
    raw_lib.check_not_empty(texts, path)
    return texts, [label_strings[i] for i in keep], [lines[i] for i in keep]

  def _csv_rows(self, path: str, text: str, delimiter: str, text_fields: list[str]
                ) -> Iterator[tuple[int, list[str], str]]:
    """(first line, text field values, label) per record (raw.delimited_records)."""
    hint = f"set --config.{self._fields_option(path)} / --config.source.label_field"
    for line, record in raw_lib.delimited_records(path, text, delimiter, self.columns,
                                                  text_fields + [self.label_field], hint):
      value = record[self.label_field].strip()
      if self.columns and line == 1 and value.lower() == self.label_field.lower():
        raise DataError(f"{path}, line 1: the label column holds {value!r}, its own name: the "
                        f"file has a header row, so leave config.source.columns empty.")
      label = raw_lib.label_string(value)
      if label is None:
        raise DataError(f"{path}, line {line}: the label column {self.label_field!r} is "
                        f"{f'{value!r}, a missing value' if value else 'empty'}; every row "
                        f"needs a label (a class name or a number).")
      yield line, [record[f] for f in text_fields], label

  def _fields_option(self, path: str) -> str:
    """The option that names `path`'s text fields (text_fields, or a split file's own)."""
    splits = [split for split, p in self.split_files.items() if p == path]
    return (f"source.{splits[0]}_text_fields" if splits and path != self.path
            else "source.text_fields")

  def _jsonl_rows(self, path: str, text: str, text_fields: list[str]
                  ) -> Iterator[tuple[int, list[str], str]]:
    for number, record in raw_lib.json_records(path, text):
      where = f"{path}, line {number}"
      missing = [f for f in text_fields + [self.label_field] if f not in record]
      if missing:
        raise DataError(f"{where}: field(s) {missing} missing; the record has "
                        f"{sorted(record)} (set --config.{self._fields_option(path)} / "
                        f"--config.source.label_field).")
      fields = []
      for field in text_fields:
        value = raw_lib.text_value(record[field], where, field)
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
