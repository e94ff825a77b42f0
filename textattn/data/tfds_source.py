"""The TFDS source (`config.dataset`, e.g. "imdb_reviews"): validation is carved from TFDS
train (`val_fraction`, permutation from `data_seed`; 0 leaves it empty); test is TFDS test.
Prepared data is read from config.data_dir (else $TFDS_DATA_DIR, else TFDS's default); data
that is not prepared is downloaded, or refused at once when there is no network."""

from __future__ import annotations

import os
import re
import socket

import numpy as np
from absl import logging

from textattn.data import raw as raw_lib
from textattn.data.cache import cache_dir, content_digest
from textattn.data.splits import DataError
from textattn.errors import DataConfigError

_READ_BATCH = 4096

# Split names that hold labelled (training or held-out) text, e.g. "validation_matched": never
# read as unlabelled text.
_LABELLED_SPLIT_PREFIXES = ("train", "valid", "test", "dev")


# TFDS's own name grammar (tensorflow_datasets.core.naming): [namespace:]name[/config][:x.y.z].
# Checked before anything touches the file system: a name is joined to the data dir and its
# files hashed, so ".." or "/" would hash a whole tree.
_TFDS_NAME = re.compile(r"([\w\-]+:)?[A-Za-z]\w*(/[\w+\-.]+)?(:(\d+|\*)(\.(\d+|\*)){2})?")


def check_name(name: str, root: str | None = None) -> None:
  """DataError (one sentence) unless `name` is shaped like a TFDS name and is not a directory
  (other than the data set's own under `root`, the TFDS data dir); cheap: a stat, no walk."""
  allowed = ("give a TFDS name such as 'imdb_reviews' (name[/config][:version]) or the path of "
             "a .csv/.tsv/.jsonl file")
  own = (root is not None and not os.path.isabs(name)
         and os.path.realpath(name) == os.path.realpath(os.path.join(root, name)))
  if os.path.isdir(name) and not own:
    raise DataConfigError(f"config.dataset={name!r} is a directory; {allowed}.")
  if not _TFDS_NAME.fullmatch(name):
    raise DataConfigError(f"config.dataset={name!r} is neither an existing local file nor a TFDS "
                    f"name; {allowed}.")


def tfds_data_dir(config) -> str | None:
  """config.data_dir, else $TFDS_DATA_DIR, else None (TFDS's default)."""
  return config.data_dir or os.environ.get("TFDS_DATA_DIR") or None


def data_root(data_dir: str | None) -> str:
  """The TFDS data dir, absolute: `data_dir` (tfds_data_dir's), else TFDS's default."""
  return os.path.realpath(os.path.expanduser(data_dir or os.path.join("~", "tensorflow_datasets")))


def network_available(host: str = "storage.googleapis.com", timeout: float = 3.0) -> bool:
  try:
    socket.create_connection((host, 443), timeout=timeout).close()
    return True
  except OSError:
    return False


