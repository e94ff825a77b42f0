"""Sliding-window (local) softmax attention; registers "sliding_window" (causal) and "local"
(bidirectional).

sliding_window: position t attends to the real positions i of its own segment with
t - window < i <= t (the last `window` positions, itself included; Longformer's / Mistral's
causal window). local: |t - i| <= window (both sides). `window` is a build keyword (default
WINDOW). Softmax over the visible keys in float32; a position that sees no real key outputs 0.

Kernels (pure functions of the projected q, k, v [batch, length, heads, head_dim], all exact):
  xla      `windowed_attention`: the full [length, length] logits with an explicit banded mask,
           the reference; O(length^2) memory.
  chunked  `blocked_windowed_attention`: queries in blocks of `window` positions attend to their
           own block and the previous one (local: and the next one), which hold every key in
           their band; O(length * window) work and memory.
"auto" picks chunked once the length is at least CHUNKED_FROM_WINDOWS windows, else xla.

Segment ids (both variants): `segment_ids` int32 [batch, length] (0 = padding) restrict each
position to its own segment, one contiguous run of equal ids (textattn/attention/linear.py's
`segment_runs`). Decoding (sliding_window, decode=True) keeps a ring buffer of the last `window`
keys and values: memory O(window) per row whatever the length decoded.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from textattn.attention import registry
from textattn.attention.common import MASK_VALUE, Array, dense_init, segment_runs
from textattn.attention.rotary import apply_rotary
from textattn.errors import UsageError
from textattn.flax_layers import DenseGeneral

WINDOW = 64


def in_band(offsets: Array, window: int, causal: bool) -> Array:
  """Whether a key at `offsets` = query position - key position is in the query's window."""
  if causal:
    return (offsets >= 0) & (offsets < window)
  return jnp.abs(offsets) <= window


def _softmax_over_visible(logits: Array, visible: Array) -> Array:
  """Softmax over the last axis of float32 logits where `visible`; rows with no visible key 0."""
  logits = jnp.where(visible, logits, MASK_VALUE)
  weights = jax.nn.softmax(logits, axis=-1)
  return jnp.where(jnp.any(visible, axis=-1, keepdims=True), weights * visible, 0.0)


def windowed_attention(query: Array, key: Array, value: Array, real: Array, runs: Array, *,
                       window: int = WINDOW, causal: bool = True) -> Array:
  """The reference: every (query, key) logit, masked to the band, real keys, the same run."""
  length = query.shape[1]
  scale = query.shape[-1] ** -0.5
  logits = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=jnp.float32) * scale
  positions = jnp.arange(length)
  visible = (in_band(positions[:, None] - positions[None, :], window, causal)[None]
             & real[:, None, :] & (runs[:, :, None] == runs[:, None, :]))[:, None]
  weights = _softmax_over_visible(logits, visible)
  out = jnp.einsum("bhqk,bkhd->bqhd", weights.astype(value.dtype), value,
                   preferred_element_type=jnp.float32)
  return out.astype(value.dtype)


def block_offsets(block: int, span: int) -> Array:
  """Query position - key position [block, span] for a block of queries against `span` keys
  that start one block before it (with_neighbours' layout)."""
  return jnp.arange(block)[:, None] - (jnp.arange(span)[None, :] - block)


