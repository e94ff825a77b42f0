"""The task registry (each task registers itself by name when its module is imported), and the
Job a task hands the runner.

A task is what a run trains for (text classification, translation, a plugin's own): its data,
model, loss and metric sums, evaluation and final report, and what `textattn.load(workdir)`
offers. Everything else -- the workdir lock, config record, resume contract, checkpoints,
metric writers, signal stop, NaN recovery -- is the runner's (textattn/run.py), written once.
The commands dispatch on `config.task` through this registry and never branch on a task's
name, so a new task is one module that calls `register(Task(...))`, loaded with
`--plugin=MODULE` if it lives outside textattn (example: tests/toy_task.py).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import ml_collections

from textattn.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Task:
  """One task behind the runner.

  defaults() -> the task's default config (config files start from it; `task` names this task).
  validate(config, device_count): UsageError naming the first bad field. Called once, at start,
    before the workdir is touched; device_count is None before JAX has started (the static
    checks) and the device count after device discovery (the checks that depend on it).
  prepare(config, workdir, is_main) -> Job: the task's data, model, steps, evaluation and
    report for one run (Job below says what it holds).
  load(workdir, checkpoint, config) -> what `textattn.load(workdir)` returns for a workdir of
    this task (a classifier's .predict/.explain, a translator's .translate, ...).
  """
  name: str
  defaults: Callable[[], ml_collections.ConfigDict]
  validate: Callable[[ml_collections.ConfigDict, int | None], None]
  prepare: Callable[[ml_collections.ConfigDict, str, bool], Any]
  load: Callable[[str, str, ml_collections.ConfigDict], Any]
  description: str = ""
  # Opt-in parts of the task's config (path -> its defaults), left out of `defaults` and
  # completed by the runner (config.complete): what only one data source, architecture or
  # recipe uses. A config sets one only to change it.
  parts: dict[str, Callable[[], ml_collections.ConfigDict]] = dataclasses.field(
      default_factory=dict)


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
    "test"/"test").
  metric / higher_is_better: the evaluation metric the best checkpoint is chosen by (and the
    report's parameters, under final_params="best"): "val/accuracy" for classification and
    translation; a language model's "val/bits_per_byte" would be lower-is-better.
  describe(abstract_params) -> the lines printed before training (model, sizes).
  pretrained() -> (token table, parameters) a fresh run starts from (None: random); called
    only when the run does not resume.
  trainable(path) -> whether the parameter at that tree path trains (None: all do); the
    others keep their start (baselines' idf / NB ratios; a stage that trains new weights only).
  attention_impl: the kernel setting the machine signature records.
  checkpoint_meta: what every checkpoint must record besides the runner's own fields (a
    classifier's class names, which prediction reads back).
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
  trainable: Callable[[tuple], bool] | None = None
  metric: str = "val/accuracy"
  higher_is_better: bool = True
  attention_impl: str = "xla"
  checkpoint_meta: dict = dataclasses.field(default_factory=dict)


_TASKS: dict[str, Task] = {}
_BUILT_IN = ("textattn.tasks.classification", "textattn.tasks.translation",
             "textattn.tasks.language_model", "textattn.tasks.mqar")


def register(task: Task) -> Task:
  """Adds `task`; the same name registered twice with another definition is an error."""
  existing = _TASKS.get(task.name)
  if existing is not None and existing != task:
    raise ValueError(f"task {task.name!r} is already registered ({existing.description}); "
                     f"choose another name.")
  _TASKS[task.name] = task
  return task


def unregister(name: str) -> None:
  """Removes a task (tests that register a toy one clean up with this)."""
  _TASKS.pop(name, None)


def _load_built_in() -> None:
  for module in _BUILT_IN:
    importlib.import_module(module)


def names() -> tuple[str, ...]:
  _load_built_in()
  return tuple(_TASKS)


def get(name: str) -> Task:
  _load_built_in()
  if name not in _TASKS:
    raise UsageError(f"config.task={name!r} is not a known task; allowed: {', '.join(_TASKS)} "
                     f"(a module that registers more can be loaded with --plugin=MODULE).")
  return _TASKS[name]
