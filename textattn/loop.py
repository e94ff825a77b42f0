"""THE training loop: batches -> compiled step -> logging, NaN guard, evaluation, checkpoints.

`fit(state, train_step, batches, schedule, hooks)` serves every task (run.py), MLM pretraining
and sweeps; what differs comes in as arguments: the pure step, the batches, the Schedule
(intervals, examples per step, compiler options) and the optional Hooks (evaluation,
checkpoints, metric writer, signal stop, NaN recovery).

Order within a step, which exact resume relies on: the step runs; at a log, evaluation or
checkpoint boundary its window's sums are fetched (one host sync) and checked for NaN/Inf before
anything is saved; then evaluation, then the checkpoint; then the next batch is drawn (so a
checkpoint's iterator position is the batch of the step after it).

Stopping on SIGINT/SIGTERM (`stop_on_signals`, installed by the caller around `fit`): the signal
only sets a flag; the current step finishes (the host is at most MAX_IN_FLIGHT steps ahead of
the device, so the stop waits for those only), the window is checked for NaN, a checkpoint is
saved at that step like any other (so the resume is exact), and `fit` raises errors.Stopped
(exit code 128 + the signal). A second signal exits at once (os._exit): whatever was being
written then is an unfinished Orbax temporary directory, which a resume ignores and removes.
The unfinished log window's per-step sums go into that checkpoint (Hooks.window) and start the
resumed window: its row is the uninterrupted run's. Several processes agree on the stop (an
allgather at each boundary and every STOP_CHECK_EVERY steps); one process syncs no more.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from absl import logging

from textattn import platform
from textattn.errors import NonFiniteLossError, Stopped, Terminated
from textattn.metrics import MetricWriter, sum_steps
from textattn.progress import EVAL_PROGRESS_EVERY_S, Countdown, duration  # noqa: F401 -- API


@dataclasses.dataclass
class Schedule:
  """When things happen, in steps (0 = never); the last step always logs, evaluates and saves.
  And how the steps are run and reported: examples per step and steps per epoch (for the
  logged examples/s and epoch), the metric prefix, and the step's XLA compiler options."""
  total_steps: int
  log_every: int = 100
  eval_every: int = 0
  checkpoint_every: int = 0
  batch_size: int = 1
  steps_per_epoch: int | None = None
  prefix: str = "train"
  compiler_options: dict | None = None
  # The device mesh the steps run on (platform.run_mesh; None: data parallelism over all
  # devices): batches laid out by platform.batch_sharding, the state replicated.
  mesh: Any = None


@dataclasses.dataclass
class Recovery:
  """NaN/Inf recovery: recover(bad_step) -> (state, step) restores the newest checkpoint before
  the step whose loss or parameters went NaN/Inf; the replay then gives that step the next
  batch (at most MAX_SKIPPED_BATCHES; a step failing again stops the run). `skipped`: those
  steps, updated in place (the caller checkpoints them). advice() -> what to tell the user when
  the run stops on a NaN."""
  recover: Callable[[int], tuple[Any, int]] | None = None
  skipped: list[int] = dataclasses.field(default_factory=list)
  advice: Callable[[], str] = lambda: ""


@dataclasses.dataclass
class Hooks:
  """The loop's periodic actions, each optional.

  evaluate(state, step, is_last) -> metrics to log (None: nothing), every schedule.eval_every
    steps and at the end.
  save(step, state, eval_metrics) every schedule.checkpoint_every steps, at the end, and on a
    signal stop.
  writer: where logged rows go (metrics.jsonl, TensorBoard); rows are also returned.
  stop: from stop_on_signals(); once set, fit saves at the current step and raises Stopped.
  window: the unfinished log window's per-step sums: a stop fills it before its save (the caller
    checkpoints it); filled from that checkpoint, the resumed (or replayed) window starts there.
  recovery: what to do when the loss goes NaN/Inf (default: stop with advice).
  progress: print a line per log window and evaluation (process 0).
  profile_dir: a jax.profiler trace of the first PROFILED_STEPS steps after compilation is
    written there, each step annotated STEP_ANNOTATION (XProf's and TensorBoard's step view).
  """
  evaluate: Callable[[Any, int, bool], dict | None] | None = None
  save: Callable[[int, Any, dict | None], None] | None = None
  writer: MetricWriter | None = None
  stop: StopRequest | None = None
  recovery: Recovery = dataclasses.field(default_factory=Recovery)
  window: list[dict] = dataclasses.field(default_factory=list)
  progress: bool = True
  profile_dir: str = ""


