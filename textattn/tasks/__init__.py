"""The task registry: each task registers itself by name when its module is imported.

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

import ml_collections

from textattn.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Task:
  """One task behind the runner.

  defaults() -> the task's default config (config files start from it; `task` names this task).
  validate(config, device_count): UsageError naming the first bad field. Called once, at start,
    before the workdir is touched; device_count is None before JAX has started (the static
    checks) and the device count after device discovery (the checks that depend on it).
  prepare(config, workdir, is_main) -> run.Job: the task's data, model, steps, evaluation and
    report for one run (textattn/run.py says what a Job holds).
  load(workdir, checkpoint, config) -> what `textattn.load(workdir)` returns for a workdir of
    this task (a classifier's .predict/.explain, a translator's .translate, ...).
  """
  name: str
  defaults: Callable[[], ml_collections.ConfigDict]
  validate: Callable[[ml_collections.ConfigDict, int | None], None]
  prepare: Callable[[ml_collections.ConfigDict, str, bool], Any]
  load: Callable[[str, str, ml_collections.ConfigDict], Any]
  description: str = ""


_TASKS: dict[str, Task] = {}
_BUILT_IN = ("textattn.tasks.classification", "textattn.tasks.translation")


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
