"""Translation pairs: read, standardise, split, tokenise (the sequence-to-sequence task).

Files:
- `.txt` / `.tsv` without a header, as the Anki / Tatoeba files (spa.txt): one pair per line,
  `source<TAB>target[<TAB>anything]`; empty lines are skipped. No quoting: a quote is text.
- `.csv` / `.tsv` with a header, or `.jsonl`: the named `source_field` and `target_field`
  (set `pairs_header=True` for a headered `.tsv`); CSV/TSV read as a classifier's files are
  (quoted fields may span lines; every row as many fields as the header).
A line without both texts, or with an empty one, is a DataError naming the file and line.

Standardisation (Deep Learning with Python, ch. 11.5, the chapter's figures use it): lower
case, ASCII punctuation deleted, and on the target side also the Spanish "¿" (the chapter's
`strip_chars`); words split on whitespace. The target is wrapped as "[start] ... [end]".

Splits: a seeded permutation of all pairs, 70 / 15 / 15 (the chapter's); or, with
`group_by_source=True`, the same proportions over *distinct source sentences*, so every
translation of one English sentence lands in one split (spa.txt has many sources with several
translations: the plain split lets a test sentence's twin train the model).
"""

from __future__ import annotations

import dataclasses
import os
import re
import string

import numpy as np

from textattn.data import raw as raw_lib
from textattn.data import tokenizer as tokenizer_lib
from textattn.data.splits import DataError
from textattn.data.tfds_source import quiet_tensorflow

START, END = "[start]", "[end]"
SPLITS = ("train", "validation", "test")
FRACTIONS = (0.70, 0.15, 0.15)
_SOURCE_STRIP = str.maketrans("", "", string.punctuation)
_TARGET_STRIP = str.maketrans("", "", string.punctuation.replace("[", "").replace("]", "")
                              + "¿")
_SPACES = re.compile(r"\s+")


def standardize_source(text: str) -> str:
  return _SPACES.sub(" ", text.lower().translate(_SOURCE_STRIP)).strip()


def standardize_target(text: str) -> str:
  """Standardised and wrapped in [start] / [end] ("[" and "]" are kept for those markers)."""
  body = _SPACES.sub(" ", text.lower().replace("[", " ").replace("]", " ")
                     .translate(_TARGET_STRIP)).strip()
  return f"{START} {body} {END}"


@dataclasses.dataclass
class Pairs:
  sources: list[str]  # raw text, as read
  targets: list[str]


def read_pairs(path: str, source_field: str = "source", target_field: str = "target",
               header: bool | None = None) -> Pairs:
  """The pairs of a file (module docstring). header=None: .csv and .jsonl have one (fields by
  name), .txt and .tsv do not (the first two columns)."""
  extension = os.path.splitext(path)[1].lower()
  if extension not in (".txt", ".tsv", ".csv", ".jsonl"):
    raise DataError(f"{path}: unsupported pairs file type {extension!r}; allowed: .txt/.tsv "
                    f"(source<TAB>target per line), .csv, .jsonl.")
  try:
    with open(path, "rb") as f:
      text = raw_lib.decode(f.read(), path)
  except OSError as e:
    raise DataError(f"{path}: cannot be read ({e.strerror}).") from None
  header = extension in (".csv", ".jsonl") if header is None else header
  sources, targets = [], []

  def add(line_number, source, target):
    if source is None or target is None or not str(source).strip() or not str(target).strip():
      raise DataError(f"{path}, line {line_number}: a pair needs a non-empty source and target "
                      f"text (got {source!r}, {target!r}).")
    sources.append(str(source).strip())
    targets.append(str(target).strip())

  if extension == ".jsonl":
    for number, record in raw_lib.json_records(path, text):
      add(number, record.get(source_field), record.get(target_field))
  elif not header:
    for number, line in enumerate(text.split("\n"), 1):  # not splitlines: see json_records
      line = line.rstrip("\r")
      if not line.strip():
        continue
      columns = line.split("\t")
      if len(columns) < 2:
        raise DataError(f"{path}, line {number}: expected source<TAB>target, found no tab.")
      add(number, columns[0], columns[1])
  else:  # (as a classifier's files: raw.delimited_records)
    delimiter = "\t" if extension in (".tsv", ".txt") else ","
    for number, record in raw_lib.delimited_records(
        path, text, delimiter, (), (source_field, target_field),
        "set config.source_field / config.target_field", skip_blank=True):
      add(number, record[source_field], record[target_field])
  if not sources:
    raise DataError(f"{path}: no pairs found.")
  return Pairs(sources, targets)


TFDS_PREFIX = "tfds:"


