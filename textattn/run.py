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
import functools
import json
import os
import shutil

import jax
import ml_collections

from textattn import attention, checkpointing, loop, optim, platform, restore, tasks, train_state
from textattn import config as config_lib
from textattn import data as data_lib
from textattn import workdir as workdir_lib
from textattn.checks import check_choice, check_integer
from textattn.errors import RunError, Stopped, UsageError
from textattn.metrics import MetricWriter, sums_to_json, write_json_atomic

FINAL_PARAMS = ("best", "last")


def fields(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The runner's fields (the same for every task), added to `config` where it lacks them (a
  task's defaults may set one differently, as translation's batch_size), and the optimizer's
  (optim.defaults) where it has none."""
  runner = ml_collections.ConfigDict()
  runner.config_version = config_lib.CONFIG_VERSION  # what migrate() reads; never set by a user
  runner.seed = 0  # parameters, dropout and batch order
  runner.batch_size = 32  # global; a multiple of the device count
  runner.num_epochs = 2
  runner.num_train_steps = -1  # > 0 overrides num_epochs
  runner.log_every_steps = 100
  runner.eval_every_steps = 0  # 0 = automatic: evals_per_epoch times per epoch
  runner.checkpoint_every_steps = 0  # 0 = at each automatic evaluation (and always at the end)
  runner.evals_per_epoch = 4  # for the 0s above (1 = once per epoch, as before there was this)
  # The data set the two intervals above were chosen for ("" = any): on another they are
  # automatic (imdb_softmax.py's 350 steps would not fit a small file's run).
  runner.intervals_dataset = ""
  runner.final_params = "best"  # test report from the best-validation checkpoint, or "last"
  runner.keep_checkpoints = 2  # the latest K are kept, plus the best by validation accuracy
  # The device mesh: the length of every batch split over `sequence` devices (context
  # parallelism; attention variants that declare it, textattn/attention/sequence.py), the batch
  # over the rest (data = devices / sequence). 1 = data parallelism only.
  runner.mesh = ml_collections.ConfigDict()
  runner.mesh.sequence = 1
  if "optimizer" not in config:
    config.optimizer = optim.defaults()
  for key, value in runner.items():
    if key not in config:
      config[key] = value
  config.config_version = config_lib.CONFIG_VERSION
  return config


# The runner's opt-in parts (config.py's complete): how the run uses the machine, the Adam
# family's moment decays, and LoRA (textattn/lora.py; off at rank 0); a config sets them only to
# change them (`config.platform = platform.default_config()`, or on the command line:
# --config.platform.num_cpu_devices=8).
PARTS = {"platform": platform.default_config, "optimizer.adam": optim.adam_config,
         "optimizer.lora": optim.lora_config}


def parts(task: str) -> dict:
  """Every opt-in part of a config of `task`: the runner's and the task's (Task.parts)."""
  return {**PARTS, **tasks.get(task).parts}


def task_defaults(name: str) -> ml_collections.ConfigDict:
  """The default config of task `name`: its own fields, then the runner's (no opt-in parts)."""
  return fields(tasks.get(name).defaults())


