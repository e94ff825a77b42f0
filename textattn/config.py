"""Configs: loaded by path or shipped name, siblings, and old workdirs' configs migrated.

Config files (configs/*.py) define `get_config()`: they start from a task's defaults
(`defaults.classification()`, `defaults.translation()`) or from another config file
(`defaults.sibling(__file__, "imdb_softmax.py")`) and change a few fields. The task's defaults
live in its task module, the runner's fields in textattn/run.py, the optimizer's in
textattn/optim.py; textattn/defaults.py hands them to config files.
"""

from __future__ import annotations

import importlib.util
import os

import ml_collections

from textattn.errors import RunError, UsageError

CONFIG_VERSION = 2  # of config.json and the run contract; migrate() brings older ones here


# What a version-1 config (written before config versions, until 2026-11-26) meant where it
# lacks a field that has another default now: the value the code fell back to then.
_V1_FALLBACKS = {"evals_per_epoch": 1}


def migrate(saved: dict, base: ml_collections.ConfigDict) -> dict:
  """A workdir's config (config.json, or a checkpoint's run contract, as a nested dict) brought
  to CONFIG_VERSION: every field of `base` (the task's defaults) it lacks is added with the
  value its version meant (_V1_FALLBACKS for version 1, else the default), so code reads every
  field directly and a resume compares every field. Fields `base` lacks (a recipe's) are kept."""
  version = saved.get("config_version", 1)
  if version > CONFIG_VERSION:
    raise RunError(f"This workdir was written by a newer textattn (config version {version}; "
                   f"this one reads up to {CONFIG_VERSION}); upgrade textattn to use it.")
  fallbacks = _V1_FALLBACKS if version == 1 else {}

  def fill(node: dict, defaults: dict, prefix: str) -> dict:
    out = dict(node)
    for key, default in defaults.items():
      name = prefix + key
      if isinstance(default, dict):
        out[key] = fill(node.get(key, {}), default, name + ".")
      elif key not in node:
        out[key] = fallbacks.get(name, default)
    return out

  migrated = fill(saved, base.to_dict(), "")
  migrated["config_version"] = CONFIG_VERSION
  return migrated


CONFIGS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def shipped_configs() -> list[str]:
  """The names of the configs that ship with textattn (textattn/configs/*.py)."""
  return sorted(name[:-3] for name in os.listdir(CONFIGS_DIR)
                if name.endswith(".py") and not name.startswith("_"))


def config_path(value: str) -> str:
  """--config's value as a path: an existing file as given, else a shipped config's name
  ("imdb_fastformer" or "imdb_fastformer.py", with an optional ":argument") as the path of
  that file in the installed package, so a name works from any directory."""
  path, sep, argument = value.partition(":")
  if os.path.isfile(path):
    return value
  name = path.removesuffix(".py")
  if os.sep not in name and name in shipped_configs():
    return os.path.join(CONFIGS_DIR, name + ".py") + sep + argument
  return value


def load(path: str) -> ml_collections.ConfigDict:
  """get_config() of the config file at `path` (or of the shipped config of that name), loaded
  by path (configs are not a package)."""
  path = config_path(path)
  if not os.path.isfile(path):
    raise UsageError(f"config file {path!r} does not exist.")
  name = "textattn_config_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def sibling(config_file: str, name: str) -> ml_collections.ConfigDict:
  """Inside a config file: `defaults.sibling(__file__, "imdb_softmax.py")` is the config of that
  file in the same directory, to start from."""
  return load(os.path.join(os.path.dirname(os.path.abspath(config_file)), name))
