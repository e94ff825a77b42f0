"""MQAR's pure steps and its evaluation: cross-entropy and accuracy at the answers only.

The model (textattn/models/decoder.LanguageModel) reads a batch's tokens causally and gives
logits only at the query positions (`logits_at`), where the target is the queried key's value;
no other position is scored. Sums (per batch, summed across batches, divided when reported):
loss_sum (nats over the answers), correct (argmax over the whole vocabulary = the value), count
(answers). Metrics of one set of examples: loss = loss_sum / count, accuracy = correct / count.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from textattn import platform
from textattn import progress as progress_lib


def _forward(apply_fn, params, batch, **kwargs):
  logits = apply_fn({"params": params}, batch["inputs"], logits_at=batch["query_positions"],
                    **kwargs)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32),
                                                           batch["answers"])
  return losses, jnp.argmax(logits, -1) == batch["answers"]


def train_step(state, batch):
  dropout_key = jax.random.fold_in(jax.random.wrap_key_data(state.dropout_key), state.step)

  def loss_fn(params):
    losses, correct = _forward(state.apply_fn, params, batch, train=True,
                               rngs={"dropout": dropout_key})
    return jnp.mean(losses), (losses, correct)

  grads, (losses, correct) = jax.grad(loss_fn, has_aux=True)(state.params)
  state = state.apply_gradients(grads=grads)
  return state, {
      "loss_sum": jnp.sum(losses), "correct": jnp.sum(correct),
      "count": jnp.asarray(losses.size, jnp.float32), "grad_norm_sum": optax.global_norm(grads),
      "steps": jnp.asarray(1, jnp.int32),
      "nonfinite": (jnp.sum(~jnp.isfinite(losses)) + sum(
          jnp.sum(~jnp.isfinite(p)) for p in jax.tree_util.tree_leaves(state.params))
      ).astype(jnp.int32)}


def eval_step(state, batch):
  losses, correct = _forward(state.apply_fn, state.params, batch)
  weights = jnp.broadcast_to(batch["weights"][:, None], losses.shape)
  return {"loss_sum": jnp.sum(losses * weights), "correct": jnp.sum(correct * weights),
          "count": jnp.sum(weights)}


def metrics(prefix: str, totals: dict) -> dict:
  count = max(float(totals["count"]), 1.0)
  return {f"{prefix}/loss": float(totals["loss_sum"]) / count,
          f"{prefix}/accuracy": float(totals["correct"]) / count,
          f"{prefix}/answers": int(totals["count"])}


def eval_batches(examples, global_batch_size: int, process_index: int = 0,
                 process_count: int = 1):
  """Every example once, in order, as data.eval_batches: this process's rows of each global
  batch, the last padded with weight-0 copies of example 0."""
  local = global_batch_size // process_count
  for start in range(0, len(examples), global_batch_size):
    positions = start + process_index * local + np.arange(local)
    real = positions < len(examples)
    yield {**examples.batch(np.where(real, positions, 0)), "weights": real.astype(np.float32)}


def make_evaluator(eval_batch_size: int, mesh=None, options=None):
  """evaluate(state, examples, prefix) -> `metrics` of one set of examples (data.Examples), in
  global batches laid out on `mesh` (the run's; None: data parallelism over all devices)."""
  mesh = mesh if mesh is not None else platform.run_mesh()
  jitted = {}

  def compiled(state, batch):
    shape = batch["inputs"].shape  # (one program per setting: its shardings follow the shape)
    if shape not in jitted:
      state_sharding = jax.tree.map(lambda _: platform.replicated(mesh), state)
      jitted[shape] = jax.jit(
          eval_step, in_shardings=(state_sharding, platform.batch_shardings(mesh, batch)),
          out_shardings=platform.replicated(mesh), compiler_options=options)
    return jitted[shape](state, batch)

  def evaluate(state, examples, prefix):
    totals = {"loss_sum": 0.0, "correct": 0.0, "count": 0.0}
    countdown = progress_lib.Countdown(prefix, len(examples), jax.process_index() == 0)
    for index, batch in enumerate(eval_batches(examples, eval_batch_size,
                                               *platform.row_block(mesh))):
      sums = jax.device_get(compiled(state, platform.to_global(batch, mesh)))  # (one sync)
      for key in totals:
        totals[key] += float(np.asarray(sums[key], np.float64))
      countdown.update((index + 1) * eval_batch_size, totals)
    return metrics(prefix, totals)

  return evaluate
