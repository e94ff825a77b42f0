"""Data: TFDS or a local file → vocabulary → int32 arrays → deterministic, resumable batches.

`load_dataset(config, workdir)` returns train / validation / test `Split`s:
- TFDS (`config.dataset`, e.g. "imdb_reviews"): validation is carved from TFDS train
  (`val_fraction`, permutation from `data_seed`; 0 leaves it empty); test is TFDS test.
- A local .csv / .tsv / .jsonl (or .json holding JSON lines) file: one split, carved into
  test, validation (`val_fraction` each) and train. Text = the `text_fields` joined with " ";
  label ids follow the sorted distinct label values (as strings).

The word vocabulary is counted on the train part only. The tokenizer (`tokenizer.json`) and the
label names (`data_info.json`) are saved in the workdir and reused from it, so ids never
change between runs of a workdir. Encoded arrays are cached in `cache_dir`, keyed by
everything that affects them; a second run of the same config reads neither TFDS nor the
text. Cache and workdir files are written atomically; an unreadable cache entry is rebuilt.
TFDS data read from anywhere but the data dir (`tfds.testing.mock_data`) is never cached.

Bad input policy: a text that is empty or only whitespace is skipped, counted and logged
(`Dataset.skipped`). Everything else — a file that does not exist, a missing column or field,
invalid UTF-8, a missing label or one outside the workdir's label set, an empty split —
raises `DataError` naming the file (or TFDS split), the row and the problem.

Batches: `TrainIterator` (a permutation per (seed, epoch), full batches only, resumable from
`get_state()`) and `eval_batches` (every example exactly once, the last batch padded with
weight-0 copies of the split's first example so model outputs stay finite). Both yield this
process's slice of every global batch.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import os
import re
import socket
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from absl import logging

from textattn.data import tokenizer as tokenizer_lib

SPLITS = ("train", "validation", "test")
LOCAL_FORMATS = {".csv": ",", ".tsv": "\t", ".jsonl": None, ".json": None}
TOKENIZER_FILE = "tokenizer.json"
DATA_INFO_FILE = "data_info.json"
_CACHE_VERSION = 1
_READ_BATCH = 4096
_SHOW_SKIPPED = 5


# Split names that hold labelled (training or held-out) text, e.g. "validation_matched": never
# read as unlabelled text.
_LABELLED_SPLIT_PREFIXES = ("train", "valid", "test", "dev")


# config.padding: "after_masked" (textattn's: tokens first, padding after, masked out of
# attention and pooling) or "before_as_token" (the Keras seed's: pad_sequences puts padding
# before the tokens and its model never masks it, so id 0 is embedded, attended to and averaged
# like any token; the model then takes no padding mask, models.Classifier.mask_padding).
PADDINGS = ("after_masked", "before_as_token")


def pads_before(config) -> bool:
  """Whether the config asks for the Keras seed's layout (config.padding="before_as_token")."""
  return config.get("padding", PADDINGS[0]) == "before_as_token"


class DataError(ValueError):
  """Bad data or data configuration; the message names the file, row and problem."""


@dataclasses.dataclass
class Split:
  inputs: np.ndarray  # int32 [N, max_len], 0 = padding; tokens left-aligned (right-aligned
  #                     with config.padding="before_as_token").
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


# ---- Config -------------------------------------------------------------------------------


def _validate_config(config) -> None:
  def check(ok: bool, field: str, allowed: str) -> None:
    if not ok:
      raise DataError(f"config.{field}={getattr(config, field)!r} is invalid; {allowed}.")

  def is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)

  check(isinstance(config.dataset, str) and config.dataset.strip() != "", "dataset",
        "give a TFDS name such as 'imdb_reviews' or the path of a .csv/.tsv/.jsonl file")
  check(config.tokenizer in ("word", "byte"), "tokenizer", "allowed: 'word', 'byte'")
  check(config.truncation in tokenizer_lib.TRUNCATIONS, "truncation", "allowed: 'pre', 'post'")
  check(config.get("punctuation", "strip") in tokenizer_lib.PUNCTUATIONS, "punctuation",
        "allowed: 'strip' (delete ASCII punctuation, as Keras), 'split' (each mark a token)")
  check(is_int(config.max_len) and config.max_len >= 1, "max_len", "it must be an integer >= 1")
  check(config.get("padding", PADDINGS[0]) in PADDINGS, "padding",
        "allowed: 'after_masked' (padding after the tokens, masked out), 'before_as_token' "
        "(padding before the tokens and attended and pooled like a token, as the Keras seed)")
  if config.tokenizer == "word":
    check(is_int(config.vocab_size) and config.vocab_size > tokenizer_lib.NUM_RESERVED,
          "vocab_size", "it must be an integer > 2 (ids 0 and 1 are reserved)")
  check(isinstance(config.val_fraction, (int, float)) and 0 <= config.val_fraction < 0.5,
        "val_fraction", "it must be in [0, 0.5)")
  check(config.val_fraction > 0 or not is_local_file(config.dataset), "val_fraction",
        "a local file needs val_fraction > 0 to carve its validation and test splits")
  check(is_int(config.data_seed) and config.data_seed >= 0, "data_seed",
        "it must be an integer >= 0")
  check(bool(_text_fields(config)), "text_fields", "give comma-separated field names")
  check(isinstance(config.label_field, str) and config.label_field.strip() != "",
        "label_field", "give the label field's name")


