"""The optimiser: an optax chain (warm-up, constant, cosine or linear schedule, clipping, weight
decay, layer-wise learning-rate decay) and Adam exactly as the seed Keras model computes it
("keras_adam")."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from textattn.defaults import check_choice
from textattn.errors import UsageError

OPTIMIZERS = ("adam", "adamw", "rmsprop", "keras_adam")
SCHEDULES = ("constant", "cosine", "linear")


def validate_config(opt: ml_collections.ConfigDict) -> None:
  """One sentence naming the first bad config.optimizer field, its value and what is allowed."""
  check_choice("optimizer.name", opt.name, OPTIMIZERS)
  check_choice("optimizer.schedule", opt.schedule, SCHEDULES)
  if opt.name == "keras_adam" and (opt.grad_clip_norm or opt.weight_decay):
    raise UsageError("config.optimizer.name='keras_adam' is the seed's plain Keras Adam: it needs "
                     f"grad_clip_norm=0 and weight_decay=0 (got {opt.grad_clip_norm}, "
                     f"{opt.weight_decay}).")
  if not opt.learning_rate > 0:
    raise UsageError(f"config.optimizer.learning_rate={opt.learning_rate} must be > 0.")
  for field in ("warmup_steps", "weight_decay", "grad_clip_norm"):
    if opt[field] < 0:
      raise UsageError(f"config.optimizer.{field}={opt[field]} must be >= 0.")
  if not 0.0 <= opt.label_smoothing < 1.0:
    raise UsageError(f"config.optimizer.label_smoothing={opt.label_smoothing} must be in [0, 1).")
  if not 0.0 < opt.layer_decay <= 1.0:
    raise UsageError(f"config.optimizer.layer_decay={opt.layer_decay} must be in (0, 1] (1 = the "
                     f"same rate for every layer).")


def make_optimizer(opt: ml_collections.ConfigDict, total_steps: int,
                   frozen: bool = False) -> optax.GradientTransformation:
  """adam | adamw | rmsprop with linear warm-up then constant, cosine or linear decay, optional
  global-norm clipping and weight decay (decoupled for adamw; added to the gradient, i.e. L2,
  otherwise), and layer-wise learning-rate decay when opt.layer_decay < 1 (a pretrained
  encoder's layers, found by name: textattn/pretrained/finetune.py).
  frozen=True: parameters named "frozen_..." (baselines.is_frozen) are never updated."""
  tx = _make_optimizer(opt, total_steps)
  if opt.layer_decay < 1.0:  # (at 1 the chain, and so the checkpointed state, is as before)
    from textattn.pretrained import finetune
    tx = optax.chain(tx, finetune.scale_by_depth(opt.layer_decay))
  if not frozen:
    return tx
  from textattn.models import baselines
  labels = lambda params: jax.tree_util.tree_map_with_path(
      lambda path, _: "frozen" if baselines.is_frozen(path) else "train", params)
  return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)


def _make_optimizer(opt: ml_collections.ConfigDict, total_steps: int) -> optax.GradientTransformation:
  if opt.schedule == "cosine":
    learning_rate = optax.warmup_cosine_decay_schedule(
        0.0, opt.learning_rate, opt.warmup_steps, max(total_steps, opt.warmup_steps + 1))
  elif opt.schedule == "linear":  # BERT's: up during warm-up, then down to 0 at the last step
    decay = optax.linear_schedule(opt.learning_rate, 0.0,
                                  max(1, total_steps - opt.warmup_steps))
    learning_rate = decay if not opt.warmup_steps else optax.join_schedules(
        [optax.linear_schedule(0.0, opt.learning_rate, opt.warmup_steps), decay],
        [opt.warmup_steps])
  elif opt.warmup_steps:
    learning_rate = optax.join_schedules(
        [optax.linear_schedule(0.0, opt.learning_rate, opt.warmup_steps),
         optax.constant_schedule(opt.learning_rate)], [opt.warmup_steps])
  else:
    learning_rate = opt.learning_rate
  chain = []
  if opt.grad_clip_norm:
    chain.append(optax.clip_by_global_norm(opt.grad_clip_norm))
  if opt.name == "adamw":
    chain.append(optax.adamw(learning_rate, opt.b1, opt.b2, opt.eps,
                             weight_decay=opt.weight_decay))
  else:
    if opt.weight_decay:
      chain.append(optax.add_decayed_weights(opt.weight_decay))
    if opt.name == "adam":
      chain.append(optax.adam(learning_rate, opt.b1, opt.b2, opt.eps))
    elif opt.name == "keras_adam":
      chain += [scale_by_keras_adam(opt.b1, opt.b2, opt.eps),
                optax.scale_by_learning_rate(learning_rate)]
    else:
      # Keras' RMSprop (rho 0.9, eps outside the square root); optax's default puts eps
      # inside it, which damps the first updates of rarely seen features (bag models) a lot.
      chain.append(optax.rmsprop(learning_rate, decay=0.9, eps=opt.eps, eps_in_sqrt=False))
  return optax.chain(*chain)


class KerasAdamState(NamedTuple):
  count: jax.Array  # int32 []
  mu: optax.Updates
  nu: optax.Updates


def scale_by_keras_adam(b1: float, b2: float, eps: float) -> optax.GradientTransformationExtraArgs:
  """Adam as the seed Keras model runs it (Keras 3 `keras.optimizers.Adam.update_step`, the
  TensorFlow backend), for optimizer.name="keras_adam"; chain it before scale_by_learning_rate:

    m <- m + (1 - b1) (g - m),   v <- v + (1 - b2) (s - v),
    direction = sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps),

  i.e. optax.adam with eps added before the bias correction, and with s = g * g except where the
  extra argument `squared_grads` (a tree like the gradients) says otherwise. train_step passes,
  for the token table, the sum over the batch's occurrences of each token of the squared
  per-occurrence gradient: an Embedding layer's gradient reaches Keras' Adam as tf.IndexedSlices,
  one slice per occurrence, and `ops.square` squares the slices before their duplicates are summed
  into v (m gets the summed gradient). A token seen n times in a batch with equal per-occurrence
  gradients therefore has sqrt(n) times Adam's step: frequent tokens' rows learn faster
  (experiments/RESULTS.md, "the Keras model's Adam"). Not Adam's published update; opt-in.
  """

  def init_fn(params):
    return KerasAdamState(jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params),
                          jax.tree.map(jnp.zeros_like, params))

  def update_fn(updates, state, params=None, *, squared_grads=None, **extra_args):
    del params, extra_args
    squares = jax.tree.map(jnp.square, updates) if squared_grads is None else squared_grads
    mu = jax.tree.map(lambda m, g: m + (1 - b1) * (g - m), state.mu, updates)
    nu = jax.tree.map(lambda v, s: v + (1 - b2) * (s - v), state.nu, squares)
    count = optax.safe_increment(state.count)
    t = count.astype(jnp.float32)
    alpha = jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    direction = jax.tree.map(lambda m, v: (alpha * m / (jnp.sqrt(v) + eps)).astype(m.dtype),
                             mu, nu)
    return direction, KerasAdamState(count, mu, nu)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