PROFILED_STEPS = 3
STEP_ANNOTATION = "textattn_step"


# Steps the host may dispatch ahead of the device (JAX dispatches asynchronously): unbounded,
# it queued every step up to the next log line (100 of 5 s on a CPU fine-tune), and a stop then
# saved only once all had run. Two keep an accelerator fed (n + 1 prepared while n - 1, n run).
MAX_IN_FLIGHT = 2
STOP_CHECK_EVERY = 10  # steps between the processes' stop agreements (several processes only)
_SIGNALS = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


@dataclasses.dataclass
class StopRequest:
  """Set by the first SIGINT/SIGTERM: `signum` (0: none)."""
  signum: int = 0


@contextlib.contextmanager
def stop_on_signals(on_force_exit: Callable[[], None] | None = None):
  """Within the block, SIGINT and SIGTERM ask `fit` to stop after the current step (yields the
  StopRequest to pass it); a second one exits at once with 128 + its number, after
  `on_force_exit` (e.g. releasing the workdir lock). The previous handlers come back after."""
  request = StopRequest()
  if threading.current_thread() is not threading.main_thread():
    yield request  # (signal handlers can only be set from the main thread)
    return

  def handler(signum, frame):
    if request.signum:
      # os.write, not print: a handler may run in the middle of another write to stderr.
      os.write(2, f"\nSecond {_SIGNALS.get(signum, signum)}: exiting now; the last checkpoint "
                  f"saved is intact (an unfinished one is ignored on resume).\n".encode())
      if on_force_exit is not None:
        with contextlib.suppress(Exception):  # exiting regardless
          on_force_exit()
      os._exit(128 + signum)
    request.signum = signum
    os.write(2, f"\n{_SIGNALS.get(signum, signum)}: finishing this step and saving a checkpoint "
                f"(send it again to exit at once).\n".encode())

  previous = {s: signal.signal(s, handler) for s in _SIGNALS}
  try:
    yield request
  finally:
    for s, old in previous.items():
      signal.signal(s, old)


def sigterm_as_interrupt() -> None:
  """From now on SIGTERM raises errors.Terminated (a KeyboardInterrupt) in the main thread, so a
  command ends on it as on Ctrl-C: one sentence, its exit code (143), the workdir lock released.
  (Python's default ends the process at once, silently, leaving the lock behind.) Inside `fit`,
  stop_on_signals' handler takes over and saves first."""
  def handler(signum, frame):
    raise Terminated()
  signal.signal(signal.SIGTERM, handler)


def _agreed_stop(stop: StopRequest | None, done: int, boundary: bool) -> int:
  """The signal to stop on (0: go on), the same on every process."""
  if stop is None:
    return 0
  if jax.process_count() == 1:
    return stop.signum
  if not (boundary or done % STOP_CHECK_EVERY == 0):
    return 0
  from jax.experimental import multihost_utils
  flags = multihost_utils.process_allgather(np.asarray(stop.signum, np.int32))
  return int(np.max(np.asarray(flags)))


@dataclasses.dataclass
class FitResult:
  state: Any
  history: list[dict]  # every logged row, {"step": ..., "<prefix>/loss": ..., ...} in order


