"""Ring attention (softmax and causal) for sequence parallelism: the per-shard cores that
`textattn/attention/sequence.py` runs under `jax.shard_map` along the "sequence" axis.

Key/value blocks travel around the ring with ppermute; each device merges its queries' partial
results online in float32 (flash attention's running max and sum). A custom VJP sends the
blocks round again in the backward pass with their gradients, so no device ever holds more than
two blocks of keys and values, and recomputes the scores: memory O(n^2 + n), not O(length).
The steps after the first run in a `jax.lax.fori_loop`, so a constant number of n x n score
blocks is live at once. Causal attention uses the zig-zag layout (shard i holds chunks i and
2S-1-i of 2S: `to_zigzag`/`from_zigzag`), so every device computes 3 + 2(S-1) chunk-blocks
(`ring_block_counts`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from textattn import sharding
from textattn.attention.common import MASK_VALUE, Array, merged_mean

SEQUENCE = sharding.SEQUENCE

# Within a shard of n positions, a causal ring splits queries and keys into two chunks of
# c = n / 2. A "block" below is a static list of (query slice, key slice) pairs to compute;
# `_schedule` picks it from the step t and the key block's owner j (traced), and counts
# computed c x c chunk-blocks. The mask is always applied from true positions, so the schedule
# only decides what is skipped, never what is seen.

def _shift(x, shards: int):
  """Pass to the next device in the ring: device i's value goes to i + 1."""
  return jax.lax.ppermute(x, SEQUENCE, [(i, (i + 1) % shards) for i in range(shards)])


def _positions(owner, n: int, shards: int, causal_layout: str | None) -> Array:
  """Global positions of the n rows a device holds (the owner's), in its layout."""
  if causal_layout == "zigzag":
    c = n // 2
    return jnp.concatenate([owner * c + jnp.arange(c), (2 * shards - 1 - owner) * c
                            + jnp.arange(c)])
  return owner * n + jnp.arange(n)


