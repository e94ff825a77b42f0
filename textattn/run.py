"""THE runner: one run of any task, from a config and a workdir to a test report.

`train_and_evaluate(config, workdir)` looks the task up (`config.task`, textattn/tasks/), lets it
prepare its data, model, steps and evaluation (a `Job`), and does everything else once, for every
task: the workdir lock, the config record (config.json), the optimizer, the resume contract and
Orbax checkpoints (textattn/checkpointing.py), the metric writers, the one training loop
(textattn/loop.py) with its signal stop and NaN recovery, and the final report from the
best-validation (or last) checkpoint, which the task computes and the runner writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import ml_collections

from textattn import checkpointing, loop, optim, platform, step, tasks
from textattn import data as data_lib
from textattn import workdir as workdir_lib
from textattn.defaults import check_integer
from textattn.errors import RunError, Stopped, UsageError
from textattn.metrics import MetricWriter, write_json_atomic


@dataclasses.dataclass
class Job:
  """What a task hands the runner for one run (tasks.Task.prepare).

  data: the splits (data.Dataset); their fingerprint joins the run contract.
  module: the Flax module whose apply is the train state's apply_fn; initialised from a dummy
    int32 batch [1, init_length].
  train_iter: the training batches (data.TrainIterator; its position is checkpointed).
  train_step(state, batch) -> (state, sums): pure (textattn/step.py says what the sums hold).
  evaluate(state, split, prefix) -> (metrics, extras): metrics of one split with keys
    "<prefix>/...", and what the report may reuse (a classifier's test probabilities).
  report(state, report_step, reused) -> test metrics of `state` (the parameters of
    `report_step`), after writing the task's own report files; `reused` is (metrics, extras)
    when the last evaluation was already this state's test evaluation, else None.
  eval_split / eval_prefix: what is evaluated during training ("validation"/"val" or
    "test"/"test"); the checkpoint kept as best is chosen by "val/accuracy".
  describe(abstract_params) -> the lines printed before training (model, sizes).
  pretrained() -> (token table, parameters) a fresh run starts from (None: random); called
    only when the run does not resume.
  frozen: parameters under a "frozen" key are not trained (baselines' idf / NB ratios).
  attention_impl: the kernel setting the machine signature records.
  checkpoint_meta: extra fields every checkpoint records (a classifier's class names).
  """
  data: Any
  module: nn.Module
  init_length: int
  train_iter: Any
  train_step: Callable
  evaluate: Callable
  report: Callable
  describe: Callable[[Any], str]
  eval_split: str = "validation"
  eval_prefix: str = "val"
  pretrained: Callable[[], tuple] = lambda: (None, None)
  frozen: bool = False
  attention_impl: str = "xla"
  checkpoint_meta: dict = dataclasses.field(default_factory=dict)


def schedule(config, steps_per_epoch: int) -> loop.Schedule:
  """The run's length and its log/evaluation/checkpoint intervals, in steps.

  eval_every_steps and checkpoint_every_steps > 0 are used as given, except in a config that
  chose them for one data set (config.intervals_dataset: imdb_softmax.py's 350, about half an
  IMDB epoch) training on another, where they would not fit (350 steps can be more than a small
  file's whole run): there they are automatic, as a 0 is. Automatic: an evaluation every
  steps_per_epoch // evals_per_epoch steps (at least 1), and a checkpoint as often, rounded
  down to a multiple of an explicit eval interval under final_params="best" (so every
  checkpoint carries its validation accuracy). No explicit setting resolves to anything other
  than before, so old workdirs resume on their grid (checkpointing.run_contract records the
  resolved intervals)."""
  total = (config.num_train_steps if config.num_train_steps > 0
           else config.num_epochs * steps_per_epoch)
  per_epoch = check_integer("evals_per_epoch", config.evals_per_epoch, 1)
  eval_every, checkpoint_every = config.eval_every_steps, config.checkpoint_every_steps
  def name(dataset):  # a TFDS name without its config and version ("imdb_reviews/plain_text")
    return dataset if data_lib.is_local_file(dataset) else dataset.split("/")[0].split(":")[0]
  if config.intervals_dataset and name(config.dataset) != name(config.intervals_dataset):
    eval_every = checkpoint_every = 0
  automatic = max(1, steps_per_epoch // per_epoch)
  eval_every = eval_every or automatic
  if not checkpoint_every:
    checkpoint_every = automatic
    if config.final_params == "best" and checkpoint_every % eval_every:
      checkpoint_every = max(eval_every, checkpoint_every // eval_every * eval_every)
  plan = loop.Schedule(total, config.log_every_steps, eval_every, checkpoint_every,
                       batch_size=config.batch_size, steps_per_epoch=steps_per_epoch,
                       compiler_options=platform.step_compiler_options(config),
                       mesh=platform.config_mesh(config))
  if config.final_params == "best" and plan.checkpoint_every % plan.eval_every:
    raise UsageError(
        f"config.checkpoint_every_steps={config.checkpoint_every_steps} must be a multiple of "
        f"the evaluation interval ({plan.eval_every} steps; config.eval_every_steps="
        f"{config.eval_every_steps}, 0 = automatic) when config.final_params='best', so every "
        f"checkpoint carries the validation accuracy it is chosen by.")
  return plan


def validate(config: ml_collections.ConfigDict, device_count: int) -> None:
  """Every check of the config's task, static and device-dependent (UsageError, one sentence)."""
  task = tasks.get(config.task)
  task.validate(config, None)
  platform.check_mesh(config, device_count)
  task.validate(config, device_count)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       profile_dir: str = "") -> dict:
  """Trains (or resumes), evaluates, and returns the final report's metrics.

  Holds the workdir lock (textattn.workdir) throughout; a workdir this call created is removed
  again if the run is refused before training starts. SIGINT/SIGTERM during training save a
  checkpoint and raise errors.Stopped (see loop.stop_on_signals). `profile_dir`: a profiler
  trace of the first steps is written there (loop.Hooks.profile_dir)."""
  validate(config, jax.device_count())
  task = tasks.get(config.task)
  return in_workdir(workdir, lambda is_main, lock, progress: _run(
      task, config, workdir, is_main, lock, progress, profile_dir))


def train_only(config: ml_collections.ConfigDict, job: Job) -> list[tuple[int, dict]]:
  """Trains `job` from its fresh start with no workdir (no checkpoints, metric files, resume or
  report), evaluating its validation split at the run's evaluation interval; returns
  [(step, metrics)]. What validation sweeps run (textattn/sweep.py)."""
  replicated = platform.replicated(platform.config_mesh(config))
  plan = dataclasses.replace(schedule(config, job.train_iter.steps_per_epoch), log_every=0,
                             checkpoint_every=0)
  tx = optim.make_optimizer(config.optimizer, plan.total_steps, frozen=job.frozen)
  init = _initializer(config, job, tx)
  rng, start = jax.random.key(config.seed), job.pretrained()
  state_sharding = jax.tree.map(lambda _: replicated, jax.eval_shape(init, rng, *start))
  state = jax.jit(init, out_shardings=state_sharding)(rng, *start)
  curve = []

  def evaluate(state, done, is_last):
    curve.append((done, job.evaluate(state, job.data.validation, "val")[0]))

  loop.fit(state, job.train_step, job.train_iter, plan,
           loop.Hooks(evaluate=evaluate, progress=False))
  return curve


def _initializer(config, job: Job, tx):
  """init(rng, pretrained_tokens=None, pretrained_params=None) -> a fresh train state of `job`."""
  def init(rng, pretrained_tokens=None, pretrained_params=None):
    return step.init_train_state(job.module, tx, rng, job.init_length, config.optimizer,
                                 pretrained_tokens, pretrained_params)
  return init


def in_workdir(workdir: str, body):
  """body(is_main, lock, progress) holding the workdir lock; a workdir this call created is
  removed again if body fails (or is interrupted) before it sets progress["training"]."""
  is_main = jax.process_index() == 0
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise RunError(f"--workdir={workdir} is a file, not a directory; name a directory (it is "
                   f"created if missing).")
  created = not os.path.exists(workdir)
  os.makedirs(workdir, exist_ok=True)
  lock = workdir_lib.WorkdirLock(workdir, enabled=is_main, num_processes=jax.process_count())
  progress = {"training": False}
  try:
    problem = None
    try:
      lock.acquire()
    except RunError as e:
      problem = e
    checkpointing.stop_together(problem)
    return body(is_main, lock, progress)
  except (Exception, KeyboardInterrupt):
    if created and is_main and not progress["training"]:
      # refused or interrupted before training: leave no trace
      shutil.rmtree(workdir, ignore_errors=True)
    raise
  finally:
    lock.release()


def recorded_machine(workdir: str) -> dict | None:
  """The machine signature of the newest checkpoint in `workdir` (None: no checkpoint, or one
  that cannot be read now; the resume checks report the latter in their own words)."""
  directory = os.path.join(workdir, "checkpoints")
  steps = sorted((int(d) for d in os.listdir(directory) if d.isdigit()), reverse=True) \
      if os.path.isdir(directory) else []
  if not steps:
    return None
  try:
    meta = checkpointing.read_meta_at(os.path.join(directory, str(steps[0])))
  except Exception:  # noqa: BLE001 -- unreadable here: check_resume says why, once
    return None
  return meta.get("machine")


def write_config(workdir: str, config, start_step: int) -> None:
  """workdir/config.json; on a resume, one that differs is kept aside, never overwritten."""
  path = os.path.join(workdir, "config.json")
  current = json.loads(config.to_json_best_effort())
  if os.path.exists(path) and start_step:
    try:
      with open(path) as f:
        same = json.load(f) == current
    except (OSError, ValueError):
      same = False  # unreadable: kept aside like a changed one
    if not same:
      os.replace(path, os.path.join(workdir, f"config.before-step-{start_step}.json"))
  write_json_atomic(path, current)


def resume_or_start(config, workdir, manager, shapes, contract, machine, abstract_state,
                    state_sharding, attach, train_iter, fresh):
  """(state, start step, meta or None, skipped batches' steps): the newest checkpoint that passes
  the resume checks and verifies (the data iterator positioned after it), or `fresh()`."""
  is_main = jax.process_index() == 0
  metrics_path = os.path.join(workdir, "metrics.jsonl")
  metrics_check = (lambda: MetricWriter.read_rows(metrics_path, warn=False)) if is_main else None
  meta = checkpointing.check_resume(manager, workdir, shapes, contract,
                                    config.optimizer.schedule, tasks.get(config.task).defaults(),
                                    [metrics_check] if metrics_check else [])
  if meta is None:
    return fresh(), 0, None, []
  if is_main:
    checkpointing.warn_machine_change(meta.get("machine", machine), machine)
  restored, meta = checkpointing.restore_verified(manager, meta, abstract_state, state_sharding)
  train_iter.set_state(restored["data"])
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


def recovery(manager, train_iter, writer, attach, abstract_state, state_sharding, fresh):
  """recover(bad_step) for loop.fit: the state of the newest checkpoint before `bad_step` (or
  `fresh()`), the batches positioned after it and the metrics rows after it dropped."""

  def recover(bad_step):
    checkpointing.finish_saves(manager)
    earlier = [s for s in manager.all_steps() if s < bad_step]
    if not earlier:
      train_iter.set_state({"epoch": 0, "index": 0})
      writer.rewind(0)
      return fresh(), 0
    restored, restored_meta = checkpointing.restore_verified(
        manager, {**checkpointing.read_meta(manager, max(earlier)), "step": max(earlier)},
        abstract_state, state_sharding)
    train_iter.set_state(restored["data"])
    writer.rewind(restored_meta["step"])
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
    raise RunError(f"The best checkpoint (step {report_step}) in {manager.directory} cannot be "
                   f"read ({type(e).__name__}: {checkpointing.one_line(e)}); no test report "
                   f"was written (an earlier one is kept).") from e
  problem = checkpointing.verify(restored, meta)
  if problem == "unverified":
    print(f"Warning: the best checkpoint (step {report_step}) was written without checksums "
          f"(an older textattn); the test report uses it unverified.", flush=True)
    problem = None
  where = checkpointing.any_process(problem is not None)
  if where >= 0:
    raise RunError(f"The best checkpoint (step {report_step}) in {manager.directory} failed "
                   f"verification ({problem or f'on process {where}'} differs from the checksum "
                   f"recorded when it was saved); no test report was written (an earlier one is "
                   f"kept): restore that checkpoint from a copy, or use final_params='last' in a "
                   f"new --workdir.")
  return restored["state"]


def restore_params(workdir: str, checkpoint: str, config, model, length: int | None = None,
                   frozen: bool = False):
  """(step, parameters) of a workdir's chosen checkpoint ("best", "last" or a step), laid out
  on this machine's first device and verified against the checksums recorded when it was
  saved; `model` and `length` (default config.max_len) rebuild the state's structure, `frozen`
  as the run's optimizer had it. What every task's `load` restores with."""
  manager = checkpointing.open_manager(workdir, int(config.keep_checkpoints))
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
                              frozen=frozen)
    abstract = jax.eval_shape(lambda rng: step.init_train_state(
        model, tx, rng, length or config.max_len, config.optimizer), jax.random.key(0))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    sharding = jax.tree.map(lambda _: device, abstract)
    try:
      restored = checkpointing.restore(manager, chosen, abstract, sharding)
      meta = checkpointing.read_meta(manager, chosen)
    except RunError:
      raise
    except Exception as e:  # noqa: BLE001 -- any unreadable checkpoint: one sentence
      raise RunError(f"The checkpoint at step {chosen} in {manager.directory} cannot be read "
                     f"({type(e).__name__}: {checkpointing.one_line(e)}).") from None
    problem = checkpointing.verify(restored, meta)
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



def _run(task, config, workdir, is_main, lock, progress, profile_dir="") -> dict:
  replicated = platform.replicated(platform.config_mesh(config))
  job = task.prepare(config, workdir, is_main)
  plan = schedule(config, job.train_iter.steps_per_epoch)
  tx = optim.make_optimizer(config.optimizer, plan.total_steps, frozen=job.frozen)
  contract = checkpointing.run_contract(config, checkpointing.data_fingerprint(job.data),
                                        plan.total_steps, plan.eval_every,
                                        plan.checkpoint_every)
  machine = platform.machine_signature(config, job.attention_impl)
  eval_data = job.data.validation if job.eval_split == "validation" else job.data.test
  if len(eval_data) == 0:
    raise UsageError(f"config.eval_split={job.eval_split!r} selects an empty split; with "
                     f"eval_split='validation' set config.val_fraction > 0.")

  init = _initializer(config, job, tx)

  def attach(restored):  # a restored state gets the functions a checkpoint does not hold
    return restored.replace(apply_fn=job.module.apply, tx=tx)

  rng = jax.random.key(config.seed)
  abstract_state = jax.eval_shape(init, rng)
  state_sharding = jax.tree.map(lambda _: replicated, abstract_state)
  shapes = checkpointing.state_shapes(abstract_state)
  if is_main:
    print(job.describe(abstract_state.params), flush=True)

  def fresh():
    return jax.jit(init, out_shardings=state_sharding)(rng, *job.pretrained())

  manager = checkpointing.open_manager(workdir, config.keep_checkpoints)
  state, start_step, meta, skipped = resume_or_start(
      config, workdir, manager, shapes, contract, machine, abstract_state, state_sharding,
      attach, job.train_iter, fresh)
  writer = MetricWriter(workdir, is_main, start_step, fresh=meta is None)
  writer.drop_after(start_step if meta is not None else None)
  if is_main:
    write_config(workdir, config, start_step)

  last_eval = {}

  def evaluate(state, done, is_last):
    metrics, extras = job.evaluate(state, eval_data, job.eval_prefix)
    last_eval.update(step=done, metrics=metrics, extras=extras)
    # A final evaluation on test is written once, as the test report below.
    return None if (is_last and job.eval_prefix == "test") else metrics

  def save(done, state, eval_metrics):
    ckpt_metrics = ({"val/accuracy": eval_metrics["val/accuracy"]}
                    if eval_metrics and "val/accuracy" in eval_metrics else None)
    data_state = {**job.train_iter.get_state(), **({"skipped": list(skipped)} if skipped else {})}
    checkpointing.save(manager, done, state, data_state,
                       {"param_shapes": shapes, "class_names": [], **job.checkpoint_meta,
                        "run": contract, "machine": machine}, ckpt_metrics)
    if is_main:
      print(f"step {done}: checkpoint saved", flush=True)

  progress["training"] = True
  with loop.stop_on_signals(on_force_exit=lock.release) as stop:
    hooks = loop.Hooks(
        evaluate=evaluate, save=save, writer=writer, stop=stop, profile_dir=profile_dir,
        recovery=loop.Recovery(
            recovery(manager, job.train_iter, writer, attach, abstract_state, state_sharding,
                     fresh), skipped, lambda: nonfinite_advice(manager, config)))
    try:
      result = loop.fit(state, job.train_step, job.train_iter, plan, hooks,
                        start_step=start_step)
    except Stopped:
      checkpointing.finish_saves(manager)  # the stop's checkpoint is complete before exit
      writer.close()
      raise
    except BaseException:
      # Let a save in flight finish; the error being raised is the one to report.
      with contextlib.suppress(Exception):
        manager.wait_until_finished()
      writer.close()
      raise
    checkpointing.finish_saves(manager)
  report = _report(config, job, result.state, manager, abstract_state, state_sharding, attach,
                   plan.total_steps, last_eval, writer, is_main)
  manager.close()
  writer.close()
  return report


def _report(config, job, state, manager, abstract_state, state_sharding, attach, total_steps,
            last_eval, writer, is_main) -> dict:
  """The task's test report of the best-validation (or last) parameters, written and printed."""
  report_step = total_steps
  if config.final_params == "best" and manager.best_step() not in (None, total_steps):
    report_step = manager.best_step()
    state = attach(restore_for_report(manager, report_step, abstract_state, state_sharding))
  reused = None
  if job.eval_prefix == "test" and last_eval and last_eval["step"] == report_step:
    reused = (last_eval["metrics"], last_eval["extras"])
  report = job.report(state, report_step, reused)
  report["test/params_from_step"] = int(report_step)
  if is_main:
    writer.write_report(total_steps, report)
    shown = {k: v for k, v in report.items() if not k.endswith("/warning")}  # (said already)
    print("Test report: " + ", ".join(
        f"{k.split('/', 1)[1]}={v:.4f}" if isinstance(v, float) else f"{k.split('/', 1)[1]}={v}"
        for k, v in shown.items()), flush=True)
  return report