def complete(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with every opt-in part of its task it lacks at its defaults (config.complete): what
  the runner, the commands and a workdir's readers work with. Idempotent."""
  return config_lib.complete(config, parts(config.task))


def option_parts() -> dict:
  """The attention variants' option sub-configs (config.model.window, .linear, .performer, ...;
  registry.Variant.options): opt-in like the parts above, but added only where a config file
  or the command line names them (`complete` leaves them out: a workdir's contract holds only
  what its run used)."""
  found = {}
  for name in attention.names():
    variant = attention.get(name)
    if variant.options and f"model.{variant.options}" not in found:
      found[f"model.{variant.options}"] = functools.partial(attention.default_options, name)
  return found


def with_parts(config: ml_collections.ConfigDict, *names: str) -> ml_collections.ConfigDict:
  """`config` with the opt-in parts `names` (run.PARTS, Task.parts, option_parts) it lacks added
  at their defaults, so a config file can change their fields: `with_parts(config, "ngrams")`."""
  known = {**parts(config.task), **option_parts()}
  for name in names:
    check_choice("opt-in part", name, tuple(known))
    *parents, leaf = name.split(".")
    node = config
    for parent in parents:
      node = node[parent]
    if leaf not in node:
      node[leaf] = known[name]()
  return config


def full_defaults(name: str) -> ml_collections.ConfigDict:
  """task_defaults with every opt-in part: what older workdirs' configs are migrated to."""
  return complete(task_defaults(name))


def read_workdir_config(workdir: str, plugins=()) -> ml_collections.ConfigDict:
  """The config a training workdir recorded (config.json), migrated to today's fields."""
  attention.load_plugins(plugins)  # a plugin's task or attention variant, as in training
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise data_lib.DataError(f"{workdir} has no config.json: it is not a textattn training "
                             f"workdir (or its run has not started).")
  saved = config_lib.read_saved(path)
  name = saved.get("task", "classification")  # (v1: only translation named it)
  return ml_collections.ConfigDict(config_lib.migrate(saved, full_defaults(name)))


def load(workdir: str, checkpoint: str = "best", plugins=()):
  """What the task of a training workdir offers for it (its Task.load): a classifier
  (`.predict(texts)`, `.explain(texts)`, `.evaluate(path)`), a translator (`.translate(texts)`),
  or a plugin task's own; `plugins`: the modules the run was trained with --plugin."""
  config = read_workdir_config(workdir, plugins)
  return tasks.get(config.task).load(workdir, checkpoint, config)


def validate_fields(config: ml_collections.ConfigDict) -> None:
  """The runner's and the optimizer's fields, checked once for every task (UsageError)."""
  optim.validate_config(config.optimizer)
  for field, value in (("batch_size", config.batch_size),
                       ("platform.eval_batch_size", config.platform.eval_batch_size)):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise UsageError(f"config.{field}={value!r} must be a positive multiple of the device "
                       f"count so every device gets an equal share.")
  if config.num_train_steps <= 0 and config.num_epochs < 1:
    raise UsageError(f"config.num_epochs={config.num_epochs} must be >= 1 when "
                     f"config.num_train_steps={config.num_train_steps} is not > 0.")
  for field in ("eval_every_steps", "checkpoint_every_steps", "log_every_steps"):
    if config[field] < 0:
      raise UsageError(f"config.{field}={config[field]} must be >= 0.")
  if not isinstance(config.platform.deterministic, bool):
    raise UsageError(f"config.platform.deterministic={config.platform.deterministic!r} must be "
                     f"True or False.")
  check_integer("evals_per_epoch", config.evals_per_epoch, 1)
  check_choice("final_params", config.final_params, FINAL_PARAMS)
  if config.keep_checkpoints < 1:
    raise UsageError(f"config.keep_checkpoints={config.keep_checkpoints} must be >= 1.")


def validate_devices(config: ml_collections.ConfigDict, device_count: int) -> None:
  """The checks that need the device count: the runner's, then the task's."""
  for field, value in (("batch_size", config.batch_size),
                       ("platform.eval_batch_size", config.platform.eval_batch_size)):
    if value % device_count:
      raise UsageError(f"config.{field}={value!r} must be a positive multiple of the "
                       f"device count ({device_count}) so every device gets an equal share.")
  platform.check_mesh(config, device_count)
  tasks.get(config.task).validate(config, device_count)


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


def validate(config: ml_collections.ConfigDict, device_count: int | None) -> None:
  """Every check of the runner's fields and the config's task, static and (with a device count)
  device-dependent: UsageError, one sentence. A plugin task gets the runner's for free."""
  config = complete(config)
  validate_fields(config)
  tasks.get(config.task).validate(config, None)
  if device_count is not None:
    validate_devices(config, device_count)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       profile_dir: str = "", checked: bool = False) -> dict:
  """Trains (or resumes), evaluates, and returns the final report's metrics.

  Holds the workdir lock (textattn.workdir) throughout; a workdir this call created is removed
  again if the run is refused before training starts. SIGINT/SIGTERM during training save a
  checkpoint and raise errors.Stopped (see loop.stop_on_signals). `profile_dir`: a profiler
  trace of the first steps is written there (loop.Hooks.profile_dir); `checked`: the caller
  (textattn.main) has run `validate` with the device count already."""
  config = complete(config)
  if not checked:
    validate(config, jax.device_count())
  task = tasks.get(config.task)
  return in_workdir(workdir, lambda is_main, lock, progress: _run(
      task, config, workdir, is_main, lock, progress, profile_dir))