def read_tfds_pairs(name: str, source_field: str, target_field: str,
                    data_dir: str | None = None) -> dict[str, Pairs]:
  """A TFDS translation set's own splits (e.g. "ted_hrlr_translate/pt_to_en" with fields "pt"
  and "en"): {"train", "test", and "validation" when the set has one} -> Pairs."""
  quiet_tensorflow()
  import tensorflow_datasets as tfds
  out = {}
  for split in SPLITS:
    try:
      dataset = tfds.load(name, split=split, data_dir=data_dir)
    except (ValueError, KeyError) as e:
      if split == "validation" and "split" in str(e).lower():
        continue  # carved from train by the caller
      raise DataError(f"TFDS {name!r}, split {split!r}: cannot be loaded ({e}).") from None
    pairs = Pairs([], [])
    for number, example in enumerate(tfds.as_numpy(dataset), 1):
      missing = [f for f in (source_field, target_field) if f not in example]
      if missing:
        raise DataError(f"TFDS {name!r} has no feature {missing[0]!r} (it has "
                        f"{', '.join(sorted(example))}); set config.source_field / "
                        f"config.target_field.")
      source, target = (raw_lib.decode(example[f], f"TFDS {name} {split} #{number}")
                        if isinstance(example[f], bytes) else str(example[f])
                        for f in (source_field, target_field))
      if source.strip() and target.strip():  # (TFDS sets hold a few empty sentences)
        pairs.sources.append(source.strip())
        pairs.targets.append(target.strip())
    if not pairs.sources:
      raise DataError(f"TFDS {name!r}, split {split!r}: no pairs found.")
    out[split] = pairs
  return out


def concatenate(splits: dict[str, Pairs], seed: int) -> tuple[Pairs, dict[str, np.ndarray]]:
  """One Pairs of the given splits and each split's rows; without "validation", 15% of train
  (a permutation from `seed`) becomes it."""
  pairs, rows, begin = Pairs([], []), {}, 0
  for name, part in splits.items():
    pairs.sources += part.sources
    pairs.targets += part.targets
    rows[name] = np.arange(begin, begin + len(part.sources))
    begin += len(part.sources)
  if "validation" not in rows:
    train = np.random.default_rng(seed).permutation(rows["train"])
    cut = round(len(train) * FRACTIONS[1] / (FRACTIONS[0] + FRACTIONS[1]))
    rows["validation"], rows["train"] = np.sort(train[:cut]), np.sort(train[cut:])
  return pairs, rows


def split_indices(pairs: Pairs, seed: int, group_by_source: bool = False
                  ) -> dict[str, np.ndarray]:
  """Indices of the train / validation / test pairs (module docstring)."""
  rng = np.random.default_rng(seed)
  n = len(pairs.sources)
  if not group_by_source:
    order = rng.permutation(n)
    cuts = np.cumsum([int(f * n) for f in FRACTIONS[:2]])
    return dict(zip(SPLITS, (np.sort(part) for part in np.split(order, cuts))))
  keys = [standardize_source(s) for s in pairs.sources]
  distinct = sorted(set(keys))
  order = rng.permutation(len(distinct))
  cuts = np.cumsum([int(f * len(distinct)) for f in FRACTIONS[:2]])
  split_of = {}
  for name, part in zip(SPLITS, np.split(order, cuts)):
    for i in part:
      split_of[distinct[i]] = name
  by_split = {name: [] for name in SPLITS}
  for index, key in enumerate(keys):
    by_split[split_of[key]].append(index)
  return {name: np.array(rows, np.int64) for name, rows in by_split.items()}


def encode_pairs(source_tokenizer, target_tokenizer, pairs: Pairs, rows: np.ndarray,
                 source_len: int, target_len: int) -> dict[str, np.ndarray]:
  """int32 arrays of the given pairs: "sources" [N, source_len] and "targets" [N, target_len+1]
  ([start] w1 ... wn [end], padded with 0 after; a long one is cut at the end, keeping
  [start]). The decoder reads targets[:, :-1] and predicts targets[:, 1:]."""
  sources = [standardize_source(pairs.sources[i]) for i in rows]
  targets = [standardize_target(pairs.targets[i]) for i in rows]
  return {"sources": source_tokenizer.encode(sources, source_len, "post", standardized=True),
          "targets": target_tokenizer.encode(targets, target_len + 1, "post", standardized=True)}


TOKENIZERS = ("word", "bpe")


def train_tokenizers(pairs: Pairs, train_rows: np.ndarray, source_vocab: int,
                     target_vocab: int, kind: str = "word", shared: bool = False):
  """Vocabularies of the training pairs only: words (the chapter's TextVectorization adapt) or
  BPE subwords ([start] and [end] kept whole as special tokens). shared=True: one vocabulary of
  `target_vocab` entries from both sides' text, returned as both tokenizers."""
  sources = [standardize_source(pairs.sources[i]) for i in train_rows]
  targets = [standardize_target(pairs.targets[i]) for i in train_rows]
  if shared:
    both = sources + targets
    tok = (tokenizer_lib.BpeTokenizer.train(both, target_vocab, (START, END), standardized=True)
           if kind == "bpe" else
           tokenizer_lib.WordTokenizer.train(both, target_vocab, standardized=True))
    return tok, tok
  if kind == "bpe":
    return (tokenizer_lib.BpeTokenizer.train(sources, source_vocab, standardized=True),
            tokenizer_lib.BpeTokenizer.train(targets, target_vocab, (START, END),
                                             standardized=True))
  return (tokenizer_lib.WordTokenizer.train(sources, source_vocab, standardized=True),
          tokenizer_lib.WordTokenizer.train(targets, target_vocab, standardized=True))
