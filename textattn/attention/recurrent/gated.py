"""The gated linear recurrence S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = scale * S_t^T q_t:
the core of RetNet (fixed g per head), Mamba-2 / SSD (g per head and position) and GLA (g per
head, position and key dimension). Conventions: textattn/attention/recurrent/__init__.py.

Forms, all the same function:
  gated_recurrent  token by token (lax.scan of `gated_step`), the reference; decoding calls
                   `gated_step` itself.
  gated_chunked    chunks of `chunk_size` tokens (flash-linear-attention's chunk form; Yang et al.
                   2024, arXiv 2312.06635, section 4). With b the chunk-local cumulative log-gate:
                     scalar gates   O = scale [(Q exp(b)) S + (Gamma * Q K^T) V],
                                    Gamma_ij = exp(b_i - b_j) for j <= i (masked before the exp);
                     per-dim gates  GLA's secondary chunking: 16-token sub-chunks; a diagonal
                                    sub-block pairwise in log space,
                                    sum_d q_id k_jd exp(b_id - b_jd);
                                    an off-diagonal one (key sub-chunk J before query sub-chunk I)
                                    as (q_i exp(b_i - b_r)) . (k_j exp(b_r - b_j)) with r the last
                                    position before sub-chunk I, so both exponents are <= 0 (never
                                    k exp(-b), which overflows under strong decay);
                     the state      S <- exp(b_C) S + (K exp(b_C - b))^T V.
                   lax.scan over the chunks, the body rematerialised: the backward pass keeps one
                   state per chunk. Work O(length * chunk * (key + value)), memory O(length).
Log-gates must be <= 0 (the layers build them as log-sigmoids or -softplus products): then
every exponent above is <= 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from textattn.attention.recurrent.chunking import (
  check_chunk,
  compute_dtype,
  document_runs,
  expand_heads,
  from_chunks,
  masked_exp,
  run_starts,
  to_chunks,
)
from textattn.attention.recurrent.layer import Core
from textattn.attention.recurrent.parallel import (
  incoming_state,
  shard_edges,
  shard_over_sequence,
)

Array = jax.Array
SUB_CHUNK = 16  # GLA's secondary chunk (the paper's and flash-linear-attention's)


def _prepare(q, k, v, log_gates, scale, initial_state, segment_ids, mask):
  """Common argument handling: the compute dtype, heads expanded, padding neutralised, runs."""
  batch, length, heads = v.shape[:3]
  dtype = compute_dtype(q, k, v, log_gates)
  q = expand_heads(q, heads, "q").astype(dtype)
  k = expand_heads(k, heads, "k").astype(dtype)
  if log_gates.shape[:3] != (batch, length, heads) or log_gates.ndim not in (3, 4):
    raise ValueError(f"log_gates {log_gates.shape} must be [batch, length, heads] or [batch, "
                     f"length, heads, key_dim] for values {v.shape}.")
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  real, runs = document_runs(mask, segment_ids, (batch, length))
  k = k * real[:, :, None, None]
  g = jnp.where(real.reshape(real.shape + (1,) * (log_gates.ndim - 2)),
                log_gates.astype(dtype), 0.0)
  if initial_state is None:  # (zeros_like of the inputs: varying as they are inside shard_map)
    initial_state = jnp.zeros_like(k[:, 0, :, :, None] * v[:, 0, :, None, :], dtype)
  return q * scale, k, v.astype(dtype), g, initial_state.astype(dtype), real, runs


def gated_step(state: Array, q_t: Array, k_t: Array, v_t: Array, log_gate_t: Array, *,
               scale: float, reset: Array | None = None,
               real: Array | None = None) -> tuple[Array, Array]:
  """One token: state [b, h, key, value], q_t and k_t [b, h, key], v_t [b, h, value],
  log_gate_t [b, h] or [b, h, key] -> (state, o_t [b, h, value]), in the state's dtype.
  `reset` bool [b]: empty the state before this token (a document starts); `real` bool [b]:
  False for padding, which neither decays nor writes."""
  dtype = state.dtype
  q_t, k_t, v_t, log_gate_t = (x.astype(dtype) for x in (q_t, k_t, v_t, log_gate_t))
  if reset is not None:
    state = jnp.where(reset[:, None, None, None], 0.0, state)
  if real is not None:
    k_t = k_t * real[:, None, None]
    log_gate_t = jnp.where(real.reshape((-1,) + (1,) * (log_gate_t.ndim - 1)), log_gate_t, 0.0)
  decay = jnp.exp(log_gate_t)
  decay = decay[..., None] if log_gate_t.ndim == 3 else decay[..., None, None]
  state = decay * state + k_t[..., :, None] * v_t[..., None, :]
  return state, scale * jnp.einsum("bhk,bhkv->bhv", q_t, state)


def gated_recurrent(q: Array, k: Array, v: Array, log_gates: Array, *, scale: float | None = None,
                    initial_state: Array | None = None, segment_ids: Array | None = None,
                    mask: Array | None = None) -> tuple[Array, Array]:
  """The recurrence token by token (the reference). Returns (out, final_state)."""
  q, k, v_c, g, state, _, runs = _prepare(q, k, v, log_gates, scale, initial_state,
                                          segment_ids, mask)

  def one(state, inputs):
    q_t, k_t, v_t, g_t, reset = inputs
    return gated_step(state, q_t, k_t, v_t, g_t, scale=1.0, reset=reset)  # (q scaled)

  time_major = lambda x: jnp.swapaxes(x, 0, 1)
  state, out = jax.lax.scan(one, state, tuple(map(time_major, (q, k, v_c, g, run_starts(runs)))))
  return time_major(out).astype(v.dtype), state


def _intra_scalar(q, k, b, visible):
  """Scores [b, h, i, j] within a chunk, scalar gates: (q_i . k_j) exp(b_i - b_j)."""
  decay = masked_exp(b[:, :, None, :] - b[:, None, :, :], visible[..., None])  # [b, i, j, h]
  return jnp.einsum("bihk,bjhk->bhij", q, k) * decay.transpose(0, 3, 1, 2)


def _intra_per_dim(q, k, b, visible, sub: int):
  """Scores [b, h, i, j] within a chunk, per-key-dimension gates, by sub-chunks of `sub`."""
  batch, chunk, heads, dim = q.shape
  n = chunk // sub
  qs, ks, bs = (x.reshape(batch, n, sub, heads, dim) for x in (q, k, b))
  # Diagonal sub-blocks, pairwise in log space: [b, n, i, j, h, d].
  tril = jnp.tril(jnp.ones((sub, sub), bool))
  diag_decay = masked_exp(bs[:, :, :, None] - bs[:, :, None, :], tril[None, None, :, :, None, None])
  diagonal = jnp.einsum("bnihd,bnjhd,bnijhd->bnhij", qs, ks, diag_decay)
  # Off-diagonal: gates referenced to r = the position before each query sub-chunk.
  b_ref = jnp.concatenate([jnp.zeros_like(b[:, :1]), b[:, sub - 1:chunk - 1:sub]], axis=1)
  q_ref = qs * jnp.exp(bs - b_ref[:, :, None])  # b_i - b_r <= 0 for i after r
  earlier = jnp.arange(n)[:, None] > jnp.arange(n)[None, :]  # [I, J]: J before I
  k_ref = ks[:, None] * masked_exp(  # [b, I, J, j, h, d]: b_r(I) - b_j <= 0 for J before I
      b_ref[:, :, None, None] - bs[:, None], earlier[None, :, :, None, None, None])
  off = jnp.einsum("bIihd,bIJjhd->bhIiJj", q_ref, k_ref)
  block_diag = jnp.eye(n, dtype=bool)[:, None, :, None]  # [I, 1, J, 1]
  diagonal_full = jnp.einsum("bnhij,nm->bhnimj", diagonal, jnp.eye(n, dtype=diagonal.dtype))
  scores = jnp.where(block_diag, diagonal_full, off).reshape(batch, heads, chunk, chunk)
  return scores * visible[:, None]


def gated_chunked(q: Array, k: Array, v: Array, log_gates: Array, *, scale: float | None = None,
                  initial_state: Array | None = None, segment_ids: Array | None = None,
                  mask: Array | None = None, chunk_size: int = 64) -> tuple[Array, Array]:
  """The recurrence chunk by chunk (module docstring). Returns (out, final_state)."""
  check_chunk(chunk_size)
  length = v.shape[1]
  q, k, v_c, g, state, real, runs = _prepare(q, k, v, log_gates, scale, initial_state,
                                             segment_ids, mask)
  per_dim = g.ndim == 4
  chunk = max(1, min(chunk_size, length))
  sub = SUB_CHUNK if chunk % SUB_CHUNK == 0 else chunk
  tril = jnp.tril(jnp.ones((chunk, chunk), bool))

  @jax.checkpoint
  def one_chunk(carry, inputs):
    state, carried_run = carry
    q_c, k_c, v_ch, g_c, run = inputs
    b = jnp.cumsum(g_c, axis=1)  # chunk-local: [b, c, h] or [b, c, h, d]
    visible = tril[None] & (run[:, :, None] == run[:, None, :])  # [b, i, j]
    scores = (_intra_per_dim(q_c, k_c, b, visible, sub) if per_dim
              else _intra_scalar(q_c, k_c, b, visible))
    out = jnp.einsum("bhij,bjhv->bihv", scores, v_ch)
    sees_state = run == carried_run[:, None]  # [b, c]: still in the state's document
    b_q = b if per_dim else b[..., None]
    q_decayed = q_c * jnp.where(sees_state[:, :, None, None], jnp.exp(b_q), 0.0)
    out = out + jnp.einsum("bihk,bhkv->bihv", q_decayed, state)
    last_run = run[:, -1]
    keep = (last_run == carried_run)[:, None, None, None]
    in_last = (run == last_run[:, None])[:, :, None, None]
    b_end = b_q[:, -1:]  # [b, 1, h, d or 1]
    k_decayed = k_c * jnp.where(in_last, jnp.exp(b_end - b_q), 0.0)
    state = (jnp.where(keep, jnp.exp(b_end[:, 0, :, :, None]) * state, 0.0)
             + jnp.einsum("bjhk,bjhv->bhkv", k_decayed, v_ch))
    return (state, last_run), out

  carry = (state, runs[:, 0])  # the initial state is the first run's (run 0)
  chunks = (to_chunks(q, chunk), to_chunks(k, chunk), to_chunks(v_c, chunk), to_chunks(g, chunk),
            to_chunks(runs, chunk, edge=True))
  (state, _), out = jax.lax.scan(one_chunk, carry, chunks)
  return from_chunks(out, length).astype(v.dtype), state


def sharded_gated(q: Array, k: Array, v: Array, log_gates: Array, *, scale: float, mesh,
                  mask: Array | None = None, segment_ids: Array | None = None,
                  chunk_size: int = 64) -> Array:
  """`gated.gated_chunked`'s outputs with the length split over mesh's "sequence" axis."""
  batch, length = v.shape[:2]
  real, runs = document_runs(mask, segment_ids, (batch, length))
  ids = runs + 1  # (global run numbers as segment ids: every position real to document_runs)

  def shard(q, k, v, g, real, ids):
    form = lambda s0: gated_chunked(q, k, v, g, scale=scale, initial_state=s0, segment_ids=ids,
                                    mask=real, chunk_size=chunk_size)
    _, local = form(None)
    first_run, last_run, single = shard_edges(real, ids)
    total = jnp.sum(jnp.where(real.reshape(real.shape + (1,) * (g.ndim - 2)),
                              g.astype(local.dtype), 0.0), axis=1)  # [b, h] or [b, h, key]
    decay = jnp.where(single.reshape((-1,) + (1,) * (total.ndim - 1)), jnp.exp(total), 0.0)
    decay = decay[..., None] if g.ndim == 4 else decay[..., None, None]
    out, _ = form(incoming_state(local, first_run, last_run, decay))
    return out
  return shard_over_sequence(shard, mesh, (q, k, v, log_gates, real, ids), v.ndim)


GATED = Core(recurrent=gated_recurrent, chunked=gated_chunked, step=gated_step,
             sharded=sharded_gated)
