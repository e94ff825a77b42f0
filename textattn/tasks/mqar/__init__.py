"""Multi-query associative recall (MQAR, Zoology: Arora et al. 2023, arXiv 2312.04927): a
causal model reads key-value pairs, then recalls each key's value when the key comes again.

For a config from `defaults.for_task("mqar")` (config.py): trains on fresh examples of one
setting (config.length tokens, config.pairs pairs; data.py, Zoology's generator) drawn from
(config.seed, the step), with the language model's decoder (textattn/models/decoder.py:
by default Zoology's two attention-only layers of one head, rotary positions) scored only at the
answers (step.py), on the runner (textattn/run.py: checkpoints, exact resume, the report). The
best checkpoint is the one of highest val/accuracy (a fixed validation set at the training
setting). The test report gives loss and accuracy per test setting (config.test_settings,
test/<LENGTH>x<PAIRS>/accuracy), and test/accuracy, their mean (every test example counts once,
as Zoology's valid/accuracy). `textattn.load(workdir)` gives a Recaller (.recall, .evaluate).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from textattn import platform, restore, tasks
from textattn.models import decoder
from textattn.tasks.mqar import data as data_lib
from textattn.tasks.mqar import step as step_lib
from textattn.tasks.mqar.config import defaults, validate


@dataclasses.dataclass
class ExampleSets:
  """A split: fixed example sets (data.Examples), one per setting. `inputs` and `labels` are
  what the runner's data fingerprint hashes (checkpointing.data_fingerprint): every set's
  tokens and query positions, and its answers."""
  sets: tuple

  def __len__(self) -> int:
    return sum(len(s) for s in self.sets)

  @property
  def inputs(self) -> np.ndarray:
    return np.concatenate([a.ravel() for s in self.sets for a in (s.inputs, s.query_positions)])

  @property
  def labels(self) -> np.ndarray:
    return np.concatenate([s.answers.ravel() for s in self.sets])


@dataclasses.dataclass
class MqarData:
  """The run's splits: train (its first batch of each setting, standing for the generator in
  the fingerprint),
  validation (the training setting) and test (one set per test setting)."""
  train: ExampleSets
  validation: ExampleSets
  test: ExampleSets
  class_names: list = dataclasses.field(default_factory=list)


def load_data(config) -> MqarData:
  train = data_lib.TrainBatches(data_lib.training_settings(config), config.batch_size,
                                config.seed, config.vocab_size, config.alpha, 1)
  validation = data_lib.fixed_set(config, data_lib.VALIDATION, data_lib.training_setting(config),
                                  config.val_examples)
  test = tuple(data_lib.fixed_set(config, data_lib.TEST, s, config.test_examples)
               for s in data_lib.test_settings(config))
  first = tuple(train.draw(n) for n in range(len(train.settings)))  # (one of each setting)
  return MqarData(ExampleSets(first), ExampleSets((validation,)), ExampleSets(test))


def build(config, mesh=None) -> decoder.LanguageModel:
  """The model of config.model for the task's vocabulary and its longest sequence."""
  return decoder.from_model_config(config.model, config.vocab_size, data_lib.longest(config),
                                   mesh)


