"""Training and evaluation: one trainer for every attention variant.

`train_and_evaluate(config, workdir)` builds the data, the model and a sharded train state,
resumes from the newest complete checkpoint in `workdir/checkpoints` if there is one, trains,
evaluates, checkpoints, and ends with a test report. Step functions are pure and compiled once
with `jax.jit` over a one-axis ("data") device mesh: the batch is sharded, the state replicated.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
import tqdm
from absl import logging
from flax import struct
from flax.training import train_state as train_state_lib
from orbax.checkpoint.checkpoint_managers import preservation_policy as preservation

from textattn import compare, models
from textattn import data as data_lib
from textattn.recipes import pretrain
from textattn.recipes import word2vec

EVAL_SPLITS = ("validation", "test")
OPTIMIZERS = ("adam", "adamw", "rmsprop", "keras_adam")
SCHEDULES = ("constant", "cosine")
FINAL_PARAMS = ("best", "last")


EMBEDDING_UPDATES = ("dense", "lazy")
# Where the token-embedding table lives in the parameters (and in every optimizer-state tree
# that mirrors them, e.g. Adam's mu and nu).
TOKEN_TABLE_PATH = ("embedding", "token", "embedding")


class TrainState(train_state_lib.TrainState):
  dropout_key: jax.Array  # raw uint32 key data; per-step keys are fold_in(dropout_key, step)
  # config.optimizer.embedding_update: "dense" or "lazy" (see train_step). Static.
  embedding_update: str = struct.field(pytree_node=False, default="dense")
  # config.optimizer.ema_decay (static): 0 = off; else ema_params is an exponential moving
  # average of params (see train_step), and evaluation uses it. {} when off.
  ema_decay: float = struct.field(pytree_node=False, default=0.0)
  label_smoothing: float = struct.field(pytree_node=False, default=0.0)  # (static)
  # config.optimizer.name == "keras_adam" (static): train_step hands the optimizer the token
  # table's per-occurrence squared gradients (see scale_by_keras_adam).
  table_squares: bool = struct.field(pytree_node=False, default=False)
  ema_params: Any = None

  def eval_params(self):
    """The parameters evaluation (and the test report) uses: the EMA when it is on."""
    return self.ema_params if self.ema_decay else self.params


class NonFiniteLossError(RuntimeError):
  pass


class RunError(ValueError):
  """The workdir cannot be used with this command (another run's checkpoints, an unreadable
  file); the message is one sentence naming the problem and what to do. Nothing is changed."""


# ---------------------------------------------------------------------------------------------
# Configuration checks: once, at start, one sentence per problem.


def validate_config(config: ml_collections.ConfigDict, device_count: int) -> None:
  models.validate_model_config(config)
  word2vec.validate_config(config)
  pretrain.validate_config(config)
  models.check_choice("eval_split", config.eval_split, EVAL_SPLITS)
  models.check_choice("final_params", config.final_params, FINAL_PARAMS)
  if config.final_params == "best" and config.eval_split == "test":
    raise ValueError("config.final_params='best' with config.eval_split='test' would choose the "
                     "model on the test set; use final_params='last' or eval_split='validation'.")
  for field in ("batch_size", "eval_batch_size"):
    value = config[field]
    if not isinstance(value, int) or value < 1 or value % device_count:
      raise ValueError(f"config.{field}={value!r} must be a positive multiple of the device "
                       f"count ({device_count}) so every device gets an equal share.")
  if config.num_train_steps <= 0 and config.num_epochs < 1:
    raise ValueError(f"config.num_epochs={config.num_epochs} must be >= 1 when "
                     f"config.num_train_steps={config.num_train_steps} is not > 0.")
  for field in ("eval_every_steps", "checkpoint_every_steps", "log_every_steps"):
    if config[field] < 0:
      raise ValueError(f"config.{field}={config[field]} must be >= 0.")
  deterministic = config.get("deterministic", True)
  if not isinstance(deterministic, bool):  # ValueError: main reports those in one sentence.
    message = f"config.deterministic={deterministic!r} must be True or False."
    raise ValueError(message)  # noqa: TRY004
  if config.keep_checkpoints < 1:
    raise ValueError(f"config.keep_checkpoints={config.keep_checkpoints} must be >= 1.")
  opt = config.optimizer
  models.check_choice("optimizer.name", opt.name, OPTIMIZERS)
  models.check_choice("optimizer.schedule", opt.schedule, SCHEDULES)
  models.check_choice("optimizer.embedding_update", opt.embedding_update, EMBEDDING_UPDATES)
  if opt.name == "keras_adam" and (opt.grad_clip_norm or opt.weight_decay
                                   or opt.embedding_update != "dense"):
    raise ValueError("config.optimizer.name='keras_adam' is the seed's plain Keras Adam: it needs "
                     "grad_clip_norm=0, weight_decay=0 and embedding_update='dense' (got "
                     f"{opt.grad_clip_norm}, {opt.weight_decay}, {opt.embedding_update!r}).")
  if not opt.learning_rate > 0:
    raise ValueError(f"config.optimizer.learning_rate={opt.learning_rate} must be > 0.")
  for field in ("warmup_steps", "weight_decay", "grad_clip_norm"):
    if opt[field] < 0:
      raise ValueError(f"config.optimizer.{field}={opt[field]} must be >= 0.")
  if not 0.0 <= opt.label_smoothing < 1.0:
    raise ValueError(f"config.optimizer.label_smoothing={opt.label_smoothing} must be in [0, 1).")
  if not 0.0 <= opt.ema_decay < 1.0:
    raise ValueError(f"config.optimizer.ema_decay={opt.ema_decay} must be in [0, 1) "
                     f"(0 = no moving average of the parameters).")


def init_train_state(model: models.Classifier, tx: optax.GradientTransformation, rng: jax.Array,
                     length: int,
                     optimizer: ml_collections.ConfigDict | dict | None = None,
                     pretrained_tokens: tuple[jax.Array, jax.Array] | None = None,
                     pretrained_params: dict | None = None) -> TrainState:
  """Fresh parameters (from a dummy batch of `length` tokens), optimizer state and dropout key.

  `optimizer` is config.optimizer (missing fields, or None, mean their defaults); the state takes
  its `embedding_update` ("dense"), `label_smoothing` (0), `ema_decay` (0; > 0 adds a moving
  average of the parameters that starts at them) and `name` ("keras_adam" makes train_step pass
  the token table's per-occurrence squared gradients to the optimizer). `tx` is built from it
  by `make_optimizer`.
  `pretrained_tokens`: (table [vocab, embed], found bool [vocab]) from word_vectors; rows where
  `found` is True replace the random token embeddings, the others keep them.
  `pretrained_params`: the embedding and encoder parameters from pretrain.pretrain; they replace
  the fresh ones (same paths and shapes), the classifier's head keeps its initialisation."""
  optimizer = optimizer or {}
  embedding_update = optimizer.get("embedding_update", "dense")
  ema_decay = float(optimizer.get("ema_decay", 0.0))
  label_smoothing = float(optimizer.get("label_smoothing", 0.0))
  params_rng, dropout_rng = jax.random.split(rng)
  params = model.init({"params": params_rng}, jnp.ones((1, length), jnp.int32))["params"]
  if pretrained_tokens is not None:
    table, found = pretrained_tokens
    random_table = _token_table(params)
    if table.shape != random_table.shape:
      raise ValueError(f"The pretrained token table has shape {table.shape}; the model's is "
                       f"{random_table.shape}.")
    merged = jnp.where(found[:, None], table.astype(random_table.dtype), random_table)
    params = jax.tree_util.tree_map_with_path(
        lambda path, leaf: merged if _is_token_table(path, leaf, merged.shape) else leaf, params)
  if pretrained_params is not None:
    params = pretrain.transfer(params, pretrained_params)
  return TrainState.create(apply_fn=model.apply, params=params, tx=tx,
                           dropout_key=jax.random.key_data(dropout_rng),
                           embedding_update=embedding_update, ema_decay=ema_decay,
                           label_smoothing=label_smoothing,
                           table_squares=optimizer.get("name") == "keras_adam",
                           ema_params=jax.tree.map(jnp.copy, params) if ema_decay else {})


def _update_ema(state: TrainState) -> TrainState:
  """ema <- d * ema + (1 - d) * params, with d = min(ema_decay, (1 + step) / (10 + step)) as
  TF's ExponentialMovingAverage(num_updates=step), so early steps are not dominated by the
  initialisation. `state.step` is the count of updates already applied, this one included
  (so the first average uses d = 2/11). d reaches 0.99 after ~890 updates, 0.999 after ~9,000."""
  step = state.step.astype(jnp.float32)
  decay = jnp.minimum(state.ema_decay, (1.0 + step) / (10.0 + step))
  ema = jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p, state.ema_params, state.params)
  return state.replace(ema_params=ema)


