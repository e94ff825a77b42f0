"""Checkpoints: the Orbax manager, and the resume contract that makes a resume exact.

A run re-started with the same command resumes from the newest checkpoint in
`workdir/checkpoints`. Each checkpoint records (item "meta") the parameter shapes, the class
names, the run contract (the flattened config minus what a resume may change, a sha256 of the
tokenised data, the run length and the evaluation/checkpoint intervals) and the machine
signature. A resume that would not continue the same training is refused with one sentence
(RunError) before anything changes; the processes of a multi-host run agree on the verdict first.

Integrity: the meta item also records a sha256 of every state array's bytes (and of the data
iterator state), computed from host copies when the checkpoint is saved; `restore_verified`
checks them. A checkpoint whose bytes changed after it was written (a flipped bit, a truncated
file that Orbax reads as fill values) is reported in one warning line naming the step and the
array, moved aside to workdir/checkpoints-failed-verification/, and the newest older checkpoint
that verifies is used; if none does, the run refuses with one line. Checkpoints written before
checksums existed are resumed with a warning. A save that fails (full disk, read-only
directory, permissions) is a RunError naming the path (see `save_failed`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from orbax.checkpoint.checkpoint_managers import preservation_policy as preservation

from textattn import config as config_lib
from textattn import workdir as workdir_lib
from textattn.errors import RunError, one_line

_SEPARATOR = "/"
FAILED_DIR = "checkpoints-failed-verification"


def _hide_expected_warnings(record) -> bool:
  """Drops two Orbax warnings about what is meant: "did not provide metrics" (saves between
  evaluations and on SIGINT/SIGTERM: only evaluated steps compete for best), and the registry's
  note when _one_writer_per_array_on_a_cpu replaces a handler."""
  return not any(part in record.getMessage()
                 for part in ("did not provide metrics", "overriding jax.Array"))


def _one_writer_per_array_on_a_cpu() -> None:
  """On a CPU, Orbax's replica-parallel saving (each of R devices holding a replicated array
  writes 1/R of it) is off: the devices share one host's memory and disk, so it only cost R
  eager slice programs per array to compile (~1.5 s a save of a tiny model on 8 devices). Either
  way restores the same (tests/test_checkpointing.py). GPUs (off by Orbax's default) and TPUs
  keep Orbax's choice. Only private attributes tell it: an Orbax without them keeps its own."""
  handler = ocp.type_handlers.get_type_handler(jax.Array)
  if jax.default_backend() == "cpu" and getattr(handler, "_use_replica_parallel", False):
    ocp.type_handlers.register_type_handler(jax.Array, ocp.type_handlers.ArrayHandler(
        use_replica_parallel=False,
        array_metadata_store=getattr(handler, "_array_metadata_store", None)), override=True)


def checkpoint_manager(workdir: str, keep: int, metric: str = "val/accuracy",
                       higher_is_better: bool = True,
                       read_only: bool = False) -> ocp.CheckpointManager:
  """Keeps the latest `keep` checkpoints plus the best by `metric` (the task's Job names it).
  read_only (predict, load, a teacher): creates nothing and leaves temporary step directories
  alone, which may be a running training's save in flight (Orbax's start-up clean-up deleted
  them, from a background thread that could outlive a quick error exit)."""
  logging.get_absl_logger().addFilter(_hide_expected_warnings)  # (added once)
  _one_writer_per_array_on_a_cpu()
  policy = preservation.AnyPreservationPolicy([
      preservation.LatestN(keep),
      preservation.BestN(get_metric_fn=lambda metrics: metrics[metric], n=1,
                         reverse=not higher_is_better, keep_checkpoints_without_metrics=False),
  ])
  # best_fn as well as the policy: without it Orbax neither writes the metrics to disk nor
  # answers best_step() with anything but the latest step.
  options = ocp.CheckpointManagerOptions(preservation_policy=policy, create=not read_only,
                                         cleanup_tmp_directories=not read_only,
                                         best_fn=lambda metrics: metrics[metric],
                                         best_mode="max" if higher_is_better else "min")
  return ocp.CheckpointManager(workdir_lib.checkpoint_dir(os.path.abspath(workdir)),
                               options=options)


# Config fields a resumed run may change: where data and caches are read from (the data
# itself is checked by its fingerprint), the logging window and evaluation batch size (the
# train-metric rows' windows, the evaluation sums' rounding), how many checkpoints are kept, and
# the hardware and kernel settings (float rounding only; a change is reported as a warning, see
# machine_signature). Everything else must match the run being resumed: parameters, checkpoints
# and every evaluation and test figure then come out as in an uninterrupted run. The run's
# length (num_epochs / num_train_steps) may grow only where nothing depends on it: a constant
# schedule, and an old end on the evaluation and checkpoint grid (so the extended run evaluates
# and keeps the same steps an uninterrupted longer run would).
RESUMABLE_CHANGES = frozenset({
    "dataset", "data_dir", "cache_dir", "source.text_fields", "source.label_field",
    "platform.eval_batch_size", "source.validation_text_fields", "source.test_text_fields",
    "log_every_steps", "keep_checkpoints", "platform.num_cpu_devices", "platform.xla_flags",
    "platform.deterministic",
    "mesh.sequence",  # a resume may change the mesh (the machine signature notes it)
    "model.attention_impl", "num_epochs", "num_train_steps",
    "config_version"})  # (the format, not the training: older contracts are migrated)


def data_fingerprint(data) -> str:
  """sha256 of the tokenised splits and labels a run trains, validates and tests on."""
  digest = hashlib.sha256()
  for split in (data.train, data.validation, data.test):
    for array in (split.inputs, split.labels):
      digest.update(str((array.dtype.str, array.shape)).encode())
      digest.update(np.ascontiguousarray(array).tobytes())
  digest.update(json.dumps(data.class_names).encode())
  return digest.hexdigest()


def flatten(tree, prefix: str = "", separator: str = _SEPARATOR) -> dict:
  out = {}
  for key, value in tree.items():
    name = f"{prefix}{separator}{key}" if prefix else str(key)
    if isinstance(value, dict):
      out.update(flatten(value, name, separator))
    else:
      out[name] = value
  return out


def unflatten(flat: dict, separator: str = _SEPARATOR) -> dict:
  tree: dict = {}
  for name, value in flat.items():
    *parents, leaf = name.split(separator)
    node = tree
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return tree


def transfer(params, pretrained):
  """`params` with every leaf that `pretrained` has replaced by it (same path and shape); the
  classifier's own head (pooling, hidden layer, logits) keeps its fresh initialisation."""
  flat = flatten(pretrained)
  target = flatten(params)
  for name, value in sorted(flat.items()):
    if name not in target or tuple(target[name].shape) != tuple(value.shape):
      got = tuple(target[name].shape) if name in target else "no such parameter"
      raise ValueError(f"The pretrained parameter {name} has shape {tuple(value.shape)}; the "
                       f"model's: {got}.")
  return unflatten({name: flat.get(name, value) for name, value in target.items()})


def run_contract(config: ml_collections.ConfigDict, data_print: str, total_steps: int,
                 eval_every: int, checkpoint_every: int) -> dict:
  """What a checkpoint records so a resume can check it continues the same training."""
  flat = flatten(json.loads(config.to_json_best_effort()), separator=".")
  return {"config": {k: v for k, v in flat.items() if k not in RESUMABLE_CHANGES},
          "data_fingerprint": data_print, "total_steps": total_steps,
          "eval_every": eval_every, "checkpoint_every": checkpoint_every}


def _same(a, b) -> bool:
  return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def check_same_run(saved: dict | None, current: dict, schedule: str, workdir: str,
                   latest_step: int, base: ml_collections.ConfigDict) -> None:
  """RunError unless `current` (run_contract of this command) continues the run `saved` was
  written by. The saved contract is first migrated to today's fields (config.migrate, with
  `base` the task's default config), then every field either side has is compared."""
  if saved is None:
    logging.warning("The checkpoints in %s predate run contracts; the resume is not checked.",
                    workdir)
    return
  before, now = saved["config"], current["config"]
  before = {k: v for k, v in flatten(config_lib.migrate(unflatten(before, "."), base),
                                     separator=".").items() if k not in RESUMABLE_CHANGES}
  before = {k: before.get(k, "(absent)") for k in set(before) | set(now)}
  now = {k: now.get(k, "(absent)") for k in before}
  differing = sorted(k for k in before if not _same(before[k], now[k]))
  if differing:
    first = differing[0]
    more = f" (and {len(differing) - 1} more: {', '.join(differing[1:4])}" + (
        ", ...)" if len(differing) > 4 else ")") if len(differing) > 1 else ""
    raise RunError(
        f"The run in {workdir} was started with config.{first}={before[first]!r} but this "
        f"command has {now[first]!r}{more}; a resume must continue the same training, so use "
        f"the original values or a new --workdir.")
  if saved["data_fingerprint"] != current["data_fingerprint"]:
    raise RunError(
        f"The run in {workdir} was trained on other data than this command loads (its "
        f"tokenised train/validation/test arrays differ: another dataset file or version, "
        f"split, vocabulary or length); use the original data or a new --workdir.")
  intervals = [(saved.get(k), current[k]) for k in ("eval_every", "checkpoint_every")]
  if any(a is not None and a != b for a, b in intervals):
    raise RunError(
        f"The run in {workdir} evaluates and checkpoints every {intervals[0][0]} / "
        f"{intervals[1][0]} steps and this command every {intervals[0][1]} / {intervals[1][1]} "
        f"(an automatic interval follows config.evals_per_epoch; before that field existed 0 "
        f"meant once per epoch, i.e. evals_per_epoch=1; a config with intervals_dataset uses "
        f"its own intervals only on that data set: --config.intervals_dataset= keeps them); set "
        f"the original intervals, or use a new --workdir.")
  old, new = saved["total_steps"], current["total_steps"]
  if new == old:
    return
  if new < latest_step:
    raise RunError(
        f"The run in {workdir} has a checkpoint at step {latest_step} and this command asks for "
        f"{new} steps in all; a run cannot be shortened after the fact: use the original "
        f"num_epochs/num_train_steps, or a new --workdir.")
  if schedule != "constant":
    raise RunError(
        f"The run in {workdir} was started to last {old} steps and this command asks for "
        f"{new}; with optimizer.schedule={schedule!r} the learning rate depends on the length, "
        f"so use the original num_epochs/num_train_steps or a new --workdir.")
  if old % current["eval_every"] or old % current["checkpoint_every"]:
    raise RunError(
        f"The run in {workdir} ended at step {old}, which is off its evaluation/checkpoint grid "
        f"(every {current['eval_every']} / {current['checkpoint_every']} steps), so extending it "
        f"to {new} steps would evaluate and keep steps an uninterrupted run would not; use a "
        f"new --workdir.")


def shape_signature(params) -> dict:
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  return {"/".join(str(getattr(k, "key", k)) for k in path): list(leaf.shape)
          for path, leaf in flat}


def _check_same_model(checkpoint_shapes: dict, current_shapes: dict, workdir: str) -> None:
  if checkpoint_shapes == current_shapes:
    return
  differing = None
  for name in sorted(set(checkpoint_shapes) | set(current_shapes)):
    if checkpoint_shapes.get(name) != current_shapes.get(name):
      differing = name
      break
  raise RunError(
      f"The model in {workdir} does not match this config: state entry {differing!r} has "
      f"shape {checkpoint_shapes.get(differing)} in the checkpoint and "
      f"{current_shapes.get(differing)} now (a changed model, or an optimizer with other "
      f"state); use a new --workdir, or the config that made this one.")


def stop_together(problem: RunError | None) -> None:
  """Raise `problem` here, and a RunError on every other process, if any process has one."""
  if jax.process_count() == 1:
    if problem is not None:
      raise problem
    return
  from jax.experimental import multihost_utils
  flags = np.asarray(multihost_utils.process_allgather(
      np.asarray(problem is not None, np.int32))).reshape(-1)
  if problem is not None:
    raise problem
  if flags.any():
    raise RunError(f"Process {int(np.argmax(flags))} cannot resume this run (its message says "
                   f"why), so process {jax.process_index()} stops too.")


def _quiet_closed_loop_callbacks() -> None:
  """After a failed read, tensorstore completes the failed read's other futures on the asyncio
  loop Orbax already closed, and Python prints each "RuntimeError: Event loop is closed" as an
  ignored exception with a traceback, burying the one line that says what is wrong. Those
  (and only those) are dropped."""
  previous = sys.unraisablehook
  if getattr(previous, "textattn_quiet", False):
    return

  def hook(unraisable):
    if not (isinstance(unraisable.exc_value, RuntimeError)
            and str(unraisable.exc_value) == "Event loop is closed"):
      previous(unraisable)

  hook.textattn_quiet = True
  sys.unraisablehook = hook


def _unreadable_checkpoint(manager, step: int, error: Exception) -> RunError:
  """One short sentence naming the step's directory and the exception's type; the exception
  itself (Orbax's are paragraphs) goes to the debug log."""
  _quiet_closed_loop_callbacks()
  path = manager.directory / str(step)
  logging.debug("Reading the checkpoint %s failed: %s", path, error)
  older = [s for s in manager.all_steps() if s < step]
  fallback = (f"to resume from step {max(older)}" if older else "to start afresh")
  return RunError(f"The checkpoint at step {step} ({path}) cannot be read "
                  f"({type(error).__name__}); if its files are damaged, move step {step} out of "
                  f"the way {fallback} (or use a new --workdir), else fix the cause "
                  f"(permissions, disk).")


def read_meta(manager, step: int) -> dict:
  """The checkpoint's "meta" item, read by Orbax's JSON handler itself rather than through
  manager.restore: that ends in a barrier across processes, which a process whose read failed
  never reaches, so the others would wait there until its timeout instead of agreeing (in
  _stop_together) to stop at once."""
  return read_meta_at(manager.directory / str(step))


def read_meta_at(step_directory) -> dict:
  """The "meta" item of one checkpoint directory (checkpoints/<step>)."""
  import pathlib
  return ocp.JsonCheckpointHandler().restore(pathlib.Path(step_directory) / "meta")


def abstract_state_with_sharding(abstract_state, state_sharding):
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract_state, state_sharding)


