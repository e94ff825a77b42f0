"""What every recurrent core shares: documents as runs, inputs split into chunks, the compute
dtype, grouped heads and the masked exponential of log-gate differences.

Runs: `document_runs(mask, segment_ids)` numbers the documents of each row. A real position
whose segment id differs from the previous REAL position's starts a new run; padding (mask False,
or segment id 0) joins the run before it (it neither decays nor writes the state, so it changes
nothing), and leading padding joins the first run, so the initial state reaches the first
document and the final state is the last document's whatever padding follows it. The numbers are
global over the row: a sequence-parallel shard compares them across its edges.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def compute_dtype(*arrays: Array) -> jnp.dtype:
  """The dtype state, gate sums and products are computed in: at least float32 (float64 kept)."""
  return jnp.promote_types(jnp.result_type(*arrays), jnp.float32)


def wide(x: Array) -> Array:
  """x in at least float32 (float64 kept)."""
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def document_runs(mask: Array | None, segment_ids: Array | None,
                  shape: tuple[int, int]) -> tuple[Array, Array]:
  """(real bool [batch, length], runs int32 [batch, length]); see the module docstring."""
  real = jnp.ones(shape, bool) if mask is None else mask.astype(bool)
  if segment_ids is None:
    return real, jnp.zeros(shape, jnp.int32)
  ids = segment_ids.astype(jnp.int32)
  real = real & (ids != 0)
  positions = jnp.broadcast_to(jnp.arange(shape[1]), shape)
  last_real = jax.lax.cummax(jnp.where(real, positions, -1), axis=1)  # at or before t
  before = jnp.concatenate([jnp.full_like(last_real[:, :1], -1), last_real[:, :-1]], axis=1)
  previous_id = jnp.take_along_axis(ids, jnp.maximum(before, 0), axis=1)
  starts = real & (before >= 0) & (ids != previous_id)
  return real, jnp.cumsum(starts.astype(jnp.int32), axis=1)


def run_starts(runs: Array) -> Array:
  """bool [batch, length]: True where a run begins after the row's first position."""
  return jnp.concatenate([jnp.zeros_like(runs[:, :1], bool), runs[:, 1:] != runs[:, :-1]], 1)


def expand_heads(x: Array, heads: int, what: str) -> Array:
  """[b, l, key_heads, d] -> [b, l, heads, d]: head h reads key head h // (heads // key_heads)."""
  key_heads = x.shape[2]
  if heads % key_heads:
    raise ValueError(f"{what} has {key_heads} heads, which must divide the values' {heads}.")
  return x if key_heads == heads else jnp.repeat(x, heads // key_heads, axis=2)


def to_chunks(x: Array, chunk: int, fill=0, *, edge: bool = False) -> Array:
  """[b, l, ...] -> [chunks, b, chunk, ...], the length padded to a multiple with `fill` (edge:
  with the last position's value, as run numbers are, so padding joins the last run)."""
  batch, length = x.shape[:2]
  num = -(-length // chunk)
  widths = [(0, 0), (0, num * chunk - length)] + [(0, 0)] * (x.ndim - 2)
  x = jnp.pad(x, widths, mode="edge") if edge else jnp.pad(x, widths, constant_values=fill)
  return x.reshape((batch, num, chunk) + x.shape[2:]).swapaxes(0, 1)


def from_chunks(x: Array, length: int) -> Array:
  """[chunks, b, chunk, ...] -> [b, length, ...]."""
  x = x.swapaxes(0, 1)
  return x.reshape((x.shape[0], -1) + x.shape[3:])[:, :length]


def masked_exp(difference: Array, visible: Array) -> Array:
  """exp(difference) where `visible`, else 0, masked before the exp: an invisible entry (whose
  difference may be positive and large) contributes neither an overflow nor a NaN gradient."""
  return jnp.where(visible, jnp.exp(jnp.where(visible, difference, 0.0)), 0.0)


def check_chunk(chunk_size: int) -> None:
  if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
    raise ValueError(f"chunk_size={chunk_size!r} must be a positive number of positions.")