def data_parallel_shardings() -> tuple[jax.NamedSharding, jax.NamedSharding]:
  """(batch sharded along a "data" axis over all devices, replicated) shardings."""
  mesh = jax.make_mesh((jax.device_count(),), ("data",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  return jax.NamedSharding(mesh, jax.P("data")), jax.NamedSharding(mesh, jax.P())


XlaOptionValue = str | bool | int | float


def _xla_option_value(text: str) -> XlaOptionValue:
  """XLA takes typed option values: 'true'/'false' for its bool flags, numbers for its numeric
  ones; everything else stays a string (e.g. the empty list of --xla_cpu_experimental_ynn_...)."""
  if text.lower() in ("true", "false"):
    return text.lower() == "true"
  for kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      pass
  return text


def xla_compiler_options(config: ml_collections.ConfigDict) -> dict[str, XlaOptionValue]:
  """config.xla_flags ("--xla_name=value ...") as `jax.jit(compiler_options=...)`: XLA reads
  $XLA_FLAGS when jax is imported, too early for a config, so the flags go to the compilations
  of the train and eval steps instead."""
  flags = config.get("xla_flags", "")
  tokens = flags.split() if isinstance(flags, str) else [None]
  if any(not (t and t.startswith("--xla_") and "=" in t) for t in tokens):
    raise ValueError(f"config.xla_flags={flags!r} must be a space-separated list of XLA flags "
                     f"of the form --xla_name=value (e.g. '--xla_cpu_experimental_ynn_fusion_"
                     f"type='), or empty.")
  return {name: _xla_option_value(value)
          for name, value in (t[2:].split("=", 1) for t in tokens)}


def step_compiler_options(
    config: ml_collections.ConfigDict) -> dict[str, XlaOptionValue] | None:
  """What the train and eval steps are compiled with: config.xla_flags, plus XLA's deterministic
  GPU ops when config.deterministic (the default) and the run is on a GPU. Call after JAX has
  started (it asks for the backend); an explicit --xla_gpu_deterministic_ops in xla_flags wins."""
  options = xla_compiler_options(config)
  if config.get("deterministic", True) and jax.default_backend() == "gpu":
    options.setdefault("xla_gpu_deterministic_ops", True)
  return options or None


def request_cpu_devices(config: ml_collections.ConfigDict) -> None:
  """Apply config.num_cpu_devices (and check config.xla_flags); call before any JAX operation
  (the backend reads the device count once)."""
  xla_compiler_options(config)
  n = config.get("num_cpu_devices", 0)
  if not isinstance(n, int) or isinstance(n, bool) or n < 0:
    raise ValueError(f"config.num_cpu_devices={n!r} must be an integer >= 0 (0 = JAX's "
                     f"default: one CPU device).")
  if n == 0:
    return
  if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
    raise ValueError(f"config.num_cpu_devices={n} and XLA_FLAGS' "
                     f"--xla_force_host_platform_device_count both set the CPU device count; "
                     f"set only one.")
  jax.config.update("jax_num_cpu_devices", n)


# ---------------------------------------------------------------------------------------------
# Optimiser.


def make_optimizer(opt: ml_collections.ConfigDict, total_steps: int) -> optax.GradientTransformation:
  """adam | adamw | rmsprop with linear warm-up then constant or cosine decay, optional global-norm
  clipping and weight decay (decoupled for adamw; added to the gradient, i.e. L2, otherwise)."""
  if opt.schedule == "cosine":
    learning_rate = optax.warmup_cosine_decay_schedule(
        0.0, opt.learning_rate, opt.warmup_steps, max(total_steps, opt.warmup_steps + 1))
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
      chain.append(optax.rmsprop(learning_rate, eps=opt.eps))
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


# ---------------------------------------------------------------------------------------------
# Pure step functions.


def _token_table(params) -> jax.Array:
  for name in TOKEN_TABLE_PATH:
    params = params[name]
  return params


def _is_token_table(path, leaf, table_shape) -> bool:
  names = tuple(getattr(key, "key", None) for key in path[-len(TOKEN_TABLE_PATH):])
  return names == TOKEN_TABLE_PATH and getattr(leaf, "shape", None) == table_shape


def _lazy_embedding_update(state: TrainState, grads, row_grads: jax.Array, tokens: jax.Array):
  """The optimizer step with only the token-embedding rows in `tokens` updated.

  The rows' gradients (one per token position) are summed per distinct id; the optimizer chain
  (state.tx, unchanged: clipping, Adam/RMSprop, weight decay, schedule) then runs on a compact
  copy of the parameters and optimizer state in which the [vocab, embed] table and every state
  leaf mirroring it (Adam's mu and nu) hold just those rows, and the results are scattered back.
  Rows absent from the batch keep their value and moments: LazyAdam's semantics, not Adam's
  (Adam would decay their moments and keep moving them). Global-norm clipping sees the same
  norm as the dense update (summing duplicates is exactly what the dense gradient does).
  """
  table = _token_table(state.params)
  n = tokens.size
  size = min(n, table.shape[0])  # at most this many distinct ids
  # Distinct ids, padded to the static `size` with an out-of-range id: gathers read 0 there
  # and scatters drop it.
  ids, inverse = jnp.unique(tokens.reshape(-1), size=size, fill_value=table.shape[0],
                            return_inverse=True)
  compact_grad = jax.ops.segment_sum(row_grads.reshape(n, -1).astype(table.dtype),
                                     inverse.reshape(-1), num_segments=size)

  def gather(path, leaf):
    return leaf.at[ids].get(mode="fill", fill_value=0) if _is_token_table(
        path, leaf, table.shape) else leaf

  def scatter(path, full, compact):
    return full.at[ids].set(compact, mode="drop") if _is_token_table(
        path, full, table.shape) else compact

  compact_params = jax.tree_util.tree_map_with_path(gather, state.params)
  compact_grads = jax.tree_util.tree_map_with_path(
      lambda path, g: compact_grad if _is_token_table(path, g, table.shape) else g, grads)
  compact_opt_state = jax.tree_util.tree_map_with_path(gather, state.opt_state)
  updates, new_compact_opt_state = state.tx.update(compact_grads, compact_opt_state,
                                                   compact_params)
  new_compact_params = optax.apply_updates(compact_params, updates)
  params = jax.tree_util.tree_map_with_path(scatter, state.params, new_compact_params)
  opt_state = jax.tree_util.tree_map_with_path(scatter, state.opt_state, new_compact_opt_state)
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), compact_grads


def _sum_all(x: jax.Array) -> jax.Array:
  """The sum of every element of `x`, taken 32 consecutive elements at a time.

  The same value as jnp.sum up to summation order. XLA:CPU rewrites one long reduction into a
  tree of reduce-window ops that it runs about 4x slower than these short row sums (0.74 ms
  against 0.20 ms for the squares of a 20,000 x 32 table here; experiments/RESULTS.md, "Fourth
  round"), and train_step reduces every gradient and parameter each step for its metrics.
  """
  x = x.reshape(-1)
  while x.size > 32:
    x = jnp.pad(x, (0, -x.size % 32)).reshape(-1, 32).sum(axis=1)
  return jnp.sum(x)


def train_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
  """One optimiser step. Metrics are sums (divide by "count" when reporting).

  state.embedding_update="lazy" differentiates with respect to the looked-up embedding rows
  instead of the [vocab, embed] table and updates only the rows in the batch
  (`_lazy_embedding_update`); "dense" is the plain optax update of every parameter.
  state.table_squares (optimizer "keras_adam") also differentiates with respect to the rows, to
  hand the optimizer the token table's per-occurrence squared gradients (scale_by_keras_adam);
  the table gradient itself is the same as dense.
  """
  dropout_key = jax.random.fold_in(jax.random.wrap_key_data(state.dropout_key), state.step)
  tokens = batch["inputs"]

  def loss_fn(params, token_embeddings=None):
    logits = state.apply_fn({"params": params}, tokens, train=True,
                            rngs={"dropout": dropout_key}, token_embeddings=token_embeddings)
    if state.label_smoothing:
      targets = optax.smooth_labels(jax.nn.one_hot(batch["labels"], logits.shape[-1]),
                                    state.label_smoothing)
      losses = optax.softmax_cross_entropy(logits, targets)
    else:
      losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
    return jnp.mean(losses), (losses, logits)

  if state.embedding_update == "lazy" or state.table_squares:
    # Differentiate with respect to the looked-up rows (one gradient per token position);
    # grads' table entry is then zero and unused: the model does not read the table.
    table = _token_table(state.params)
    (grads, row_grads), (losses, logits) = jax.grad(loss_fn, argnums=(0, 1), has_aux=True)(
        state.params, jnp.take(table, tokens, axis=0))
  if state.embedding_update == "lazy":
    state, grads = _lazy_embedding_update(state, grads, row_grads, tokens)
  elif state.table_squares:
    flat_rows = row_grads.reshape(tokens.size, -1).astype(table.dtype)
    # One scatter for both: per token id, the summed gradient and the summed squares.
    both = jax.ops.segment_sum(jnp.concatenate([flat_rows, jnp.square(flat_rows)], axis=1),
                               tokens.reshape(-1), num_segments=table.shape[0])
    table_grad, table_squares = jnp.split(both, 2, axis=1)
    grads = jax.tree_util.tree_map_with_path(
        lambda path, g: table_grad if _is_token_table(path, g, table.shape) else g, grads)
    squares = jax.tree_util.tree_map_with_path(
        lambda path, g: table_squares if _is_token_table(path, g, table.shape) else jnp.square(g),
        grads)
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params,
                                         squared_grads=squares)
    state = state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                          opt_state=opt_state)
  else:
    grads, (losses, logits) = jax.grad(loss_fn, has_aux=True)(state.params)
    state = state.apply_gradients(grads=grads)
  if state.ema_decay:
    state = _update_ema(state)
  metrics = {
      "loss_sum": jnp.sum(losses),
      "correct": jnp.sum(jnp.argmax(logits, -1) == batch["labels"]),
      "count": jnp.asarray(losses.shape[0], jnp.int32),
      # optax.global_norm(grads), with the fast sum.
      "grad_norm_sum": jnp.sqrt(sum(_sum_all(jnp.square(g).astype(jnp.float32))
                                    for g in jax.tree_util.tree_leaves(grads))),
      "steps": jnp.asarray(1, jnp.int32),
      # Non-finite losses, plus the count of non-finite parameters after the update: the loop
      # never checkpoints a state from a window where this is non-zero.
      "nonfinite": (jnp.sum(~jnp.isfinite(losses)) + sum(
          _sum_all((~jnp.isfinite(p)).astype(jnp.int32))
          for p in jax.tree_util.tree_leaves(state.params))).astype(jnp.int32),
  }
  return state, metrics


