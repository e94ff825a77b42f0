"""Attention transfer (issue 55): train a pretrained encoder's new attention to reproduce its
softmax attention, layer by layer, before fine-tuning (Hedgehog, Zhang et al. 2024; LoLCATs'
first stage, arXiv 2410.10254).

The teacher is a frozen softmax BERT-family encoder (bert.BertClassifier's parameters); the
student is the same encoder with another attention variant (`config.model.attention`), started
from the teacher's weights where names and shapes match (textattn/pretrained/finetune.py). For
each layer l the teacher's hidden state h_l entering block l is computed once per batch (the
teacher's embeddings and blocks, dropout off); the teacher's attention output a_l = A_l(h_l) and
the student's s_l = A'_l(h_l), both before the residual and LayerNorm, are compared:

    loss = sum_l mean over real positions and features of (s_l - a_l)^2

Every layer sees the teacher's own input, so the layers train independently (LoLCATs' "layer-wise
attention transfer"), and the loss is exactly 0 when the student is the teacher (softmax into
softmax). What trains (`trainable`): the student attention's parameters the teacher does not have
(a feature map, a hybrid's mix, additive attention's alpha/beta) and, by default, its output
projection "out" ("new", "new+out", "new+out+qk": queries and keys too); everything else is
frozen (optax.masked: no update, no optimizer state). This module holds the stage's pure pieces:
`layer_inputs`, `transfer_loss`, `trainable`, `make_step`; not yet wired into a run's start.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from textattn import attention as attention_lib
from textattn.checks import check_choice
from textattn.models import bert

TRAINS = ("new", "new+out", "new+out+qk")


def default_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.num_steps = 300  # 0: no transfer stage
  c.learning_rate = 1e-3
  c.train = "new+out"  # TRAINS
  return c


def layer_inputs(config: bert.BertConfig, teacher_params, tokens, padding_mask):
  """[h_0, ..., h_{L-1}]: the teacher's hidden state entering each block (dropout off)."""
  c = config
  x = bert.BertEmbeddings(c).apply({"params": teacher_params["encoder"]["embeddings"]}, tokens,
                                   jnp.zeros_like(tokens), deterministic=True)
  inputs = []
  for i in range(c.num_layers):
    inputs.append(x)
    x = bert.BertBlock(c, "softmax", "xla").apply(
        {"params": teacher_params["encoder"][f"block_{i}"]}, x, padding_mask, deterministic=True)
  return inputs


def _attention(config: bert.BertConfig, name: str, implementation: str,
               options: tuple[tuple[str, Any], ...] = ()):
  return attention_lib.get(name).build(num_heads=config.num_heads,
                                       implementation=implementation, **dict(options))


def transfer_loss(config: bert.BertConfig, student: str, student_params, teacher_params,
                  inputs, padding_mask, *, implementation: str = "xla",
                  options: tuple[tuple[str, Any], ...] = ()):
  """(total, per-layer losses [L]) of the module docstring, float32."""
  teacher_attention = _attention(config, "softmax", "xla")
  student_attention = _attention(config, student, implementation, options)
  real = padding_mask.astype(jnp.float32)[..., None]
  count = jnp.maximum(jnp.sum(real) * config.hidden_size, 1.0)
  losses = []
  for i, h in enumerate(inputs):
    block = f"block_{i}"
    want = teacher_attention.apply(
        {"params": teacher_params["encoder"][block]["attention"]}, h, padding_mask)
    got = student_attention.apply(
        {"params": student_params["encoder"][block]["attention"]}, h, padding_mask)
    error = (got.astype(jnp.float32) - jax.lax.stop_gradient(want).astype(jnp.float32)) * real
    losses.append(jnp.sum(error * error) / count)
  losses = jnp.stack(losses)
  return jnp.sum(losses), losses


def trainable(student_params, teacher_params, train: str = "new+out"):
  """A pytree of bools like student_params: True where the stage trains (module docstring)."""
  check_choice("attention_transfer.train", train, TRAINS)
  named = {"out"} | ({"query", "key"} if train == "new+out+qk" else set())
  teacher = {tuple(getattr(k, "key", k) for k in path): leaf.shape for path, leaf
             in jax.tree_util.tree_leaves_with_path(teacher_params)}

  def decide(path, leaf):
    keys = tuple(getattr(k, "key", k) for k in path)
    if "attention" not in keys:
      return False
    inside = keys[keys.index("attention") + 1:]
    if teacher.get(keys) != leaf.shape:
      return True  # new to the student (or reshaped): trains
    return train != "new" and bool(inside) and inside[0] in named
  return jax.tree_util.tree_map_with_path(decide, student_params)


def make_step(config: bert.BertConfig, student: str, teacher_params, mask_tree,
              learning_rate: float, *, implementation: str = "xla",
              options: tuple[tuple[str, Any], ...] = ()):
  """(optimizer, step): step(student_params, opt_state, tokens, padding_mask) ->
  (student_params, opt_state, total, per-layer losses), pure (jit it). Adam on the trainable
  leaves only; the others are returned unchanged."""
  tx = optax.masked(optax.adam(learning_rate), mask_tree)

  def step(student_params, opt_state, tokens, padding_mask):
    inputs = layer_inputs(config, teacher_params, tokens, padding_mask)
    loss = functools.partial(transfer_loss, config, student, teacher_params=teacher_params,
                             inputs=inputs, padding_mask=padding_mask,
                             implementation=implementation, options=options)
    (total, per_layer), grads = jax.value_and_grad(lambda p: loss(student_params=p),
                                                   has_aux=True)(student_params)
    grads = jax.tree.map(lambda g, m: g if m else jnp.zeros_like(g), grads, mask_tree)
    updates, opt_state = tx.update(grads, opt_state, student_params)
    return optax.apply_updates(student_params, updates), opt_state, total, per_layer
  return tx, step
