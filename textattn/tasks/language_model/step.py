"""The language model's pure steps and its evaluation: next-token cross-entropy over packed rows.

Sums (per batch, summed across batches, divided only when reported): loss_sum (nats over the
weighted positions: every within-document next token, [end] included), correct (argmax =
target), count (those positions). Metrics of a split:
  loss = loss_sum / count (nats per token), perplexity = exp(loss), accuracy = correct / count,
  bits_per_byte = loss_sum / ln 2 / (the split's documents' UTF-8 bytes), for a lossless
  tokenizer only: the model's total negative log2-likelihood of the raw bytes, [end] included.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from textattn import platform
from textattn import progress as progress_lib
from textattn.data import eval_batches
from textattn.tasks.language_model.data import row_fields


def _forward(apply_fn, params, rows, **kwargs):
  fields = row_fields(rows.astype(jnp.int32))
  logits = apply_fn({"params": params}, fields["inputs"], fields["segment_ids"],
                    fields["positions"], **kwargs)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32),
                                                           fields["targets"])
  correct = jnp.argmax(logits, -1) == fields["targets"]
  return losses, correct, fields["weights"]


def train_step(state, batch):
  dropout_key = jax.random.fold_in(jax.random.wrap_key_data(state.dropout_key), state.step)

  def loss_fn(params):
    losses, correct, weights = _forward(state.apply_fn, params, batch["inputs"], train=True,
                                        rngs={"dropout": dropout_key})
    loss = jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0)
    return loss, (losses, correct, weights)

  grads, (losses, correct, weights) = jax.grad(loss_fn, has_aux=True)(state.params)
  state = state.apply_gradients(grads=grads)
  return state, {
      "loss_sum": jnp.sum(losses * weights), "correct": jnp.sum(correct * weights),
      "count": jnp.sum(weights), "grad_norm_sum": optax.global_norm(grads),
      "steps": jnp.asarray(1, jnp.int32),
      "nonfinite": (jnp.sum(~jnp.isfinite(losses) * weights) + sum(
          jnp.sum(~jnp.isfinite(p)) for p in jax.tree_util.tree_leaves(state.params))
      ).astype(jnp.int32)}


def eval_step(state, batch):
  losses, correct, weights = _forward(state.apply_fn, state.params, batch["inputs"])
  weights = weights * batch["weights"][:, None]
  return {"loss_sum": jnp.sum(losses * weights), "correct": jnp.sum(correct * weights),
          "count": jnp.sum(weights)}


def metrics(prefix: str, totals: dict, byte_count: int | None) -> dict:
  """A split's metrics from its summed totals (byte_count None: a lossy tokenizer's, no
  bits_per_byte)."""
  count = max(float(totals["count"]), 1.0)
  loss = float(totals["loss_sum"]) / count
  out = {f"{prefix}/loss": loss, f"{prefix}/perplexity": math.exp(min(loss, 700.0)),
         f"{prefix}/accuracy": float(totals["correct"]) / count,
         f"{prefix}/tokens": int(totals["count"])}
  if byte_count is not None:
    out[f"{prefix}/bits_per_byte"] = float(totals["loss_sum"]) / math.log(2) / byte_count
    out[f"{prefix}/tokens_per_byte"] = float(totals["count"]) / byte_count
  return out


def make_evaluator(eval_batch_size: int, mesh=None, options=None):
  """evaluate(state, split, prefix, byte_count) -> the split's metrics (`metrics`), its rows in
  global batches laid out on `mesh` (the run's; None: data parallelism over all devices)."""
  mesh = mesh if mesh is not None else platform.run_mesh()
  jitted = {}

  def compiled(state, batch):
    if "step" not in jitted:
      state_sharding = jax.tree.map(lambda _: platform.replicated(mesh), state)
      jitted["step"] = jax.jit(
          eval_step, in_shardings=(state_sharding, platform.batch_shardings(mesh, batch)),
          out_shardings=platform.replicated(mesh), compiler_options=options)
    return jitted["step"](state, batch)

  def evaluate(state, split, prefix, byte_count):
    totals = {"loss_sum": 0.0, "correct": 0.0, "count": 0.0}
    countdown = progress_lib.Countdown(prefix, len(split), jax.process_index() == 0)
    for index, batch in enumerate(eval_batches(split, eval_batch_size,
                                               *platform.row_block(mesh))):
      sums = jax.device_get(compiled(state, platform.to_global(batch, mesh)))
      for key in totals:  # (float64 on the host: a test split's sum of millions of tokens)
        totals[key] += float(np.asarray(sums[key], np.float64))
      countdown.update((index + 1) * eval_batch_size, totals)
    return metrics(prefix, totals, byte_count)

  return evaluate
