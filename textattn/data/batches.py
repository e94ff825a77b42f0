"""Batches of a `Split`: `TrainIterator` (a permutation per (seed, epoch), full batches only,
resumable from `get_state()`) and `eval_batches` (every example exactly once, the last batch
padded with weight-0 copies of the split's first example so model outputs stay finite). Both
yield this process's slice of every global batch."""

from __future__ import annotations

from collections.abc import Iterator

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
