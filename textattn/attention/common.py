"""What every attention variant shares: masks, the masked softmax over tokens, initialisers.

Conventions for every kernel: tensors are [batch, length, heads, head_dim]; `padding_mask` is
bool [batch, length], True for real tokens; padding keys never receive weight; a query with no
visible key (a fully padded row, or a causal row whose visible prefix is all padding) outputs
exactly zero, never NaN/Inf; softmax runs in float32 even when activations are bfloat16.
"""

from __future__ import annotations

import contextlib
import contextvars
import os

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array

_TRACED_FOR: contextvars.ContextVar[str | None] = contextvars.ContextVar("traced_for",
                                                                         default=None)


def backend() -> str:
  """The backend attention code is traced for: `jax.default_backend()`, or the one `traced_for`
  names while a function is exported for another platform (each kernel choice, interpret mode
  and platform check reads this, so an export for CUDA from a CPU traces what a GPU would)."""
  return _TRACED_FOR.get() or jax.default_backend()


@contextlib.contextmanager
def traced_for(platform: str):
  """Within: `backend()` is `platform` ("cuda"/"rocm" read as "gpu"), for `jax.export`."""
  token = _TRACED_FOR.set({"cuda": "gpu", "rocm": "gpu"}.get(platform, platform))
  try:
    yield
  finally:
    _TRACED_FOR.reset(token)


# Added to the logits of masked positions. Finite (so a row with every key masked stays finite)
# and far below any real logit; rows with no valid key are zeroed explicitly afterwards.
MASK_VALUE = -1e30


def key_visibility(padding_mask: Array, causal: bool, q_positions: Array | None = None,
                    num_keys: int | None = None) -> Array:
  """Boolean [batch, 1, q, k] (or [batch, 1, 1, k]) mask of the keys each query may see."""
  visible = padding_mask[:, None, None, :]
  if causal:
    num_keys = padding_mask.shape[-1] if num_keys is None else num_keys
    if q_positions is None:
      q_positions = jnp.arange(num_keys)
    look_ahead = q_positions[:, None] >= jnp.arange(num_keys)[None, :]
    visible = visible & look_ahead[None, None, :, :]
  return visible


def rows_with_a_key(padding_mask: Array, causal: bool, q_positions: Array | None = None) -> Array:
  """Boolean [batch, q, 1, 1]: does query q see at least one real key? O(length) to compute."""
  if causal:
    seen = jnp.cumsum(padding_mask.astype(jnp.int32), axis=-1) > 0  # [batch, length]
    if q_positions is not None:
      seen = seen[:, q_positions]
    return seen[:, :, None, None]
  return jnp.any(padding_mask, axis=-1)[:, None, None, None]



def masked_softmax_over_tokens(scores: Array, padding_mask: Array) -> Array:
  """Softmax over the length axis of float32 scores [batch, length, heads]; padding gets 0."""
  scores = jnp.where(padding_mask[:, :, None], scores.astype(jnp.float32), MASK_VALUE)
  weights = jax.nn.softmax(scores, axis=1)
  return jnp.where(padding_mask[:, :, None], weights, 0.0)


def dense_init():
  # Keras' Dense default (glorot uniform), as in the seed notebooks.
  return nn.initializers.xavier_uniform()


def usable_cores() -> int:
  """The CPU cores this process may use (its affinity mask, where the OS has one)."""
  try:
    return max(1, len(os.sched_getaffinity(0)))
  except AttributeError:  # macOS
    return os.cpu_count() or 1


def merged_mean(total_values: Array, total_weights: Array) -> Array:
  """total_values / total_weights, 0 where the weight is 0 (no real token), with a finite
  gradient however small the weight: the quotient's derivative squares its divisor, and a
  linear-attention denominator phi(q).sum(phi(k)) can be ~1e-20 (FAVOR+ features of a long key),
  whose square underflows float32 (-inf, then 0 * inf = NaN at padded queries). So both sides
  are divided by the weight held constant first: v/w as (v/s) / (w/s) with s = w, whose divisor
  is exactly 1, the same value, bit for bit, and the same gradient, finite. A divisor of 0 is
  replaced by 1 (a floor like 1e-30 would underflow the same way)."""
  seen = total_weights > 0
  scale = jax.lax.stop_gradient(jnp.where(seen, total_weights, 1.0))
  unit = jnp.where(seen, total_weights / scale, 1.0)  # (exactly 1 where seen)
  return jnp.where(seen[..., None], (total_values / scale[..., None]) / unit[..., None], 0.0)


def segment_runs(padding_mask: Array, segment_ids: Array | None) -> tuple[Array, Array]:
  """(real bool [batch, length], runs int32 [batch, length]): real = not padding (and segment
  id != 0); runs number the contiguous runs of equal segment ids (all 0 without segment ids),
  so "same segment" is "same run" and a run starts wherever the id changes."""
  real = padding_mask.astype(bool)
  if segment_ids is None:
    return real, jnp.zeros(real.shape, jnp.int32)
  segment_ids = segment_ids.astype(jnp.int32)
  real = real & (segment_ids != 0)
  starts = segment_ids[:, 1:] != segment_ids[:, :-1]
  runs = jnp.concatenate([jnp.zeros_like(segment_ids[:, :1]),
                          jnp.cumsum(starts.astype(jnp.int32), axis=1)], axis=1)
  return real, runs
