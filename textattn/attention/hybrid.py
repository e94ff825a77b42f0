"""Sliding-window softmax + linear attention, LoLCATs' hybrid (Zhang et al. 2024, arXiv
2410.10254); registers "window_linear" (bidirectional) and "causal_window_linear".

Each query t attends to the keys inside its window W(t) with softmax weights and to the keys it
sees outside the window with linear attention's kernel phi(q_t).phi(k_i), in one normalisation:

    out_t = (g sum_{i in W(t)} exp(s_ti - m_t) v_i + (1 - g) sum_{i out} phi(q_t).phi(k_i) v_i)
            / (g sum_{i in W(t)} exp(s_ti - m_t) + (1 - g) sum_{i out} phi(q_t).phi(k_i))

with s_ti = q_t.k_i / sqrt(d), m_t the largest in-window score (0 where the window holds no
visible key), and g = sigmoid(window_factor) a learned mixing weight per head (initialised to
0.5). W(t): the last `window` positions up to t (causal; Mistral's / sliding_window's band) or
|t - i| <= window (bidirectional); every key also has to be real (and, causal, i <= t). A query
that sees no key outputs 0. With a window covering the whole row there is no linear part and the
output is softmax attention exactly, whatever g: so a softmax layer's weights (the same
query/key/value/out parameter names as softmax's SelfAttention) start it as the softmax it
replaces, the starting point of attention transfer (issue 55).

The feature map is linear attention's (textattn/attention/linear.py's registry; default
"hedgehog", learned, under "feature_map"). Kernels (the same function):
  xla      `hybrid_attention`: the quadratic form, [length, length] scores; the reference.
  chunked  `blocked_hybrid_attention`: blocks of `window` queries; each block's previous, own
           and (bidirectional) next block hold its window's keys, scored as in the reference
           (softmax inside the window, phi(q).phi(k) for the block keys outside it); the keys
           of the blocks further away enter through per-block sums of phi(k) v^T and phi(k),
           cumulated from the start (and, bidirectional, from the end), never differenced.
           O(length * window) work, O(length * (window + features * head_dim / window)) memory.
"auto" picks chunked from CHUNKED_FROM_WINDOWS windows on. Cached decoding (causal): a ring
of the last `window` keys and values plus the linear state of the keys that have left it,
O(window + features * head_dim) a step (WindowLinearAttention). Segment ids are not taken, so
the language model refuses this variant in one sentence.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from textattn.attention import linear, registry, sliding_window
from textattn.attention.common import Array, dense_init, merged_mean
from textattn.attention.sliding_window import block_offsets, in_band, to_blocks, with_neighbours
from textattn.errors import UsageError
from textattn.flax_layers import DenseGeneral

WINDOW = 64
F32 = jnp.float32


def hybrid_attention(query: Array, key: Array, value: Array, fq: Array, fk: Array, real: Array,
                     mix: Array, *, window: int, causal: bool) -> Array:
  """The module docstring's out [b, l, h, d] (float32 sums), from the projected queries, keys,
  values, their features fq, fk [b, l, h, f], real keys [b, l] and g [h]."""
  length = query.shape[1]
  positions = jnp.arange(length)
  offsets = positions[:, None] - positions[None, :]
  visible = real[:, None, None, :]  # [b, 1, t, i]
  if causal:
    visible = visible & (offsets >= 0)[None, None]
  inside = visible & in_band(offsets, window, causal)[None, None]
  outside = visible & ~inside
  scores = jnp.einsum("bthd,bihd->bhti", query.astype(jnp.float32), key.astype(jnp.float32))
  scores = scores * query.shape[-1] ** -0.5
  top = jnp.max(jnp.where(inside, scores, -jnp.inf), axis=-1, keepdims=True)
  top = jnp.where(jnp.isfinite(top), top, 0.0)
  g = mix[None, :, None, None]
  near = jnp.where(inside, g * jnp.exp(jnp.where(inside, scores - top, 0.0)), 0.0)
  far = (1.0 - g) * jnp.einsum("bthf,bihf->bhti", fq, fk) * outside
  weights = near + far
  numerator = jnp.einsum("bhti,bihd->bthd", weights, value.astype(jnp.float32))
  return merged_mean(numerator, jnp.sum(weights, axis=-1).transpose(0, 2, 1))


def blocked_hybrid_attention(query: Array, key: Array, value: Array, fq: Array, fk: Array,
                             real: Array, mix: Array, *, window: int, causal: bool) -> Array:
  """hybrid_attention's out in blocks of min(window, length) queries (module docstring); the
  length is padded to a multiple of the block with padding positions."""
  batch, length, heads, head_dim = query.shape
  block = max(1, min(window, length))
  blocks = functools.partial(to_blocks, block=block)
  neighbours = functools.partial(with_neighbours, causal=causal)
  is_real = blocks(real)
  value = blocks(value.astype(F32)) * is_real[..., None, None]
  fk = blocks(fk) * is_real[..., None, None]
  q, fq = blocks(query.astype(F32)), blocks(fq)
  num_blocks = q.shape[1]
  k, v, fk_near = neighbours(blocks(key.astype(F32))), neighbours(value), neighbours(fk)
  span = k.shape[2]
  offsets = block_offsets(block, span)  # [block, span]
  visible = neighbours(is_real)[:, :, None, None, :]  # [b, n, 1, 1, span]
  if causal:
    visible = visible & (offsets >= 0)
  inside = visible & in_band(offsets, window, causal)
  outside = visible & ~in_band(offsets, window, causal)
  scores = jnp.einsum("bnthd,bnihd->bnhti", q, k) * head_dim ** -0.5
  top = jnp.max(jnp.where(inside, scores, -jnp.inf), axis=-1, keepdims=True)
  top = jnp.where(jnp.isfinite(top), top, 0.0)
  g = mix[None, None, :, None, None]
  near = jnp.where(inside, g * jnp.exp(jnp.where(inside, scores - top, 0.0)), 0.0)
  weights = near + (1.0 - g) * jnp.einsum("bnthf,bnihf->bnhti", fq, fk_near) * outside
  numerator = jnp.einsum("bnhti,bnihd->bnthd", weights, v)
  denominator = jnp.sum(weights, axis=-1).transpose(0, 1, 3, 2)  # [b, n, t, h]
  # The blocks out of reach: m <= n - 2 (and, bidirectional, m >= n + 2).
  kv = jnp.einsum("bnihf,bnihd->bnhfd", fk, value)
  z = jnp.sum(fk, axis=2)  # [b, n, h, f]

  def beyond(x):  # [b, n, ...] -> sum over the blocks out of reach of each block
    shift = [(0, 0), (2, 0)] + [(0, 0)] * (x.ndim - 2)
    far = jnp.pad(jnp.cumsum(x, axis=1), shift)[:, :num_blocks]
    if not causal:
      backward = jnp.flip(jnp.cumsum(jnp.flip(x, axis=1), axis=1), axis=1)
      far = far + jnp.pad(backward, [(0, 0), (0, 2)] + [(0, 0)] * (x.ndim - 2))[:, 2:]
    return far

  gq = (1.0 - mix)[None, None, None, :, None] * fq
  numerator = numerator + jnp.einsum("bnthf,bnhfd->bnthd", gq, beyond(kv))
  denominator = denominator + jnp.einsum("bnthf,bnhf->bnth", gq, beyond(z))
  out = merged_mean(numerator, denominator)
  return out.reshape(batch, -1, heads, head_dim)[:, :length]


KERNELS = {"xla": hybrid_attention, "chunked": blocked_hybrid_attention}
IMPLEMENTATIONS = ("auto",) + tuple(KERNELS)
# "auto": the blocked kernel from this many windows on. Forward + backward, window 64, MiniLM's
# layer (batch 1, 384 wide, 12 heads), median ms at L = 128, 256, 512, 1024 (python -m
# textattn.benchmark --mode=attention+backward --variants=window_linear_xla,window_linear_chunked
# --seq_lens=128,256,512,1024 --batch_size=1 --embed_dim=384 --num_heads=12; CPU-4): xla 9.46,
# 33.3, 111, 498; chunked 8.45, 30.0, 54.6, 125. Peak MiB at 1024: xla 516, chunked 155.
CHUNKED_FROM_WINDOWS = 2


resolve = sliding_window.windows_resolve(CHUNKED_FROM_WINDOWS, WINDOW)


class WindowLinearAttention(nn.Module):
  """Multi-head hybrid attention with Q/K/V/output projections (softmax's parameter names)."""
  num_heads: int
  causal: bool = False
  window: int = WINDOW
  implementation: str = "xla"
  dtype: Any = jnp.float32
  head_dim: int | None = None
  feature_map: str = "hedgehog"
  feature_options: tuple[tuple[str, Any], ...] = ()

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array, decode: bool = False) -> Array:
    """decode=True (causal only), as sliding_window's: a first whole-length call allocates the
    "cache" (a ring of the last `window` keys and values and their visibility, the next
    position, and the linear state of the keys that have left the window: sum phi(k) v^T and
    sum phi(k)), then one position [batch, 1, embed] per call."""
    if decode and not self.causal:
      raise ValueError("decode=True needs the causal window + linear hybrid.")
    embed = x.shape[-1]
    head_dim = self.head_dim or embed // self.num_heads
    dense = functools.partial(DenseGeneral, features=(self.num_heads, head_dim),
                              dtype=self.dtype, kernel_init=dense_init())
    query, key, value = (dense(name=name)(x) for name in ("query", "key", "value"))
    phi = linear.build_feature_map(self.feature_map, num_heads=self.num_heads,
                                   head_dim=head_dim, options=self.feature_options)
    mix = jax.nn.sigmoid(self.param("window_factor", nn.initializers.zeros, (self.num_heads,)))
    fq = phi(query, is_query=True)
    if decode and self.has_variable("cache", "keys"):
      out = self._decode_step(query, key, value, fq, padding_mask, mix, phi)
    else:
      if decode:
        self._allocate(x.shape[0], head_dim, fq.shape[-1], key.dtype)
      kernel = KERNELS[resolve(self.implementation, length=x.shape[1], window=self.window)]
      out = kernel(query, key, value, fq, phi(key, is_query=False),
                   padding_mask.astype(bool), mix, window=self.window, causal=self.causal)
    return DenseGeneral(embed, axis=(-2, -1), dtype=self.dtype, kernel_init=dense_init(),
                        name="out")(out.astype(self.dtype))


  def _allocate(self, batch: int, head_dim: int, features: int, dtype) -> None:
    ring = (batch, self.window, self.num_heads, head_dim)
    self.variable("cache", "keys", jnp.zeros, ring, dtype)
    self.variable("cache", "values", jnp.zeros, ring, dtype)
    self.variable("cache", "visible", jnp.zeros, (batch, self.window), bool)
    self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
    self.variable("cache", "kv", jnp.zeros, (batch, self.num_heads, features, head_dim), F32)
    self.variable("cache", "z", jnp.zeros, (batch, self.num_heads, features), F32)

  def _decode_step(self, query, key, value, fq, padding_mask, mix, phi):
    """One position: the key in its ring slot (index % window) is the one leaving the window,
    so its phi(k) v^T and phi(k) join the linear state first; then the new key takes the slot
    and the query meets the ring with softmax weights and the state with phi(q), in the one
    normalisation of the module docstring. O(window + features * head_dim)."""
    keys, values = self.variable("cache", "keys"), self.variable("cache", "values")
    visible, index = self.variable("cache", "visible"), self.variable("cache", "index")
    kv, z = self.variable("cache", "kv"), self.variable("cache", "z")
    slot = index.value % self.window
    leaving = jax.lax.dynamic_slice_in_dim(keys.value, slot, 1, axis=1)
    was_seen = jax.lax.dynamic_slice_in_dim(visible.value, slot, 1, axis=1)  # [b, 1]
    f_leaving = phi(leaving, is_query=False)[:, 0] * was_seen[..., None]  # [b, h, f]
    v_leaving = jax.lax.dynamic_slice_in_dim(values.value, slot, 1, axis=1)[:, 0].astype(F32)
    kv.value = kv.value + jnp.einsum("bhf,bhd->bhfd", f_leaving, v_leaving)
    z.value = z.value + f_leaving
    keys.value = jax.lax.dynamic_update_slice(keys.value, key, (0, slot, 0, 0))
    values.value = jax.lax.dynamic_update_slice(values.value, value, (0, slot, 0, 0))
    visible.value = jax.lax.dynamic_update_slice(
        visible.value, padding_mask[:, :1].astype(bool), (0, slot))
    index.value = index.value + 1
    scores = jnp.einsum("bqhd,bkhd->bhqk", query.astype(F32), keys.value.astype(F32))
    scores = scores * query.shape[-1] ** -0.5
    inside = visible.value[:, None, None, :]
    top = jnp.max(jnp.where(inside, scores, -jnp.inf), axis=-1, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    near = jnp.where(inside, mix[None, :, None, None] * jnp.exp(
        jnp.where(inside, scores - top, 0.0)), 0.0)  # [b, h, 1, window]
    gq = (1.0 - mix)[None, None, :, None] * fq  # [b, 1, h, f]
    numerator = (jnp.einsum("bhqk,bkhd->bqhd", near, values.value.astype(F32))
                 + jnp.einsum("bqhf,bhfd->bqhd", gq, kv.value))
    denominator = near.sum(-1).transpose(0, 2, 1) + jnp.einsum("bqhf,bhf->bqh", gq, z.value)
    return merged_mean(numerator, denominator)


def hybrid_keywords(window: int, feature_map: str, features: int) -> dict:
  """config.model.hybrid.{window, feature_map, features} -> build keywords."""
  if not isinstance(window, int) or isinstance(window, bool) or window < 1:
    raise UsageError(f"config.model.hybrid.window={window!r} must be a positive number of "
                     f"positions.")
  keywords = linear.linear_keywords(feature_map, 64, features, sub_config="hybrid")
  del keywords["chunk_size"]
  return {"window": window, **keywords}


def forward_flops(batch: int, length: int, heads: int, head_dim: int, window: int = WINDOW,
                  causal: bool = False) -> float:
  """The function's work, as sliding_window's (the xla kernel does the quadratic form's more):
  QK^T and PV over each query's band, 4 B H L keys d (keys = min(window, L), bidirectional
  min(2 window + 1, L)), and phi(q) against the far keys' sums, 4 B H L f d with the default
  map's f = 2 d."""
  keys = min(window if causal else 2 * window + 1, length)
  return 4.0 * batch * heads * length * (keys + 2 * head_dim) * head_dim


def variant(name: str, causal: bool, description: str) -> registry.Variant:
  return registry.Variant(
      name=name,
      build=functools.partial(WindowLinearAttention, causal=causal),
      causal=causal,
      options="hybrid",
      option_defaults=(("window", WINDOW), ("feature_map", "hedgehog"), ("features", 0)),
      option_keywords=hybrid_keywords,
      implementations=IMPLEMENTATIONS,
      resolve=resolve,
      forward_flops=functools.partial(forward_flops, causal=causal),
      kernels=(("xla", "quadratic"), ("chunked", "blocked")),
      description=description)


registry.register(variant(
    "window_linear", False, f"softmax within +-window (default {WINDOW}) + linear attention "
    "(hedgehog features) outside, one normalisation (LoLCATs)"))
registry.register(variant(
    "causal_window_linear", True, f"causal: softmax over the last window positions (default "
    f"{WINDOW}) + linear attention before them (LoLCATs)"))
