"""The language model's data: documents -> tokens -> packed rows.

Documents (`read_documents`):
- TFDS (config.dataset, e.g. "imdb_reviews"): training on split config.train_split (IMDB's
  50,000 "unsupervised" reviews); validation and test drawn, disjoint, from split
  config.heldout_split (IMDB's "test" reviews) by a permutation from config.data_seed: the first
  test_documents for test, the next val_documents for validation; training never reads that
  split. The text is feature config.text_field.
- A local .txt (one document a line) or .jsonl (the text in field config.text_field): test and
  validation drawn from its documents in the same way, training on the rest.
Blank documents are skipped. The raw documents are cached in config.cache_dir (keyed by the
source's content and the draw), so a second run reads neither TFDS nor the file.

Packing (`pack`): each document becomes [start] tokens [end]; the documents of a split are laid
end to end and cut into rows of max_len + 1 tokens that overlap by one (row r holds stream
positions r * max_len .. r * max_len + max_len), the last row padded with 0. A row's inputs are
its first max_len tokens and its targets the last max_len (`row_fields`): every within-document
(token, next token) pair is trained on exactly once, and a document that runs over a row's end
goes on in the next row with a fresh context. Per position, `row_fields` gives the segment id
(1, 2, ... per document piece in the row, 0 for padding), the position within the piece
(restarting at 0 at each) and the loss weight (0 on padding and on an [end] input, whose target
is the next document's [start]).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from textattn.data import cache as cache_lib
from textattn.data import raw as raw_lib
from textattn.data import tfds_source
from textattn.data.dataset import refuse_other_training_data
from textattn.data.splits import DataError, Dataset, Split
from textattn.tasks.language_model import tokenizers

SPLITS = ("train", "validation", "test")
LOCAL_EXTENSIONS = (".txt", ".jsonl")


def is_local(dataset: str) -> bool:
  return os.path.splitext(dataset)[1].lower() in LOCAL_EXTENSIONS or os.path.isfile(dataset)


@dataclasses.dataclass
class LmData:
  """The packed splits (`dataset`, its Split.inputs int32 [rows, max_len + 1]), the raw
  documents of each split, their UTF-8 byte counts, and the tokenizer."""
  dataset: Dataset
  documents: dict[str, list[str]]
  byte_counts: dict[str, int]
  tokenizer: object


def pack(documents: list[np.ndarray], max_len: int) -> np.ndarray:
  """int32 [rows, max_len + 1]: [start] ids [end] of each document, end to end, in rows that
  overlap by one token (see the module's docstring); no document: no rows."""
  if not documents:
    return np.zeros((0, max_len + 1), np.int32)
  lengths = np.asarray([len(d) + 2 for d in documents])
  stream = np.empty(int(lengths.sum()), np.int32)
  ends = np.cumsum(lengths)
  starts = ends - lengths
  stream[starts] = tokenizers.START_ID
  stream[ends - 1] = tokenizers.END_ID
  for begin, ids in zip(starts, documents):
    stream[begin + 1:begin + 1 + len(ids)] = ids
  rows = -(-(len(stream) - 1) // max_len)
  padded = np.zeros(rows * max_len + 1, np.int32)
  padded[:len(stream)] = stream
  return padded[np.arange(rows)[:, None] * max_len + np.arange(max_len + 1)[None, :]]


def row_fields(rows: jax.Array) -> dict:
  """Of packed rows [batch, max_len + 1]: inputs, targets, loss weights (float32), segment ids
  and positions (int32), each [batch, max_len]."""
  inputs, targets = rows[:, :-1], rows[:, 1:]
  index = jnp.arange(inputs.shape[1])[None, :]
  starts = (inputs == tokenizers.START_ID) | (index == 0)
  real = inputs != tokenizers.PAD_ID
  segment_ids = jnp.cumsum(starts.astype(jnp.int32), axis=1) * real
  positions = index - jax.lax.cummax(jnp.where(starts, index, 0), axis=1)
  weights = real & (inputs != tokenizers.END_ID) & (targets != tokenizers.PAD_ID)
  return {"inputs": inputs, "targets": targets, "weights": weights.astype(jnp.float32),
          "segment_ids": segment_ids.astype(jnp.int32),
          "positions": jnp.where(real, positions, 0).astype(jnp.int32)}


def _draw(count: int, config, what: str, rest: bool = False):
  """(test, validation, rest) indices of `count` documents, drawn by config.data_seed; `rest`:
  the rest is trained on, so it must not be empty."""
  need = config.test_documents + config.val_documents
  if count < need + rest:
    tail = " and train on the rest" if rest else ""
    raise DataError(f"{config.dataset}: {what} has {count} document(s), too few to draw "
                    f"test_documents={config.test_documents} and val_documents="
                    f"{config.val_documents} from{tail}.")
  order = np.random.default_rng(config.data_seed).permutation(count)
  return (np.sort(order[:config.test_documents]),
          np.sort(order[config.test_documents:need]), np.sort(order[need:]))


def _nonblank(texts: list[str]) -> list[str]:
  return [t for t in texts if t.strip()]


def _read_local(config) -> dict[str, list[str]]:
  path = config.dataset
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except UnicodeDecodeError as e:
    raise DataError(f"{path}: invalid UTF-8 ({e.reason} at byte {e.start}).") from None
  except OSError as e:
    raise DataError(f"{path}: cannot be read ({e.strerror}).") from None
  if path.lower().endswith(".jsonl"):
    texts = []
    for number, record in raw_lib.json_records(path, text):
      if config.text_field not in record or not isinstance(record[config.text_field], str):
        raise DataError(f"{path}, line {number}: no text field {config.text_field!r} "
                        f"(set --config.text_field).")
      texts.append(record[config.text_field])
  else:
    texts = text.split("\n")
  texts = _nonblank(texts)
  test, validation, train = _draw(len(texts), config, "the file", rest=True)
  return {"train": [texts[i] for i in train], "validation": [texts[i] for i in validation],
          "test": [texts[i] for i in test]}


def _read_tfds_split(tfds, builder, split: str, field: str, name: str) -> list[str]:
  try:
    dataset = builder.as_dataset(split=split, batch_size=4096, shuffle_files=False)
  except Exception as e:  # noqa: BLE001 -- TFDS versions differ on an unknown split
    raise DataError(f"TFDS dataset {name!r} has no split {split!r} (it has "
                    f"{sorted(builder.info.splits)}; {type(e).__name__}).") from None
  texts = []
  for batch in tfds.as_numpy(dataset):
    texts.extend(raw_lib.decode(v, f"TFDS {name!r}, split {split!r}") for v in batch[field])
  return _nonblank(texts)


def _read_tfds(config) -> tuple[dict[str, list[str]], bool]:
  tfds_source.quiet_tensorflow()
  import tensorflow_datasets as tfds  # (slow import; only on a cache miss)
  tfds_source._keep_tensorflow_off_accelerators()  # (TensorFlow off the GPU JAX trains on)
  data_dir = tfds_source.tfds_data_dir(config)
  try:
    builder = tfds.builder(config.dataset, data_dir=data_dir)
  except Exception as e:  # noqa: BLE001 -- any TFDS failure here is one sentence
    raise DataError(f"config.dataset={config.dataset!r} is neither a .txt/.jsonl file nor a "
                    f"known TFDS dataset ({type(e).__name__}).") from None
  if config.text_field not in builder.info.features:
    raise DataError(f"TFDS dataset {config.dataset!r} has no feature {config.text_field!r}; it "
                    f"has {sorted(builder.info.features.keys())} (set --config.text_field).")
  def read():
    return [_read_tfds_split(tfds, builder, split, config.text_field, config.dataset)
            for split in (config.train_split, config.heldout_split)]
  try:  # (prepared data, or a mocked TFDS, needs no download_and_prepare)
    train, heldout = read()
  except DataError:
    if builder.is_prepared():
      raise
    if not tfds_source.network_available():  # (offline, TFDS's downloader retries for minutes)
      raise DataError(f"TFDS dataset {config.dataset!r} is not prepared in "
                      f"{data_dir or '~/tensorflow_datasets'} and there is no network to download "
                      f"it; point to a prepared copy with TFDS_DATA_DIR=DIR.") from None
    builder.download_and_prepare()  # (TFDS's own errors say what went wrong)
    train, heldout = read()
  test, validation, _ = _draw(len(heldout), config, f"split {config.heldout_split!r}")
  if not train:
    raise DataError(f"TFDS {config.dataset!r}: split {config.train_split!r} has no document.")
  root = tfds_source.data_root(data_dir)
  cacheable = os.path.realpath(builder.data_dir).startswith(root + os.sep)
  return {"train": train, "validation": [heldout[i] for i in validation],
          "test": [heldout[i] for i in test]}, cacheable


def _identity(config, write: bool) -> list | None:
  """What the raw documents depend on (None: not cacheable before reading)."""
  if is_local(config.dataset):
    if not os.path.isfile(config.dataset):
      return None
    source = ["file", cache_lib.content_digest(config.dataset, cache_lib.cache_dir(config), write)]
  else:
    root = tfds_source.data_root(tfds_source.tfds_data_dir(config))
    base = os.path.join(root, config.dataset.split("/")[0].split(":")[0])
    files = []
    for dirpath, _, filenames in os.walk(base):
      for filename in filenames:
        path = os.path.join(dirpath, filename)
        files.append([os.path.relpath(path, base),
                      cache_lib.content_digest(path, cache_lib.cache_dir(config), write)])
    if not files:
      return None
    source = ["tfds", config.dataset, sorted(files), config.train_split, config.heldout_split]
  return ["lm-documents-v1", source, config.text_field, int(config.data_seed),
          int(config.val_documents), int(config.test_documents)]


def _cache_path(config, identity) -> str:
  return os.path.join(cache_lib.cache_dir(config),
                      f"{cache_lib.slug(config)}-lm-documents-{cache_lib.key(identity)}.npz")


def _save(path: str, documents: dict[str, list[str]]) -> None:
  arrays = {}
  for split, texts in documents.items():
    encoded = [t.encode("utf-8") for t in texts]
    arrays[f"{split}_bytes"] = np.frombuffer(b"".join(encoded), np.uint8)
    arrays[f"{split}_ends"] = np.cumsum([len(e) for e in encoded], dtype=np.int64)
  try:
    cache_lib.atomic_write(path, lambda f: np.savez(f, **arrays), "wb")
  except OSError:  # a read-only or full cache dir only costs a re-read
    pass


def _load(path: str) -> dict[str, list[str]]:
  with np.load(path, allow_pickle=False) as archive:
    documents = {}
    for split in SPLITS:
      data, ends = archive[f"{split}_bytes"].tobytes(), archive[f"{split}_ends"]
      starts = np.concatenate([[0], ends[:-1]]) if len(ends) else ends
      documents[split] = [data[s:e].decode("utf-8") for s, e in zip(starts, ends)]
  return documents


def read_documents(config, write: bool = True) -> dict[str, list[str]]:
  """split -> the raw documents (see the module's docstring), from the cache when it has them."""
  identity = _identity(config, write)
  path = _cache_path(config, identity) if identity is not None else None
  if path is not None:
    cached = cache_lib.read_cache(path, "documents", _load)
    if cached is not None:
      return cached
  if is_local(config.dataset):
    documents, cacheable = _read_local(config), True
  else:
    if write:
      print(f"Reading TFDS dataset {config.dataset!r} (cached for later runs) ...", flush=True)
    documents, cacheable = _read_tfds(config)
  if path is not None and cacheable and write:
    _save(path, documents)
  return documents


def load_tokenizer(workdir: str | None):
  """The tokenizer a run saved in `workdir` (None: none yet)."""
  path = os.path.join(workdir, tokenizers.FILE) if workdir else None
  if path is None or not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return tokenizers.from_json(f.read())


# What a trained (word, BPE) tokenizer was counted on: the training documents (sha256) and size.
COUNTED_ON = "lm_tokenizer_counted_on.json"


def counted_on(config, train_documents: list[str]) -> dict | None:
  if config.tokenizer == "bytes":  # (its ids are the bytes': counted on nothing)
    return None
  digest = hashlib.sha256()
  for document in train_documents:
    digest.update(f"{len(document)}:{document}".encode("utf-8", "surrogatepass"))
  return {"train_documents": digest.hexdigest(), "tokenizer": config.tokenizer,
          "vocab_size": int(config.vocab_size)}


def load_data(config, workdir: str | None, write: bool = True) -> LmData:
  """The config's packed splits; the tokenizer is the workdir's (trained on the training split
  and saved there on a first run, with what it was counted on: a fresh start on other training
  documents or another vocab_size is refused, data.refuse_other_training_data)."""
  documents = read_documents(config, write)
  tokenizer, now = load_tokenizer(workdir), counted_on(config, documents["train"])
  if tokenizer is not None and tokenizer.kind != config.tokenizer:
    raise DataError(f"{workdir} holds a {tokenizer.kind} tokenizer, the config asks for "
                    f"config.tokenizer={config.tokenizer!r}; use another --workdir.")
  record = os.path.join(workdir, COUNTED_ON) if workdir else None
  if tokenizer is not None and record and os.path.exists(record):
    with open(record, encoding="utf-8") as f:
      refuse_other_training_data(workdir, json.load(f), now, "tokenizer",
                                 "dataset, data_seed, document split or vocab_size")
  if tokenizer is None:
    tokenizer = tokenizers.train(config.tokenizer, documents["train"], config.vocab_size)
    if workdir and write:
      cache_lib.atomic_write(os.path.join(workdir, tokenizers.FILE),
                             lambda f: f.write(tokenizer.to_json()))
      if now is not None:
        cache_lib.atomic_write(record, lambda f: json.dump(now, f))
  splits = {}
  for split in SPLITS:
    rows = pack(tokenizer.encode(documents[split]), config.max_len)
    splits[split] = Split(rows, np.zeros(len(rows), np.int32))
  dataset = Dataset(train=splits["train"], validation=splits["validation"], test=splits["test"],
                    class_names=[], vocab_size=tokenizer.vocab_size, tokenizer=tokenizer)
  byte_counts = {s: int(sum(len(t.encode("utf-8")) for t in documents[s])) for s in SPLITS}
  return LmData(dataset, documents, byte_counts, tokenizer)


def describe(config, data: LmData) -> str:
  counts = ", ".join(f"{s} {len(data.documents[s]):,} documents ({data.byte_counts[s]:,} bytes, "
                     f"{len(getattr(data.dataset, s)):,} rows)" for s in SPLITS)
  return f"Data: {config.dataset}: {counts}; {config.tokenizer} tokenizer, " \
         f"{data.tokenizer.vocab_size:,} ids."