def to_blocks(x: Array, fill=0, *, block: int) -> Array:
  """[b, l, ...] -> [b, n, block, ...], the length padded with `fill` to a multiple of block."""
  num_blocks = -(-x.shape[1] // block)
  x = jnp.pad(x, [(0, 0), (0, num_blocks * block - x.shape[1])] + [(0, 0)] * (x.ndim - 2),
              constant_values=fill)
  return x.reshape((x.shape[0], num_blocks, block) + x.shape[2:])


def with_neighbours(x: Array, fill=0, *, causal: bool) -> Array:
  """[b, n, block, ...] -> [b, n, 2 or 3 blocks, ...]: each block's previous block, itself and
  (not causal) its next, `fill` beyond the ends."""
  edge = jnp.full_like(x[:, :1], fill)
  parts = [jnp.concatenate([edge, x[:, :-1]], axis=1), x]
  if not causal:
    parts.append(jnp.concatenate([x[:, 1:], edge], axis=1))
  return jnp.concatenate(parts, axis=2)


def blocked_windowed_attention(query: Array, key: Array, value: Array, real: Array, runs: Array,
                               *, window: int = WINDOW, causal: bool = True) -> Array:
  """The same function in blocks of min(window, length) queries: each block's keys are the
  previous, its own and (local) the next block, which contain every key of its band; logits
  [batch, blocks, heads, block, 2 or 3 blocks], so O(length * window). The length is padded to a
  multiple of the block with padding positions."""
  batch, length, heads, head_dim = query.shape
  block = max(1, min(window, length))
  blocks = functools.partial(to_blocks, block=block)
  neighbours = functools.partial(with_neighbours, causal=causal)
  q = blocks(query)
  k, v = neighbours(blocks(key)), neighbours(blocks(value))
  key_real = neighbours(blocks(real, False), False)
  query_runs, key_runs = blocks(runs, -1), neighbours(blocks(runs, -1), -1)
  span = k.shape[2]
  offsets = block_offsets(block, span)  # [block, span]
  visible = (in_band(offsets, window, causal)[None, None]
             & key_real[:, :, None, :]
             & (query_runs[:, :, :, None] == key_runs[:, :, None, :]))[:, :, None]  # [b,n,1,q,k]
  scale = head_dim ** -0.5
  logits = jnp.einsum("bnqhd,bnkhd->bnhqk", q, k, preferred_element_type=jnp.float32) * scale
  weights = _softmax_over_visible(logits, visible)
  out = jnp.einsum("bnhqk,bnkhd->bnqhd", weights.astype(v.dtype), v,
                   preferred_element_type=jnp.float32)
  return out.reshape(batch, -1, heads, head_dim)[:, :length].astype(value.dtype)


KERNELS = {"xla": windowed_attention, "chunked": blocked_windowed_attention}
IMPLEMENTATIONS = ("auto",) + tuple(KERNELS)
KERNEL_LABELS = (("xla", "naive (banded mask)"), ("chunked", "blocked"))
# "auto": the blocked kernel from this many windows on (at two windows both do the same block
# pairs). Forward + backward, window 64, median ms at L = 128, 256, 512, 1024, 2048
# (python -m textattn.benchmark --mode=attention+backward --variants=sliding_window_xla,
# sliding_window_chunked --seq_lens=128,256,512,1024,2048 --batch_size=2 --embed_dim=64
# --num_heads=2; a 2-core CPU): xla 1.73, 5.29, 16.4, 210, 654; chunked 1.54, 3.69, 12.0, 13.8,
# 48.3. Peak MiB: xla 1.5 and chunked 1.6 at 128; xla 325 and chunked 27 at 2048.
CHUNKED_FROM_WINDOWS = 2


def windows_resolve(chunked_from_windows: int, default_window: int):
  """A variant's resolve: 'auto' -> 'chunked' for a length of at least `chunked_from_windows`
  windows (the configured window, registry.Variant.kernel's options), else 'xla' (both exact).
  Other names are returned as they are."""

  def resolve(implementation: str, head_dim: int | None = None, dtype: str = "float32", *,
              length: int | None = None, num_heads: int | None = None,
              window: int = default_window) -> str:
    del head_dim, dtype, num_heads
    if implementation != "auto":
      return implementation
    if length is not None and length >= chunked_from_windows * window:
      return "chunked"
    return "xla"

  return resolve


resolve = windows_resolve(CHUNKED_FROM_WINDOWS, WINDOW)


class SlidingWindowAttention(nn.Module):
  """Multi-head windowed softmax attention with Q/K/V/output projections."""
  num_heads: int
  causal: bool = True
  window: int = WINDOW
  implementation: str = "xla"
  dtype: Any = jnp.float32
  head_dim: int | None = None
  rotary: bool = False  # queries and keys turned by position (registry.Variant.rotary)

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array, decode: bool = False, *,
               segment_ids: Array | None = None) -> Array:
    """decode=True (causal only), as softmax's SelfAttention: a first whole-length call allocates
    the "cache" (a ring of the last `window` keys and values, their visibility, the next
    position and the last segment id), then one position [batch, 1, embed] per call; a change
    of segment id between calls empties the ring."""
    if self.window < 1:
      raise ValueError(f"window={self.window} must be a positive number of positions.")
    embed = x.shape[-1]
    head_dim = self.head_dim or embed // self.num_heads
    dense = functools.partial(DenseGeneral, features=(self.num_heads, head_dim),
                              dtype=self.dtype, kernel_init=dense_init())
    query, key, value = (dense(name=name)(x) for name in ("query", "key", "value"))
    if decode and not self.causal:
      raise ValueError("decode=True needs the causal sliding_window variant.")
    if self.rotary:  # (decoding: the cache's next position; else 0 .. length - 1)
      positions = (self.get_variable("cache", "index")[None]
                   if decode and self.has_variable("cache", "keys") else jnp.arange(x.shape[1]))
      query, key = apply_rotary(query, positions), apply_rotary(key, positions)
    if decode and self.has_variable("cache", "keys"):
      out = self._decode_step(query, key, value, padding_mask, segment_ids)
    else:
      if decode:
        batch = x.shape[0]
        ring = (batch, self.window, self.num_heads, head_dim)
        self.variable("cache", "keys", jnp.zeros, ring, key.dtype)
        self.variable("cache", "values", jnp.zeros, ring, value.dtype)
        self.variable("cache", "visible", jnp.zeros, (batch, self.window), bool)
        self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
        self.variable("cache", "segment", jnp.zeros, (batch,), jnp.int32)
      real, runs = segment_runs(padding_mask, segment_ids)
      kernel = KERNELS[resolve(self.implementation, length=x.shape[1], window=self.window)]
      out = kernel(query, key, value, real, runs, window=self.window, causal=self.causal)
    return DenseGeneral(embed, axis=(-2, -1), dtype=self.dtype, kernel_init=dense_init(),
                        name="out")(out)

  def _decode_step(self, query, key, value, padding_mask, segment_ids):
    """One position against the ring: slot index % window holds it, the others the previous
    window - 1 positions; O(window) work and memory."""
    keys, values = self.variable("cache", "keys"), self.variable("cache", "values")
    visible, index = self.variable("cache", "visible"), self.variable("cache", "index")
    segment = self.variable("cache", "segment")
    real = padding_mask[:, 0].astype(bool)
    seen = visible.value
    if segment_ids is not None:
      ids = segment_ids[:, 0].astype(jnp.int32)
      real = real & (ids != 0)
      seen = seen & (ids == segment.value)[:, None]  # a new segment: nothing before it
      segment.value = ids
    slot = index.value % self.window
    keys.value = jax.lax.dynamic_update_slice(keys.value, key, (0, slot, 0, 0))
    values.value = jax.lax.dynamic_update_slice(values.value, value, (0, slot, 0, 0))
    visible.value = jax.lax.dynamic_update_slice(seen, real[:, None], (0, slot))
    index.value = index.value + 1
    logits = jnp.einsum("bqhd,bkhd->bhqk", query, keys.value,
                        preferred_element_type=jnp.float32) * query.shape[-1] ** -0.5
    weights = _softmax_over_visible(logits, visible.value[:, None, None, :])
    out = jnp.einsum("bhqk,bkhd->bqhd", weights.astype(value.dtype), values.value,
                     preferred_element_type=jnp.float32)
    return out.astype(value.dtype)