def prepare(config, workdir: str, is_main: bool) -> tasks.Job:
  del workdir
  data = load_data(config)
  mesh = platform.config_mesh(config)
  module = build(config, mesh)
  train_iter = data_lib.TrainBatches(
      data_lib.training_settings(config), config.batch_size, config.seed, config.vocab_size,
      config.alpha, config.num_train_steps, *platform.row_block(mesh))
  evaluator = step_lib.make_evaluator(config.platform.eval_batch_size, mesh,
                                      platform.step_compiler_options(config))

  def evaluate(state, split, prefix):
    return evaluator(state, split.sets[0], prefix), None

  def report(state, report_step, reused):
    del report_step, reused  # (the evaluation during training is of validation)
    metrics = {}
    for examples in data.test.sets:
      metrics.update(evaluator(state, examples, f"test/{examples.setting.name}"))
    accuracies = [metrics[f"test/{s.setting.name}/accuracy"] for s in data.test.sets]
    metrics["test/accuracy"] = float(np.mean(accuracies))
    if is_main:
      print(describe_report(config, metrics), flush=True)
    return metrics

  def describe(params):
    count = sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(params))
    m = config.model
    mixed = f" (in turn after {config.mixed_settings})" if config.mixed_settings else ""
    return (f"Model: {m.num_layers}-layer {m.attention} decoder, embed {m.embed_dim}, "
            f"{m.num_heads} head(s), {m.position} positions, feed-forward {m.ffn_dim or 'none'}; "
            f"{count:,} parameters\nData: MQAR, vocabulary {config.vocab_size:,}, training "
            f"{config.length} tokens x {config.pairs} pairs{mixed}, fresh every step, alpha "
            f"{config.alpha}; validation {config.val_examples:,} examples; test "
            f"{config.test_examples:,} per setting: {config.test_settings}")

  return tasks.Job(
      data=data, module=module, init_length=config.length, train_iter=train_iter,
      train_step=step_lib.train_step, evaluate=evaluate, report=report, describe=describe)


def describe_report(config, metrics: dict) -> str:
  """The test accuracy per setting, one line each, those trained on marked."""
  trained, mixed = data_lib.training_setting(config), data_lib.training_settings(config)
  longest = max(s.length for s in mixed)
  lines = ["MQAR test accuracy per setting (LENGTHxPAIRS):"]
  for setting in data_lib.test_settings(config):
    note = ("  (the training setting)" if setting == trained else
            "  (mixed into training)" if setting in mixed else
            "  (longer than trained)" if setting.length > longest else "")
    lines.append(f"  {setting.name:>10}: {metrics[f'test/{setting.name}/accuracy']:.4f}{note}")
  return "\n".join(lines)


class Recaller:
  """What textattn.load(workdir) gives for an MQAR workdir: `.recall(inputs, query_positions)`
  (the predicted value at each query position) and `.evaluate(setting, count)` (accuracy on
  fresh examples of a setting such as "512x64")."""

  def __init__(self, workdir: str, checkpoint: str, config):
    self.config = config
    self.model = build(config)
    self.step, self.params = restore.restore_params(workdir, checkpoint, config, self.model,
                                                    config.length)
    self._logits = jax.jit(lambda params, inputs, at: self.model.apply(
        {"params": params}, inputs, logits_at=at))

  def recall(self, inputs, query_positions) -> np.ndarray:
    """int32 [batch, queries]: the model's argmax at `query_positions` of `inputs`."""
    logits = self._logits(self.params, jnp.asarray(inputs, jnp.int32),
                          jnp.asarray(query_positions, jnp.int32))
    return np.asarray(jnp.argmax(logits, -1))

  def evaluate(self, setting: str, count: int = 1000, seed: int = 12345) -> float:
    """Accuracy on `count` examples of `setting` ("LENGTHxPAIRS") drawn from `seed`."""
    parsed = data_lib.parse_settings(setting, "setting")[0]
    data_lib.check_setting(parsed, self.config.vocab_size, f"setting {setting!r}")
    if self.config.model.position == "learned" and parsed.length > self.model.max_len:
      raise ValueError(f"setting {setting!r}: a learned position table has {self.model.max_len} "
                       f"rows, fewer than its length.")
    examples = data_lib.generate(np.random.default_rng(seed), count, parsed,
                                 self.config.vocab_size, self.config.alpha)
    return float(np.mean(self.recall(examples.inputs, examples.query_positions)
                         == examples.answers))


tasks.register(tasks.Task(
    name="mqar", defaults=defaults, validate=validate, prepare=prepare, load=Recaller,
    description="multi-query associative recall, Zoology's MQAR (textattn/tasks/mqar/)"))
