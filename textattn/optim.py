"""The optimiser: an optax chain (warm-up, constant, cosine or linear schedule, clipping, weight
decay, layer-wise learning-rate decay, LoRA: textattn/lora.py) and Adam exactly as the seed Keras
model computes it ("keras_adam")."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from textattn import lora
from textattn.checks import check_choice
from textattn.errors import UsageError

OPTIMIZERS = ("adam", "adamw", "rmsprop", "keras_adam")
_BLOCK = re.compile(r"^block_(\d+)$")  # a pretrained encoder's blocks, by name
SCHEDULES = ("constant", "cosine", "linear")


def defaults() -> ml_collections.ConfigDict:
  """The optimizer's fields (config.optimizer); a task's defaults may change them."""
  config = ml_collections.ConfigDict()
  # adam | adamw | rmsprop (Keras') | keras_adam (Adam exactly as the seed Keras model computes it)
  config.name = "adam"
  config.learning_rate = 1e-3
  # constant | cosine | linear (decay to 0 at the last step, BERT's), all after linear warm-up
  config.schedule = "constant"
  config.warmup_steps = 0
  config.weight_decay = 0.0  # decoupled for adamw, L2 on the gradient otherwise
  config.grad_clip_norm = 0.0  # global-norm clipping; 0 = none
  config.label_smoothing = 0.0  # of the training loss; evaluation loss is plain
  # < 1: layer-wise learning-rate decay of a pretrained encoder (model.pretrained): each block
  # learns at this times the rate of the one above it (scale_by_depth below)
  config.layer_decay = 1.0
  return config


def full_defaults() -> ml_collections.ConfigDict:
  """`defaults` with the opt-in parts (adam, lora): a whole optimizer config
  (textattn.defaults.optimizer)."""
  config = defaults()
  config.adam = adam_config()
  config.lora = lora_config()
  return config


def adam_config() -> ml_collections.ConfigDict:
  """config.optimizer.adam, an opt-in part (config.complete): the moment decays and epsilon of
  adam, adamw and keras_adam (rmsprop uses eps)."""
  part = ml_collections.ConfigDict()
  part.b1 = 0.9
  part.b2 = 0.999
  part.eps = 1e-7  # Keras Adam's default, as in the seed
  return part


def lora_config() -> ml_collections.ConfigDict:
  """config.optimizer.lora, an opt-in part: LoRA's rank (0: off) and what it adapts (lora.py)."""
  return lora.default_config()


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
  lora.validate_config(opt.lora)
  if opt.lora.rank and opt.grad_clip_norm:
    raise UsageError(f"config.optimizer.lora.rank={opt.lora.rank} trains low-rank factors, whose "
                     f"gradients exist only inside LoRA's update, so global-norm clipping "
                     f"(grad_clip_norm={opt.grad_clip_norm}) would clip them and the fully "
                     f"trained parameters apart, not together as PEFT does: set grad_clip_norm=0 "
                     f"or lora.rank=0.")
  if opt.lora.rank and opt.layer_decay != 1.0:
    raise UsageError(f"config.optimizer.lora.rank={opt.lora.rank} trains low-rank factors, which "
                     f"layer-wise decay (layer_decay={opt.layer_decay}) cannot scale: use one of "
                     f"the two, leaving layer_decay=1 or lora.rank=0.")


def make_optimizer(opt: ml_collections.ConfigDict, total_steps: int,
                   trainable: Callable[[tuple], bool] | None = None, seed: int = 0
                   ) -> optax.GradientTransformation:
  """adam | adamw | rmsprop with linear warm-up then constant, cosine or linear decay, optional
  global-norm clipping and weight decay (decoupled for adamw; added to the gradient, i.e. L2,
  otherwise), and layer-wise learning-rate decay when opt.layer_decay < 1 (a pretrained
  encoder's layers, found by name: scale_by_depth).
  `trainable(path)`: whether the parameter at that tree path trains (None: all do); the others
  are never updated (a baseline's fixed statistics, a stage that trains only new weights).
  With opt.lora.rank > 0 (LoRA), the parameters `opt.lora.targets` names train through
  low-rank factors drawn from `seed`, those `opt.lora.train` names (and `trainable` allows) in
  full, and the rest not at all."""
  tx = _make_optimizer(opt, total_steps)
  if opt.layer_decay < 1.0:  # (at 1 the chain, and so the checkpointed state, is as before)
    tx = optax.chain(tx, scale_by_depth(opt.layer_decay))
  if opt.lora.rank:
    adapted = lora.lora(_make_optimizer(opt, total_steps), opt.lora.rank, opt.lora.alpha, seed)
    return optax.multi_transform({"lora": adapted, "train": tx, "frozen": optax.set_to_zero()},
                                 functools.partial(_lora_labels, opt.lora, trainable))
  if trainable is None:
    return tx
  labels = lambda params: jax.tree_util.tree_map_with_path(
      lambda path, _: "train" if trainable(path) else "frozen", params)
  return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)


