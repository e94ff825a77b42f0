"""The text-classification task: texts and labels -> a classifier -> test accuracy.

Its data come from TFDS or the user's .csv/.tsv/.jsonl files (textattn/data), its models are
the architectures of textattn/models/ (attention encoder, n-gram bag, BiLSTM, pretrained
encoder), its steps are step.py's (cross-entropy; loss, correct and confusion sums), and its
report is the test split's accuracy, weighted F1 and per-class precision/recall from the
parameters the runner chose, with the class probabilities in test_predictions.npz
(predictions.py; read by textattn.compare and textattn.ensemble). `textattn.load(workdir)`
gives a classifier.Classifier (.predict/.evaluate/.explain). The wing: config.py (fields and
checks), step.py, kernels.py, classifier.py, explain.py, predictions.py.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os

import jax
import jax.numpy as jnp
import numpy as np

from textattn import data as data_lib
from textattn import models, platform, progress, tasks
from textattn.data import atomic_write
from textattn.errors import UsageError
from textattn.metrics import summarize_eval
from textattn.models import baselines
from textattn.pretrained import finetune
from textattn.recipes import attention_transfer, pretrain, vectors, word2vec
from textattn.tasks.classification import classifier, kernels, predictions, step
from textattn.tasks.classification.config import PARTS, defaults, validate


def collapse_warning(sums: dict, class_names, prefix: str) -> str | None:
  """A line for an evaluation that shows a model which learnt nothing, else None: predictions
  that all fall in one class although the examples hold several (seen on a news set where the
  Keras seed config scored 25% on four classes and reported it like any result), or a loss at
  ln(classes), what a uniform guess scores, with an accuracy no better than always predicting the
  most frequent class (seen when swapping a pretrained encoder's attention: IMDB validation
  0.4860 at loss 0.6935 while some of its predictions were of each class)."""
  confusion = np.asarray(sums["confusion"], np.float64)  # rows: true class, columns: predicted
  predicted = np.flatnonzero(confusion.sum(0))
  if np.count_nonzero(confusion.sum(1)) < 2:  # (a split of one class: nothing to compare with)
    return None
  count = float(sums["count"])
  loss, chance = float(sums["loss_sum"]) / count, float(np.log(len(class_names)))
  near_chance = abs(loss - chance) < 0.02
  split = {"val": "validation"}.get(prefix, prefix)
  advice = ("try a lower optimizer.learning_rate, another seed, or on a small data set the n-gram "
            "baseline (configs/imdb_nbsvm.py).")
  if len(predicted) == 1:
    constant = (f"; its loss {loss:.4f} is near ln {len(class_names)} = {chance:.4f}, what a "
                f"uniform guess scores" if near_chance else "")
    return (f"Warning: all {int(count):,} {split} examples are predicted "
            f"{class_names[int(predicted[0])]!r}: the model has collapsed to one class{constant}; "
            f"{advice}")
  accuracy, majority = np.trace(confusion) / count, confusion.sum(1).max() / count
  if near_chance and accuracy <= majority + 0.01:
    return (f"Warning: the {split} loss {loss:.4f} is near ln {len(class_names)} = {chance:.4f}, "
            f"what a uniform guess scores, and the accuracy {accuracy:.4f} is no better than "
            f"always predicting the most frequent class ({majority:.4f}): the model has learnt "
            f"nothing yet; if later evaluations say the same, {advice}")
  return None


def make_evaluator(state_sharding, num_classes: int, eval_batch_size: int, class_names,
                   compiler_options=None, mesh=None):
  """evaluate(state, split, prefix) -> (metrics, class probabilities [N, C] for "test" else
  None). Eval batches are consecutive examples with weight-0 padding at the end, laid out on
  `mesh` (the run's, platform.run_mesh; None: data parallelism over all devices)."""
  mesh = mesh if mesh is not None else platform.run_mesh()
  jitted = {}

  def compiled(with_probabilities, state, batch):
    if with_probabilities not in jitted:  # (every eval batch has one shape)
      jitted[with_probabilities] = jax.jit(
          lambda s, b: step.eval_step(s, b, num_classes, probabilities=with_probabilities),
          in_shardings=(state_sharding, platform.batch_shardings(mesh, batch)),
          out_shardings=platform.replicated(mesh), compiler_options=compiler_options)
    return jitted[with_probabilities](state, batch)

  def evaluate(state, split, prefix):
    with_probabilities = prefix == "test"
    totals, probabilities = None, []
    countdown = progress.Countdown(prefix, len(split), jax.process_index() == 0)
    for index, batch in enumerate(data_lib.eval_batches(split, eval_batch_size,
                                                        *platform.row_block(mesh))):
      sums = compiled(with_probabilities, state, platform.to_global(batch, mesh))
      if with_probabilities:
        probabilities.append(sums.pop("probabilities"))
      totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
      countdown.update((index + 1) * eval_batch_size, totals)
    totals = jax.device_get(totals)
    metrics = summarize_eval(totals, class_names, prefix)
    warning = collapse_warning(totals, class_names, prefix)
    if warning:  # printed now, and kept with the evaluation's row (the test report's too)
      metrics[f"{prefix}/warning"] = warning
      if jax.process_index() == 0:
        print(warning, flush=True)
    if not with_probabilities:
      return metrics, None
    return metrics, np.concatenate(jax.device_get(probabilities))[:len(split)]

  return evaluate


def prepare(config, workdir: str, is_main: bool) -> tasks.Job:
  # A pretrained encoder: its config and tokenizer from the workdir once a run saved them (a
  # resume needs no model directory), else from the model directory, whose weights a fresh
  # start then uses.
  bert_config = source = None
  if finetune.enabled(config):
    bert_config = finetune.read_config(workdir)
    if bert_config is None:
      source = finetune.load(config)
      bert_config = source.config
  data = data_lib.load_dataset(config, workdir, write=is_main,
                               tokenizer=source.tokenizer if source else None)
  if is_main:
    print(data_lib.describe(config, data), flush=True)
  if bert_config is not None and is_main and source is not None:
    finetune.save_config(workdir, bert_config)
  return make_job(config, data, workdir, is_main, bert_config=bert_config, source=source)


def teacher_log_probs(config, data, workdir: str | None, is_main: bool,
                      bert_config) -> np.ndarray:
  """float32 [N, classes]: the log-probabilities the teacher run (attention_transfer.teacher)
  gives the training split, read from the workdir when an earlier start saved them for the same
  teacher (its real path, kept in the file beside them: a restart of a workdir with no
  checkpoint yet may name another one) and the same training rows (their digest, kept too:
  another data_seed or file gives as many rows in another order); a resume does not recompute
  them (nor need the teacher's workdir still there)."""
  path = os.path.join(workdir, attention_transfer.TEACHER_FILE) if workdir else None
  teacher_dir = os.path.realpath(config.attention_transfer.teacher)
  rows = hashlib.sha256(np.ascontiguousarray(data.train.inputs).tobytes()).hexdigest()
  if path and os.path.isfile(path):
    with contextlib.suppress(Exception), np.load(path) as saved:  # (unreadable: recomputed)
      if (str(saved["teacher"]) == teacher_dir and str(saved["rows"]) == rows
          and saved["log_probs"].shape == (len(data.train), len(data.class_names))):
        return saved["log_probs"]
  teacher = classifier.softmax_teacher(config.attention_transfer.teacher, config, bert_config,
                                       data.class_names)
  probabilities = teacher.probabilities(data.train.inputs,
                                        progress="teacher predictions" if is_main else None)
  log_probs = np.log(np.maximum(probabilities, np.finfo(np.float32).tiny)).astype(np.float32)
  if path and is_main:
    atomic_write(path, lambda f: np.savez(f, log_probs=log_probs, teacher=teacher_dir,
                                          rows=rows), "wb")
  return log_probs


def distilled_step(config, data, workdir, is_main, bert_config):
  """(train_step, the TrainIterator's extras): step.train_step with, under
  attention_transfer.distill, the distillation bound and the teacher's predictions batched."""
  if "attention_transfer" not in config or not config.attention_transfer.distill:
    return step.train_step, None
  extras = {"teacher_log_probs": teacher_log_probs(config, data, workdir, is_main, bert_config)}
  return functools.partial(
      step.train_step, distill=float(config.attention_transfer.distill),
      temperature=float(config.attention_transfer.distill_temperature)), extras


def make_job(config, data, workdir: str | None, is_main: bool, pretrained=None,
             bert_config=None, source=None) -> tasks.Job:
  """The runner's Job for `data` (a data.Dataset); `pretrained`: the fresh start's (token table,
  parameters) when the caller has them (a sweep's export), else the config's recipes;
  `bert_config` / `source`: a pretrained encoder's config and loaded weights (finetune)."""
  kernel_config = kernels.pinned_kernel(config, workdir, is_main, bert_config=bert_config)
  mesh = platform.config_mesh(config)
  model = models.build_model(kernel_config, len(data.class_names), vocab_size=data.vocab_size,
                             pretrained_config=bert_config, mesh=mesh)
  train_step, extras = distilled_step(config, data, workdir, is_main, bert_config)
  train_iter = data_lib.TrainIterator(data.train, config.batch_size, config.seed,
                                      *platform.row_block(mesh), extras=extras)
  evaluator = None

  def evaluate(state, split, prefix):
    nonlocal evaluator
    if evaluator is None:  # (the state's sharding: replicated over the run's mesh)
      evaluator = make_evaluator(jax.tree.map(lambda _: platform.replicated(mesh), state),
                                 len(data.class_names), config.platform.eval_batch_size,
                                 data.class_names, platform.step_compiler_options(config), mesh)
    return evaluator(state, split, prefix)

  def report(state, report_step, reused):
    if reused is None and is_main:  # (IMDB's 25,000 reviews: a minute or more on a CPU)
      print(f"Evaluating the test split ({len(data.test):,} examples) with the parameters of "
            f"step {report_step} ...", flush=True)
    metrics, probabilities = reused or evaluate(state, data.test, "test")
    if is_main:
      predictions.write_predictions(workdir, data.test.labels, probabilities, data.class_names,
                                report_step)
    return metrics

  def start():
    """A new run's start: word vectors, a pretrained encoder or a baseline's frozen statistics
    if the config asks."""
    tokens = params = None
    if config.embedding.init == "word2vec":
      tokens = word2vec.pretrained_token_table(config, data.tokenizer, data.vocab_size,
                                               write=is_main)
    if vectors.is_vectors(config.embedding.init):
      tokens = vectors.token_table(config, data.tokenizer, data.vocab_size, announce=is_main)
    if finetune.enabled(config):
      nonlocal source
      if source is None:  # (a workdir with no checkpoint yet: the weights are needed again)
        source = finetune.load(config)
        if source.config != bert_config:
          raise UsageError(f"config.model.pretrained={config.model.pretrained!r} is not the "
                           f"model this workdir was started with (its "
                           f"{finetune.WORKDIR_FILE} differs); use a new workdir.")
      params = finetune.start_params(model, config.max_len, source, announce=is_main)
      if attention_transfer.enabled(config):  # (deterministic: a killed stage repeats exactly)
        teacher = None  # (the pretrained checkpoint) or a finished softmax run's parameters
        if config.attention_transfer.teacher:
          teacher = classifier.softmax_teacher(config.attention_transfer.teacher, config,
                                               bert_config, data.class_names).params
        params, curve = attention_transfer.run_stage(config, model, source, data.train.inputs,
                                                     announce=is_main, teacher_params=teacher)
        if is_main:
          attention_transfer.write_curve(workdir, curve)
    if pretrain.enabled(config):
      # Every process writes its cache (atomically; identical content): caches may be per host.
      params, curve = pretrain.pretrain(config, data.tokenizer, data.vocab_size)
      if is_main:
        pretrain.write_curve(workdir, curve)
    if baselines.has_frozen(config):  # idf / NB ratios of the training split
      params = baselines.frozen_parameters(config, data.train.inputs, data.train.labels,
                                           len(data.class_names), data.vocab_size)
    return tokens, params

  eval_split = config.eval_split
  return tasks.Job(
      data=data, module=model, init_length=config.max_len, train_iter=train_iter,
      train_step=train_step, evaluate=evaluate, report=report,
      describe=lambda params: (f"Model: {models.describe(config)}\n"
                               + models.parameter_table(params)),
      eval_split=eval_split, eval_prefix="val" if eval_split == "validation" else "test",
      pretrained=pretrained or start, trainable=baselines.trainable(config),
      attention_impl=models.resolved_kernel(kernel_config, bert_config),
      checkpoint_meta={"class_names": data.class_names})


def load(workdir: str, checkpoint: str, config):
  return classifier.Classifier(workdir, checkpoint, config=config)


tasks.register(tasks.Task(
    name="classification", defaults=defaults, validate=validate,
    prepare=prepare, load=load, parts=PARTS,
    description="text classification (textattn/tasks/classification/)"))
