"""Configs: loaded by path or shipped name, siblings, and old workdirs' configs migrated.

Config files (configs/*.py) define `get_config()`: they start from a task's defaults
(`defaults.classification()`, `defaults.translation()`) or from another config file
(`defaults.sibling(__file__, "imdb_softmax.py")`) and change a few fields. The task's defaults
live in its task module, the runner's fields in textattn/run.py, the optimizer's in
textattn/optim.py; textattn/defaults.py hands them to config files.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable

import ml_collections

from textattn.errors import DataError, RunError, UsageError, one_line

CONFIG_VERSION = 3  # of config.json and the run contract; migrate() brings older ones here


# What a version-1 config (written before config versions, until 2026-11-26) meant where it
# lacks a field that has another default now: the value the code fell back to then.
_V1_FALLBACKS = {"evals_per_epoch": 1}

# Version 3 (2026-11-27) moved the fields only one data source, architecture, recipe or platform
# uses into opt-in parts (complete() below); a version 1-2 config's field -> its new place.
MOVED_IN_V3 = {
    "text_fields": "source.text_fields", "label_field": "source.label_field",
    "columns": "source.columns", "validation_file": "source.validation_file",
    "test_file": "source.test_file", "validation_text_fields": "source.validation_text_fields",
    "test_text_fields": "source.test_text_fields",
    "truncation": "layout.truncation", "padding": "layout.padding",
    "ngram_order": "ngrams.order", "ngram_counts": "ngrams.counts",
    "model.bag_weighting": "ngrams.weighting", "model.rnn_dim": "bilstm.rnn_dim",
    "model.embedding_init": "embedding.init", "model.vectors_scale": "embedding.vectors_scale",
    "model.token_dropout_rate": "embedding.token_dropout_rate",
    "model.bigram_buckets": "embedding.bigram_buckets",
    "num_cpu_devices": "platform.num_cpu_devices", "xla_flags": "platform.xla_flags",
    "deterministic": "platform.deterministic", "eval_batch_size": "platform.eval_batch_size",
    "optimizer.b1": "optimizer.adam.b1", "optimizer.b2": "optimizer.adam.b2",
    "optimizer.eps": "optimizer.adam.eps",
}


def _move(node: dict, moved: dict[str, str]) -> dict:
  """A nested config dict with each field `old` of `moved` that it has put at `moved[old]`."""
  node = json.loads(json.dumps(node))  # (a deep copy)
  for old, new in moved.items():
    *old_parents, old_name = old.split(".")
    parent = node
    for name in old_parents:
      parent = parent.get(name) if isinstance(parent, dict) else None
    if not isinstance(parent, dict) or old_name not in parent:
      continue
    value = parent.pop(old_name)
    *new_parents, new_name = new.split(".")
    target = node
    for name in new_parents:
      target = target.setdefault(name, {})
    target[new_name] = value
  return node


def set_fields(config: ml_collections.ConfigDict, fields: dict) -> ml_collections.ConfigDict:
  """Sets each field of `fields` (a dotted path: "source.columns", "model.embed_dim") in `config`
  and returns it; a version 1-2 name of a field that moved (MOVED_IN_V3: "columns") is set at
  its new place, so scripts written for those versions keep working."""
  for path, value in fields.items():
    *parents, name = MOVED_IN_V3.get(path, path).split(".")
    node = config
    for parent in parents:
      node = node[parent]
    node[name] = value
  return config


def complete(config: ml_collections.ConfigDict,
             parts: dict[str, Callable[[], ml_collections.ConfigDict]]) -> ml_collections.ConfigDict:
  """A copy of `config` with every opt-in part (path -> its defaults: "source", "optimizer.adam")
  it lacks added, and the fields a part it has lacks filled in, so code reads them directly.
  A config sets only the parts it changes (`config.ngrams = ngrams.default_config()`); the
  runner completes it once, at start."""
  config = ml_collections.ConfigDict(config.to_dict())
  for path, defaults in parts.items():
    *parents, name = path.split(".")
    node = config
    for parent in parents:
      node = node[parent]
    full = defaults()
    if name in node:
      for key, value in node[name].items():
        if key not in full:
          raise UsageError(f"config.{path}.{key}: config.{path} has no field {key!r}; its "
                           f"fields are: {', '.join(full.keys())}.")
        full[key] = value
    node[name] = full
  return config


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
  if version < 3:
    saved = _move(saved, MOVED_IN_V3)

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


def read_saved(path: str) -> dict:
  """A workdir's config.json as a dict; unreadable, damaged or not a JSON object: a DataError
  in one line (the workdir's other files are left as they are)."""
  try:
    with open(path, encoding="utf-8") as f:
      saved = json.load(f)
  except (OSError, ValueError) as e:
    raise DataError(f"{path} cannot be read as a run's config ({one_line(e, 120)}); restore "
                    f"it from a copy, or give another workdir.") from None
  if not isinstance(saved, dict):
    raise DataError(f"{path} holds no run config (a JSON object); restore it from a copy, or "
                    f"give another workdir.")
  return saved
