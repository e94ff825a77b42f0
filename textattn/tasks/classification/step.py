"""The classifier's pure train and eval steps.

`train_step(state, batch) -> (state, sums)` and `eval_step(state, batch, ...) -> sums` are pure
functions of their inputs, compiled by the loop with `jax.jit` over the data-parallel mesh.
Dropout keys are `fold_in(state.dropout_key, state.step)`: deterministic, and the same after a
resume. Metrics are sums (divide by "count" when reporting).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from textattn.train_state import TrainState, is_token_table, token_table


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


def distillation_losses(logits, teacher_log_probs, temperature: float) -> jax.Array:
  """[B]: T^2 KL(p_T || q_T), p_T = softmax(teacher logits / T) (from the teacher's log
  probabilities: softmax(log p / T) = softmax(z / T)) and q_T the student's (Hinton et al. 2015;
  the T^2 keeps its gradients' scale as T changes)."""
  teacher = jax.nn.log_softmax(teacher_log_probs.astype(jnp.float32) / temperature, -1)
  student = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, -1)
  return temperature ** 2 * jnp.sum(jnp.exp(teacher) * (teacher - student), -1)


def train_step(state: TrainState, batch: dict, distill: float = 0.0,
               temperature: float = 1.0) -> tuple[TrainState, dict]:
  """One optimiser step. Metrics are sums (divide by "count" when reporting).

  With `distill` > 0 the batch holds "teacher_log_probs" [B, classes] (a fine-tuned teacher's,
  attention_transfer.distill) and each example's loss is (1 - distill) x its cross-entropy +
  distill x distillation_losses (at `temperature`); the metrics' loss is that mix.

  With state.table_squares (optimizer "keras_adam") the loss is also differentiated with respect
  to the looked-up embedding rows, and the optimizer gets the token table's per-occurrence
  gradients (optim.scale_by_keras_adam's sparse_table: Keras' per-occurrence squares in the
  second moment, and no dense table gradient in the update); the metrics' gradient norm sums
  them per token id.
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
    if distill:
      losses = (1.0 - distill) * losses + distill * distillation_losses(
          logits, batch["teacher_log_probs"], temperature)
    return jnp.mean(losses), (losses, logits)

  if state.table_squares:
    # Differentiate with respect to the looked-up rows (one gradient per token position);
    # grads' table entry is then zero and unused: the model does not read the table.
    table = token_table(state.params)
    (grads, row_grads), (losses, logits) = jax.grad(loss_fn, argnums=(0, 1), has_aux=True)(
        state.params, jnp.take(table, tokens, axis=0))
    flat_rows = row_grads.reshape(tokens.size, -1).astype(table.dtype)
    ids = tokens.reshape(-1)
    marks = jax.tree_util.tree_map_with_path(
        lambda path, g: is_token_table(path, g, table.shape), grads)
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params,
                                         sparse_table=(marks, ids, flat_rows))
    state = state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                          opt_state=opt_state)
    # The table gradient's squared norm, for the metrics: with T = segment_sum(rows, ids) (each
    # id's rows sum to its row of T), |T|^2 = sum_i <rows_i, T[ids_i]>: the batch's 6,400 rows
    # are read, not T's 20,000 (a 0.3 ms pass in the seed model's 5.8 ms step, issue 56).
    table_grad = jax.ops.segment_sum(flat_rows, ids, num_segments=table.shape[0])
    squares = [_sum_all(flat_rows * jnp.take(table_grad, ids, axis=0))]
    grads = jax.tree.map(lambda g, t: None if t else g, grads, marks)
  else:
    grads, (losses, logits) = jax.grad(loss_fn, has_aux=True)(state.params)
    state = state.apply_gradients(grads=grads)
    squares = []
  metrics = {
      "loss_sum": jnp.sum(losses),
      "correct": jnp.sum(jnp.argmax(logits, -1) == batch["labels"]),
      "count": jnp.asarray(losses.shape[0], jnp.int32),
      # optax.global_norm(grads), with the fast sum.
      "grad_norm_sum": jnp.sqrt(sum(squares + [_sum_all(jnp.square(g).astype(jnp.float32))
                                               for g in jax.tree_util.tree_leaves(grads)])),
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
  logits = state.apply_fn({"params": state.params}, batch["inputs"], train=False)
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