def state_shapes(abstract_state) -> dict:
  """The shape signature of a train state's parameters and optimizer state."""
  shapes = shape_signature(abstract_state.params)
  shapes.update({f"opt_state/{k}": v for k, v in shape_signature(abstract_state.opt_state).items()})
  return shapes


def open_manager(workdir: str, keep: int, metric: str = "val/accuracy",
                 higher_is_better: bool = True, read_only: bool = False) -> ocp.CheckpointManager:
  try:
    return checkpoint_manager(workdir, keep, metric, higher_is_better, read_only)
  except Exception as e:  # e.g. a damaged checkpoint's metrics or metadata
    directory = workdir_lib.checkpoint_dir(workdir)
    logging.debug("Opening the checkpoints in %s failed: %s", directory, e)
    raise RunError(f"The checkpoints in {directory} cannot be read ({type(e).__name__}); if a "
                   f"step's files are damaged, move that step directory aside to resume "
                   f"from an older one (or use a new --workdir), else fix the cause (permissions, "
                   f"disk).") from e


def check_resume(manager, workdir: str, shapes: dict, contract: dict, schedule: str,
                 base: ml_collections.ConfigDict, other_checks=()) -> dict | None:
  """The newest checkpoint's meta item if there is one and this run may resume from it, else
  None for a fresh run. Every check that can stop a resume runs here, before any collective,
  and the processes agree on the verdict (one of them may see a damaged file the others do
  not), so none is left waiting. `base`: the task's default config, which older run contracts
  are migrated to. `other_checks`: more callables that raise RunError."""
  latest = manager.latest_step()
  problem = meta = None
  if latest is not None:
    try:
      meta = read_meta(manager, latest)
    except Exception as e:  # noqa: BLE001 -- any failure to read it gets the same advice
      problem = _unreadable_checkpoint(manager, latest, e)
    if problem is None:
      try:
        _check_same_model(meta["param_shapes"], shapes, workdir)
        check_same_run(meta.get("run"), contract, schedule, workdir, latest, base)
      except RunError as e:
        problem = e
  for check in other_checks:
    if problem is None:
      try:
        check()
      except RunError as e:
        problem = e
  stop_together(problem)
  return None if latest is None else {**meta, "step": int(latest)}