def eval_step(state: TrainState, batch: dict, num_classes: int,
              probabilities: bool = False) -> dict:
  """Sums over the real (weight 1) examples of a padded eval batch, and a confusion matrix;
  with `probabilities`, also each row's predicted class probabilities ([B, num_classes])."""
  logits = state.apply_fn({"params": state.eval_params()}, batch["inputs"], train=False)
  weights = batch["weights"]
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
  predictions = jnp.argmax(logits, -1)
  confusion = jnp.einsum("bi,bj->ij", jax.nn.one_hot(batch["labels"], num_classes) * weights[:, None],
                         jax.nn.one_hot(predictions, num_classes))
  out = {"loss_sum": jnp.sum(losses * weights),
         "correct": jnp.sum((predictions == batch["labels"]) * weights),
         "count": jnp.sum(weights), "confusion": confusion}
  if probabilities:
    out["probabilities"] = jax.nn.softmax(logits.astype(jnp.float32), -1)
  return out


def summarize_eval(sums: dict, class_names: list[str], prefix: str) -> dict:
  """loss, accuracy, weighted F1 and per-class precision/recall from summed eval metrics."""
  count = float(sums["count"])
  confusion = np.asarray(sums["confusion"], np.float64)  # rows: true class, columns: predicted
  support = confusion.sum(1)
  predicted = confusion.sum(0)
  true_positive = np.diag(confusion)
  precision = np.divide(true_positive, predicted, out=np.zeros_like(true_positive),
                        where=predicted > 0)
  recall = np.divide(true_positive, support, out=np.zeros_like(true_positive), where=support > 0)
  f1 = np.divide(2 * precision * recall, precision + recall, out=np.zeros_like(precision),
                 where=(precision + recall) > 0)
  out = {f"{prefix}/loss": float(sums["loss_sum"]) / count,
         f"{prefix}/accuracy": float(sums["correct"]) / count,
         f"{prefix}/f1_weighted": float(np.sum(f1 * support) / max(support.sum(), 1)),
         f"{prefix}/count": int(count)}
  for name, p, r in zip(class_names, precision, recall):
    out[f"{prefix}/precision_{name}"] = float(p)
    out[f"{prefix}/recall_{name}"] = float(r)
  return out


