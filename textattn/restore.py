"""Restoring train states: a resume's newest good checkpoint, the recovery after a NaN, the
best checkpoint for the test report, and a workdir's parameters for prediction.

Every restore is verified against the checksums recorded when the checkpoint was saved
(textattn/checkpointing.py): parameters whose bytes changed are never used.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys

import jax
from absl import logging

from textattn import checkpointing, optim, platform, train_state
from textattn import workdir as workdir_lib
from textattn.errors import RunError
from textattn.metrics import MetricWriter, sums_from_json


def recorded_machine(workdir: str) -> dict | None:
  """The machine signature of the newest checkpoint in `workdir` (None: no checkpoint, or one
  that cannot be read now; the resume checks report the latter in their own words)."""
  steps = workdir_lib.checkpoint_steps(workdir)
  if not steps:
    return None
  try:
    meta = checkpointing.read_meta_at(os.path.join(workdir_lib.checkpoint_dir(workdir),
                                                   str(steps[0])))
  except Exception:  # noqa: BLE001 -- unreadable here: check_resume says why, once
    return None
  return meta.get("machine")


def resume_or_start(config, workdir, manager, shapes, contract, machine, abstract_state,
                    state_sharding, attach, train_iter, fresh, base, window: list):
  """(state, start step, meta or None, skipped batches' steps): the newest checkpoint that passes
  the resume checks and verifies (the data iterator positioned after it; `window` filled with
  the unfinished log window a stop checkpoint carries), or `fresh()`; `base`: the task's full
  default config, which an older checkpoint's contract is migrated to."""
  is_main = jax.process_index() == 0
  metrics_path = os.path.join(workdir, "metrics.jsonl")
  metrics_check = (lambda: MetricWriter.read_rows(metrics_path, warn=False)) if is_main else None
  meta = checkpointing.check_resume(manager, workdir, shapes, contract,
                                    config.optimizer.schedule, base,
                                    [metrics_check] if metrics_check else [])
  if meta is None:
    return fresh(), 0, None, []
  if is_main:
    checkpointing.warn_machine_change(meta.get("machine", machine), machine)
  restored, meta = restore_verified(manager, meta, abstract_state, state_sharding)
  train_iter.set_state(restored["data"])
  window[:] = sums_from_json(restored["data"].get("window", []))
  if is_main:
    print(f"Resuming from checkpoint at step {meta['step']}.", flush=True)
  return (attach(restored["state"]), meta["step"], meta,
          list(restored["data"].get("skipped", [])))


def nonfinite_advice(manager, config) -> str:
  with contextlib.suppress(Exception):  # a failed save: the steps listed below are what exists
    manager.wait_until_finished()
  latest = manager.latest_step()
  kept = (f"the last good checkpoint (step {latest}) is kept in {manager.directory}"
          if latest is not None else "there is no checkpoint yet")
  return (f"Runs are deterministic, so running the same command again replays the same "
          f"NaN; {kept}. Change the training in a new --workdir (a resume must continue "
          f"the same training): a lower optimizer.learning_rate (now "
          f"{config.optimizer.learning_rate}) or optimizer.grad_clip_norm > 0 (now "
          f"{config.optimizer.grad_clip_norm}).")


def recovery(manager, train_iter, writer, attach, abstract_state, state_sharding, fresh,
             window: list):
  """recover(bad_step) for loop.fit: the state of the newest checkpoint before `bad_step` (or
  `fresh()`), the batches positioned after it, its carried log window in `window` and the
  metrics rows after it dropped."""

  def recover(bad_step):
    checkpointing.finish_saves(manager)
    earlier = [s for s in manager.all_steps() if s < bad_step]
    if not earlier:
      train_iter.set_state({"epoch": 0, "index": 0})
      platform.on_main_process(lambda: writer.rewind(0))
      return fresh(), 0
    restored, restored_meta = restore_verified(
        manager, {**checkpointing.read_meta(manager, max(earlier)), "step": max(earlier)},
        abstract_state, state_sharding)
    train_iter.set_state(restored["data"])
    window[:] = sums_from_json(restored["data"].get("window", []))
    platform.on_main_process(lambda: writer.rewind(restored_meta["step"]))
    return attach(restored["state"]), restored_meta["step"]

  return recover


def restore_for_report(manager, report_step, abstract_state, state_sharding):
  """The best checkpoint's state, verified: a report is never computed from parameters whose
  bytes changed after they were saved (the previous report, if any, is then kept)."""
  try:
    restored = checkpointing.restore(manager, report_step, abstract_state, state_sharding,
                                     with_data=False)
    meta = checkpointing.read_meta(manager, report_step)
  except Exception as e:
    logging.debug("Reading the best checkpoint (step %s) failed: %s", report_step, e)
    raise RunError(f"The best checkpoint (step {report_step}) in {manager.directory} cannot be "
                   f"read ({type(e).__name__}); no test report was written (an earlier one is "
                   f"kept).") from e
  problem = verify(restored, meta)
  if problem == "unverified":
    print(f"Warning: the best checkpoint (step {report_step}) was written without checksums "
          f"(an older textattn); the test report uses it unverified.", flush=True)
    problem = None
  where = platform.any_process(problem is not None)
  if where >= 0:
    raise RunError(f"The best checkpoint (step {report_step}) in {manager.directory} failed "
                   f"verification ({problem or f'on process {where}'} differs from the checksum "
                   f"recorded when it was saved); no test report was written (an earlier one is "
                   f"kept): restore that checkpoint from a copy, or use final_params='last' in a "
                   f"new --workdir.")
  return restored["state"]


def restore_params(workdir: str, checkpoint: str, config, model, length: int | None = None,
                   trainable=None, metric: str = "val/accuracy", higher_is_better: bool = True):
  """(step, parameters) of a workdir's chosen checkpoint ("best", "last" or a step), laid out
  on this machine's first device and verified against the checksums recorded when it was
  saved; `model` and `length` (default config.max_len) rebuild the state's structure,
  `trainable` as the run's optimizer had it (optim.make_optimizer); `metric` and
  `higher_is_better`: what "best" is chosen by (the task's Job.metric). What every task's
  `load` restores with."""
  manager = checkpointing.open_manager(workdir, int(config.keep_checkpoints), metric,
                                       higher_is_better, read_only=True)
  try:
    steps = sorted(manager.all_steps())
    if not steps:
      raise RunError(f"{workdir} has no checkpoint yet; train first (or wait for the first "
                     f"checkpoint).")
    if checkpoint == "best":
      best = manager.best_step() if config.final_params == "best" else None
      chosen = best if best is not None else steps[-1]
    elif checkpoint == "last":
      chosen = steps[-1]
    elif checkpoint.isdigit() and int(checkpoint) in steps:
      chosen = int(checkpoint)
    else:
      raise RunError(f"--checkpoint={checkpoint!r} is not available in {workdir}; allowed: "
                     f"best, last, or a step of {', '.join(map(str, steps))}.")
    # The saved state's structure, placed on this machine's device (a GPU-trained workdir
    # restores on a CPU): the optimizer's state is restored too, as the checksums cover it.
    tx = optim.make_optimizer(config.optimizer, max(1, int(config.num_train_steps)),
                              trainable=trainable)
    abstract = jax.eval_shape(lambda rng: train_state.init_train_state(
        model, tx, rng, length or config.max_len, config.optimizer), jax.random.key(0))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    sharding = jax.tree.map(lambda _: device, abstract)
    try:
      restored = checkpointing.restore(manager, chosen, abstract, sharding)
      meta = checkpointing.read_meta(manager, chosen)
    except RunError:
      raise
    except Exception as e:  # noqa: BLE001 -- any unreadable checkpoint: one sentence
      logging.debug("Reading the checkpoint at step %s failed: %s", chosen, e)
      raise RunError(f"The checkpoint at step {chosen} in {manager.directory} cannot be read "
                     f"({type(e).__name__}).") from None
    problem = verify(restored, meta)
    if problem == "unverified":
      print(f"Warning: the checkpoint at step {chosen} was written without checksums (an older "
            f"textattn); its parameters are used unverified.", file=sys.stderr)
    elif problem is not None:
      raise RunError(f"The checkpoint at step {chosen} in {manager.directory} failed "
                     f"verification ({problem} changed since it was saved); choose another with "
                     f"--checkpoint.")
    return chosen, restored["state"].params
  finally:
    manager.close()


def verify(restored: dict, meta: dict) -> str | None:
  """None if `restored` (state, and data if restored) has the checksums `meta` recorded, else
  what differs ("array params/x"); "unverified" for a checkpoint written without them."""
  recorded = meta.get("checksums")
  if not recorded:
    return "unverified"
  now = checkpointing.checksums(restored["state"], restored.get("data"))
  differing = sorted(name for name in set(recorded["state"]) | set(now["state"])
                     if recorded["state"].get(name) != now["state"].get(name))
  if "data" in restored and recorded.get("data") != now.get("data"):
    differing.append("data iterator state")
  if not differing:
    return None
  more = f" and {len(differing) - 1} more" if len(differing) > 1 else ""
  return f"{'array ' if differing[0] in now['state'] else ''}{differing[0]}{more}"


def restore_verified(manager, meta: dict, abstract_state, state_sharding,
                     with_data: bool = True) -> tuple[dict, dict]:
  """(restored items, meta) of the newest checkpoint at or before meta["step"] whose arrays
  verify. Newer ones that fail are reported (one warning line each) and moved aside into
  workdir/checkpoints-failed-verification/ (so the resumed run can write those steps again);
  RunError if none verifies (then nothing is moved)."""
  failed = []
  candidates = sorted((s for s in manager.all_steps() if s <= meta["step"]), reverse=True)
  for step in candidates:
    try:
      step_meta = (meta if step == meta["step"]
                   else {**checkpointing.read_meta(manager, step), "step": step})
      restored = checkpointing.restore(manager, step, abstract_state, state_sharding,
                                       with_data=with_data)
    except Exception as e:  # an unreadable older candidate: try the next one
      if step == meta["step"]:
        raise
      restored, problem = None, f"unreadable: {type(e).__name__}"
    else:
      problem = verify(restored, step_meta)
    if problem == "unverified":
      if jax.process_index() == 0:
        print(f"Warning: the checkpoint at step {step} in {manager.directory} was written "
              f"without checksums (an older textattn); resuming from it unverified.", flush=True)
      problem = None
    where = platform.any_process(problem is not None)
    if where < 0:
      if failed:
        _move_aside(manager, [s for s, _ in failed])
      return restored, step_meta
    problem = problem or f"on process {where}"
    failed.append((step, problem))
    if jax.process_index() == 0:
      older = [s for s in candidates if s < step]
      print(f"Warning: the checkpoint at step {step} in {manager.directory} failed verification "
            f"({problem} differs from the checksum recorded when it was saved: its files "
            f"changed since); " + (f"trying step {older[0]}." if older else "no older one."),
            flush=True)
  listed = "; ".join(f"step {s}: {p}" for s, p in failed)
  raise RunError(f"No checkpoint in {manager.directory} passed verification ({listed}); their "
                 f"files changed after they were written, so resuming would continue from wrong "
                 f"parameters: restore them from a copy, or move them away to start afresh (or "
                 f"use a new --workdir).")


def _move_aside(manager, steps) -> None:
  directory = os.path.abspath(str(manager.directory))
  target = os.path.join(os.path.dirname(directory), checkpointing.FAILED_DIR)
  if jax.process_index() == 0:
    os.makedirs(target, exist_ok=True)
    for step in steps:
      destination = os.path.join(target, str(step))
      if os.path.exists(destination):
        destination += f"-{len(os.listdir(target))}"
      shutil.move(os.path.join(directory, str(step)), destination)
      print(f"Moved the checkpoint at step {step} that failed verification to {destination}.",
            flush=True)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("textattn: failed checkpoints moved aside")
  manager.reload()
