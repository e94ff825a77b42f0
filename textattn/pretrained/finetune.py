"""Layer-wise learning-rate decay for fine-tuning a pretrained encoder (Clark et al. 2020,
ELECTRA; Howard & Ruder 2018's discriminative rates): the classifier head and the pooler learn at
the full rate, the last block at `decay` times it, each block below at `decay` times the one
above, the embeddings at decay ** (num_layers + 1). Lower layers hold the most general features
and move least.

    tx = optax.chain(optax.adamw(schedule, weight_decay=0.01),
                     scale_by_layer_decay(layer_decay_scales(params, num_layers, 0.9)))

Scaling AdamW's update scales its weight-decay term with it, as ELECTRA's and BEiT's
implementations do (they scale the layer's learning rate).
"""

from __future__ import annotations

import re

import jax
import optax

_BLOCK = re.compile(r"^block_(\d+)$")


def layer_depth(path: tuple[str, ...], num_layers: int) -> int:
  """0 for the embeddings, i + 1 for block_i, num_layers + 1 for everything above (pooler,
  head); the encoder's modules are found by name wherever the encoder sits in the tree."""
  for name in path:
    if name == "embeddings":
      return 0
    match = _BLOCK.match(name)
    if match:
      return int(match.group(1)) + 1
  return num_layers + 1


def layer_decay_scales(params, num_layers: int, decay: float):
  """A pytree like `params` of each leaf's learning-rate multiplier, decay ** (top - depth)."""
  if not 0.0 < decay <= 1.0:
    raise ValueError(f"The layer-wise learning-rate decay {decay} must be in (0, 1].")

  def scale(path, leaf):
    del leaf
    names = tuple(str(getattr(key, "key", key)) for key in path)
    return float(decay ** (num_layers + 1 - layer_depth(names, num_layers)))

  return jax.tree_util.tree_map_with_path(scale, params)


def scale_by_layer_decay(scales) -> optax.GradientTransformation:
  """Multiplies each update by its `layer_decay_scales` entry (put it after the optimizer)."""

  def update(updates, state, params=None):
    del params
    return jax.tree_util.tree_map(lambda u, s: u * s, updates, scales), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)