# ---------------------------------------------------------------------------------------------
# Output: metrics.jsonl, TensorBoard, console. Only process 0 writes.


class MetricWriter:

  def __init__(self, workdir: str, enabled: bool, start_step: int = 0):
    self.enabled = enabled
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._tensorboard = None
    if enabled:
      import tensorboardX  # TensorBoard event files without TensorBoard itself.
      # purge_step: TensorBoard hides events past the restored step (they are produced again).
      self._tensorboard = tensorboardX.SummaryWriter(workdir, flush_secs=30,
                                                     purge_step=start_step or None)

  @staticmethod
  def read_rows(path: str, warn: bool = True) -> tuple[list[tuple[str, dict]], int]:
    """((line, row) per JSON line of a metrics file, its number of non-empty lines). An
    unfinished last line (a kill while it was written) is left out; any other line that is
    not JSON is a RunError. Checked on every resume, before anything is changed."""
    if not os.path.exists(path):
      return [], 0
    with open(path) as f:
      rows = [line for line in f if line.strip()]
    parsed = []
    for number, line in enumerate(rows):
      try:
        parsed.append((line if line.endswith("\n") else line + "\n", json.loads(line)))
      except json.JSONDecodeError:
        if number != len(rows) - 1:
          raise RunError(f"{path} line {number + 1} is not JSON; fix or remove that line to "
                         f"resume this run.") from None
        if warn:
          logging.warning("Dropping the unfinished last line of %s.", path)
    return parsed, len(rows)

  def drop_after(self, step: int) -> None:
    """On resume: rows past the restored step will be produced again, so drop them."""
    if not self.enabled:
      return
    parsed, lines = self.read_rows(self.path)
    # The final test report is always produced again at the end of the run, so it goes too.
    keep = [line for line, row in parsed
            if row.get("step", 0) <= step and "test/params_from_step" not in row]
    if len(keep) != lines:
      tmp = self.path + ".tmp"
      with open(tmp, "w") as f:
        f.writelines(keep)
      os.replace(tmp, self.path)

  def write(self, step: int, metrics: dict) -> None:
    if not self.enabled:
      return
    with open(self.path, "a") as f:
      f.write(json.dumps({"step": int(step), **metrics}) + "\n")
    for key, value in metrics.items():
      if isinstance(value, (int, float)):
        self._tensorboard.add_scalar(key, value, int(step))

  def close(self) -> None:
    if self._tensorboard is not None:
      self._tensorboard.close()


