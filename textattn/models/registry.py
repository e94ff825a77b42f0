"""The architecture registry: each classification architecture registers itself by name when
its module is imported, the way attention variants do (textattn/attention/registry.py).

A config names its architecture by config.model.architecture ("transformer", "bag", "bilstm"),
or, with config.model.pretrained set, the pretrained encoder ("pretrained",
textattn/pretrained/finetune.py). Nothing outside an architecture's own module branches on its
name: a new one is a module that calls `register(Architecture(...))`.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import ml_collections

from textattn.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Architecture:
  """build(config, num_classes, vocab_size, pretrained_config, mesh) -> the Flax classifier;
  describe(config) -> one line naming it; validate(config): its own fields' checks (UsageError);
  encoder_config(config): a pretrained encoder's configuration, read from the model it names."""
  name: str
  build: Callable[..., Any]
  describe: Callable[[ml_collections.ConfigDict], str]
  validate: Callable[[ml_collections.ConfigDict], None] | None = None
  encoder_config: Callable[[ml_collections.ConfigDict], Any] | None = None


_ARCHITECTURES: dict[str, Architecture] = {}
# The built-in architectures' modules, imported by name on first look-up (as the task registry
# does): the pretrained encoder's lives with the other pretrained code, above this package.
_BUILT_IN = ("textattn.models.encoder", "textattn.models.baselines",
             "textattn.pretrained.finetune")


def register(architecture: Architecture) -> Architecture:
  _ARCHITECTURES[architecture.name] = architecture
  return architecture


def _load_built_in() -> None:
  for module in _BUILT_IN:
    importlib.import_module(module)


def name_of(config: ml_collections.ConfigDict) -> str:
  """The architecture a config describes."""
  return "pretrained" if config.model.pretrained else config.model.architecture


def names() -> tuple[str, ...]:
  _load_built_in()
  return tuple(_ARCHITECTURES)


def get(name: str) -> Architecture:
  _load_built_in()
  if name not in _ARCHITECTURES:
    raise UsageError(f"config.model.architecture={name!r} is not a registered architecture; "
                     f"allowed: {', '.join(a for a in _ARCHITECTURES if a != 'pretrained')}.")
  return _ARCHITECTURES[name]


def describe(config: ml_collections.ConfigDict) -> str:
  """One line naming the config's model, e.g. "additive attention, attention pooling"."""
  return get(name_of(config)).describe(config)