def fit(state, train_step: Callable, batches: Iterator[dict], schedule: Schedule,
        hooks: Hooks | None = None, *, start_step: int = 0) -> FitResult:
  """Trains `state` from `start_step` to `schedule.total_steps`: the final state and the logged
  rows. train_step(state, batch) -> (state, sums): pure; sums hold "loss_sum", "correct",
  "count", "nonfinite" and optionally "grad_norm_sum" with "steps"; compiled here over
  schedule.mesh (batch split along its data and sequence axes, state replicated and donated).
  batches: this process's rows of each global batch (numpy). hooks: the periodic actions
  (evaluation, checkpoints, metric log, signal stop, NaN recovery, progress lines)."""
  hooks = hooks or Hooks()
  evaluate, save, writer, stop = hooks.evaluate, hooks.save, hooks.writer, hooks.stop
  recover, skipped, prefix = hooks.recovery.recover, hooks.recovery.skipped, schedule.prefix
  is_main, total, history = jax.process_index() == 0, schedule.total_steps, []
  mesh = schedule.mesh if schedule.mesh is not None else platform.run_mesh()
  failed = []  # process 0's failed metric-log write (MetricWriter.write_or_keep)

  def log(step, row):
    history.append({"step": step, **row})
    if writer is not None:
      writer.write_or_keep(step, row, failed)
  if start_step >= total:
    return FitResult(state, history)
  step_for, batch, compile_s = _compile(train_step, state, batches, schedule, mesh,
                                        is_main and hooks.progress)
  if start_step == 0:  # (a resumed run would add a row the original run lacks)
    log(0, {f"{prefix}/compile_s": compile_s})

  progress = _Progress(total, start_step, is_main and hooks.progress, prefix)
  pending, window_start, untimed = _carried(hooks.window)
  in_flight, step = collections.deque(), start_step
  profiler = _Profiler(hooks.profile_dir, start_step, total)
  while step < total:
    profiler.before(step)
    if step + 1 in skipped:  # this step's batch made the loss NaN before: take the next one
      batch = platform.to_global(next(batches), mesh)
      log(step + 1, {f"{prefix}/skipped_batch_of_step": step + 1})  # (in step order, on replay)
    with profiler.annotate(step + 1):
      state, sums = step_for(state, batch)(state, batch)
    profiler.after(step + 1, sums)
    pending.append(sums)
    in_flight.append(sums)
    if len(in_flight) > MAX_IN_FLIGHT:
      jax.block_until_ready(in_flight.popleft())
    done = step = step + 1
    is_last, log_now, eval_now, save_now = _due(schedule, done, evaluate is not None,
                                                save is not None)
    boundary = bool(log_now or eval_now or save_now)
    if boundary:
      totals = sum_steps(pending)  # one host sync per window
      if totals["nonfinite"] and recover is not None:
        bad = _first_nonfinite_step(pending, done)
        if bad not in skipped and len(skipped) < MAX_SKIPPED_BATCHES:
          state, step = recover(bad)
          skipped.append(bad)
          history[:] = [row for row in history if row["step"] <= step]
          progress.skipped(bad, step, len(skipped))
          pending, window_start, untimed = _carried(hooks.window)
          batch = platform.to_global(next(batches), mesh)
          continue
      _check_finite(totals, done, len(pending), prefix, lambda: _skips_text(skipped)
                    + hooks.recovery.advice(), progress)
      row = _train_row(totals, prefix, (len(pending) - untimed) * schedule.batch_size,
                       time.perf_counter() - window_start, done, schedule.steps_per_epoch)
      log(done, row)
      progress.window(done, row)
      eval_metrics = evaluate(state, done, is_last) if eval_now else None
      if eval_metrics:
        log(done, eval_metrics)
        progress.evaluation(done, eval_metrics)
      platform.raise_together(failed[0] if failed else None)  # (before a save: no rows lost)
      if save_now:
        save(done, state, eval_metrics)
      pending, window_start, untimed = [], time.perf_counter(), 0
    signum = _agreed_stop(stop, done, boundary)
    if signum:
      platform.raise_together(failed[0] if failed else None)  # (a failed write: not a stop)
      _stop_now(signum, done, state, pending, hooks, save_now, prefix, progress)
    if not is_last:
      batch = platform.to_global(next(batches), mesh)
  progress.close()
  return FitResult(state, history)


MAX_SKIPPED_BATCHES = 3