def _write_json_atomic(path: str, obj: Any) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def _shape_signature(params) -> dict:
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  return {"/".join(str(getattr(k, "key", k)) for k in path): list(leaf.shape)
          for path, leaf in flat}


# ---------------------------------------------------------------------------------------------
# The loop.


def _checkpoint_manager(workdir: str, config) -> ocp.CheckpointManager:
  policy = preservation.AnyPreservationPolicy([
      preservation.LatestN(config.keep_checkpoints),
      preservation.BestN(get_metric_fn=lambda metrics: metrics["val/accuracy"], n=1,
                         keep_checkpoints_without_metrics=False),
  ])
  # best_fn as well as the policy: without it Orbax neither writes the metrics to disk nor
  # answers best_step() with anything but the latest step.
  options = ocp.CheckpointManagerOptions(preservation_policy=policy, create=True,
                                         cleanup_tmp_directories=True,
                                         best_fn=lambda metrics: metrics["val/accuracy"],
                                         best_mode="max")
  return ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "checkpoints"),
                               options=options)


# Config fields a resumed run may change: where data and caches are read from (the data
# itself is checked by its fingerprint), the logging window and evaluation batch size (the
# train-metric rows' windows, the evaluation sums' rounding), how many checkpoints are kept, and
# the hardware and kernel settings (float rounding only; a change is reported as a warning, see
# machine_signature). Everything else must match the run being resumed: parameters, checkpoints
# and every evaluation and test figure then come out as in an uninterrupted run. The run's
# length (num_epochs / num_train_steps) may grow only where nothing depends on it: a constant
# schedule, and an old end on the evaluation and checkpoint grid (so the extended run evaluates
# and keeps the same steps an uninterrupted longer run would).
RESUMABLE_CHANGES = frozenset({
    "dataset", "data_dir", "cache_dir", "text_fields", "label_field", "eval_batch_size",
    "log_every_steps", "keep_checkpoints", "num_cpu_devices", "xla_flags", "deterministic",
    "model.attention_impl", "num_epochs", "num_train_steps"})


def data_fingerprint(data: data_lib.Dataset) -> str:
  """sha256 of the tokenised splits and labels a run trains, validates and tests on."""
  digest = hashlib.sha256()
  for split in (data.train, data.validation, data.test):
    for array in (split.inputs, split.labels):
      digest.update(str((array.dtype.str, array.shape)).encode())
      digest.update(np.ascontiguousarray(array).tobytes())
  digest.update(json.dumps(data.class_names).encode())
  return digest.hexdigest()


def run_contract(config: ml_collections.ConfigDict, data_print: str, total_steps: int,
                 eval_every: int, checkpoint_every: int) -> dict:
  """What a checkpoint records so a resume can check it continues the same training."""
  flat = pretrain.flatten(json.loads(config.to_json_best_effort()), separator=".")
  return {"config": {k: v for k, v in flat.items() if k not in RESUMABLE_CHANGES},
          "data_fingerprint": data_print, "total_steps": total_steps,
          "eval_every": eval_every, "checkpoint_every": checkpoint_every}


def _same(a, b) -> bool:
  return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def check_same_run(saved: dict | None, current: dict, schedule: str, workdir: str,
                   latest_step: int) -> None:
  """RunError unless `current` (run_contract of this command) continues the run `saved` was
  written by. Fields one side lacks (added to textattn later) are not compared."""
  if saved is None:
    logging.warning("The checkpoints in %s predate run contracts; the resume is not checked.",
                    workdir)
    return
  before, now = saved["config"], current["config"]
  differing = sorted(k for k in set(before) & set(now) if not _same(before[k], now[k]))
  if differing:
    first = differing[0]
    more = f" (and {len(differing) - 1} more: {', '.join(differing[1:4])}" + (
        ", ...)" if len(differing) > 4 else ")") if len(differing) > 1 else ""
    raise RunError(
        f"The run in {workdir} was started with config.{first}={before[first]!r} but this "
        f"command has {now[first]!r}{more}; a resume must continue the same training, so use "
        f"the original values or a new --workdir.")
  if saved["data_fingerprint"] != current["data_fingerprint"]:
    raise RunError(
        f"The run in {workdir} was trained on other data than this command loads (its "
        f"tokenised train/validation/test arrays differ: another dataset file or version, "
        f"split, vocabulary or length); use the original data or a new --workdir.")
  old, new = saved["total_steps"], current["total_steps"]
  if new == old:
    return
  if new < latest_step:
    raise RunError(
        f"The run in {workdir} has a checkpoint at step {latest_step} and this command asks for "
        f"{new} steps in all; a run cannot be shortened after the fact: use the original "
        f"num_epochs/num_train_steps, or a new --workdir.")
  if schedule != "constant":
    raise RunError(
        f"The run in {workdir} was started to last {old} steps and this command asks for "
        f"{new}; with optimizer.schedule={schedule!r} the learning rate depends on the length, "
        f"so use the original num_epochs/num_train_steps or a new --workdir.")
  if old % current["eval_every"] or old % current["checkpoint_every"]:
    raise RunError(
        f"The run in {workdir} ended at step {old}, which is off its evaluation/checkpoint grid "
        f"(every {current['eval_every']} / {current['checkpoint_every']} steps), so extending it "
        f"to {new} steps would evaluate and keep steps an uninterrupted run would not; use a "
        f"new --workdir.")


