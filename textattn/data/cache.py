"""The cache under config.cache_dir: vocabularies and encoded arrays keyed by everything that
affects them (the source's content, the carve, the tokenizer, max_len, truncation), content
digests of source files, and the atomic writes and forgiving reads every cache file goes
through. A cache failure only ever costs a rebuild."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
from absl import logging

from textattn.data import ngrams
from textattn.data.splits import SPLITS, Split
from textattn.paths import cache_root

_CACHE_VERSION = 1

_DIGESTS: dict[str, str] = {}  # (path, size, mtime) stamp -> sha256, this process


def cache_dir(config) -> str:
  return os.path.expanduser(config.cache_dir) if config.cache_dir else cache_root()


def key(parts: Any) -> str:
  return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def slug(config) -> str:
  """A readable prefix for cache file names: the data set's name, file-name safe."""
  name = os.path.splitext(os.path.basename(config.dataset.rstrip("/\\")))[0]
  safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:40]
  return safe or "data"


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


def save_npz(path: str, compressed: bool = True, **arrays) -> None:
  """np.savez(_compressed)(path, **arrays) written whole or not at all (atomic_write): an
  interrupted write leaves an earlier file as it was. ".npz" is added as numpy adds it."""
  path = path if path.endswith(".npz") else path + ".npz"
  save = np.savez_compressed if compressed else np.savez
  atomic_write(path, lambda f: save(f, **arrays), "wb")


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


def content_digest(path: str, memo_dir: str | None = None, write: bool = True) -> str:
  """sha256 of a file's bytes: what cache keys hold for source data, rather than modification
  times, so a copied or re-synced data dir keeps its cache. Memoised as a small file in
  `memo_dir` (when given; written only if `write`) keyed by (path, size, modification time),
  so an unchanged file is read once, not at every start (and in this process, once at all:
  a run asks for the source's identity two or three times)."""
  stat = os.stat(path)
  stamp = key([os.path.realpath(path), stat.st_size, stat.st_mtime_ns])
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


class Cache:
  """Vocabularies and encoded arrays of one config's source (`identity`: the source's
  identity(), None for a source that must not be cached); `writable`: False on non-zero
  processes."""

  def __init__(self, config, identity: list | None, writable: bool):
    self.directory = cache_dir(config)
    self.config = config
    self.identity = identity
    self.writable = writable

  def source_key(self) -> dict:
    config = self.config
    return {"version": _CACHE_VERSION, "source": self.identity,
            "val_fraction": float(config.val_fraction), "data_seed": int(config.data_seed)}

  def _vocab_path(self) -> str:
    # (A vocabulary of the removed punctuation="split" option had "punctuation" in its key.)
    parts = {**self.source_key(), "vocab_size": int(self.config.vocab_size)}
    kind = ""
    if self.config.tokenizer == "ngram":
      parts["ngram"] = [int(self.config.ngrams.order), bool(self.config.ngrams.counts)]
      kind = f"ngram{self.config.ngrams.order}-"
    return os.path.join(self.directory, f"{slug(self.config)}-{kind}vocab"
                        f"{self.config.vocab_size}-{key(parts)}.json")

  def _arrays_path(self, tokenizer) -> str:
    config = self.config
    arrays_key = key({**self.source_key(), "tokenizer": tokenizer.fingerprint(),
                      "max_len": int(config.max_len), "truncation": config.layout.truncation})
    return os.path.join(self.directory, f"{slug(config)}-{tokenizer.kind}-"
                        f"{config.max_len}{config.layout.truncation}-{arrays_key}.npz")

  def load_vocab(self):
    if self.identity is None:
      return None
    def read(path):
      with open(path, encoding="utf-8") as f:
        return ngrams.tokenizer_from_json(f.read())
    return read_cache(self._vocab_path(), "vocabulary", read)

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
