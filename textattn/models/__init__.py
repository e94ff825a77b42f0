"""The classification models, by architecture: attention encoder (encoder.py), n-gram bag and
BiLSTM (baselines.py), pretrained BERT-family encoder (bert.py; registered by
textattn/pretrained/finetune.py). Each registers itself (registry.py); `build_model` looks the
config's up. The translation model is seq2seq.py; the decoder-only one (the language model's
and MQAR's) decoder.py.

Token id 0 is padding everywhere: the padding mask is `tokens != 0`, it is handed to every
attention variant, and no pooling lets a padding position contribute. The one exception is
`mask_padding=False` (config.layout.padding="before_as_token", the Keras seed's computation): then
nothing is masked and id 0 is a token like any other.
"""

from __future__ import annotations

import ml_collections

from textattn.models import registry
from textattn.models.encoder import (  # noqa: F401 -- (the package's names)
  DTYPES,
  NORMS,
  POOLINGS,
  POSITIONS,
  Classifier,
  abstract_params,
  count_parameters,
  parameter_table,
  resolved_kernel,
  validate_model_config,
)


def build_model(config: ml_collections.ConfigDict, num_classes: int,
                vocab_size: int | None = None, pretrained_config=None, mesh=None):
  """The classifier a config describes; `mesh`: the run's (platform.config_mesh), whose
  sequence axis, if it has more than one device, splits the encoder's attention (None: one
  device's model, as for prediction). `vocab_size` (ids the tokenizer uses) defaults to
  config.vocab_size (258 for the byte tokenizer). With config.model.pretrained,
  `pretrained_config` is the encoder's BertConfig (finetune.load, or finetune.read_config of a
  workdir; None: read from the model's config.json)."""
  validate_model_config(config)
  return registry.get(registry.name_of(config)).build(config, num_classes, vocab_size,
                                                      pretrained_config, mesh)


def describe(config: ml_collections.ConfigDict) -> str:
  """One line naming the config's model, e.g. "additive attention, attention pooling"."""
  return registry.describe(config)