def forward_flops(batch: int, length: int, heads: int, head_dim: int, window: int = WINDOW,
                  causal: bool = True) -> float:
  """QK^T and PV over each query's band: 4 * B * H * L * keys * d, keys = min(window, L)
  (local: min(2 window + 1, L)), for the default window."""
  keys = min(window if causal else 2 * window + 1, length)
  return 4.0 * batch * heads * length * keys * head_dim


def window_keywords(size: int) -> dict:
  """config.model.window.size -> the build keyword `window`."""
  if not isinstance(size, int) or isinstance(size, bool) or size < 1:
    raise UsageError(f"config.model.window.size={size!r} must be a positive number of positions.")
  return {"window": size}


def variant(name: str, causal: bool, description: str) -> registry.Variant:
  return registry.Variant(
      name=name,
      build=functools.partial(SlidingWindowAttention, causal=causal),
      implementations=IMPLEMENTATIONS,
      resolve=resolve,
      causal=causal,
      segment_ids=True,
      rotary=True,
      options="window",
      option_defaults=(("size", WINDOW),),
      option_keywords=window_keywords,
      forward_flops=functools.partial(forward_flops, causal=causal),
      kernels=KERNEL_LABELS,
      description=description)


registry.register(variant(
    "sliding_window", True, f"causal softmax attention over the last window positions (default "
    f"{WINDOW}); O(length * window)"))
registry.register(variant(
    "local", False, f"softmax attention within +-window positions (default {WINDOW}); "
    "O(length * window)"))