def warn_machine_change(saved: dict, machine: dict) -> None:
  changed = {k: (v, machine.get(k)) for k, v in saved.items() if machine.get(k) != v}
  if changed:
    print("Warning: resuming with other hardware or kernel settings than the checkpoint was "
          "written with (" + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
          + "): the run continues, but float rounding may differ, so it need not end "
          "bit-identical to an uninterrupted run.", flush=True)


def restore(manager, step: int, abstract_state, state_sharding, with_data: bool = True) -> dict:
  """{"state": ..., "data": iterator state (with_data)} of checkpoint `step`, laid out as
  `state_sharding`; an unreadable checkpoint is a RunError naming the step to move aside."""
  _quiet_closed_loop_callbacks()
  items = {"state": ocp.args.StandardRestore(
      abstract_state_with_sharding(abstract_state, state_sharding))}
  if with_data:
    items["data"] = ocp.args.JsonRestore()
  try:
    return manager.restore(step, args=ocp.args.Composite(**items))
  except Exception as e:
    if not with_data:
      raise
    raise _unreadable_checkpoint(manager, step, e) from e


def save(manager, step: int, state, data_state: dict, meta: dict, metrics: dict | None) -> None:
  """Saves (asynchronously; Orbax waits for the previous save first) with checksums in the meta
  item. Any failure, of this save or of the previous one, is a RunError (save_failed)."""
  meta = {**meta, "checksums": checksums(state, data_state)}
  try:
    manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state),
        meta=ocp.args.JsonSave(meta)), metrics=metrics)
  except Exception as e:
    raise save_failed(manager, step, e) from e


