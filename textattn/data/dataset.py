"""`load_dataset`: the config's data set as int32 arrays, with the workdir's vocabulary and label
names; the config's data fields are checked first; `load_tokenizer` reads the workdir back.

The word vocabulary is counted on the train part only; a pretrained model (config.model.pretrained)
brings its own tokenizer, applied to the raw text. The tokenizer (`tokenizer.json`) and the label
names (`data_info.json`) are saved in the workdir and reused from it, so ids never change between
runs of a workdir. Encoded arrays come from the cache when it has them: a second run of
the same config reads neither TFDS nor the text."""

from __future__ import annotations

import json
import os

import numpy as np
from absl import logging

from textattn import workdir as workdir_lib
from textattn.data import ngrams as ngrams_lib
from textattn.data import raw as raw_lib
from textattn.data import tfds_source
from textattn.data import tokenizer as tokenizer_lib
from textattn.data.cache import Cache, atomic_write
from textattn.data.file_source import (
  LOCAL_FORMATS,
  FileSource,
  column_names,
  is_local_file,
  split_files,
)
from textattn.data.pretrained_tokenizer import PretrainedTokenizer
from textattn.data.sources import source
from textattn.data.splits import (
  PADDINGS,
  SPLITS,
  DataError,
  Dataset,
  Split,
  pad_before,
  pads_before,
)
from textattn.errors import DataConfigError

TOKENIZER_FILE = "tokenizer.json"
DATA_INFO_FILE = "data_info.json"


def validate_config(config) -> None:
  """One DataError naming the field, its value and what is allowed, for the first bad field."""
  def check(ok: bool, field: str, allowed: str) -> None:
    if not ok:
      value = config
      for name in field.split("."):  # ("layout.padding": a field of an opt-in part)
        value = value[name]
      raise DataConfigError(f"config.{field}={value!r} is invalid; {allowed}.")

  def is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)

  check(isinstance(config.dataset, str) and config.dataset.strip() != "", "dataset",
        "give a TFDS name such as 'imdb_reviews' or the path of a .csv/.tsv/.jsonl file")
  if is_local_file(config.dataset):
    problem = raw_lib.not_a_file(config.dataset)
    if problem:
      raise DataConfigError(f"config.dataset={config.dataset}: {problem}; give the path of a "
                            f".csv/.tsv/.jsonl file or a TFDS name such as 'imdb_reviews'.")
  else:
    tfds_source.check_name(config.dataset,
                           tfds_source.data_root(tfds_source.tfds_data_dir(config)))
  check(config.tokenizer in ("word", "byte", "ngram"), "tokenizer",
        "allowed: 'word', 'byte', 'ngram'")
  if config.tokenizer == "ngram":
    order = config.ngrams.order
    check(is_int(order) and 1 <= order <= ngrams_lib.MAX_ORDER, "ngrams.order",
          f"it must be an integer from 1 to {ngrams_lib.MAX_ORDER}")
  check(config.layout.truncation in tokenizer_lib.TRUNCATIONS, "layout.truncation", "allowed: 'pre', 'post'")
  check(is_int(config.max_len) and config.max_len >= 1, "max_len", "it must be an integer >= 1")
  check(config.layout.padding in PADDINGS, "layout.padding",
        "allowed: 'after_masked' (padding after the tokens, masked out), 'before_as_token' "
        "(padding before the tokens and attended and pooled like a token, as the Keras seed)")
  if config.tokenizer in ("word", "ngram"):
    check(is_int(config.vocab_size) and config.vocab_size > tokenizer_lib.NUM_RESERVED,
          "vocab_size", "it must be an integer > 2 (ids 0 and 1 are reserved)")
  check(isinstance(config.val_fraction, (int, float)) and 0 <= config.val_fraction < 0.5,
        "val_fraction", "it must be in [0, 0.5)")
  check(is_int(config.data_seed) and config.data_seed >= 0, "data_seed",
        "it must be an integer >= 0")
  check(bool(raw_lib.text_fields(config)), "source.text_fields", "give comma-separated field names")
  check(isinstance(config.source.label_field, str) and config.source.label_field.strip() != "",
        "source.label_field", "give the label field's name")
  _check_local_files(config, check)