def machine_signature(config: ml_collections.ConfigDict) -> dict:
  """What a step's float rounding may depend on: the backend and devices, JAX's version, the
  kernel and XLA settings, and on a CPU the cores this process may use (XLA's and the native
  kernels' thread counts follow them) and a hash of its feature flags (what -march=native and
  XLA compile for)."""
  import jaxlib
  signature = {"backend": jax.default_backend(), "devices": jax.device_count(),
               "device_kind": jax.devices()[0].device_kind, "jax": jax.__version__,
               "jaxlib": jaxlib.__version__, "attention_impl": config.model.attention_impl,
               "xla_flags": config.xla_flags, "deterministic": config.deterministic,
               # None: JAX's default (TF32 products on recent NVIDIA GPUs, float32 on CPUs).
               "matmul_precision": jax.config.jax_default_matmul_precision}
  if signature["backend"] == "cpu":
    from textattn import attention
    from textattn.attention import native
    signature["cpu_cores"] = attention.usable_cores()
    signature["cpu_features"] = hashlib.sha256(native.cpu_signature().encode()).hexdigest()[:12]
  return signature


def _stop_together(problem: RunError | None) -> None:
  """Raise `problem` here, and a RunError on every other process, if any process has one."""
  if jax.process_count() == 1:
    if problem is not None:
      raise problem
    return
  from jax.experimental import multihost_utils
  flags = np.asarray(multihost_utils.process_allgather(
      np.asarray(problem is not None, np.int32))).reshape(-1)
  if problem is not None:
    raise problem
  if flags.any():
    raise RunError(f"Process {int(np.argmax(flags))} cannot resume this run (its message says "
                   f"why), so process {jax.process_index()} stops too.")


def _one_line(text: str, limit: int = 200) -> str:
  return " ".join(str(text).split())[:limit]


def _unreadable_checkpoint(manager, step: int, error: Exception) -> RunError:
  older = [s for s in manager.all_steps() if s < step]
  fallback = (f"to resume from step {max(older)}" if older else "to start afresh")
  return RunError(f"The checkpoint at step {step} in {manager.directory} cannot be read "
                  f"({type(error).__name__}: {_one_line(error)}); if its files are damaged, move "
                  f"{manager.directory / str(step)} out of the way {fallback} (or use a new "
                  f"--workdir), else fix the cause (permissions, disk) and re-run.")


def _read_meta(manager, step: int) -> dict:
  """The checkpoint's "meta" item, read by Orbax's JSON handler itself rather than through
  manager.restore: that ends in a barrier across processes, which a process whose read failed
  never reaches, so the others would wait there until its timeout instead of agreeing (in
  _stop_together) to stop at once."""
  return ocp.JsonCheckpointHandler().restore(manager.directory / str(step) / "meta")


