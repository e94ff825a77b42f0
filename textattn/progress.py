"""Progress lines for long passes, so no stretch of a run is silent."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import jax

EVAL_PROGRESS_EVERY_S = 30.0  # a long evaluation prints a progress line this often


class Countdown:
  """Progress of a long pass over a split (an evaluation: IMDB's 25,000 test reviews take ~20
  minutes through a pretrained encoder on a 2-core CPU): on process 0, at most one line every
  `every_s` seconds, `  test: 5,120/25,000 examples, 1m40s, ETA 6m12s`, so no stretch of it is
  silent; nothing for a pass shorter than that."""

  def __init__(self, name: str, total: int, enabled: bool, every_s: float | None = None,
               clock: Callable[[], float] = time.monotonic, file: Any = None):
    self.name, self.total, self.enabled, self.clock = name, total, enabled, clock
    self.file = file  # None: stdout (a command whose stdout is its output passes sys.stderr)
    self.every_s = EVAL_PROGRESS_EVERY_S if every_s is None else every_s
    self.start = self.last = clock()

  def update(self, done: int, pending: Any = None) -> None:
    """`done` examples dispatched; `pending`: arrays to wait for before a line is printed (JAX
    dispatches ahead, so the count is what has been computed when the line appears)."""
    if not self.enabled or self.clock() - self.last < self.every_s:
      return
    if pending is not None:
      jax.block_until_ready(pending)
    now = self.clock()
    self.last, elapsed = now, now - self.start
    left = elapsed / max(done, 1) * (self.total - done)
    print(f"  {self.name}: {min(done, self.total):,}/{self.total:,} examples, "
          f"{duration(elapsed)}, ETA {duration(left)}", file=self.file or sys.stdout, flush=True)


def duration(seconds: float) -> str:
  seconds = round(seconds)
  if seconds < 60:
    return f"{seconds}s"
  minutes, seconds = divmod(seconds, 60)
  if minutes < 60:
    return f"{minutes}m{seconds:02d}s"
  hours, minutes = divmod(minutes, 60)
  return f"{hours}h{minutes:02d}m"
