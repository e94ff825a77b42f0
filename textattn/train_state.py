"""The train state every task's step carries, and how a fresh one is made.

A Flax TrainState (step, params, tx, opt_state) plus the dropout key (per-step keys are
fold_in(dropout_key, step): deterministic, and the same after a resume) and two static fields
the classifier's step reads. The runner builds it (`init_train_state`) for every task.
"""


from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training import train_state as train_state_lib

from textattn import checkpointing, optim

# Where the token-embedding table lives in the parameters (and in every optimizer-state tree
# that mirrors them, e.g. Adam's mu and nu).
TOKEN_TABLE_PATH = ("embedding", "token", "embedding")


class TrainState(train_state_lib.TrainState):
  dropout_key: jax.Array  # raw uint32 key data; per-step keys are fold_in(dropout_key, step)
  label_smoothing: float = struct.field(pytree_node=False, default=0.0)  # (static)
  # config.optimizer.name == "keras_adam" (static): train_step hands the optimizer the token
  # table's per-occurrence squared gradients (see optim.scale_by_keras_adam).
  table_squares: bool = struct.field(pytree_node=False, default=False)


def init_train_state(model, tx: optax.GradientTransformation, rng: jax.Array, length: int,
                     optimizer=None, pretrained_tokens=None, pretrained_params=None) -> TrainState:
  """Fresh parameters (from a dummy batch of `length` tokens), optimizer state and dropout key.

  `optimizer` is config.optimizer (None: defaults); the state takes its `label_smoothing` and
  whether it is "keras_adam". `tx` is built from it by `optim.make_optimizer`.
  `pretrained_tokens`: (table [vocab, embed], found bool [vocab]) from the word2vec recipe; rows
  where `found` is True replace the random token embeddings, the others keep them.
  `pretrained_params`: embedding and encoder parameters from the MLM pretraining recipe; they
  replace the fresh ones (same paths and shapes), the classifier's head keeps its initialisation.
  """
  if optimizer is None:
    optimizer = optim.full_defaults()
  params_rng, dropout_rng = jax.random.split(rng)
  params = model.init({"params": params_rng}, jnp.ones((1, length), jnp.int32))["params"]
  if pretrained_tokens is not None:
    table, found = pretrained_tokens
    random_table = token_table(params)
    if table.shape != random_table.shape:
      raise ValueError(f"The pretrained token table has shape {table.shape}; the model's is "
                       f"{random_table.shape}.")
    merged = jnp.where(found[:, None], table.astype(random_table.dtype), random_table)
    params = jax.tree_util.tree_map_with_path(
        lambda path, leaf: merged if is_token_table(path, leaf, merged.shape) else leaf, params)
  if pretrained_params is not None:
    params = checkpointing.transfer(params, pretrained_params)
  return TrainState.create(apply_fn=model.apply, params=params, tx=tx,
                           dropout_key=jax.random.key_data(dropout_rng),
                           label_smoothing=float(optimizer.label_smoothing),
                           table_squares=optimizer.name == "keras_adam")


def token_table(params) -> jax.Array:
  for name in TOKEN_TABLE_PATH:
    params = params[name]
  return params


def is_token_table(path, leaf, table_shape) -> bool:
  names = tuple(getattr(key, "key", None) for key in path[-len(TOKEN_TABLE_PATH):])
  return names == TOKEN_TABLE_PATH and getattr(leaf, "shape", None) == table_shape
