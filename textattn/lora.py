"""LoRA (Hu et al. 2021, arXiv 2106.09685) as an optax transformation: config.optimizer.lora.

A LoRA fine-tuning trains, for each adapted weight matrix W0 [m, n], two factors A [m, r] and
B [r, n] and uses W = W0 + (alpha / r) A B; W0 is frozen, B starts at 0 (so the model starts as
the checkpoint), A at uniform(+-1/sqrt(m)) (PEFT's default). Here the model keeps its ordinary
parameter W, and the factors live in the optimizer's state: given the gradient G of the loss
with respect to W,

    dL/dA = s G B^T,   dL/dB = s A^T G          (s = alpha / r; the chain rule through W)

go to the inner optimizer (Adam, with the run's schedule), which returns A', B', and W moves by
s (A'B' - AB). So W = W0 + s AB after every step (up to float rounding), the training is
LoRA's exactly, and everything that reads parameters (evaluation, checkpoints, predict, explain,
an exact resume: the factors and their moments are checkpointed with the optimizer's state)
works unchanged, with the adapters already merged. What it does not save is LoRA's memory: W
and its gradient are full size.

A kernel of more than two axes is read as a matrix split where its two sides are closest in size,
e.g. attention's query kernel [width, heads, head_dim] as [width, heads * head_dim] and its
output kernel [heads, head_dim, width] as [heads * head_dim, width].
"""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from textattn.checks import check_integer, check_number
from textattn.errors import UsageError


def default_config() -> ml_collections.ConfigDict:
  """config.optimizer.lora, an opt-in part (rank 0: off)."""
  c = ml_collections.ConfigDict()
  c.rank = 0  # r; 0: no LoRA, every parameter the run trains trains in full
  c.alpha = 16.0  # the factors' product is scaled by alpha / rank
  # Parameters (their "/"-joined tree paths, re.search) trained through rank-r factors: the
  # attention projections of every block (LoLCATs adapts q, k, v and o).
  c.targets = r"(^|/)attention/(query|key|value|out)/kernel$"
  # Parameters that train in full beside the factors; every other one is frozen. Default: a
  # pretrained classifier's head (logits, pooler) and the attention parameters the checkpoint
  # does not have (a feature map, additive attention's scoring weights).
  c.train = r"^logits/|^encoder/pooler/|(^|/)attention/(?!(query|key|value|out)/)"
  return c


def validate_config(lora: ml_collections.ConfigDict) -> None:
  check_integer("optimizer.lora.rank", lora.rank, 0)
  check_number("optimizer.lora.alpha", lora.alpha, lambda a: a > 0, "a positive number")
  for field in ("targets", "train"):
    try:
      re.compile(lora[field])
    except (re.error, TypeError) as e:
      raise UsageError(f"config.optimizer.lora.{field}={lora[field]!r} must be a regular "
                       f"expression over parameter paths ({e}).") from None


def matrix_split(shape: tuple[int, ...]) -> int:
  """How many leading axes of a kernel of `shape` form the matrix's rows (see the docstring)."""
  if len(shape) < 2:
    raise ValueError(f"LoRA adapts matrices, not a parameter of shape {shape}.")
  return min(range(1, len(shape)),
             key=lambda k: abs(math.prod(shape[:k]) - math.prod(shape[k:])))


class LoraState(NamedTuple):
  factors: Any  # per adapted leaf, (A [m, r], B [r, n])
  inner: Any  # the inner optimizer's state of the factors


def lora(inner: optax.GradientTransformation, rank: int, alpha: float,
         seed: int = 0) -> optax.GradientTransformation:
  """Trains every leaf it is given (use it under optax.multi_transform) through rank-`rank`
  factors, `inner` updating the factors; A's start is drawn from `seed` and the leaf's index."""
  scale = alpha / rank

  def init_fn(params):
    leaves, treedef = jax.tree.flatten(params)
    factors = []
    for index, leaf in enumerate(leaves):
      k = matrix_split(leaf.shape)
      m, n = math.prod(leaf.shape[:k]), math.prod(leaf.shape[k:])
      bound = 1.0 / math.sqrt(m)
      a = jax.random.uniform(jax.random.fold_in(jax.random.key(seed), index), (m, rank),
                             jnp.float32, -bound, bound)
      factors.append((a, jnp.zeros((rank, n), jnp.float32)))
    factors = jax.tree.unflatten(treedef, factors)
    return LoraState(factors, inner.init(factors))

  def update_fn(updates, state, params=None):
    del params
    # (the factors' tree has the updates' tree as a prefix: an (A, B) pair at each leaf)
    grads = jax.tree.map(
        lambda g, ab: (scale * (_matrix(g) @ ab[1].T), scale * (ab[0].T @ _matrix(g))),
        updates, state.factors)
    steps, inner_state = inner.update(grads, state.inner, state.factors)
    factors = optax.apply_updates(state.factors, steps)
    moves = jax.tree.map(
        lambda g, old, new: (scale * (new[0] @ new[1] - old[0] @ old[1])).reshape(g.shape
                                                                               ).astype(g.dtype),
        updates, state.factors, factors)
    return moves, LoraState(factors, inner_state)

  return optax.GradientTransformation(init_fn, update_fn)


def _matrix(x: jax.Array) -> jax.Array:
  k = matrix_split(x.shape)
  return x.reshape(math.prod(x.shape[:k]), -1).astype(jnp.float32)
