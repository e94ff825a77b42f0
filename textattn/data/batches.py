"""Batches of a `Split`: `TrainIterator` (a permutation per (seed, epoch), full batches only,
resumable from `get_state()`) and `eval_batches` (every example exactly once, the last batch
padded with weight-0 copies of the split's first example so model outputs stay finite). Both
yield this process's slice of every global batch."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from textattn.data.splits import DataError, Split


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
  [process_index * local, (process_index + 1) * local) of every global batch (on a device mesh,
  (process_index, process_count) is platform.row_block's: processes whose devices share a data
  group, a sequence axis across processes, pass the same index and read the same rows). The position
  is `get_state()` = {"epoch", "index"} of the next batch; `set_state` resumes there exactly.

  Length grouping (`lengths` [N] and `length_pool` > 0, as fairseq's and tensor2tensor's
  bucketing): each epoch's permutation is cut into pools of `length_pool` global batches, each
  pool is sorted by length and cut into batches, and the epoch's batches are shuffled; every
  batch then holds rows of similar length, so `trim(batch, width)` can cut the padding columns
  (width: the longest row of the global batch, the same on every process). Still a function of
  (seed, epoch): resume stays exact.
  """

  def __init__(self, split: Split, global_batch_size: int, seed: int, process_index: int = 0,
               process_count: int = 1, lengths: np.ndarray | None = None, length_pool: int = 0,
               trim: Callable[[dict, int], dict] | None = None,
               extras: dict[str, np.ndarray] | None = None):
    self.split = split
    # Per-row arrays besides inputs and labels (e.g. a teacher's "teacher_log_probs" [N, C]),
    # batched with the same rows.
    self.extras = dict(extras or {})
    for name, rows in self.extras.items():
      if len(rows) != len(split):
        raise ValueError(f"extras[{name!r}] has {len(rows)} rows for a split of {len(split)}.")
    if lengths is not None and len(lengths) != len(split):
      raise ValueError(f"lengths has {len(lengths)} entries for a split of {len(split)} rows.")
    self.lengths, self.length_pool, self.trim = lengths, int(length_pool), trim
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
      if self.lengths is not None and self.length_pool > 0:
        self._permutation = self._grouped(self._permutation, rng)
      self._permutation_epoch = epoch
    return self._permutation

  def _grouped(self, permutation: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    size = self.global_batch_size
    rows = permutation[:self.steps_per_epoch * size]
    pool = self.length_pool * size
    pools = [rows[i:i + pool] for i in range(0, len(rows), pool)]
    batches = np.concatenate([p[np.argsort(self.lengths[p], kind="stable")] for p in pools])
    batches = batches.reshape(self.steps_per_epoch, size)
    return batches[rng.permutation(self.steps_per_epoch)].reshape(-1)

  def __iter__(self) -> TrainIterator:
    return self

  def __next__(self) -> dict:
    order = self._order(self._epoch)
    begin = self._index * self.global_batch_size
    rows = order[begin + self._offset:begin + self._offset + self.local_batch_size]
    global_rows = order[begin:begin + self.global_batch_size]
    self._index += 1
    if self._index == self.steps_per_epoch:
      self._epoch, self._index = self._epoch + 1, 0
    batch = {"inputs": self.split.inputs[rows], "labels": self.split.labels[rows]}
    batch.update((name, values[rows]) for name, values in self.extras.items())
    if self.trim is not None:
      width = int(self.lengths[global_rows].max()) if self.lengths is not None else None
      batch = self.trim(batch, width)
    return batch


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
