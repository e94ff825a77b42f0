"""Metrics: evaluation sums -> reported figures, and the writers (metrics.jsonl, TensorBoard).

Steps return sums and counts, divided only when reported, so padded evaluation batches count
each real example exactly once. Only process 0 writes.

On a restart the metrics equal an uninterrupted run's: a resume drops rows and TensorBoard
steps past the restored step (tensorboardX's purge_step); a fresh start (no checkpoint yet)
drops every earlier row and event file, so a restart before the first checkpoint leaves no
duplicate step-0 rows. The final report row is replaced, atomically, only when a new report is
written, so a run that fails before its report keeps the last good one.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import jax
import numpy as np
from absl import logging

from textattn.errors import RunError


def sum_steps(metrics: list[dict]) -> dict:
  """Per-step metric sums of a logging window, fetched and added up on the host (one sync)."""
  return jax.tree.map(lambda *xs: np.sum(np.stack(xs), 0), *jax.device_get(metrics))


def sums_to_json(window: list[dict]) -> list[dict]:
  """A log window's per-step sums (host values) as JSON: each value's dtype and numbers, exact
  (float32 and float64 values are Python floats without rounding)."""
  return [{key: [str(np.asarray(value).dtype), np.asarray(value).tolist()]
           for key, value in sums.items()} for sums in window]


def sums_from_json(entries: list[dict]) -> list[dict]:
  """sums_to_json's inverse: the same values, bit for bit, in their dtypes."""
  return [{key: np.asarray(value, dtype) for key, (dtype, value) in sums.items()}
          for sums in entries]


def summarize_eval(sums: dict, class_names: list[str], prefix: str) -> dict:
  """loss, accuracy, weighted F1 and per-class precision/recall from summed eval metrics."""
  count = float(sums["count"])
  confusion = np.asarray(sums["confusion"], np.float64)  # rows: true class, columns: predicted
  support = confusion.sum(1)
  predicted = confusion.sum(0)
  true_positive = np.diag(confusion)
  precision = np.divide(true_positive, predicted, out=np.zeros_like(true_positive),
                        where=predicted > 0)
  recall = np.divide(true_positive, support, out=np.zeros_like(true_positive), where=support > 0)
  f1 = np.divide(2 * precision * recall, precision + recall, out=np.zeros_like(precision),
                 where=(precision + recall) > 0)
  out = {f"{prefix}/loss": float(sums["loss_sum"]) / count,
         f"{prefix}/accuracy": float(sums["correct"]) / count,
         f"{prefix}/f1_weighted": float(np.sum(f1 * support) / max(support.sum(), 1)),
         f"{prefix}/count": int(count)}
  for name, p, r in zip(class_names, precision, recall):
    out[f"{prefix}/precision_{name}"] = float(p)
    out[f"{prefix}/recall_{name}"] = float(r)
  return out


class MetricWriter:
  """metrics.jsonl (the durable record: one JSON line a row) and TensorBoard's event files, a
  view of it written anew from its kept rows at every start (drop_after): events a kill left
  unflushed, events past the step resumed from, an earlier report's, are in no file after."""

  def __init__(self, workdir: str, enabled: bool):
    self.enabled = enabled
    self.workdir = workdir
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._tensorboard = None

  def rewind(self, step: int) -> None:
    """A replay from `step` (the NaN guard's recovery): as a resume from it (drop_after)."""
    self.drop_after(step)

  @staticmethod
  def read_rows(path: str, warn: bool = True) -> tuple[list[tuple[str, dict]], int]:
    """((line, row) per JSON line of a metrics file, its number of non-empty lines). An
    unfinished last line (a kill while it was written) is left out; any other line that is
    not JSON is a RunError. Checked on every resume, before anything is changed."""
    if not os.path.exists(path):
      return [], 0
    with open(path) as f:
      rows = [line for line in f if line.strip()]
    parsed = []
    for number, line in enumerate(rows):
      try:
        parsed.append((line if line.endswith("\n") else line + "\n", json.loads(line)))
      except json.JSONDecodeError:
        if number != len(rows) - 1:
          raise RunError(f"{path} line {number + 1} is not JSON; fix or remove that line to "
                         f"resume this run.") from None
        if warn:
          logging.warning("Dropping the unfinished last line of %s.", path)
    return parsed, len(rows)

  def drop_after(self, step: int | None) -> None:
    """At a start: rows past the restored step will be produced again, so drop them (step None:
    a fresh start, every row); the final report row stays until write_report replaces it.
    TensorBoard's files are then written anew from the rows kept, the report's left out."""
    if not self.enabled:
      return
    parsed, lines = self.read_rows(self.path)
    keep = [(line, row) for line, row in parsed if "test/params_from_step" in row
            or (step is not None and row.get("step", 0) <= step)]
    if len(keep) != lines:
      self._replace([line for line, _ in keep])
    if self._tensorboard is not None:
      self._tensorboard.close()
      self._tensorboard = None
    for old in glob.glob(os.path.join(glob.escape(self.workdir), "events.out.tfevents.*")):
      os.remove(old)
    for _, row in keep:
      if "test/params_from_step" not in row:
        self._scalars(row.get("step", 0), row)

  def _replace(self, lines: list[str]) -> None:
    tmp = self.path + ".tmp"
    try:
      with open(tmp, "w") as f:
        f.writelines(lines)
      os.replace(tmp, self.path)
    except OSError as e:
      raise self._failed(e) from e

  def _failed(self, error: OSError) -> RunError:
    return RunError(f"Cannot write {self.path} ({type(error).__name__}: "
                    f"{error.strerror or error}); free disk space or fix its permissions, then "
                    f"run the same command to resume from the last checkpoint.")

  def write(self, step: int, metrics: dict) -> None:
    if not self.enabled:
      return
    try:
      with open(self.path, "a") as f:  # one line, one write: a kill leaves at most its tail
        f.write(json.dumps({"step": int(step), **metrics}) + "\n")
    except OSError as e:
      raise self._failed(e) from e
    self._scalars(step, metrics)

  def write_or_keep(self, step: int, metrics: dict, failed: list) -> None:
    """write(); with several processes a failure is appended to `failed` instead, for the loop
    to raise on every process together (platform.raise_together): one process may not call a
    collective alone. Nothing is written once a write failed."""
    if failed:
      return
    try:
      self.write(step, metrics)
    except RunError as error:
      if jax.process_count() == 1:
        raise
      failed.append(error)

  def write_report(self, step: int, metrics: dict) -> None:
    """The final report row: replaces any earlier one in one atomic rewrite of the file."""
    if not self.enabled:
      return
    parsed, _ = self.read_rows(self.path)
    self._replace([line for line, row in parsed if "test/params_from_step" not in row]
                  + [json.dumps({"step": int(step), **metrics}) + "\n"])
    self._scalars(step, metrics)

  def _scalars(self, step: int, metrics: dict) -> None:
    if self._tensorboard is None:  # (opened at the first event after a start)
      import tensorboardX  # TensorBoard event files without TensorBoard itself.
      self._tensorboard = tensorboardX.SummaryWriter(self.workdir, flush_secs=30)
    for key, value in metrics.items():
      if isinstance(value, (int, float)) and key != "step":
        self._tensorboard.add_scalar(key, value, int(step))

  def close(self) -> None:
    if self._tensorboard is not None:
      self._tensorboard.close()


def write_json_atomic(path: str, obj: Any) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)