def _check_local_files(config, check) -> None:
  """validation_file, test_file and columns: for local files only, and consistent."""
  local = is_local_file(config.dataset)
  given = split_files(config)
  for split, path in given.items():
    field = f"source.{split}_file"
    if not local:
      raise DataConfigError(f"config.{field}={path!r} is invalid; separate split files need "
                      f"config.dataset to be a local file (a TFDS dataset has its own splits).")
    problem = raw_lib.not_a_file(path)
    if problem or os.path.splitext(path)[1].lower() not in LOCAL_FORMATS:
      raise DataConfigError(f"config.{field}={path!r} is invalid ("
                            f"{problem or 'not a .csv/.tsv/.jsonl file'}); give the path of an "
                            f"existing .csv/.tsv/.jsonl file (or '' to carve the {split} split "
                            f"from config.dataset).")
  for split in ("validation", "test"):
    own = config.source[f"{split}_text_fields"]
    if not isinstance(own, str):
      raise DataConfigError(f"config.source.{split}_text_fields={own!r} is invalid; give "
                            f"comma-separated field names, or '' for config.source.text_fields.")
    if own.strip() and split not in given:
      raise DataConfigError(f"config.source.{split}_text_fields={own!r} names the text fields of "
                            f"config.source.{split}_file, which is not set (a carved {split} split "
                            f"has the training file's text_fields); set both or neither.")
  carved = [s for s in ("validation", "test") if s not in given]
  check(config.val_fraction > 0 or not local or not carved, "val_fraction",
        f"a local file needs val_fraction > 0 to carve its {' and '.join(carved)} split"
        f"{'s' if len(carved) > 1 else ''} (or give config.source.validation_file and "
        f"config.source.test_file)")
  columns = column_names(config)
  if columns:
    if not local:
      raise DataConfigError(f"config.source.columns={config.source.columns!r} is invalid; it names the columns of "
                      f"headerless .csv/.tsv files, and config.dataset is a TFDS dataset.")
    for path in [config.dataset, *given.values()]:
      if LOCAL_FORMATS.get(os.path.splitext(path)[1].lower()) is None:
        raise DataConfigError(f"config.source.columns={config.source.columns!r} is invalid for {path}: it names "
                        f"the columns of headerless .csv/.tsv files; JSON lines name their "
                        f"own fields (set config.source.columns='').")
    check(len(set(columns)) == len(columns), "source.columns", "each column name must differ")
    named = [f for split in ("train", *given) for f in raw_lib.text_fields(config, split)]
    missing = [f for f in dict.fromkeys(named + [config.source.label_field]) if f not in columns]
    check(not missing, "source.columns", f"it lacks {missing}, named by config.source.text_fields / "
          f"config.source.label_field")


def tokenizer_kind(config) -> str:
  """The kind of tokenizer a config's run uses: a pretrained model's own ("pretrained", when
  config.model.pretrained is set), else config.tokenizer."""
  return "pretrained" if config.model.pretrained else config.tokenizer