def _text_fields(config) -> list[str]:
  return [f.strip() for f in str(config.text_fields).split(",") if f.strip()]


def is_local_file(dataset: str) -> bool:
  # TFDS names may contain "/" ("imdb_reviews/plain_text:1.0.0"), so a path is recognised
  # by its extension or by existing.
  return os.path.splitext(dataset)[1].lower() in LOCAL_FORMATS or os.path.isfile(dataset)


def _tfds_data_dir(config) -> str | None:
  """config.data_dir, else $TFDS_DATA_DIR, else None (TFDS's default)."""
  return config.data_dir or os.environ.get("TFDS_DATA_DIR") or None


# ---- Reading ------------------------------------------------------------------------------


@dataclasses.dataclass
class _Raw:
  """Texts and labels of every split; labels index `class_names`."""
  texts: dict[str, list[str]]
  labels: dict[str, np.ndarray]
  class_names: list[str]
  skipped: dict[str, int]


_DIGESTS: dict[str, str] = {}  # (path, size, mtime) stamp -> sha256, this process


def content_digest(path: str, memo_dir: str | None = None, write: bool = True) -> str:
  """sha256 of a file's bytes: what cache keys hold for source data, rather than modification
  times, so a copied or re-synced data dir keeps its cache. Memoised as a small file in
  `memo_dir` (when given; written only if `write`) keyed by (path, size, modification time),
  so an unchanged file is read once, not at every start (and in this process, once at all:
  a run asks for the source's identity two or three times)."""
  stat = os.stat(path)
  stamp = _key([os.path.realpath(path), stat.st_size, stat.st_mtime_ns])
  if stamp in _DIGESTS:
    return _DIGESTS[stamp]
  memo = os.path.join(memo_dir, "digests", stamp) if memo_dir else None
  if memo:
    try:
      with open(memo, encoding="ascii") as f:
        digest = f.read().strip()
      if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest):
        _DIGESTS[stamp] = digest
        return digest
    except (OSError, UnicodeDecodeError):
      pass
  sha = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      sha.update(block)
  digest = _DIGESTS[stamp] = sha.hexdigest()
  if memo and write:
    try:
      atomic_write(memo, lambda f: f.write(digest))
    except OSError:  # A read-only cache dir only costs hashing again next time.
      pass
  return digest


def _keep_tensorflow_off_accelerators() -> None:
  """TFDS reads through TensorFlow; without this TF would claim the GPU memory JAX trains in.
  Only the TFDS read path imports TensorFlow (seconds of start-up), so only it pays for this."""
  try:
    import tensorflow as tf
    tf.config.set_visible_devices([], "GPU")
  except (ImportError, RuntimeError):  # No TF, or its devices are already initialised.
    pass