def finish_saves(manager) -> None:
  """Waits for the checkpoint being written; a failure is a RunError (save_failed)."""
  try:
    manager.wait_until_finished()
  except Exception as e:
    raise save_failed(manager, manager.latest_step() or 0, e) from e


def _leaf_name(path) -> str:
  parts = []
  for key in path:
    for attribute in ("key", "name", "idx"):
      if hasattr(key, attribute):
        parts.append(str(getattr(key, attribute)))
        break
    else:
      parts.append(str(key))
  return "/".join(parts)


def checksums(state, data_state: dict | None = None) -> dict:
  """{"state": {array name: sha256 of its dtype, shape and bytes}, "data": sha256 of the
  iterator state's JSON}. From host copies (one device-to-host copy; checkpoints only)."""
  host = jax.device_get(state)
  out = {"state": {}}
  for path, leaf in jax.tree_util.tree_flatten_with_path(host)[0]:
    array = np.ascontiguousarray(np.asarray(leaf))
    digest = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    digest.update(array.reshape(-1).view(np.uint8))
    out["state"][_leaf_name(path)] = digest.hexdigest()
  if data_state is not None:
    out["data"] = hashlib.sha256(json.dumps(data_state, sort_keys=True).encode()).hexdigest()
  return out


def save_failed(manager, step: int, error: Exception) -> RunError:
  """The one line for a checkpoint that could not be written."""
  path = getattr(error, "filename", None) or os.path.join(str(manager.directory), str(step))
  try:
    older = [s for s in manager.all_steps() if s < step]
  except Exception:  # noqa: BLE001 -- the directory itself may be unreadable
    older = []
  kept = (f"the checkpoints saved before (latest: step {max(older)}) are intact" if older
          else "no earlier checkpoint exists")
  detail = (f"{type(error).__name__}: {error.strerror}" if isinstance(error, OSError)
            and error.strerror else f"{type(error).__name__}: {one_line(error, 200)}")
  return RunError(f"Saving the checkpoint at step {step} to {path} failed ({detail}); training "
                  f"stopped and {kept}: free disk space or fix the directory's permissions, then "
                  f"run the same command to resume.")