def train_only(config: ml_collections.ConfigDict, job: tasks.Job) -> list[tuple[int, dict]]:
  """Trains `job` from its fresh start with no workdir (no checkpoints, metric files, resume or
  report), evaluating its validation split at the run's evaluation interval; returns
  [(step, metrics)]. What validation sweeps run (textattn/sweep.py)."""
  config = complete(config)
  replicated = platform.replicated(platform.config_mesh(config))
  plan = dataclasses.replace(schedule(config, job.train_iter.steps_per_epoch), log_every=0,
                             checkpoint_every=0)
  tx = optim.make_optimizer(config.optimizer, plan.total_steps, trainable=job.trainable,
                            seed=config.seed)
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


def _initializer(config, job: tasks.Job, tx):
  """init(rng, pretrained_tokens=None, pretrained_params=None) -> a fresh train state of `job`."""
  def init(rng, pretrained_tokens=None, pretrained_params=None):
    return train_state.init_train_state(job.module, tx, rng, job.init_length, config.optimizer,
                                        pretrained_tokens, pretrained_params)
  return init


def in_workdir(workdir: str, body):
  """body(is_main, lock, progress) holding the workdir lock; a workdir this call created (and
  whose lock it then held: of two runs starting on one new workdir, the one refused must not
  remove the other's) is removed again if body fails (or is interrupted) before it sets
  progress["training"]."""
  is_main = jax.process_index() == 0
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise RunError(f"--workdir={workdir} is a file, not a directory; name a directory (it is "
                   f"created if missing).")
  try:
    os.makedirs(os.path.dirname(os.path.abspath(workdir)), exist_ok=True)
    try:
      os.mkdir(workdir)  # (atomic: of two runs creating it at once, one is told it exists)
      created = True
    except FileExistsError:
      created = False
  except OSError as e:
    raise RunError(f"--workdir={workdir} cannot be created ({type(e).__name__}: "
                   f"{e.strerror or e}); name a directory in a writable place.") from None
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
    if created and is_main and lock.held and not progress["training"]:
      # refused or interrupted before training: leave no trace
      shutil.rmtree(workdir, ignore_errors=True)
    raise
  finally:
    lock.release()


def write_config(workdir: str, config, start_step: int) -> None:
  """workdir/config.json; on a resume, one that differs is first kept aside (a copy under a
  name of its own, config.before-step-N[.K].json), never overwritten: a failed write leaves
  the old file in place."""
  path = os.path.join(workdir, "config.json")
  current = json.loads(config.to_json_best_effort())
  try:
    if os.path.exists(path) and start_step:
      try:
        with open(path) as f:
          same = json.load(f) == current
      except (OSError, ValueError):
        same = False  # unreadable: kept aside like a changed one
      if not same:
        aside, k = os.path.join(workdir, f"config.before-step-{start_step}.json"), 1
        while os.path.exists(aside):  # (resumed from this step before, with another config)
          k += 1
          aside = os.path.join(workdir, f"config.before-step-{start_step}.{k}.json")
        shutil.copy2(path, aside)
    write_json_atomic(path, current)
  except OSError as e:
    raise RunError(f"Cannot write {path} ({type(e).__name__}: {e.strerror or e}); the "
                   f"workdir must be writable.") from None