class _TfdsSource:
  """A TFDS dataset; its identity is cheap (file stats) so a cache hit never imports TFDS."""

  def __init__(self, config):
    self.name = config.dataset
    self.data_dir = _tfds_data_dir(config)
    self.text_fields = _text_fields(config)
    self.label_field = config.label_field
    self.description = f"TFDS dataset {self.name!r}"
    self.cache_dir = _cache_dir(config)
    self._read_from: str | None = None

  def _root(self) -> str:
    data_dir = self.data_dir or os.path.join("~", "tensorflow_datasets")
    return os.path.realpath(os.path.expanduser(data_dir))

  def identity(self, write: bool = True) -> list | None:
    """Name and the names and contents (sha256) of its prepared files, not their location or
    modification times: a re-copied or moved data dir keeps its cache. None when nothing is
    prepared. `write`: whether the digests may be memoised in the cache dir."""
    base = os.path.join(self._root(), self.name.split("/")[0].split(":")[0])
    files = []
    for dirpath, _, filenames in os.walk(base):
      for filename in filenames:
        path = os.path.join(dirpath, filename)
        try:
          digest = content_digest(path, self.cache_dir, write)
        except OSError:  # Vanished mid-walk (TFDS preparing right now).
          continue
        files.append([os.path.relpath(path, base), digest])
    if not files:
      return None
    return ["tfds", self.name, sorted(files), self.text_fields, self.label_field]

  def cacheable(self) -> bool:
    """False when TFDS read from somewhere other than the data dir (e.g. mocked in tests)."""
    if self._read_from is None:
      return False
    return os.path.realpath(self._read_from).startswith(self._root() + os.sep)

  def _read_columns(self, tfds, builder) -> dict[str, dict[str, list]]:
    """split -> field -> values, for the train and test splits, in file order."""
    columns = {}
    for split in ("train", "test"):
      columns[split] = {f: [] for f in self.text_fields + [self.label_field]}
      dataset = builder.as_dataset(split=split, batch_size=_READ_BATCH, shuffle_files=False)
      for batch in tfds.as_numpy(dataset):
        for field, values in columns[split].items():
          values.extend(batch[field].tolist())
    return columns

  def read_unlabeled(self, split: str, field: str = "word2vec.unlabeled_split") -> list[str]:
    """The texts of a split read for its text only (e.g. IMDB's "unsupervised"); call after
    read(), which makes sure the data set is prepared. Empty texts are skipped. `field` names
    the config field that asked for it, in error messages."""
    import tensorflow_datasets as tfds
    if not re.fullmatch(r"[A-Za-z0-9_]+", split):
      # TFDS would also take "unsupervised+test" or "test[:20%]": held-out text in the corpus.
      raise DataError(f"config.{field}={split!r} is not a plain split name; name one whole split "
                      f"of unlabelled text (letters, digits, '_') such as 'unsupervised', or ''.")
    if split.lower().startswith(_LABELLED_SPLIT_PREFIXES):
      raise DataError(f"config.{field}={split!r} is a labelled split (its held-out part would "
                      f"leak into what is pretrained on it; the training part is used anyway); "
                      f"name a split of unlabelled text such as 'unsupervised', or ''.")
    builder = tfds.builder(self.name, data_dir=self.data_dir)
    texts, index = [], 0
    try:
      dataset = builder.as_dataset(split=split, batch_size=_READ_BATCH, shuffle_files=False)
    except Exception as e:  # noqa: BLE001 -- unknown split names differ by TFDS version: one sentence
      raise DataError(f"config.{field}={split!r} is not a split of "
                      f"{self.description} (it has {sorted(builder.info.splits)}; "
                      f"{type(e).__name__}); set it to '' to use the training split's text "
                      f"only.") from None
    for batch in tfds.as_numpy(dataset):
      for values in zip(*(batch[f] for f in self.text_fields)):
        where = f"{self.description}, split {split!r}, example {index}"
        text = _join_fields([_decode(v, where) for v in values])
        index += 1
        if text.strip():
          texts.append(text)
    return texts

  def read(self, val_fraction: float, data_seed: int) -> _Raw:
    import tensorflow_datasets as tfds  # Slow import; only needed on a cache miss.
    _keep_tensorflow_off_accelerators()
    where = self.data_dir or "TFDS's default data dir (~/tensorflow_datasets)"
    supply = ("prepare it there (run once with internet access) or point to a prepared copy "
              "with TFDS_DATA_DIR=DIR or --config.data_dir=DIR")
    try:
      builder = tfds.builder(self.name, data_dir=self.data_dir)
    except Exception as e:  # noqa: BLE001 -- any TFDS failure here is one sentence for the user
      # (DatasetNotFoundError, registry and config errors differ across TFDS versions).
      first_line = str(e).strip().split("\n")[0]  # TFDS appends every dataset's name.
      raise DataError(f"config.dataset={self.name!r} is neither an existing local file nor a "
                      f"known TFDS dataset ({type(e).__name__}: {first_line}).") from None
    features = builder.info.features
    missing = [f for f in self.text_fields + [self.label_field] if f not in features]
    if missing:
      raise DataError(f"{self.description} has no feature(s) {missing}; it has "
                      f"{sorted(features.keys())} (set --config.text_fields / "
                      f"--config.label_field).")
    class_names = list(getattr(features[self.label_field], "names", None) or [])

    # Read first: prepared data (or a mocked TFDS) needs no download_and_prepare.
    try:
      columns = self._read_columns(tfds, builder)
    except Exception as e:  # noqa: BLE001 -- not prepared (or unreadable): decided just below
      if builder.is_prepared():
        raise DataError(f"{self.description}: reading {builder.data_dir} failed "
                        f"({type(e).__name__}: {e}).") from None
      # Offline, TFDS's downloader retries for minutes before failing; fail at once instead.
      if not _network_available():
        raise DataError(f"{self.description} is not prepared in {where} and there is no "
                        f"network to download it; {supply}.") from None
      logging.info("%s is not prepared in %s; downloading and preparing it.",
                   self.description, where)
      try:
        builder.download_and_prepare()
        columns = self._read_columns(tfds, builder)
      except Exception as e:  # noqa: BLE001 -- any download failure: one sentence, no traceback
        raise DataError(f"{self.description} is not prepared in {where} and could not be "
                        f"downloaded ({type(e).__name__}); {supply}.") from None
    self._read_from = builder.data_dir

    texts, raw_labels = {}, {}
    for split, split_columns in columns.items():
      texts[split] = [_join_fields(
          [_decode(split_columns[f][i], f"{self.description}, split {split!r}, example {i}, "
                   f"field {f!r}") for f in self.text_fields]) for i in range(
              len(split_columns[self.label_field]))]
      raw_labels[split] = split_columns[self.label_field]

    if class_names:  # ClassLabel: ints must index the names.
      labels = {}
      for split, values in raw_labels.items():
        array = np.asarray(values, np.int64)
        bad = np.flatnonzero((array < 0) | (array >= len(class_names)))
        if bad.size:
          raise DataError(f"{self.description}, split {split!r}, example {bad[0]}: label "
                          f"{array[bad[0]]} is outside the label set 0..{len(class_names) - 1}.")
        labels[split] = array.astype(np.int32)
    else:
      string_labels = {s: [_label_string(v) for v in vs] for s, vs in raw_labels.items()}
      class_names, labels = _index_labels(string_labels)

    skipped = {}
    for split in ("train", "test"):
      keep = _keep_nonempty(texts[split], f"{self.description}, split {split!r}",
                            lambda i: f"example {i}", skipped, split)
      texts[split] = [texts[split][i] for i in keep]
      labels[split] = labels[split][keep]
    _check_not_empty(texts["test"], f"{self.description}: split 'test'")
    train, validation = _carve(len(texts["train"]), val_fraction, data_seed, 1,
                               f"{self.description}: split 'train'")
    return _Raw(
        texts={"train": [texts["train"][i] for i in train],
               "validation": [texts["train"][i] for i in validation],
               "test": texts["test"]},
        labels={"train": labels["train"][train], "validation": labels["train"][validation],
                "test": labels["test"]},
        class_names=class_names, skipped=skipped)