def _lora_labels(part: ml_collections.ConfigDict, trainable, params):
  """Each parameter's group under LoRA: "lora", "train" or "frozen" (make_optimizer)."""
  targets, train = re.compile(part.targets), re.compile(part.train)

  def label(path, _):
    name = "/".join(str(getattr(key, "key", key)) for key in path)
    if trainable is not None and not trainable(path):
      return "frozen"  # (a frozen parameter stays so, LoRA target or not)
    if targets.search(name):
      return "lora"
    return "train" if train.search(name) else "frozen"

  labels = jax.tree_util.tree_map_with_path(label, params)
  if "lora" not in jax.tree.leaves(labels):
    some = "/".join(str(getattr(key, "key", key)) for key in jax.tree_util.tree_leaves_with_path(
        params)[0][0])
    raise UsageError(f"config.optimizer.lora.targets={part.targets!r} names no parameter of this "
                     f"model (whose parameters are named like {some!r}); LoRA needs at least one.")
  return labels


def _make_optimizer(opt: ml_collections.ConfigDict, total_steps: int) -> optax.GradientTransformation:
  adam = opt.adam
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
    chain.append(optax.adamw(learning_rate, adam.b1, adam.b2, adam.eps,
                             weight_decay=opt.weight_decay))
  else:
    if opt.weight_decay:
      chain.append(optax.add_decayed_weights(opt.weight_decay))
    if opt.name == "adam":
      chain.append(optax.adam(learning_rate, adam.b1, adam.b2, adam.eps))
    elif opt.name == "keras_adam":
      chain += [scale_by_keras_adam(adam.b1, adam.b2, adam.eps),
                optax.scale_by_learning_rate(learning_rate)]
    else:
      # Keras' RMSprop (rho 0.9, eps outside the square root); optax's default puts eps
      # inside it, which damps the first updates of rarely seen features (bag models) a lot.
      chain.append(optax.rmsprop(learning_rate, decay=0.9, eps=adam.eps, eps_in_sqrt=False))
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

  The extra argument `sparse_table=(marks, ids, rows)` (marks: a tree of bools like the gradients,
  True at the token table; ids: int [N], the batch's token ids; rows: [N, dim], the gradient at
  each occurrence) updates that leaf's moments from the occurrences instead of a dense gradient:
  m <- b1 m + sum (1 - b1) row, v <- b2 v + sum (1 - b2) row^2, each scaled and then scattered
  into in place, so no [vocabulary, dim] gradient is zero-filled and read (issue 56; the same
  values as the dense formula up to float rounding). Its entries in the gradients and
  `squared_grads` are not read.
  """

  def init_fn(params):
    return KerasAdamState(jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params),
                          jax.tree.map(jnp.zeros_like, params))

  def update_fn(updates, state, params=None, *, squared_grads=None, sparse_table=None,
                **extra_args):
    del params, extra_args
    squares = jax.tree.map(jnp.square, updates) if squared_grads is None else squared_grads
    if sparse_table is None:
      marks = jax.tree.map(lambda _: False, updates)
    else:
      marks, ids, rows = sparse_table

    def moment(decay, old, new, sparse, occurrences):
      if not sparse:
        return old + (1 - decay) * (new - old)
      return (decay * old).at[ids].add((1 - decay) * occurrences())  # (in place, no zero fill)

    mu = jax.tree.map(lambda m, g, t: moment(b1, m, g, t, lambda: rows), state.mu, updates, marks)
    nu = jax.tree.map(lambda v, s, t: moment(b2, v, s, t, lambda: jnp.square(rows)), state.nu,
                      squares, marks)
    count = optax.safe_increment(state.count)
    t = count.astype(jnp.float32)
    alpha = jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    direction = jax.tree.map(lambda m, v: (alpha * m / (jnp.sqrt(v) + eps)).astype(m.dtype),
                             mu, nu)
    return direction, KerasAdamState(count, mu, nu)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


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


def scale_by_depth(decay: float) -> optax.GradientTransformation:
  """scale_by_layer_decay with the scales found from the updates' own names: the encoder's
  depth is one more than its highest block_i, so the optimizer needs no model to be built
  (optim.make_optimizer, config.optimizer.layer_decay)."""

  def update(updates, state, params=None):
    del params
    depths = [int(match.group(1)) + 1 for path, _ in jax.tree_util.tree_leaves_with_path(updates)
              for key in path
              for match in [_BLOCK.match(str(getattr(key, "key", key)))] if match]
    scales = layer_decay_scales(updates, max(depths, default=0), decay)
    return jax.tree_util.tree_map(lambda u, s: u * s, updates, scales), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)
