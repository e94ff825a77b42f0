"""Metrics: evaluation sums -> reported figures, and the writers (metrics.jsonl, TensorBoard).

Steps return sums and counts, divided only when reported, so padded evaluation batches count
each real example exactly once. Only process 0 writes.
"""

from __future__ import annotations

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

  def __init__(self, workdir: str, enabled: bool, start_step: int = 0):
    self.enabled = enabled
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._tensorboard = None
    if enabled:
      import tensorboardX  # TensorBoard event files without TensorBoard itself.
      # purge_step: TensorBoard hides events past the restored step (they are produced again).
      self._tensorboard = tensorboardX.SummaryWriter(workdir, flush_secs=30,
                                                     purge_step=start_step or None)

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

  def drop_after(self, step: int) -> None:
    """On resume: rows past the restored step will be produced again, so drop them."""
    if not self.enabled:
      return
    parsed, lines = self.read_rows(self.path)
    # The final test report is always produced again at the end of the run, so it goes too.
    keep = [line for line, row in parsed
            if row.get("step", 0) <= step and "test/params_from_step" not in row]
    if len(keep) != lines:
      tmp = self.path + ".tmp"
      with open(tmp, "w") as f:
        f.writelines(keep)
      os.replace(tmp, self.path)

  def write(self, step: int, metrics: dict) -> None:
    if not self.enabled:
      return
    with open(self.path, "a") as f:
      f.write(json.dumps({"step": int(step), **metrics}) + "\n")
    for key, value in metrics.items():
      if isinstance(value, (int, float)):
        self._tensorboard.add_scalar(key, value, int(step))

  def close(self) -> None:
    if self._tensorboard is not None:
      self._tensorboard.close()


def write_json_atomic(path: str, obj: Any) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)