class _FileSource:
  """A local .csv / .tsv / .jsonl file, carved into train / validation / test."""

  def __init__(self, config):
    self.path = config.dataset
    self.text_fields = _text_fields(config)
    self.label_field = config.label_field
    self.description = self.path
    self.cache_dir = _cache_dir(config)

  def identity(self, write: bool = True) -> list | None:
    """The file's content (sha256; memoised in the cache dir if `write`), not its path or
    modification time: a copy or a moved file keeps its cache. None: no such file."""
    if not os.path.isfile(self.path):
      return None
    return ["file", content_digest(self.path, self.cache_dir, write), self.text_fields,
            self.label_field]

  def cacheable(self) -> bool:
    return True

  def read(self, val_fraction: float, data_seed: int) -> _Raw:
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
      texts.append(_join_fields(fields))
      label_strings.append(label)
      lines.append(line)
    skipped = {}
    keep = _keep_nonempty(texts, path, lambda i: f"line {lines[i]}", skipped, "file")
    texts = [texts[i] for i in keep]
    label_strings = [label_strings[i] for i in keep]
    _check_not_empty(texts, path)
    class_names, labels = _index_labels({"file": label_strings})
    labels = labels["file"]
    train, validation, test = _carve(len(texts), val_fraction, data_seed, 2, path)
    return _Raw(
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
          label = record[label_column].strip()
          if not label:
            raise DataError(f"{path}, line {line}: the label column {self.label_field!r} "
                            f"is empty.")
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
      if label is None or isinstance(label, (list, dict)) or (
          isinstance(label, str) and not label.strip()):
        raise DataError(f"{where}: label field {self.label_field!r} is {label!r}; it must be "
                        f"a non-empty string or a number.")
      yield number, fields, _label_string(label)


def _network_available(host: str = "storage.googleapis.com", timeout: float = 3.0) -> bool:
  try:
    socket.create_connection((host, 443), timeout=timeout).close()
    return True
  except OSError:
    return False


def _decode(value: bytes | str, where: str) -> str:
  if isinstance(value, str):
    return value
  try:
    return value.decode("utf-8")
  except UnicodeDecodeError as e:
    raise DataError(f"{where}: invalid UTF-8 ({e.reason} at byte {e.start}).") from None


def _join_fields(values: Sequence[str]) -> str:
  return values[0] if len(values) == 1 else " ".join(values)


def _label_string(value: Any) -> str:
  if isinstance(value, bytes):
    value = value.decode("utf-8", "replace")
  return str(value).strip()


def _index_labels(labels: dict[str, list[str]]) -> tuple[list[str], dict[str, np.ndarray]]:
  """Label ids in the sorted order of the distinct label strings."""
  class_names = sorted({label for values in labels.values() for label in values})
  index = {name: i for i, name in enumerate(class_names)}
  return class_names, {split: np.array([index[v] for v in values], np.int32)
                       for split, values in labels.items()}


def _keep_nonempty(texts: list[str], where: str, row_name, skipped: dict, key: str) -> list[int]:
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


def _check_not_empty(texts: list[str], where: str) -> None:
  if not texts:
    raise DataError(f"{where}: no examples (after skipping empty texts).")


def _carve(n: int, fraction: float, seed: int, parts: int, where: str) -> list[np.ndarray]:
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


# ---- Workdir and cache --------------------------------------------------------------------


def atomic_write(path: str, write_fn, mode: str = "w") -> None:
  """Writes via a temporary file in the same directory, then os.replace: never half a file."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
  try:
    with open(tmp, mode.replace("w", "x"), **({} if "b" in mode else {"encoding": "utf-8"})) as f:
      write_fn(f)
    os.replace(tmp, path)
  except BaseException:
    try:
      os.remove(tmp)
    except OSError:
      pass
    raise


def read_cache(path: str, what: str, read: Callable[[str], Any]):
  """read(path), or None when the cache file is missing or unreadable (corrupt, truncated,
  another version's, or `read` raising because it does not match the configuration): a cache
  must never stop a run, so an unreadable entry is logged and rebuilt."""
  try:
    return read(path)
  except FileNotFoundError:
    return None
  except Exception as e:  # noqa: BLE001 -- a cache must never stop a run: corrupt = rebuild
    logging.warning("Ignoring unreadable %s cache %s (%s: %s).", what, path, type(e).__name__, e)
    return None


def check_unlabeled_split(config, field: str, purpose: str) -> None:
  """One sentence if config.<field> names a TFDS split of unlabelled text while config.dataset
  is a local file (which has none)."""
  section, _, name = field.partition(".")
  split = config[section][name]
  if split and is_local_file(config.dataset):
    raise ValueError(f"config.{field}={split!r} names a TFDS split, but config.dataset is a "
                     f"local file; set it to '' ({purpose} on the training split's text only).")


def load_tokenizer(workdir: str, config=None):
  """(tokenizer, class_names) saved in `workdir`, or (None, None) if none is saved yet.

  Used on resume and at prediction time: `tokenizer.encode(texts, max_len, truncation)`, then
  `pad_before(...)` when the run used config.padding="before_as_token".
  With `config`, a tokenizer kind or vocab_size other than the workdir's is a DataError.
  """
  info_path = os.path.join(workdir, DATA_INFO_FILE)
  if not os.path.exists(info_path):
    return None, None
  try:
    with open(info_path, encoding="utf-8") as f:
      info = json.load(f)
    kind = info["tokenizer"]
    class_names = [str(name) for name in info["class_names"]]
    if kind == "word":
      with open(os.path.join(workdir, TOKENIZER_FILE), encoding="utf-8") as f:
        tokenizer = tokenizer_lib.WordTokenizer.from_json(f.read())
    elif kind == "byte":
      tokenizer = tokenizer_lib.ByteTokenizer()
    else:
      raise ValueError(f"unknown tokenizer {kind!r}")
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise DataError(f"{workdir}: the saved vocabulary ({DATA_INFO_FILE}, {TOKENIZER_FILE}) is "
                    f"unreadable ({type(e).__name__}: {e}); restore it or use a new "
                    f"workdir.") from None
  if config is not None:
    if kind != config.tokenizer:
      raise DataError(f"{workdir} was created with tokenizer={kind!r} but "
                      f"config.tokenizer={config.tokenizer!r}; use a new workdir or the "
                      f"original value.")
    if kind == "word" and info.get("config_vocab_size") != config.vocab_size:
      raise DataError(f"{workdir} was created with vocab_size={info.get('config_vocab_size')} "
                      f"but config.vocab_size={config.vocab_size}; use a new workdir or the "
                      f"original value.")
    if kind == "word" and tokenizer.punctuation != _punctuation(config):
      raise DataError(f"{workdir} was created with punctuation={tokenizer.punctuation!r} but "
                      f"config.punctuation={_punctuation(config)!r}; use a new workdir or the "
                      f"original value.")
  return tokenizer, class_names


def _save_workdir(workdir: str, config, tokenizer, class_names: list[str]) -> None:
  if tokenizer.kind == "word":
    atomic_write(os.path.join(workdir, TOKENIZER_FILE),
                  lambda f: f.write(tokenizer.to_json()))
  info = {
      "tokenizer": tokenizer.kind,
      "vocab_size": tokenizer.vocab_size,
      "config_vocab_size": config.vocab_size,
      "class_names": class_names,
      "punctuation": getattr(tokenizer, "punctuation", None),
      # For the record only; not checked on reuse.
      "dataset": config.dataset,
      "max_len": config.max_len,
      "truncation": config.truncation,
  }
  # Written last: its presence marks the workdir's vocabulary as complete.
  atomic_write(os.path.join(workdir, DATA_INFO_FILE),
                lambda f: json.dump(info, f, indent=2, ensure_ascii=False))


def _punctuation(config) -> str:
  """config.punctuation; configs written before the field existed mean Keras' "strip"."""
  return config.get("punctuation", "strip")


def _cache_dir(config) -> str:
  return os.path.expanduser(config.cache_dir or os.path.join("~", ".cache", "textattn"))


def _key(parts: Any) -> str:
  return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def _slug(config) -> str:
  name = os.path.splitext(os.path.basename(config.dataset.rstrip("/\\")))[0]
  safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:40]
  return safe or "data"


def _source(config) -> _FileSource | _TfdsSource:
  return _FileSource(config) if is_local_file(config.dataset) else _TfdsSource(config)


def source_cache_path(config, what: str, key_parts: dict[str, Any], extension: str,
                      write: bool = True) -> str | None:
  """A path in cache_dir for something derived from the config's data source (not yet read),
  its train/validation carve and `key_parts`; None when the source has no identity yet (TFDS
  data not prepared, or a file that does not exist), so nothing is cached. `write`: False
  where nothing may be written to the cache dir (non-zero processes)."""
  identity = _source(config).identity(write)
  if identity is None:
    return None
  key = _key({**_Cache(config, identity, writable=False).source_key(), "what": what,
              **key_parts})
  return os.path.join(_cache_dir(config), f"{_slug(config)}-{what}-{key}{extension}")


def pretraining_texts(config, unlabeled_split: str,
                      field: str = "word2vec.unlabeled_split") -> tuple[list[str], bool]:
  """The raw texts a model may be pretrained on without labels: the training split (validation
  carved out exactly as load_dataset does) plus TFDS split `unlabeled_split` if not "" (TFDS
  only: the callers' config checks refuse it for a local file). Never the validation or test
  split. Also whether the texts came from the source's own files (False for mocked TFDS data),
  i.e. whether what is derived from them may be cached. `field`: the config field naming the
  split, for error messages."""
  source = _source(config)
  raw = source.read(config.val_fraction, config.data_seed)
  texts = list(raw.texts["train"])
  if unlabeled_split:
    texts.extend(source.read_unlabeled(unlabeled_split, field))
  return texts, source.cacheable()


def word2vec_texts(config, unlabeled_split: str) -> tuple[list[list[str]], bool]:
  """pretraining_texts, standardised and split into words (the corpus of word_vectors)."""
  texts, cacheable = pretraining_texts(config, unlabeled_split)
  punctuation = _punctuation(config)
  return [tokenizer_lib.standardize(text, punctuation).split() for text in texts], cacheable


class _Cache:
  """Vocabularies and encoded arrays under cache_dir; failures only ever cost a rebuild."""

  def __init__(self, config, identity: list | None, writable: bool):
    self.directory = _cache_dir(config)
    self.config = config
    self.identity = identity
    self.writable = writable

  def source_key(self) -> dict:
    config = self.config
    return {"version": _CACHE_VERSION, "source": self.identity,
            "val_fraction": float(config.val_fraction), "data_seed": int(config.data_seed)}

  def _vocab_path(self) -> str:
    parts = {**self.source_key(), "vocab_size": int(self.config.vocab_size)}
    punctuation = _punctuation(self.config)
    if punctuation != "strip":  # (the key "strip" vocabularies had before the field existed)
      parts["punctuation"] = punctuation
    return os.path.join(self.directory,
                        f"{_slug(self.config)}-vocab{self.config.vocab_size}-{_key(parts)}.json")

  def _arrays_path(self, tokenizer) -> str:
    config = self.config
    key = _key({**self.source_key(), "tokenizer": tokenizer.fingerprint(),
                "max_len": int(config.max_len), "truncation": config.truncation})
    return os.path.join(self.directory, f"{_slug(config)}-{tokenizer.kind}-"
                        f"{config.max_len}{config.truncation}-{key}.npz")

  def load_vocab(self):
    if self.identity is None:
      return None
    def read(path):
      with open(path, encoding="utf-8") as f:
        return tokenizer_lib.WordTokenizer.from_json(f.read())
    tokenizer = read_cache(self._vocab_path(), "vocabulary", read)
    if tokenizer is not None and tokenizer.punctuation != _punctuation(self.config):
      return None  # (not expected: the key has the setting) rebuilt rather than misused
    return tokenizer

  def save_vocab(self, tokenizer) -> None:
    if self.writable and self.identity is not None:
      self._try_write(self._vocab_path(), lambda f: f.write(tokenizer.to_json()), "w")

  def load_arrays(self, tokenizer):
    """(splits, class_names, skipped) or None on a miss or an unreadable entry."""
    if self.identity is None:
      return None
    return read_cache(self._arrays_path(tokenizer), "data",
                      lambda path: self._read_arrays(path, tokenizer))

  def _read_arrays(self, path: str, tokenizer):
    with np.load(path, allow_pickle=False) as archive:
      meta = json.loads(str(archive["meta"]))
      splits = {s: Split(archive[f"{s}_inputs"].astype(np.int32),
                         archive[f"{s}_labels"].astype(np.int32)) for s in SPLITS}
    class_names = [str(c) for c in meta["class_names"]]
    for split in splits.values():
      if (split.inputs.ndim != 2 or split.inputs.shape[1] != self.config.max_len
          or split.labels.shape != (split.inputs.shape[0],)
          or (len(split) and (split.inputs.min() < 0
                              or split.inputs.max() >= tokenizer.vocab_size
                              or split.labels.min() < 0
                              or split.labels.max() >= len(class_names)))):
        raise ValueError("arrays do not match the configuration")
    return splits, class_names, {str(k): int(v) for k, v in meta["skipped"].items()}

  def save_arrays(self, tokenizer, splits: dict[str, Split], class_names: list[str],
                  skipped: dict[str, int]) -> None:
    if not self.writable or self.identity is None:
      return
    dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    arrays = {"meta": np.array(json.dumps({"class_names": class_names, "skipped": skipped}))}
    for name, split in splits.items():
      arrays[f"{name}_inputs"] = split.inputs.astype(dtype)
      arrays[f"{name}_labels"] = split.labels
    self._try_write(self._arrays_path(tokenizer), lambda f: np.savez(f, **arrays), "wb")

  def _try_write(self, path: str, write_fn, mode: str) -> None:
    try:
      atomic_write(path, write_fn, mode)
    except OSError as e:  # A read-only or full cache dir must not stop training.
      logging.warning("Could not write cache file %s (%s).", path, e)


# ---- Loading ------------------------------------------------------------------------------


def load_dataset(config, workdir: str | None, *, write: bool = True) -> Dataset:
  """Train / validation / test splits of int32 token ids, per the config's data fields.

  Args:
    config: the run's ConfigDict (dataset, data_dir, text_fields, label_field, val_fraction,
      data_seed, tokenizer, vocab_size, max_len, truncation, cache_dir).
    workdir: where the vocabulary and label names are saved and reused from; None to
      neither save nor reuse them (benchmarks).
    write: False on non-zero processes: nothing is written (workdir or cache); the vocabulary
      is read from the workdir if process 0 saved it, else built identically in memory.
  """
  _validate_config(config)
  source = _source(config)
  saved_tokenizer, saved_class_names = (load_tokenizer(workdir, config) if workdir
                                        else (None, None))

  tokenizer = saved_tokenizer
  if tokenizer is None and config.tokenizer == "byte":
    tokenizer = tokenizer_lib.ByteTokenizer()
  cache = _Cache(config, source.identity(write), writable=write)
  if tokenizer is None:
    tokenizer = cache.load_vocab()
  cached = cache.load_arrays(tokenizer) if tokenizer is not None else None

  if cached is not None:
    splits, class_names, skipped = cached
    logging.info("Loaded encoded %s from cache.", source.description)
  else:
    raw = source.read(config.val_fraction, config.data_seed)
    # Key the cache by what was actually read, and never cache mocked TFDS data.
    cache = _Cache(config, source.identity(write) if source.cacheable() else None,
                   writable=write)
    standardized = config.tokenizer == "word"
    punctuation = getattr(tokenizer, "punctuation", _punctuation(config))
    if standardized:  # Once per text, not once for counting and again for encoding.
      raw.texts = {s: [tokenizer_lib.standardize(t, punctuation) for t in texts]
                   for s, texts in raw.texts.items()}
    if tokenizer is None:
      tokenizer = tokenizer_lib.WordTokenizer.train(raw.texts["train"], config.vocab_size,
                                                    standardized=standardized,
                                                    punctuation=punctuation)
      cache.save_vocab(tokenizer)
    splits = {s: Split(tokenizer.encode(raw.texts[s], config.max_len, config.truncation,
                                        standardized=standardized), raw.labels[s])
              for s in SPLITS}
    class_names, skipped = raw.class_names, raw.skipped
    cache.save_arrays(tokenizer, splits, class_names, skipped)

  if saved_class_names is not None and saved_class_names != class_names:
    splits = _remap_labels(splits, class_names, saved_class_names, workdir)
    class_names = saved_class_names
  if workdir and write and saved_tokenizer is None:
    _save_workdir(workdir, config, tokenizer, class_names)
  if pads_before(config):
    splits = {s: Split(pad_before(split.inputs), split.labels) for s, split in splits.items()}
  return Dataset(train=splits["train"], validation=splits["validation"], test=splits["test"],
                 class_names=list(class_names), vocab_size=tokenizer.vocab_size,
                 skipped=dict(skipped), tokenizer=tokenizer)


def pad_before(inputs: np.ndarray) -> np.ndarray:
  """Left-aligned rows (tokens, then 0s) -> right-aligned (0s, then the same tokens), the layout
  of Keras' pad_sequences(padding="pre"). Token ids are never 0, so a row's token count is its
  number of non-zero ids."""
  length = inputs.shape[1]
  shift = length - np.count_nonzero(inputs, axis=1)
  source = np.arange(length)[None, :] - shift[:, None]
  rows = np.arange(inputs.shape[0])[:, None]
  return np.where(source >= 0, inputs[rows, np.maximum(source, 0)], 0).astype(inputs.dtype)


def _remap_labels(splits: dict[str, Split], names: list[str], saved: list[str],
                  workdir: str) -> dict[str, Split]:
  """Re-expresses labels in the workdir's label ids (fixed since the workdir was created)."""
  index = {name: i for i, name in enumerate(saved)}
  unknown = sorted(set(names) - set(index))
  present = {names[i] for s in splits.values() for i in np.unique(s.labels)}
  unknown = [name for name in unknown if name in present]
  if unknown:
    raise DataError(f"label(s) {unknown} in the data are outside the label set {saved} saved "
                    f"in {workdir}/{DATA_INFO_FILE}.")
  mapping = np.array([index.get(name, -1) for name in names], np.int32)
  return {k: Split(s.inputs, mapping[s.labels]) for k, s in splits.items()}


# ---- Batches ------------------------------------------------------------------------------


def _local_batch_size(global_batch_size: int, process_index: int, process_count: int) -> int:
  if not (isinstance(global_batch_size, (int, np.integer)) and global_batch_size >= 1):
    raise DataError(f"batch size {global_batch_size!r} is invalid; it must be an integer >= 1.")
  if not 0 <= process_index < process_count:
    raise DataError(f"process_index={process_index} is outside 0..{process_count - 1}.")
  if global_batch_size % process_count:
    raise DataError(f"global batch size {global_batch_size} is not divisible by the process "
                    f"count {process_count}.")
  return global_batch_size // process_count


class TrainIterator:
  """Infinite training batches: epoch e visits a permutation drawn from (seed, e).

  Full global batches only (each epoch drops its remainder). This process yields rows
  [process_index * local, (process_index + 1) * local) of every global batch. The position
  is `get_state()` = {"epoch", "index"} of the next batch; `set_state` resumes there exactly.
  """

  def __init__(self, split: Split, global_batch_size: int, seed: int, process_index: int = 0,
               process_count: int = 1):
    self.split = split
    self.local_batch_size = _local_batch_size(global_batch_size, process_index, process_count)
    self.global_batch_size = int(global_batch_size)
    self.steps_per_epoch = len(split) // self.global_batch_size
    if self.steps_per_epoch == 0:
      raise DataError(f"the training split has {len(split)} example(s), fewer than one global "
                      f"batch of {global_batch_size}; lower --config.batch_size.")
    self.seed = int(seed) % (1 << 63)  # default_rng needs a non-negative seed.
    self._offset = process_index * self.local_batch_size
    self._epoch = 0
    self._index = 0
    self._permutation_epoch = None
    self._permutation = None

  def get_state(self) -> dict:
    return {"epoch": self._epoch, "index": self._index}

  def set_state(self, state: dict) -> None:
    epoch, index = int(state["epoch"]), int(state["index"])
    if epoch < 0 or not 0 <= index < self.steps_per_epoch:
      raise DataError(f"iterator state {state} is invalid for {self.steps_per_epoch} steps per "
                      f"epoch (was the batch size or the data changed?).")
    self._epoch, self._index = epoch, index

  def _order(self, epoch: int) -> np.ndarray:
    if self._permutation_epoch != epoch:
      rng = np.random.default_rng([self.seed, epoch])
      self._permutation = rng.permutation(len(self.split))
      self._permutation_epoch = epoch
    return self._permutation

  def __iter__(self) -> TrainIterator:
    return self

  def __next__(self) -> dict:
    start = self._index * self.global_batch_size + self._offset
    rows = self._order(self._epoch)[start:start + self.local_batch_size]
    self._index += 1
    if self._index == self.steps_per_epoch:
      self._epoch, self._index = self._epoch + 1, 0
    return {"inputs": self.split.inputs[rows], "labels": self.split.labels[rows]}


def eval_batches(split: Split, global_batch_size: int, process_index: int = 0,
                 process_count: int = 1) -> Iterator[dict]:
  """Every example exactly once, in order; ceil(N / global_batch_size) batches per process.

  The last global batch is padded with copies of example 0 whose "weights" are 0.
  """
  local = _local_batch_size(global_batch_size, process_index, process_count)
  if len(split) == 0:
    raise DataError("cannot evaluate on an empty split.")
  return _eval_batches(split, int(global_batch_size), local, process_index * local)


def _eval_batches(split: Split, global_batch_size: int, local: int,
                  offset: int) -> Iterator[dict]:
  n = len(split)
  num_batches = -(-n // global_batch_size)
  for batch in range(num_batches):
    positions = np.arange(local) + batch * global_batch_size + offset
    real = positions < n
    rows = np.where(real, positions, 0)
    yield {"inputs": split.inputs[rows], "labels": split.labels[rows],
           "weights": real.astype(np.float32)}
