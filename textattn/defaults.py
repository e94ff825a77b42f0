"""What config files start from: `defaults.classification()`, `defaults.translation()`, or a
sibling config (`defaults.sibling(__file__, "imdb_softmax.py")`).

Thin names over where each part lives: a task's own fields in its task module
(textattn/tasks/), the runner's in textattn/run.py, the optimizer's in textattn/optim.py,
loading and migrating configs in textattn/config.py, the field checkers in textattn/checks.py.
"""

from __future__ import annotations

import ml_collections

from textattn import optim, run
from textattn.checks import check_choice, check_integer  # noqa: F401 -- (re-exported)
from textattn.config import (  # noqa: F401 -- (re-exported)
  CONFIG_VERSION,
  CONFIGS_DIR,
  config_path,
  load,
  migrate,
  set_fields,
  shipped_configs,
  sibling,
)
from textattn.paths import cache_root  # noqa: F401 -- (re-exported)
from textattn.run import complete, read_workdir_config, with_parts  # noqa: F401 -- (re-exported)


def classification(*parts: str) -> ml_collections.ConfigDict:
  """The classification task's defaults with the runner's fields (textattn/tasks/classification/),
  and the opt-in `parts` named ("source", "ngrams", ...: a config adds those it changes)."""
  return for_task("classification", *parts)


def translation(*parts: str) -> ml_collections.ConfigDict:
  """The translation task's defaults with the runner's fields (textattn/tasks/translation/)."""
  return for_task("translation", *parts)


def for_task(name: str, *parts: str) -> ml_collections.ConfigDict:
  """Any registered task's defaults with the runner's fields (a plugin task's config files),
  and the opt-in `parts` named (run.PARTS, the task's Task.parts)."""
  return run.with_parts(run.task_defaults(name), *parts)


def optimizer() -> ml_collections.ConfigDict:
  """The optimizer's fields (textattn/optim.py)."""
  return optim.full_defaults()


def run_fields(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The runner's fields added to `config` (textattn/run.py): for a plugin task's defaults."""
  return run.fields(config)
