"""The text-classification task: data + model -> fit -> test report.

`train_and_evaluate(config, workdir)` loads the data (textattn.data), builds the classifier
(textattn.models) and a replicated train state, resumes from the newest checkpoint in `workdir`
if there is one (textattn.checkpointing), trains with the one loop (textattn.loop.fit),
evaluating on validation and checkpointing as the config says, and ends with a test report from
the best-validation (or last) parameters, written to metrics.jsonl and test_predictions.npz.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from textattn import baselines, checkpointing, compare, loop, models, optim, platform, step
from textattn import data as data_lib
from textattn import workdir as workdir_lib
from textattn.defaults import check_choice, check_integer
from textattn.errors import RunError, Stopped
from textattn.metrics import MetricWriter, summarize_eval, write_json_atomic
from textattn.recipes import pretrain, word2vec

EVAL_SPLITS = ("validation", "test")
FINAL_PARAMS = ("best", "last")


def validate_config(config: ml_collections.ConfigDict, device_count: int) -> None:
  """One sentence naming the first bad field, its value and what is allowed."""
  models.validate_model_config(config)
  word2vec.validate_config(config)
  pretrain.validate_config(config)
  optim.validate_config(config.optimizer)
  check_choice("eval_split", config.eval_split, EVAL_SPLITS)
  check_choice("final_params", config.final_params, FINAL_PARAMS)
  if config.final_params == "best" and config.eval_split == "test":
    raise ValueError("config.final_params='best' with config.eval_split='test' would choose the "
                     "model on the test set; use final_params='last' or eval_split='validation'.")
  for field in ("batch_size", "eval_batch_size"):
    value = config[field]
    if not isinstance(value, int) or value < 1 or value % device_count:
      raise ValueError(f"config.{field}={value!r} must be a positive multiple of the device "
                       f"count ({device_count}) so every device gets an equal share.")
  if config.num_train_steps <= 0 and config.num_epochs < 1:
    raise ValueError(f"config.num_epochs={config.num_epochs} must be >= 1 when "
                     f"config.num_train_steps={config.num_train_steps} is not > 0.")
  for field in ("eval_every_steps", "checkpoint_every_steps", "log_every_steps"):
    if config[field] < 0:
      raise ValueError(f"config.{field}={config[field]} must be >= 0.")
  if not isinstance(config.deterministic, bool):
    raise ValueError(  # noqa: TRY004 -- a bad config value is a ValueError, like all the others
        f"config.deterministic={config.deterministic!r} must be True or False.")
  check_integer("evals_per_epoch", config.get("evals_per_epoch", 1), 1)
  if config.keep_checkpoints < 1:
    raise ValueError(f"config.keep_checkpoints={config.keep_checkpoints} must be >= 1.")


def make_evaluator(state_sharding, num_classes: int, eval_batch_size: int, class_names,
                   compiler_options=None):
  """evaluate(state, split, prefix) -> (metrics, class probabilities [N, C] for "test" else
  None). Eval batches are consecutive examples with weight-0 padding at the end."""
  data_sharding, replicated = platform.data_parallel_shardings()
  compiled = {
      with_probabilities: jax.jit(
          lambda s, b, p=with_probabilities: step.eval_step(s, b, num_classes, probabilities=p),
          in_shardings=(state_sharding, data_sharding), out_shardings=replicated,
          compiler_options=compiler_options)
      for with_probabilities in (False, True)}

  def evaluate(state, split, prefix):
    with_probabilities = prefix == "test"
    totals, probabilities = None, []
    for batch in data_lib.eval_batches(split, eval_batch_size, jax.process_index(),
                                       jax.process_count()):
      sums = compiled[with_probabilities](state, platform.to_global(batch, data_sharding))
      if with_probabilities:
        probabilities.append(sums.pop("probabilities"))
      totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    metrics = summarize_eval(jax.device_get(totals), class_names, prefix)
    if not with_probabilities:
      return metrics, None
    return metrics, np.concatenate(jax.device_get(probabilities))[:len(split)]

  return evaluate


def intervals(config, steps_per_epoch: int) -> loop.Schedule:
  """The run's length and its log/evaluation/checkpoint intervals, in steps.

  eval_every_steps and checkpoint_every_steps > 0 are used as given, except in a config that
  chose them for one data set (config.intervals_dataset: imdb_softmax.py's 350, about half an
  IMDB epoch) training on another, where they would not fit (350 steps can be more than a small
  file's whole run): there they are automatic, as a 0 is. Automatic: an evaluation every
  steps_per_epoch // evals_per_epoch steps (at least 1), and a checkpoint as often, rounded
  down to a multiple of an explicit eval interval under final_params="best" (so every
  checkpoint carries its validation accuracy). evals_per_epoch=1 is what 0 meant before the
  field existed, once per epoch; the seed Keras configs keep it (their per-epoch test rows).
  No explicit setting resolves to anything other than before, so old workdirs resume on their
  grid (checkpointing.run_contract records the resolved intervals)."""
  total = (config.num_train_steps if config.num_train_steps > 0
           else config.num_epochs * steps_per_epoch)
  per_epoch = check_integer("evals_per_epoch", config.get("evals_per_epoch", 1), 1)
  eval_every, checkpoint_every = config.eval_every_steps, config.checkpoint_every_steps
  def name(dataset):  # a TFDS name without its config and version ("imdb_reviews/plain_text")
    return dataset if data_lib.is_local_file(dataset) else dataset.split("/")[0].split(":")[0]
  chosen_for = config.get("intervals_dataset", "")
  if chosen_for and name(config.dataset) != name(chosen_for):
    eval_every = checkpoint_every = 0
  automatic = max(1, steps_per_epoch // per_epoch)
  eval_every = eval_every or automatic
  if not checkpoint_every:
    checkpoint_every = automatic
    if config.final_params == "best" and checkpoint_every % eval_every:
      checkpoint_every = max(eval_every, checkpoint_every // eval_every * eval_every)
  schedule = loop.Schedule(total, config.log_every_steps, eval_every, checkpoint_every)
  if config.final_params == "best" and schedule.checkpoint_every % schedule.eval_every:
    raise ValueError(
        f"config.checkpoint_every_steps={config.checkpoint_every_steps} must be a multiple of "
        f"the evaluation interval ({schedule.eval_every} steps; config.eval_every_steps="
        f"{config.eval_every_steps}, 0 = automatic) when config.final_params='best', so every "
        f"checkpoint carries the validation accuracy it is chosen by.")
  return schedule


def _fresh_state(config, init, rng, data, state_sharding, workdir, is_main):
  """A new run's state: from word vectors or a pretrained encoder if the config asks."""
  pretrained_tokens = pretrained_params = None
  if config.model.embedding_init == "word2vec":
    pretrained_tokens = word2vec.pretrained_token_table(config, data.tokenizer, data.vocab_size,
                                                        write=is_main)
  if pretrain.enabled(config):
    # Every process writes its cache (atomically; identical content): caches may be per host.
    pretrained_params, curve = pretrain.pretrain(config, data.tokenizer, data.vocab_size)
    if is_main:
      pretrain.write_curve(workdir, curve)
  if baselines.has_frozen(config):  # idf / NB ratios of the training split
    pretrained_params = baselines.frozen_parameters(config, data.train.inputs, data.train.labels,
                                                    len(data.class_names), data.vocab_size)
  return jax.jit(init, out_shardings=state_sharding)(rng, pretrained_tokens, pretrained_params)


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


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains (or resumes), evaluates, and returns the final report's metrics.

  Holds the workdir lock (textattn.workdir) throughout; a workdir this call created is removed
  again if the run is refused before training starts. SIGINT/SIGTERM during training save a
  checkpoint and raise errors.Stopped (see loop.stop_on_signals)."""
  validate_config(config, jax.device_count())
  return in_workdir(workdir, lambda is_main, lock, progress: _train_and_evaluate(
      config, workdir, is_main, lock, progress))


def in_workdir(workdir: str, body):
  """body(is_main, lock, progress) holding the workdir lock; a workdir this call created is
  removed again if body fails before it sets progress["training"] (shared by the tasks)."""
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
  except Exception:
    if created and is_main and not progress["training"]:
      shutil.rmtree(workdir, ignore_errors=True)  # refused before training: leave no trace
    raise
  finally:
    lock.release()


def resume_or_start(config, workdir, manager, shapes, contract, machine, abstract_state,
                     state_sharding, attach, train_iter, fresh):
  """(state, start step, meta or None, skipped batches' steps): the newest checkpoint that passes
  the resume checks and verifies (the data iterator positioned after it), or `fresh()`."""
  is_main = jax.process_index() == 0
  metrics_path = os.path.join(workdir, "metrics.jsonl")
  metrics_check = (lambda: MetricWriter.read_rows(metrics_path, warn=False)) if is_main else None
  meta = checkpointing.check_resume(manager, workdir, shapes, contract,
                                    config.optimizer.schedule,
                                    [metrics_check] if metrics_check else [])
  if meta is None:
    return fresh(), 0, None, []
  if is_main:
    checkpointing.warn_machine_change(meta.get("machine", machine), machine)
  restored, meta = checkpointing.restore_verified(manager, meta, abstract_state, state_sharding)
  train_iter.set_state(restored["data"])
  if is_main:
    print(f"Resuming from checkpoint at step {meta['step']}.", flush=True)
  return attach(restored["state"]), meta["step"], meta, list(restored["data"].get("skipped", []))


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


def recovery(manager, train_iter, writer, model, tx, abstract_state, state_sharding, fresh):
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
    return restored["state"].replace(apply_fn=model.apply, tx=tx), restored_meta["step"]

  return recover


def _train_and_evaluate(config, workdir, is_main, lock, progress) -> dict:
  _, replicated = platform.data_parallel_shardings()

  data = data_lib.load_dataset(config, workdir, write=is_main)
  model = models.build_model(config, len(data.class_names), vocab_size=data.vocab_size)
  train_iter = data_lib.TrainIterator(data.train, config.batch_size, config.seed,
                                      jax.process_index(), jax.process_count())
  schedule = intervals(config, train_iter.steps_per_epoch)
  tx = optim.make_optimizer(config.optimizer, schedule.total_steps,
                            frozen=baselines.has_frozen(config))
  contract = checkpointing.run_contract(config, checkpointing.data_fingerprint(data),
                                        schedule.total_steps, schedule.eval_every,
                                        schedule.checkpoint_every)
  machine = platform.machine_signature(config)
  eval_data = data.validation if config.eval_split == "validation" else data.test
  eval_prefix = "val" if config.eval_split == "validation" else "test"
  if len(eval_data) == 0:
    raise ValueError(f"config.eval_split={config.eval_split!r} selects an empty split; with "
                     f"eval_split='validation' set config.val_fraction > 0.")

  def init(rng, pretrained_tokens=None, pretrained_params=None):
    return step.init_train_state(model, tx, rng, config.max_len, config.optimizer,
                                 pretrained_tokens, pretrained_params)

  rng = jax.random.key(config.seed)
  abstract_state = jax.eval_shape(init, rng)
  state_sharding = jax.tree.map(lambda _: replicated, abstract_state)
  shapes = checkpointing.state_shapes(abstract_state)
  if is_main:
    print(f"Model: {models.describe(config)}\n"
          + models.parameter_table(abstract_state.params), flush=True)

  manager = checkpointing.open_manager(workdir, config.keep_checkpoints)
  state, start_step, meta, skipped = resume_or_start(
      config, workdir, manager, shapes, contract, machine, abstract_state, state_sharding,
      lambda restored: restored.replace(apply_fn=model.apply, tx=tx), train_iter,
      lambda: _fresh_state(config, init, rng, data, state_sharding, workdir, is_main))

  writer = MetricWriter(workdir, is_main, start_step, fresh=meta is None)
  writer.drop_after(start_step if meta is not None else None)
  if is_main:
    write_config(workdir, config, start_step)

  options = platform.step_compiler_options(config)
  evaluator = make_evaluator(state_sharding, len(data.class_names), config.eval_batch_size,
                             data.class_names, options)
  last_eval = {}

  def evaluate(state, done, is_last):
    metrics, probabilities = evaluator(state, eval_data, eval_prefix)
    last_eval.update(step=done, metrics=metrics, probabilities=probabilities)
    # A final evaluation on test is written once, as the test report below.
    return None if (is_last and eval_prefix == "test") else metrics

  def save(done, state, eval_metrics):
    ckpt_metrics = ({"val/accuracy": eval_metrics["val/accuracy"]}
                    if eval_metrics and "val/accuracy" in eval_metrics else None)
    data_state = {**train_iter.get_state(), **({"skipped": list(skipped)} if skipped else {})}
    checkpointing.save(manager, done, state, data_state,
                       {"param_shapes": shapes, "class_names": data.class_names,
                        "run": contract, "machine": machine}, ckpt_metrics)
    if is_main:
      print(f"step {done}: checkpoint saved", flush=True)

  recover = recovery(manager, train_iter, writer, model, tx, abstract_state, state_sharding,
                      lambda: _fresh_state(config, init, rng, data, state_sharding, workdir,
                                           is_main))

  progress["training"] = True
  with loop.stop_on_signals(on_force_exit=lock.release) as stop:
    try:
      result = loop.fit(state, step.train_step, train_iter, schedule,
                        batch_size=config.batch_size, start_step=start_step,
                        steps_per_epoch=train_iter.steps_per_epoch, evaluate=evaluate,
                        save=save, writer=writer, compiler_options=options,
                        nonfinite_advice=lambda: nonfinite_advice(manager, config),
                        stop=stop, recover=recover, skipped=skipped)
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
  test_metrics = _test_report(config, result.state, manager, abstract_state, state_sharding,
                              model, tx, schedule.total_steps, last_eval, evaluator, data,
                              workdir, writer, is_main)
  manager.close()
  writer.close()
  return test_metrics


def _test_report(config, state, manager, abstract_state, state_sharding, model, tx, total_steps,
                 last_eval, evaluator, data, workdir, writer, is_main) -> dict:
  """Test metrics of the best-validation (or last) parameters, written and printed."""
  report_step = total_steps
  if config.final_params == "best" and manager.best_step() is not None:
    report_step = manager.best_step()
    if report_step != total_steps:
      state = restore_for_report(manager, report_step, abstract_state, state_sharding)
      state = state.replace(apply_fn=model.apply, tx=tx)
  if config.eval_split == "test" and last_eval.get("step") == report_step:
    test_metrics, test_probabilities = last_eval["metrics"], last_eval["probabilities"]
  else:
    test_metrics, test_probabilities = evaluator(state, data.test, "test")
  test_metrics["test/params_from_step"] = int(report_step)
  if is_main:
    compare.write_predictions(workdir, data.test.labels, test_probabilities, data.class_names,
                              report_step)
    writer.write_report(total_steps, test_metrics)
    print("Test report: " + ", ".join(
        f"{k.split('/', 1)[1]}={v:.4f}" if isinstance(v, float) else f"{k.split('/', 1)[1]}={v}"
        for k, v in test_metrics.items()), flush=True)
  return test_metrics


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