def load_dataset(config, workdir: str | None, *, write: bool = True,
                 tokenizer=None) -> Dataset:
  """Train / validation / test splits of int32 token ids, per the config's data fields.

  Args:
    config: the run's ConfigDict (dataset, data_dir, text_fields, label_field, val_fraction,
      data_seed, tokenizer, vocab_size, max_len, truncation, cache_dir).
    workdir: where the vocabulary and label names are saved and reused from; None to
      neither save nor reuse them (benchmarks).
    write: False on non-zero processes: nothing is written (workdir or cache); the vocabulary
      is read from the workdir if process 0 saved it, else built identically in memory.
    tokenizer: a pretrained model's own (config.model.pretrained), applied to the raw text;
      the workdir's saved copy wins once there is one, so ids never change.
  """
  validate_config(config)
  data_source = source(config)
  saved_tokenizer, saved_class_names = (load_tokenizer(workdir, config) if workdir
                                        else (None, None))
  given = tokenizer
  tokenizer = saved_tokenizer or given
  if tokenizer_kind(config) == "pretrained" and tokenizer is None:
    raise ValueError("config.model.pretrained is set: load_dataset needs the model's tokenizer.")
  if tokenizer is None and config.tokenizer == "byte":
    tokenizer = tokenizer_lib.ByteTokenizer()
  identity = data_source.identity(write)
  cache = Cache(config, identity, writable=write)
  if saved_tokenizer is not None:
    _check_vocabulary_source(workdir, saved_tokenizer, cache.source_key())
  if tokenizer is None:
    tokenizer = cache.load_vocab()
  cached = cache.load_arrays(tokenizer) if tokenizer is not None else None
  if cached is not None and not _labels_follow_the_rules(cached[0], cached[1], data_source):
    # An entry written before the label rules (raw.label_string, raw.check_classes): its key
    # is the file's content, so it is read afresh, which applies them (or names the problem).
    cached = None

  if cached is not None:
    splits, class_names, skipped = cached
    logging.info("Loaded encoded %s from cache.", data_source.description)
  else:
    if write:  # (a cold start's silent stretch: IMDB takes a minute or more to read and encode)
      print(f"Reading {data_source.description} and encoding it (cached for later runs) ...",
            flush=True)
    raw = data_source.read(config.val_fraction, config.data_seed)
    # Key the cache by what was read, and never cache mocked TFDS data. A local file that
    # changed while it was read (still being copied?) may have been read in part: caching that
    # under the finished file's key would serve it to every later run, so the run stops instead.
    # (TFDS writes its own files while preparing a dataset: its reads are TFDS's to check.)
    read_identity = data_source.identity(write) if data_source.cacheable() else None
    if isinstance(data_source, FileSource) and read_identity != identity:
      raise DataError(f"{data_source.description} changed while it was being read (is it "
                      f"still being written?); run again once it is complete. Nothing was "
                      f"cached.")
    cache = Cache(config, read_identity, writable=write)
    standardized = tokenizer_kind(config) in ("word", "ngram")
    if standardized:  # Once per text, not once for counting and again for encoding.
      raw.texts = {s: [tokenizer_lib.standardize(t) for t in texts]
                   for s, texts in raw.texts.items()}
    if tokenizer is None:
      tokenizer = train_tokenizer(config, raw.texts["train"], standardized)
      cache.save_vocab(tokenizer)
    splits = {s: Split(tokenizer.encode(raw.texts[s], config.max_len, config.layout.truncation,
                                        standardized=standardized), raw.labels[s])
              for s in SPLITS}
    class_names, skipped = raw.class_names, raw.skipped
    cache.save_arrays(tokenizer, splits, class_names, skipped)

  if saved_class_names is not None and saved_class_names != class_names:
    splits = _remap_labels(splits, class_names, saved_class_names, workdir)
    class_names = saved_class_names
  if workdir and write and saved_tokenizer is None:
    _save_workdir(workdir, config, tokenizer, class_names, cache.source_key())
  if pads_before(config):
    splits = {s: Split(pad_before(split.inputs), split.labels) for s, split in splits.items()}
  return Dataset(train=splits["train"], validation=splits["validation"], test=splits["test"],
                 class_names=list(class_names), vocab_size=tokenizer.vocab_size,
                 skipped=dict(skipped), tokenizer=tokenizer)


def describe(config, data: Dataset) -> str:
  """One line a run prints of its data: each split's size and where a held-out one comes from
  (a carved one says how), the classes, and the empty texts skipped."""
  local = is_local_file(config.dataset)
  given = split_files(config) if local else {}
  carved = [s for s in ("validation", "test") if s not in given and (local or s != "test")]
  each = " each" if len(carved) > 1 else ""
  carve = (f"{' and '.join(carved)} carved from train: val_fraction={config.val_fraction}"
           f"{each}, data_seed={config.data_seed}")
  origins = [carve] if carved else []
  origins += [f"{split}: {path}" for split, path in given.items()]
  origins += [] if local else ["test: TFDS test"]
  sizes = ", ".join(f"{split} {len(getattr(data, split)):,}"
                    for split in ("train", "validation", "test"))
  skipped = sum(data.skipped.values())
  classes = ", ".join(data.class_names[:6]) + (", ..." if len(data.class_names) > 6 else "")
  return (f"Data: {config.dataset}: {sizes} examples ({'; '.join(origins)}); "
          f"{len(data.class_names)} classes ({classes})"
          + (f"; {skipped:,} empty text(s) skipped" if skipped else "") + ".")