def _compile(train_step, state, batches, schedule: Schedule, mesh, talk: bool):
  """The step compiled on the first batch: (executables by batch width, that global batch,
  seconds taken); `talk`: say so before and after (seconds to minutes of nothing else)."""
  replicated = platform.replicated(mesh)
  state_sharding = jax.tree.map(lambda _: replicated, state)

  def jitted(batch):
    return jax.jit(train_step, in_shardings=(state_sharding, platform.batch_shardings(mesh, batch)),
                   out_shardings=(state_sharding, replicated), donate_argnums=0,
                   compiler_options=schedule.compiler_options)
  prefix = schedule.prefix
  if talk:
    print(f"Compiling the {'training' if prefix == 'train' else prefix} step ...", flush=True)
  t0 = time.perf_counter()
  batch = platform.to_global(next(batches), mesh)
  step_for = _Executables(jitted)
  step_for(state, batch)
  compile_s = time.perf_counter() - t0
  logging.info("Compiled the %s step in %.1fs.", prefix, compile_s)
  if talk:
    print(f"Compiled in {compile_s:.1f} s.", flush=True)
  return step_for, batch, compile_s


def _due(schedule: Schedule, done: int, evaluates: bool, saves: bool):
  """(is_last, log_now, eval_now, save_now) after step `done`."""
  is_last = done == schedule.total_steps
  log_now = bool(schedule.log_every and done % schedule.log_every == 0) or is_last
  eval_now = evaluates and (bool(schedule.eval_every and done % schedule.eval_every == 0)
                            or is_last)
  save_now = saves and (bool(schedule.checkpoint_every and done % schedule.checkpoint_every == 0)
                        or is_last)
  return is_last, log_now, eval_now, save_now


class _Profiler:
  """A jax.profiler trace of the first PROFILED_STEPS steps of this call (none without a
  directory); each step is a StepTraceAnnotation and the trace ends once the last one's results
  are ready, so it holds whole steps."""

  def __init__(self, directory: str, start_step: int, total: int):
    self.directory = directory
    self.last = min(start_step + PROFILED_STEPS, total) if directory else -1
    self.tracing = False

  def before(self, step: int) -> None:
    if self.directory and not self.tracing and step < self.last:
      jax.profiler.start_trace(self.directory)
      self.tracing = True

  def annotate(self, step: int):
    if not self.tracing:
      return contextlib.nullcontext()
    return jax.profiler.StepTraceAnnotation(STEP_ANNOTATION, step_num=step)

  def after(self, step: int, sums) -> None:
    if self.tracing and step >= self.last:
      jax.block_until_ready(sums)
      jax.profiler.stop_trace()
      self.tracing, self.directory = False, ""


class _Executables:
  """One compiled step per batch shape: a task whose batches are cut to a few widths
  (translation's length buckets) compiles each width once, on first use. jitted(batch) -> the
  step jitted for that batch's shardings."""

  def __init__(self, jitted):
    self.jitted, self.compiled = jitted, {}

  def __call__(self, state, batch: dict):
    shapes = tuple((key, batch[key].shape) for key in sorted(batch))
    if shapes not in self.compiled:
      self.compiled[shapes] = self.jitted(batch).lower(state, batch).compile()
    return self.compiled[shapes]


class _Progress:
  """What the loop prints on process 0: one line per log window (step, loss, accuracy,
  examples/s and an ETA from the steps timed since the loop started, or since the first
  evaluation, so neither step's compilation is counted), and the evaluation and skip lines."""

  def __init__(self, total: int, start_step: int, enabled: bool, prefix: str):
    self.total, self.enabled, self.prefix = total, enabled, prefix
    self.evaluated = False
    self.restart(start_step)

  def restart(self, step: int) -> None:
    self.first, self.start = step, time.perf_counter()

  def window(self, done: int, row: dict) -> None:
    seconds_per_step = (time.perf_counter() - self.start) / max(done - self.first, 1)
    p = self.prefix
    self.write(f"{'' if p == 'train' else p + ' '}step {done}/{self.total}: loss "
               f"{row[f'{p}/loss']:.4f}, accuracy {row[f'{p}/accuracy']:.4f}, "
               f"{row[f'{p}/examples_per_sec']:,.0f} examples/s, ETA "
               f"{duration(seconds_per_step * (self.total - done))}")

  def evaluation(self, done: int, metrics: dict) -> None:
    name = next(k for k in metrics if k.endswith("/accuracy")).split("/")[0]
    self.write(f"step {done}: {name} accuracy {metrics[f'{name}/accuracy']:.4f}, "
               f"loss {metrics[f'{name}/loss']:.4f}")
    if not self.evaluated:  # the first evaluation compiled the eval step: time from here
      self.evaluated = True
      self.restart(done)

  def skipped(self, bad: int, step: int, count: int) -> None:
    self.write(f"step {bad}: the loss or parameters became NaN/Inf; resumed from step {step} "
               f"and skipping that step's batch ({count} of at most {MAX_SKIPPED_BATCHES} "
               f"skips).")
    self.restart(step)

  def write(self, text: str) -> None:
    if self.enabled:
      print(text, flush=True)

  def close(self) -> None:
    pass