def _schedule(layout: str | None, first: bool, me, owner, n: int, apply: Callable, carry):
  """apply(carry, blocks) for the blocks device `me` computes against `owner`'s keys at the
  first step (its own keys: `first`, static) or a later one; returns (carry, chunk-blocks
  computed)."""
  whole, first_half, second_half = slice(0, n), slice(0, n // 2), slice(n // 2, n)
  if layout is None:  # not causal: everything
    return apply(carry, [(whole, whole)]), 4
  if layout == "zigzag":
    if first:  # chunks (me, 2S-1-me) against themselves: the (me, 2S-1-me) corner is masked
      return apply(carry, [(whole, first_half), (second_half, second_half)]), 3
    # Keys from a lower device: both query chunks see its first chunk only; from a higher one,
    # only the second query chunk sees anything, and it sees both key chunks. 2 either way.
    return jax.lax.cond(owner < me, lambda c: apply(c, [(whole, first_half)]),
                        lambda c: apply(c, [(second_half, whole)]), carry), 2
  # Contiguous causal layout (for comparison): lower devices' blocks whole, higher ones skipped.
  if first:
    return apply(carry, [(whole, whole)]), 4
  computed = jnp.where(owner < me, 4, 0)
  return jax.lax.cond(owner < me, lambda c: apply(c, [(whole, whole)]), lambda c: c,
                      carry), computed


def _visible(key_ids, query_ids, q_pos, k_pos, causal: bool) -> Array:
  """bool [batch, 1, q, k]: the key is real (id != 0) and of the query's segment (same id)."""
  visible = (key_ids[:, None, None, :] != 0) & (key_ids[:, None, None, :]
                                                 == query_ids[:, None, :, None])
  if causal:
    visible = visible & (q_pos[:, None] >= k_pos[None, :])[None, None]
  return visible


# The ring's steps: step 0 (the device's own keys, a schedule of its own) is written out, steps
# 1 .. S-1 run in a `jax.lax.fori_loop` whose carry holds the travelling key/value blocks (and,
# backward, their gradient accumulators), the ppermute inside its body. Unrolled, XLA scheduled
# the bidirectional ring's steps' score blocks to be live together (about S + 3 blocks of
# (L/S)^2 per device at the longest lengths); in a loop, only one step's temporaries are live
# (experiments/seq_parallel/README.md has the compiled memory before and after).

def _ids(padding_mask: Array, query_ids: Array | None) -> tuple[Array, Array]:
  """(key ids, query ids) int32 [batch, n]: without segments, real keys 1 and padding 0, every
  query 1; with them (`query_ids`: the run number + 1 of every position), the key's own id
  where it is real, else 0."""
  if query_ids is None:
    return padding_mask.astype(jnp.int32), jnp.ones(padding_mask.shape, jnp.int32)
  query_ids = query_ids.astype(jnp.int32)
  return jnp.where(padding_mask, query_ids, 0), query_ids


def _ring_forward(query, key, value, padding_mask, query_ids, layout):
  """Forward ring on one shard: (out [b, n, h, d], logsumexp [b, h, n], chunk-blocks)."""
  shards = jax.lax.axis_size(SEQUENCE)
  me = jax.lax.axis_index(SEQUENCE)
  batch, n, heads, head_dim = query.shape
  f32 = jnp.float32
  causal = layout is not None
  q = query.astype(f32) * head_dim ** -0.5
  q_pos = _positions(me, n, shards, layout)
  key_ids, q_ids = _ids(padding_mask, query_ids)

  def apply(running, blocks, kv, k_pos):
    k_all, v_all, k_ids = kv
    m_run, l_run, o_run = running
    for qs, ks in blocks:
      s = jnp.einsum("bqhd,bkhd->bhqk", q[:, qs], k_all[:, ks].astype(f32))
      visible = _visible(k_ids[:, ks], q_ids[:, qs], q_pos[qs], k_pos[ks], causal)
      m_blk = jnp.max(jnp.where(visible, s, MASK_VALUE), axis=-1)
      p = jnp.where(visible, jnp.exp(s - m_blk[..., None]), 0.0)
      m_old = m_run[..., qs]
      m_new = jnp.maximum(m_old, m_blk)
      old_scale, blk_scale = jnp.exp(m_old - m_new), jnp.exp(m_blk - m_new)
      pv = jnp.einsum("bhqk,bkhd->bhqd", p, v_all[:, ks].astype(f32))
      m_run = m_run.at[..., qs].set(m_new)
      l_run = l_run.at[..., qs].set(l_run[..., qs] * old_scale + p.sum(-1) * blk_scale)
      o_run = o_run.at[..., qs, :].set(o_run[..., qs, :] * old_scale[..., None]
                                       + pv * blk_scale[..., None])
    return m_run, l_run, o_run

  def step(first, t, running, kv):
    owner = (me - t) % shards
    block = functools.partial(apply, kv=kv, k_pos=_positions(owner, n, shards, layout))
    return _schedule(layout, first, me, owner, n, block, running)

  running = (jnp.full((batch, heads, n), MASK_VALUE, f32), jnp.zeros((batch, heads, n), f32),
             jnp.zeros((batch, heads, n, head_dim), f32))
  kv = (key, value, key_ids)
  running, computed = step(True, 0, running, kv)

  def later(t, state):  # step t >= 1: the keys of device me - t, received from me - 1
    running, kv, computed = state
    kv = _shift(kv, shards)
    running, blocks = step(False, t, running, kv)
    return running, kv, computed + blocks

  # (The count varies along the axis: the contiguous layout's does, so the carry's must too.)
  computed = jax.lax.pcast(jnp.int32(computed), SEQUENCE, to="varying")
  running, _, computed = jax.lax.fori_loop(1, shards, later, (running, kv, computed))
  m_run, l_run, o_run = running
  out = merged_mean(o_run, l_run)  # a query with no visible key outputs 0, as on one device
  logsumexp = jnp.where(l_run > 0, m_run + jnp.log(jnp.where(l_run > 0, l_run, 1.0)), 0.0)
  return out.transpose(0, 2, 1, 3).astype(query.dtype), logsumexp, computed


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def ring_attention_shard(query: Array, key: Array, value: Array, padding_mask: Array,
                         query_ids: Array | None = None, layout: str | None = None) -> Array:
  """One shard of exact softmax attention by a ring (inside shard_map over "sequence").

  layout None: bidirectional, contiguous shards. "zigzag": causal, shard i holding chunks i and
  2S-1-i of the sequence (`to_zigzag`). "contiguous": causal on contiguous shards (unbalanced:
  the last device computes S times the blocks of the first; kept to show the difference).
  query_ids int32 [batch, n] (None: no segments): each position's segment run + 1
  (`common.segment_runs`); a query sees only the real keys of its own run."""
  return _ring_forward(query, key, value, padding_mask, query_ids, layout)[0]


def _ring_fwd(query, key, value, padding_mask, query_ids, layout):
  out, logsumexp, _ = _ring_forward(query, key, value, padding_mask, query_ids, layout)
  return out, (query, key, value, padding_mask, query_ids, out, logsumexp)


def _ring_bwd(layout, residuals, d_out):
  """Flash attention's backward, ring by ring: the key/value blocks travel round again with their
  gradient accumulators, which a last pass brings home."""
  query, key, value, padding_mask, query_ids, out, logsumexp = residuals
  shards = jax.lax.axis_size(SEQUENCE)
  me = jax.lax.axis_index(SEQUENCE)
  n, head_dim = query.shape[1], query.shape[-1]
  f32 = jnp.float32
  causal = layout is not None
  scale = head_dim ** -0.5
  q = query.astype(f32) * scale
  q_pos = _positions(me, n, shards, layout)
  key_ids, q_ids = _ids(padding_mask, query_ids)
  d_o = d_out.astype(f32).transpose(0, 2, 1, 3)  # [b, h, n, d]
  delta = jnp.sum(d_o * out.astype(f32).transpose(0, 2, 1, 3), axis=-1)  # [b, h, n]

  def apply(grads, blocks, kv, k_pos):
    k_all, v_all, k_ids = kv
    d_q, d_k, d_v = grads
    for qs, ks in blocks:
      k_blk, v_blk = k_all[:, ks].astype(f32), v_all[:, ks].astype(f32)
      s = jnp.einsum("bqhd,bkhd->bhqk", q[:, qs], k_blk)
      visible = _visible(k_ids[:, ks], q_ids[:, qs], q_pos[qs], k_pos[ks], causal)
      p = jnp.where(visible, jnp.exp(s - logsumexp[..., qs, None]), 0.0)
      d_v = d_v.at[:, ks].add(jnp.einsum("bhqk,bhqd->bkhd", p, d_o[..., qs, :]))
      d_p = jnp.einsum("bhqd,bkhd->bhqk", d_o[..., qs, :], v_blk)
      d_s = p * (d_p - delta[..., qs, None])
      d_q = d_q.at[:, qs].add(jnp.einsum("bhqk,bkhd->bqhd", d_s, k_blk))
      d_k = d_k.at[:, ks].add(jnp.einsum("bhqk,bqhd->bkhd", d_s, q[:, qs]))
    return d_q, d_k, d_v

  def step(first, t, grads, kv):
    owner = (me - t) % shards
    block = functools.partial(apply, kv=kv, k_pos=_positions(owner, n, shards, layout))
    return _schedule(layout, first, me, owner, n, block, grads)[0]

  kv = (key, value, key_ids)
  grads = step(True, 0, (jnp.zeros(q.shape, f32), jnp.zeros(key.shape, f32),
                         jnp.zeros(value.shape, f32)), kv)

  def later(t, state):  # step t >= 1: blocks and their gradients so far arrive from me - 1
    (d_q, d_k, d_v), (k_all, v_all, k_ids) = state
    # Keys, values and their gradients travel as one array (one collective a step), the key
    # ids (int32) beside them. (Unrolled, the backward's ppermutes once repeated the forward's exactly and XLA's
    # CSE reused the forward's results, keeping every received block alive until the backward;
    # in a loop they sit in another body than the forward's, but at S = 2 XLA inlines both
    # one-trip loops, and the packing, which differs from what the forward sends, still keeps
    # them apart there; memory_comm.txt's S = 2 bytes equal the formula.)
    packed = _shift(jnp.concatenate([k_all.astype(f32), v_all.astype(f32), d_k, d_v], -1),
                    shards)
    kv = (packed[..., :head_dim].astype(key.dtype),
          packed[..., head_dim:2 * head_dim].astype(value.dtype),
          _shift(k_ids, shards))
    d_kv = (packed[..., 2 * head_dim:3 * head_dim], packed[..., 3 * head_dim:])
    return step(False, t, (d_q, *d_kv), kv), kv

  (d_q, d_k, d_v), _ = jax.lax.fori_loop(1, shards, later, (grads, kv))
  packed = _shift(jnp.concatenate([d_k, d_v], -1), shards)  # home to the keys' owner
  d_k, d_v = packed[..., :head_dim], packed[..., head_dim:]
  return ((d_q * scale).astype(query.dtype), d_k.astype(key.dtype), d_v.astype(value.dtype),
          None, None)


ring_attention_shard.defvjp(_ring_fwd, _ring_bwd)


def _first_chunk_is_even() -> Array:
  """Whether this device's first zig-zag chunk (chunk i of device i) is its even one."""
  return jax.lax.axis_index(SEQUENCE) % 2 == 0


def to_zigzag(x: Array) -> Array:
  """A contiguous shard [.., chunks 2i, 2i+1 ..] (length axis 1) -> zig-zag [chunks i, 2S-1-i].

  Each device's even chunk goes to the device holding it in zig-zag order, likewise its odd
  chunk: two ppermutes; every device receives exactly one even and one odd chunk, since i and
  2S-1-i differ in parity."""
  shards = jax.lax.axis_size(SEQUENCE)
  half = x.shape[1] // 2

  def home(chunk):
    return chunk if chunk < shards else 2 * shards - 1 - chunk

  even = jax.lax.ppermute(x[:, :half], SEQUENCE, [(j, home(2 * j)) for j in range(shards)])
  odd = jax.lax.ppermute(x[:, half:], SEQUENCE, [(j, home(2 * j + 1)) for j in range(shards)])
  first_is_even = _first_chunk_is_even()
  return jnp.where(first_is_even, jnp.concatenate([even, odd], 1),
                   jnp.concatenate([odd, even], 1))


def from_zigzag(x: Array) -> Array:
  """The inverse of `to_zigzag`."""
  shards = jax.lax.axis_size(SEQUENCE)
  half = x.shape[1] // 2
  first_is_even = _first_chunk_is_even()
  first, second = x[:, :half], x[:, half:]
  even = jnp.where(first_is_even, first, second)
  odd = jnp.where(first_is_even, second, first)

  def even_chunk(i):
    return i if i % 2 == 0 else 2 * shards - 1 - i

  even = jax.lax.ppermute(even, SEQUENCE, [(i, even_chunk(i) // 2) for i in range(shards)])
  odd = jax.lax.ppermute(odd, SEQUENCE,
                         [(i, (2 * shards - 1 - even_chunk(i)) // 2) for i in range(shards)])
  return jnp.concatenate([even, odd], 1)


def ring_block_counts(mesh: jax.sharding.Mesh, layout: str | None, batch: int, length: int,
                      heads: int = 1, head_dim: int = 1) -> Array:
  """Chunk-blocks each device of the sequence axis computes in the forward ring (the backward
  follows the same schedule): int32 [S]. Runs `_ring_forward`, the forward of
  `ring_attention_shard` itself."""
  shape = (batch, length, heads, head_dim)

  def count(q, k, v, mask):
    return jnp.reshape(_ring_forward(q, k, v, mask, None, layout)[2], (1,))

  spec = jax.P(None, SEQUENCE)
  counted = jax.shard_map(count, mesh=mesh, in_specs=(spec, spec, spec, spec),
                          out_specs=jax.P(SEQUENCE))
  zeros = jnp.zeros(shape, jnp.float32)
  return jax.jit(counted)(zeros, zeros, zeros, jnp.ones((batch, length), bool))