def train_tokenizer(config, texts: list[str], standardized: bool):
  """The config's word or n-gram vocabulary, counted on `texts` (the training split)."""
  if config.tokenizer == "ngram":
    return ngrams_lib.NgramTokenizer.train(texts, config.vocab_size, config.ngrams.order,
                                           config.ngrams.counts, standardized=standardized)
  return tokenizer_lib.WordTokenizer.train(texts, config.vocab_size, standardized=standardized)


def _labels_follow_the_rules(splits: dict[str, Split], class_names: list[str],
                              data_source) -> bool:
  """Whether cached labels are what reading the source today would give: canonical class
  names and, for a local file, two or more training classes covering the held-out labels."""
  if any(raw_lib.label_string(name) != name for name in class_names):
    return False
  if not isinstance(data_source, FileSource):
    return True
  trained = set(np.unique(splits["train"].labels).tolist())
  held_out = set(np.unique(np.concatenate([splits["validation"].labels,
                                           splits["test"].labels])).tolist())
  return len(trained) >= 2 and held_out <= trained


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


def load_tokenizer(workdir: str, config=None):
  """(tokenizer, class_names) saved in `workdir`, or (None, None) if none is saved yet.

  Used on resume and at prediction time: `tokenizer.encode(texts, max_len, truncation)`, then
  `pad_before(...)` when the run used config.layout.padding="before_as_token".
  With `config`, a tokenizer kind or vocab_size other than the workdir's is a DataError.
  """
  info_path = os.path.join(workdir, DATA_INFO_FILE)
  if not os.path.exists(info_path):
    return None, None
  try:
    with open(info_path, encoding="utf-8") as f:
      info = json.load(f)
    kind = info["tokenizer"]
    if info.get("punctuation") not in ("strip", None):  # (None: a byte tokenizer, or older)
      raise DataError(f"{workdir} was created with punctuation={info['punctuation']!r}, an "
                      f"option textattn no longer has; use a new workdir.")
    class_names = [str(name) for name in info["class_names"]]
    if kind in ("word", "ngram"):
      with open(os.path.join(workdir, TOKENIZER_FILE), encoding="utf-8") as f:
        tokenizer = ngrams_lib.tokenizer_from_json(f.read())
      if tokenizer.kind != kind:
        raise ValueError(f"{TOKENIZER_FILE} holds a {tokenizer.kind} vocabulary")
    elif kind == "byte":
      tokenizer = tokenizer_lib.ByteTokenizer()
    elif kind == "pretrained":
      with open(os.path.join(workdir, TOKENIZER_FILE), encoding="utf-8") as f:
        text = f.read()
      try:
        tokenizer = PretrainedTokenizer.from_json(text, info["pad_id"])
      except Exception as e:  # tokenizers raises a plain Exception for a file it cannot read
        raise ValueError(str(e)) from e
    else:
      raise ValueError(f"unknown tokenizer {kind!r}")
  except DataError:
    raise
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise DataError(f"{workdir}: the saved vocabulary ({DATA_INFO_FILE}, {TOKENIZER_FILE}) is "
                    f"unreadable ({type(e).__name__}: {e}); restore it or use a new "
                    f"workdir.") from None
  if config is not None:
    if kind != tokenizer_kind(config):
      now = (f"config.model.pretrained={config.model.pretrained!r} (its own tokenizer)"
             if config.model.pretrained else f"config.tokenizer={config.tokenizer!r}")
      raise DataError(f"{workdir} was created with tokenizer={kind!r} but {now}; use a new "
                      f"workdir or the original value.")
    if kind == "ngram" and (tokenizer.order, tokenizer.counts) != (
        config.ngrams.order, config.ngrams.counts):
      raise DataError(f"{workdir} was created with ngrams.order={tokenizer.order}, ngrams.counts="
                      f"{tokenizer.counts} but the config has {config.ngrams.order}, "
                      f"{config.ngrams.counts}; use a new workdir or the original values.")
    if kind in ("word", "ngram") and info.get("config_vocab_size") != config.vocab_size:
      raise DataError(f"{workdir} was created with vocab_size={info.get('config_vocab_size')} "
                      f"but config.vocab_size={config.vocab_size}; use a new workdir or the "
                      f"original value.")
  return tokenizer, class_names