def _check_same_model(checkpoint_shapes: dict, current_shapes: dict, workdir: str) -> None:
  if checkpoint_shapes == current_shapes:
    return
  differing = None
  for name in sorted(set(checkpoint_shapes) | set(current_shapes)):
    if checkpoint_shapes.get(name) != current_shapes.get(name):
      differing = name
      break
  raise RunError(
      f"The model in {workdir} does not match this config: state entry {differing!r} has "
      f"shape {checkpoint_shapes.get(differing)} in the checkpoint and "
      f"{current_shapes.get(differing)} now (a changed model, or an optimizer with other "
      f"state); use a new --workdir, or the config that made this one.")


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains (or resumes), evaluates, and returns the final report's metrics."""
  validate_config(config, jax.device_count())
  is_main = jax.process_index() == 0
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise RunError(f"--workdir={workdir} is a file, not a directory; name a directory (it is "
                   f"created if missing).")
  os.makedirs(workdir, exist_ok=True)
  data_sharding, replicated = data_parallel_shardings()

  data = data_lib.load_dataset(config, workdir, write=is_main)
  num_classes = len(data.class_names)
  model = models.build_model(config, num_classes, vocab_size=data.vocab_size)
  train_iter = data_lib.TrainIterator(data.train, config.batch_size, config.seed,
                                            jax.process_index(), jax.process_count())
  total_steps = (config.num_train_steps if config.num_train_steps > 0
                 else config.num_epochs * train_iter.steps_per_epoch)
  eval_every = config.eval_every_steps or train_iter.steps_per_epoch
  checkpoint_every = config.checkpoint_every_steps or train_iter.steps_per_epoch
  if config.final_params == "best" and checkpoint_every % eval_every:
    raise ValueError(
        f"config.checkpoint_every_steps={config.checkpoint_every_steps} must be a multiple of "
        f"config.eval_every_steps={config.eval_every_steps} (0 = once per epoch, here "
        f"{train_iter.steps_per_epoch} steps) when config.final_params='best', so every "
        f"checkpoint carries the validation accuracy it is chosen by.")
  tx = make_optimizer(config.optimizer, total_steps)
  contract = run_contract(config, data_fingerprint(data), total_steps, eval_every,
                          checkpoint_every)
  machine = machine_signature(config)
  eval_data = data.validation if config.eval_split == "validation" else data.test
  eval_prefix = "val" if config.eval_split == "validation" else "test"
  if len(eval_data) == 0:
    raise ValueError(f"config.eval_split={config.eval_split!r} selects an empty split; with "
                     f"eval_split='validation' set config.val_fraction > 0.")

  def init(rng, pretrained_tokens=None, pretrained_params=None):
    return init_train_state(model, tx, rng, config.max_len, config.optimizer, pretrained_tokens,
                            pretrained_params)

  rng = jax.random.key(config.seed)
  abstract_state = jax.eval_shape(init, rng)
  state_sharding = jax.tree.map(lambda _: replicated, abstract_state)
  shapes = _shape_signature(abstract_state.params)
  shapes.update({f"opt_state/{k}": v
                 for k, v in _shape_signature(abstract_state.opt_state).items()})
  shapes.update({f"ema_params/{k}": v
                 for k, v in _shape_signature(abstract_state.ema_params).items()})
  if is_main:
    print(f"Model: {config.model.attention} attention, {config.model.pooling} pooling\n"
          + models.parameter_table(abstract_state.params), flush=True)

  try:
    manager = _checkpoint_manager(workdir, config)
  except Exception as e:  # e.g. a damaged checkpoint's metrics or metadata
    raise RunError(f"The checkpoints in {os.path.join(workdir, 'checkpoints')} cannot be read "
                   f"({type(e).__name__}: {_one_line(e)}); if a step's files are damaged, move "
                   f"that step directory out of the way to resume from an older one (or use a "
                   f"new --workdir), else fix the cause (permissions, disk) and re-run.") from e
  start_step = 0
  latest = manager.latest_step()
  # Every check that can stop a resume runs before any collective, and the processes agree on
  # the verdict (one of them may see a damaged file the others do not), so none is left waiting.
  problem = None
  if latest is not None:
    try:
      meta = _read_meta(manager, latest)
    except Exception as e:  # noqa: BLE001 -- any failure to read it gets the same advice
      problem = _unreadable_checkpoint(manager, latest, e)
    if problem is None:
      try:
        _check_same_model(meta["param_shapes"], shapes, workdir)
        check_same_run(meta.get("run"), contract, config.optimizer.schedule, workdir, latest)
      except RunError as e:
        problem = e
  if problem is None and is_main:
    try:
      MetricWriter.read_rows(os.path.join(workdir, "metrics.jsonl"), warn=False)
    except RunError as e:
      problem = e
  _stop_together(problem)
  if latest is not None:
    changed = {k: (v, machine.get(k)) for k, v in meta.get("machine", machine).items()
               if machine.get(k) != v}
    if is_main and changed:
      print("Warning: resuming with other hardware or kernel settings than the checkpoint was "
            "written with (" + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
            + "): the run continues, but float rounding may differ, so it need not end "
            "bit-identical to an uninterrupted run.", flush=True)
    try:
      restored = manager.restore(latest, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state_with_sharding(abstract_state,
                                                                      state_sharding)),
          data=ocp.args.JsonRestore()))
    except Exception as e:
      raise _unreadable_checkpoint(manager, latest, e) from e
    state = restored["state"].replace(apply_fn=model.apply, tx=tx)
    train_iter.set_state(restored["data"])
    start_step = int(latest)
    logging.info("Resumed from %s at step %d.", manager.directory, start_step)
    if is_main:
      print(f"Resuming from checkpoint at step {start_step}.", flush=True)
  else:
    # Only a fresh run starts from word vectors or a pretrained encoder: a resume restores them.
    pretrained_tokens = pretrained_params = None
    if config.model.embedding_init == "word2vec":
      pretrained_tokens = word2vec.pretrained_token_table(
          config, data.tokenizer, data.vocab_size, write=is_main)
    if pretrain.enabled(config):
      # Every process writes its cache (atomically; identical content): caches may be per host.
      pretrained_params, curve = pretrain.pretrain(config, data.tokenizer, data.vocab_size)
      if is_main:
        pretrain.write_curve(workdir, curve)
    state = jax.jit(init, out_shardings=state_sharding)(rng, pretrained_tokens, pretrained_params)

  writer = MetricWriter(workdir, is_main, start_step)
  writer.drop_after(start_step)
  if is_main:
    config_path = os.path.join(workdir, "config.json")
    if os.path.exists(config_path) and start_step:
      try:
        with open(config_path) as f:
          same = json.load(f) == json.loads(config.to_json_best_effort())
      except (OSError, ValueError):
        same = False  # unreadable: kept aside like a changed one, never overwritten
      if not same:
        os.replace(config_path, os.path.join(workdir, f"config.before-step-{start_step}.json"))
    _write_json_atomic(config_path, json.loads(config.to_json_best_effort()))

  options = step_compiler_options(config)
  p_train_step = jax.jit(train_step, in_shardings=(state_sharding, data_sharding),
                         out_shardings=(state_sharding, replicated), donate_argnums=0,
                         compiler_options=options)
  p_eval_step = jax.jit(lambda s, b: eval_step(s, b, num_classes),
                        in_shardings=(state_sharding, data_sharding), out_shardings=replicated,
                        compiler_options=options)
  p_test_step = jax.jit(lambda s, b: eval_step(s, b, num_classes, probabilities=True),
                        in_shardings=(state_sharding, data_sharding), out_shardings=replicated,
                        compiler_options=options)

  def evaluate(state, split, prefix):
    """(metrics, per-example class probabilities in the split's order on test, else None).
    Eval batches are consecutive examples with the padding at the end."""
    step_fn = p_test_step if prefix == "test" else p_eval_step
    totals, probabilities = None, []
    for batch in data_lib.eval_batches(split, config.eval_batch_size, jax.process_index(),
                                             jax.process_count()):
      sums = step_fn(state, to_global(batch, data_sharding))
      if prefix == "test":
        probabilities.append(sums.pop("probabilities"))
      totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    metrics = summarize_eval(jax.device_get(totals), data.class_names, prefix)
    if prefix != "test":
      return metrics, None
    return metrics, np.concatenate(jax.device_get(probabilities))[:len(split)]

  def save(step, state, metrics=None):
    manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(train_iter.get_state()),
        meta=ocp.args.JsonSave({"param_shapes": shapes, "class_names": data.class_names,
                                "run": contract, "machine": machine})),
        metrics=metrics)

  if start_step < total_steps:
    t0 = time.perf_counter()
    first_batch = to_global(next(train_iter), data_sharding)
    compiled = p_train_step.lower(state, first_batch).compile()
    compile_s = time.perf_counter() - t0
    logging.info("Compiled train_step in %.1fs.", compile_s)
    if is_main and start_step == 0:  # (a resumed run would add a row the original run lacks)
      writer.write(start_step, {"train/compile_s": compile_s})

  progress = tqdm.tqdm(total=total_steps, initial=start_step, disable=not is_main,
                       unit="step", dynamic_ncols=True, mininterval=1.0)
  pending, window_start, window_examples = [], time.perf_counter(), 0
  batch = first_batch if start_step < total_steps else None
  last_eval = None
  for step in range(start_step, total_steps):
    state, metrics = compiled(state, batch)
    pending.append(metrics)
    window_examples += config.batch_size
    progress.update(1)
    done = step + 1
    is_last = done == total_steps
    log_now = (config.log_every_steps and done % config.log_every_steps == 0) or is_last
    eval_now = done % eval_every == 0 or is_last
    checkpoint_now = done % checkpoint_every == 0 or is_last
    if log_now or eval_now or checkpoint_now:
      # One host sync per window; the NaN guard sees every step's loss before any save.
      sums = sum_steps(pending)
      elapsed = time.perf_counter() - window_start
      if sums["nonfinite"]:
        progress.close()
        manager.wait_until_finished()
        raise NonFiniteLossError(
            f"The training loss or parameters became NaN/Inf between steps {done - len(pending) + 1} and "
            f"{done}; stopping. The last good checkpoint (step {manager.latest_step()}) is "
            f"kept in {manager.directory}. Try a lower optimizer.learning_rate or "
            f"optimizer.grad_clip_norm > 0.")
      train_metrics = {
          "train/loss": float(sums["loss_sum"]) / float(sums["count"]),
          "train/accuracy": float(sums["correct"]) / float(sums["count"]),
          "train/grad_norm": float(sums["grad_norm_sum"]) / float(sums["steps"]),
          "train/examples_per_sec": window_examples / elapsed,
          "train/epoch": done / train_iter.steps_per_epoch,
      }
      if is_main:
        writer.write(done, train_metrics)
        progress.set_postfix(loss=f"{train_metrics['train/loss']:.4f}",
                             ex_per_s=f"{train_metrics['train/examples_per_sec']:.0f}")
      eval_metrics = None
      if eval_now:
        eval_metrics, probabilities = evaluate(state, eval_data, eval_prefix)
        last_eval = (done, eval_metrics, probabilities)
        # (A final eval on test is written once, as the test report below.)
        if is_main and not (is_last and eval_prefix == "test"):
          writer.write(done, eval_metrics)
          progress.write(f"step {done}: {eval_prefix} accuracy "
                         f"{eval_metrics[f'{eval_prefix}/accuracy']:.4f}, loss "
                         f"{eval_metrics[f'{eval_prefix}/loss']:.4f}")
      if checkpoint_now:
        ckpt_metrics = ({"val/accuracy": eval_metrics["val/accuracy"]}
                        if eval_metrics and "val/accuracy" in eval_metrics else None)
        save(done, state, ckpt_metrics)
      pending, window_start, window_examples = [], time.perf_counter(), 0
    if not is_last:
      # Only after any checkpoint above: the saved iterator position is the batch of step done+1.
      batch = to_global(next(train_iter), data_sharding)
  progress.close()
  manager.wait_until_finished()

  # Final report on the test split.
  if config.final_params == "best" and manager.best_step() is not None:
    best = manager.best_step()
    if best != total_steps:
      state = manager.restore(best, args=ocp.args.Composite(state=ocp.args.StandardRestore(
          abstract_state_with_sharding(abstract_state, state_sharding))))["state"]
      state = state.replace(apply_fn=model.apply, tx=tx)
    report_step = best
  else:
    report_step = total_steps
  if (last_eval is not None and eval_prefix == "test" and last_eval[0] == report_step):
    _, test_metrics, test_probabilities = last_eval
  else:
    test_metrics, test_probabilities = evaluate(state, data.test, "test")
  test_metrics["test/params_from_step"] = int(report_step)
  if is_main:
    compare.write_predictions(workdir, data.test.labels, test_probabilities, data.class_names,
                              report_step)
    writer.write(total_steps, test_metrics)
    print("Test report: " + ", ".join(
        f"{k.split('/', 1)[1]}={v:.4f}" if isinstance(v, float) else f"{k.split('/', 1)[1]}={v}"
        for k, v in test_metrics.items()), flush=True)
  manager.close()
  writer.close()
  return test_metrics


def to_global(batch: dict, data_sharding: jax.NamedSharding) -> dict:
  """This process's rows of a batch -> global arrays sharded along the data axis."""
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(data_sharding, x), batch)


def sum_steps(metrics: list[dict]) -> dict:
  """Per-step metric sums of a logging window, fetched and added up on the host (one sync)."""
  return jax.tree.map(lambda *xs: np.sum(np.stack(xs), 0), *jax.device_get(metrics))


def abstract_state_with_sharding(abstract_state, state_sharding):
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract_state, state_sharding)
