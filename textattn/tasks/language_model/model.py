"""The language model: textattn/models/decoder.py's LanguageModel (token embedding, positions,
the translation decoder's blocks without cross-attention, logits) over the task's config."""

from __future__ import annotations

from textattn.models.decoder import POSITIONS, LanguageModel, from_model_config

__all__ = ["POSITIONS", "LanguageModel", "build"]


def build(config, vocab_size: int, mesh=None) -> LanguageModel:
  """`mesh`: the run's (platform.config_mesh); its sequence axis, if it has more than one device,
  splits the attention (None: one device's model, as for generation)."""
  return from_model_config(config.model, vocab_size, config.max_len, mesh)