def _counted_on(source_key: dict) -> dict | None:
  """What a word or n-gram vocabulary was counted on: the training data's content and carve
  (Cache.source_key, its format version left out), JSON-normalised; None when unknown."""
  if source_key.get("source") is None:
    return None
  return json.loads(json.dumps({k: v for k, v in source_key.items() if k != "version"}))


def _check_vocabulary_source(workdir: str, tokenizer, source_key: dict) -> None:
  """A DataError when the workdir's word/n-gram vocabulary was counted on other training data
  than this run's (a start after one that stopped before its first checkpoint, with another
  data_seed, val_fraction, file or fields): reused, it would hold words of this run's held-out
  splits; rebuilt, the workdir's ids would change under its run. (A resume of changed data is
  refused by its checkpoint's data fingerprint, with the field that changed: a workdir with a
  checkpoint is left to that check; workdirs from before the record pass.)"""
  if tokenizer.kind not in ("word", "ngram"):
    return  # (a pretrained model's own or the byte vocabulary: not counted on the data)
  with open(os.path.join(workdir, DATA_INFO_FILE), encoding="utf-8") as f:
    saved = json.load(f).get("counted_on")
  refuse_other_training_data(workdir, saved, _counted_on(source_key), "vocabulary",
                             "dataset content, text fields, val_fraction or data_seed")


def refuse_other_training_data(workdir: str, saved, now, what: str, differs: str) -> None:
  """A DataError when a fresh start (no checkpoint yet: a resume is its checkpoint's data
  fingerprint's to check) finds the workdir's `what` (a vocabulary, tokenizers) counted on
  other training data than this run's (`saved` != `now`; None: not recorded, e.g. a workdir
  from before the record). Reused, it would hold words of this run's held-out splits; rebuilt,
  the workdir's ids would change under its run."""
  if saved is None or now is None or saved == now or workdir_lib.checkpoint_steps(workdir):
    return
  raise DataError(f"{workdir} holds a {what} counted on other training data than this run's "
                  f"(another {differs}); reusing it would leak held-out words and rebuilding it "
                  f"would change the workdir's ids: use a new --workdir (or delete {workdir} if "
                  f"it holds no run to keep).")


def _save_workdir(workdir: str, config, tokenizer, class_names: list[str],
                  source_key: dict) -> None:
  if tokenizer.kind in ("word", "ngram", "pretrained"):
    atomic_write(os.path.join(workdir, TOKENIZER_FILE), lambda f: f.write(tokenizer.to_json()))
  info = {
      "tokenizer": tokenizer.kind,
      "vocab_size": tokenizer.vocab_size,
      "config_vocab_size": config.vocab_size,
      "class_names": class_names,
      "punctuation": "strip" if tokenizer.kind in ("word", "ngram") else None,  # (read by load_tokenizer)
      **({"pad_id": tokenizer.model_pad_id} if tokenizer.kind == "pretrained" else {}),
      # What a word/n-gram vocabulary was counted on (checked on reuse: _check_vocabulary_source)
      **({"counted_on": _counted_on(source_key)} if tokenizer.kind in ("word", "ngram") else {}),
      # For the record only; not checked on reuse.
      "dataset": config.dataset,
      "max_len": config.max_len,
      "truncation": config.layout.truncation,
  }
  # Written last: its presence marks the workdir's vocabulary as complete.
  atomic_write(os.path.join(workdir, DATA_INFO_FILE),
               lambda f: json.dump(info, f, indent=2, ensure_ascii=False))