def quiet_tensorflow() -> None:
  """Before TensorFlow's first import: without these its C++ start-up prints an INFO line about
  oneDNN, once per library that links it (twice), plus an absl warning, on every TFDS read.
  oneDNN only changes TF's own float kernels, which reading records never uses; a user's own
  setting of either variable is kept."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def _keep_tensorflow_off_accelerators() -> None:
  """TFDS reads through TensorFlow; without this TF would claim the GPU memory JAX trains in.
  Only the TFDS read path imports TensorFlow (seconds of start-up), so only it pays for this."""
  quiet_tensorflow()
  try:
    import tensorflow as tf
    tf.config.set_visible_devices([], "GPU")
  except (ImportError, RuntimeError):  # No TF, or its devices are already initialised.
    pass


class TfdsSource:
  """A TFDS dataset; its identity is cheap (file stats) so a cache hit never imports TFDS."""

  def __init__(self, config):
    self.name = config.dataset
    self.data_dir = tfds_data_dir(config)
    self.text_fields = raw_lib.text_fields(config)
    self.label_field = config.source.label_field
    self.description = f"TFDS dataset {self.name!r}"
    self.cache_dir = cache_dir(config)
    self._read_from: str | None = None

  def _root(self) -> str:
    return data_root(self.data_dir)

  def identity(self, write: bool = True) -> list | None:
    """Name and the names and contents (sha256) of its prepared files, not their location or
    modification times: a re-copied or moved data dir keeps its cache. None when nothing is
    prepared. `write`: whether the digests may be memoised in the cache dir."""
    check_name(self.name, self._root())  # (before the walk: ".." would walk the data dir's parent)
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
    quiet_tensorflow()
    import tensorflow_datasets as tfds
    if not re.fullmatch(r"[A-Za-z0-9_]+", split):
      # TFDS would also take "unsupervised+test" or "test[:20%]": held-out text in the corpus.
      raise DataConfigError(f"config.{field}={split!r} is not a plain split name; name one whole split "
                      f"of unlabelled text (letters, digits, '_') such as 'unsupervised', or ''.")
    if split.lower().startswith(_LABELLED_SPLIT_PREFIXES):
      raise DataConfigError(f"config.{field}={split!r} is a labelled split (its held-out part would "
                      f"leak into what is pretrained on it; the training part is used anyway); "
                      f"name a split of unlabelled text such as 'unsupervised', or ''.")
    builder = tfds.builder(self.name, data_dir=self.data_dir)
    texts, index = [], 0
    try:
      dataset = builder.as_dataset(split=split, batch_size=_READ_BATCH, shuffle_files=False)
    except Exception as e:  # noqa: BLE001 -- TFDS versions differ on an unknown split: one sentence
      raise DataConfigError(f"config.{field}={split!r} is not a split of "
                      f"{self.description} (it has {sorted(builder.info.splits)}; "
                      f"{type(e).__name__}); set it to '' to use the training split's text "
                      f"only.") from None
    for batch in tfds.as_numpy(dataset):
      for values in zip(*(batch[f] for f in self.text_fields)):
        where = f"{self.description}, split {split!r}, example {index}"
        text = raw_lib.join_fields([raw_lib.decode(v, where) for v in values])
        index += 1
        if text.strip():
          texts.append(text)
    return texts

  def read(self, val_fraction: float, data_seed: int) -> raw_lib.Raw:
    quiet_tensorflow()
    import tensorflow_datasets as tfds  # Slow import; only needed on a cache miss.
    _keep_tensorflow_off_accelerators()
    builder = self._builder(tfds)
    features = builder.info.features
    missing = [f for f in self.text_fields + [self.label_field] if f not in features]
    if missing:
      raise DataError(f"{self.description} has no feature(s) {missing}; it has "
                      f"{sorted(features.keys())} (set --config.source.text_fields / "
                      f"--config.source.label_field).")
    class_names = list(getattr(features[self.label_field], "names", None) or [])
    columns = self._read_or_prepare(tfds, builder)
    self._read_from = builder.data_dir

    texts, raw_labels = {}, {}
    for split, split_columns in columns.items():
      raw_labels[split] = split_columns[self.label_field]
      texts[split] = [
          raw_lib.join_fields([raw_lib.decode(split_columns[f][i], f"{self.description}, split "
                                              f"{split!r}, example {i}, field {f!r}")
                               for f in self.text_fields])
          for i in range(len(raw_labels[split]))]
    class_names, labels = self._label_ids(raw_labels, class_names)

    skipped = {}
    for split in ("train", "test"):
      keep = raw_lib.keep_nonempty(texts[split], f"{self.description}, split {split!r}",
                                   lambda i: f"example {i}", skipped, split)
      texts[split] = [texts[split][i] for i in keep]
      labels[split] = labels[split][keep]
    raw_lib.check_not_empty(texts["test"], f"{self.description}: split 'test'")
    train, validation = raw_lib.carve(len(texts["train"]), val_fraction, data_seed, 1,
                                      f"{self.description}: split 'train'")
    return raw_lib.Raw(
        texts={"train": [texts["train"][i] for i in train],
               "validation": [texts["train"][i] for i in validation],
               "test": texts["test"]},
        labels={"train": labels["train"][train], "validation": labels["train"][validation],
                "test": labels["test"]},
        class_names=class_names, skipped=skipped)

  def _builder(self, tfds):
    try:
      return tfds.builder(self.name, data_dir=self.data_dir)
    except Exception as e:  # noqa: BLE001 -- any TFDS failure here is one sentence for the user
      # (DatasetNotFoundError, registry and config errors differ across TFDS versions).
      first_line = str(e).strip().split("\n")[0]  # TFDS appends every dataset's name.
      raise DataConfigError(f"config.dataset={self.name!r} is neither an existing local file nor a "
                      f"known TFDS dataset ({type(e).__name__}: {first_line}).") from None

  def _read_or_prepare(self, tfds, builder) -> dict[str, dict[str, list]]:
    """_read_columns, downloading and preparing the data set first if it is not prepared."""
    where = self.data_dir or "TFDS's default data dir (~/tensorflow_datasets)"
    supply = ("prepare it there (run once with internet access) or point to a prepared copy "
              "with TFDS_DATA_DIR=DIR or --config.data_dir=DIR")
    # Read first: prepared data (or a mocked TFDS) needs no download_and_prepare.
    try:
      return self._read_columns(tfds, builder)
    except Exception as e:  # noqa: BLE001 -- not prepared (or unreadable): decided just below
      if builder.is_prepared():
        raise DataError(f"{self.description}: reading {builder.data_dir} failed "
                        f"({type(e).__name__}: {e}).") from None
      # Offline, TFDS's downloader retries for minutes before failing; fail at once instead.
      if not network_available():
        raise DataError(f"{self.description} is not prepared in {where} and there is no "
                        f"network to download it; {supply}.") from None
    logging.info("%s is not prepared in %s; downloading and preparing it.",
                 self.description, where)
    try:
      builder.download_and_prepare()
      return self._read_columns(tfds, builder)
    except Exception as e:  # noqa: BLE001 -- any download failure: one sentence, no traceback
      raise DataError(f"{self.description} is not prepared in {where} and could not be "
                      f"downloaded ({type(e).__name__}); {supply}.") from None

  def _label_ids(self, raw_labels: dict[str, list], class_names: list[str]
                 ) -> tuple[list[str], dict[str, np.ndarray]]:
    """(class_names, split -> int32 label ids): a ClassLabel's ints must index its names;
    other labels are indexed as strings in sorted order, checked as a local file's are (two
    classes in training at least, and no held-out label that training lacks)."""
    if not class_names:
      string_labels = {s: [raw_lib.label_string(v) for v in vs] for s, vs in raw_labels.items()}
      for split, values in string_labels.items():
        if None in values:
          i = values.index(None)
          raise DataError(f"{self.description}, split {split!r}, example {i}: label "
                          f"{raw_labels[split][i]!r} is a missing value; every example needs a "
                          f"label.")
      class_names, ids = raw_lib.index_labels(string_labels)
      raw_lib.check_classes({"validation": np.zeros(0, np.int32), **ids}, class_names,
                            self.description, lambda split, i: f"example {i}", "")
      return class_names, ids
    labels = {}
    for split, values in raw_labels.items():
      array = np.asarray(values, np.int64)
      bad = np.flatnonzero((array < 0) | (array >= len(class_names)))
      if bad.size:
        raise DataError(f"{self.description}, split {split!r}, example {bad[0]}: label "
                        f"{array[bad[0]]} is outside the label set 0..{len(class_names) - 1}.")
      labels[split] = array.astype(np.int32)
    return class_names, labels