def _stop_now(signum: int, done: int, state, pending: list, hooks: Hooks, just_saved: bool,
              prefix: str, progress) -> None:
  """A signal stop: save at this step (unless a checkpoint was just saved, or the window went
  NaN: never saved; with recovery the rerun replays from the last checkpoint and skips the bad
  batch, as the uninterrupted run would) and raise Stopped with the one line."""
  checkpoints = hooks.save is not None
  save = hooks.save if not just_saved else None
  nonfinite_advice, recoverable = hooks.recovery.advice, hooks.recovery.recover is not None
  saved = "checkpoint saved" if checkpoints else "nothing saved (no checkpoints)"
  if save is not None:
    if pending and sum_steps(pending)["nonfinite"] and recoverable:
      progress.close()
      raise Stopped(f"stopped at step {done}, not saved (its last steps went NaN/Inf; the "
                    f"earlier checkpoints are intact); run the same command to resume",
                    128 + signum)
    if pending:  # never save parameters that went NaN
      _check_finite(sum_steps(pending), done, len(pending), prefix, nonfinite_advice, progress)
    hooks.window[:] = jax.device_get(pending)  # (the resumed run's window starts with these)
    save(done, state, None)
  progress.close()
  raise Stopped(f"stopped at step {done}, {saved}; run the same command to resume",
                128 + signum)


def _carried(window: list) -> tuple[list, float, int]:
  """(the log window a stop checkpoint carried, taken out of `window`; now; its step count, run
  before this process timed anything: the window's examples/s counts the others only)."""
  carried, window[:] = list(window), []
  return carried, time.perf_counter(), len(carried)


def _first_nonfinite_step(pending: list[dict], done: int) -> int:
  """The first step of the window whose loss or parameters were NaN/Inf (1-based)."""
  flags = [int(np.asarray(jax.device_get(sums["nonfinite"]))) for sums in pending]
  return done - len(pending) + 1 + next(i for i, flag in enumerate(flags) if flag)


def _skips_text(skipped: list[int]) -> str:
  if not skipped:
    return ""
  return (f"Skipping the batches of steps {', '.join(map(str, skipped))} did not help. ")


def _check_finite(totals: dict, done: int, steps: int, prefix: str,
                  nonfinite_advice: Callable[[], str], progress) -> None:
  if totals["nonfinite"]:
    progress.close()
    raise NonFiniteLossError(
        f"The {'training' if prefix == 'train' else prefix} loss or parameters became NaN/Inf "
        f"between steps {done - steps + 1} and {done}; stopping. " + nonfinite_advice())


def _train_row(totals: dict, prefix: str, examples: int, seconds: float, step: int,
               steps_per_epoch: int | None) -> dict:
  count = float(totals["count"])
  row = {f"{prefix}/loss": float(totals["loss_sum"]) / count,
         f"{prefix}/accuracy": float(totals["correct"]) / count}
  if "grad_norm_sum" in totals:
    row[f"{prefix}/grad_norm"] = float(totals["grad_norm_sum"]) / float(totals["steps"])
  row[f"{prefix}/examples_per_sec"] = examples / seconds
  if steps_per_epoch:
    row[f"{prefix}/epoch"] = step / steps_per_epoch
  return row
