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
  shipped_configs,
  sibling,
)
from textattn.paths import cache_root  # noqa: F401 -- (re-exported)
from textattn.run import read_workdir_config  # noqa: F401 -- (re-exported)


def classification() -> ml_collections.ConfigDict:
  """The classification task's defaults with the runner's fields (textattn/tasks/classification/)."""
  return run.task_defaults("classification")


def translation() -> ml_collections.ConfigDict:
  """The translation task's defaults with the runner's fields (textattn/tasks/translation/)."""
  return run.task_defaults("translation")


def for_task(name: str) -> ml_collections.ConfigDict:
  """Any registered task's defaults with the runner's fields (a plugin task's config files)."""
  return run.task_defaults(name)


def optimizer() -> ml_collections.ConfigDict:
  """The optimizer's fields (textattn/optim.py)."""
  return optim.defaults()


def run_fields(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The runner's fields added to `config` (textattn/run.py): for a plugin task's defaults."""
  return run.fields(config)