def _eval_data(job: tasks.Job):
  """The split evaluated during training (UsageError if it is empty)."""
  data = job.data.validation if job.eval_split == "validation" else job.data.test
  if len(data) == 0:
    raise UsageError(f"config.eval_split={job.eval_split!r} selects an empty split; with "
                     f"eval_split='validation' set config.val_fraction > 0.")
  return data


def _run(task, config, workdir, is_main, lock, progress, profile_dir="") -> dict:
  replicated = platform.replicated(platform.config_mesh(config))
  job = task.prepare(config, workdir, is_main)
  plan = schedule(config, job.train_iter.steps_per_epoch)
  tx = optim.make_optimizer(config.optimizer, plan.total_steps, trainable=job.trainable,
                            seed=config.seed)
  contract = checkpointing.run_contract(config, checkpointing.data_fingerprint(job.data),
                                        plan.total_steps, plan.eval_every,
                                        plan.checkpoint_every)
  machine = platform.machine_signature(config, job.attention_impl)
  eval_data = _eval_data(job)
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

  manager = checkpointing.open_manager(workdir, config.keep_checkpoints, job.metric,
                                       job.higher_is_better)
  window, last_eval = [], {}  # (window: the unfinished log window a stop carries, loop.Hooks)
  state, start_step, meta, skipped = restore.resume_or_start(
      config, workdir, manager, shapes, contract, machine, abstract_state, state_sharding,
      attach, job.train_iter, fresh, full_defaults(config.task), window)
  writer = MetricWriter(workdir, is_main)
  platform.on_main_process(lambda: (writer.drop_after(start_step if meta is not None else None),
                                    write_config(workdir, config, start_step)))

  def evaluate(state, done, is_last):
    metrics, extras = job.evaluate(state, eval_data, job.eval_prefix)
    last_eval.update(step=done, metrics=metrics, extras=extras)
    # A final evaluation on test is written once, as the test report below.
    return None if (is_last and job.eval_prefix == "test") else metrics

  def save(done, state, eval_metrics):
    ckpt_metrics = ({job.metric: eval_metrics[job.metric]}
                    if eval_metrics and job.metric in eval_metrics else None)
    data_state = {**job.train_iter.get_state(), **({"skipped": list(skipped)} if skipped else {}),
                  **({"window": sums_to_json(window)} if window else {})}
    checkpointing.save(manager, done, state, data_state,
                       {"param_shapes": shapes, **job.checkpoint_meta,
                        "run": contract, "machine": machine}, ckpt_metrics)
    if is_main:
      print(f"step {done}: checkpoint saved", flush=True)

  progress["training"] = True
  with loop.stop_on_signals(on_force_exit=lock.release) as stop:
    hooks = loop.Hooks(
        evaluate=evaluate, save=save, writer=writer, stop=stop, profile_dir=profile_dir,
        window=window, recovery=loop.Recovery(
            restore.recovery(manager, job.train_iter, writer, attach, abstract_state,
                             state_sharding, fresh, window),
            skipped, lambda: restore.nonfinite_advice(manager, config)))
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
    state = attach(restore.restore_for_report(manager, report_step, abstract_state, state_sharding))
  reused = None
  if job.eval_prefix == "test" and last_eval and last_eval["step"] == report_step:
    reused = (last_eval["metrics"], last_eval["extras"])
  report = job.report(state, report_step, reused)
  report["test/params_from_step"] = int(report_step)
  platform.on_main_process(lambda: writer.write_report(total_steps, report))
  if is_main:
    shown = {k: v for k, v in report.items() if not k.endswith("/warning")}  # (said already)
    print("Test report: " + ", ".join(
        f"{k.split('/', 1)[1]}={v:.4f}" if isinstance(v, float) else f"{k.split('/', 1)[1]}={v}"
        for k, v in shown.items()), flush=True)
  return report
