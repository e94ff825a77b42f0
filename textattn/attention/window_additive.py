"""Sliding-window softmax + one Fastformer-pooled global slot; registers "window_additive"
(bidirectional), the additive family's counterpart of LoLCATs' window + linear hybrid (issue 55).

Each query t attends with softmax to the real keys within |t - i| <= window and to one global
slot, in one normalisation:

    out_t = (sum_{i in W(t)} exp(s_ti - m_t) v_i + exp(c_t - m_t) v_g)
            / (sum_{i in W(t)} exp(s_ti - m_t) + exp(c_t - m_t))

    s_ti = q_t . k_i / sqrt(d),   c_t = q_t . k_g / sqrt(d) + b   (b: "slot_bias", per head)

The slot's key and value are additive attention's pooling (textattn/attention/additive.py,
Fastformer's beta weights: alpha over the queries gives the global query g_q, beta scores
p_i = k_i * g_q): k_g = sum_i beta_i k_i and v_g = sum_i beta_i v_i over the real tokens. A
softmax layer splits its weight between the near keys and the far ones; here the far ones are
summarised by one additive-attention-pooled key and value, and how much weight they get is still
decided per query by softmax. Work O(length * window): the window's keys, plus O(length) for
the slot. With a window covering the row and b -> -inf the output is softmax attention, so a
softmax layer's weights (the same query/key/value/out names) start it as the layer it replaces
up to the slot, which attention transfer then trains (its new parameters: alpha_kernel,
beta_kernel, slot_bias). Not Fastformer's own output (W_o (g_k * q_t) + q_t): the
bidirectional "additive" variant is that.

Kernels (the same function): xla `window_additive_attention`, the [length, length] scores with
a banded mask (the reference); chunked `blocked_window_additive_attention`, blocks of `window`
queries against their own and neighbouring blocks, O(length * window) memory. "auto" picks
chunked from CHUNKED_FROM_WINDOWS windows on. No cached decoding and no segment ids.

Window 0 (config.model.window.size=0) keeps no neighbours: each token attends to itself and the
slot only, O(length) like "additive", with no local softmax (the ablation asking what the
window does in attention transfer, RESULTS section 31).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from textattn.attention import additive, registry, sliding_window
from textattn.attention.common import Array, dense_init
from textattn.attention.sliding_window import block_offsets, in_band, to_blocks, with_neighbours
from textattn.errors import UsageError
from textattn.flax_layers import DenseGeneral

WINDOW = sliding_window.WINDOW
CHUNKED_FROM_WINDOWS = 2
F32 = jnp.float32


def global_slot(query: Array, key: Array, value: Array, real: Array, alpha_kernel: Array,
                beta_kernel: Array) -> tuple[Array, Array]:
  """(k_g, v_g) [b, heads, dim] float32: the real tokens' keys and values weighed by
  additive attention's beta (module docstring)."""
  beta, _ = additive.key_weights(query.astype(F32), key.astype(F32), real, alpha_kernel,
                                 beta_kernel)
  return (jnp.einsum("blh,blhd->bhd", beta, key.astype(F32)),
          jnp.einsum("blh,blhd->bhd", beta, value.astype(F32)))


def _with_slot(scores: Array, inside: Array, slot: Array, values: Array, slot_value: Array,
               contract: str) -> Array:
  """Softmax over the in-window scores [..., h, t, i] and the slot's [..., h, t]; the weighted
  sum of `values` (einsum `contract`: weights, values -> [..., t, h, d]) and of slot_value
  [b, h, d] (broadcast over the leading axes after b)."""
  logits = jnp.concatenate([jnp.where(inside, scores, -jnp.inf), slot[..., None]], axis=-1)
  weights = jax.nn.softmax(logits, axis=-1)  # (the slot's logit is finite: no empty row)
  near = jnp.einsum(contract, weights[..., :-1], values)
  far = jnp.moveaxis(weights[..., -1], -1, -2)[..., None]  # [..., t, h, 1]
  return near + far * slot_value.reshape(
      (slot_value.shape[0],) + (1,) * (far.ndim - 3) + slot_value.shape[1:])


def window_additive_attention(query: Array, key: Array, value: Array, real: Array,
                              alpha_kernel: Array, beta_kernel: Array, slot_bias: Array, *,
                              window: int) -> Array:
  """The module docstring's out [b, l, h, d] (float32), from the projected queries, keys and
  values, real keys [b, l], the two scoring kernels [h * d, h] and the slot's bias [h]."""
  length, scale = query.shape[1], query.shape[-1] ** -0.5
  slot_key, slot_value = global_slot(query, key, value, real, alpha_kernel, beta_kernel)
  q = query.astype(F32)
  positions = jnp.arange(length)
  inside = (real[:, None, None, :]
            & in_band(positions[:, None] - positions[None, :], window, False)[None, None])
  scores = jnp.einsum("bthd,bihd->bhti", q, key.astype(F32)) * scale
  slot = jnp.einsum("bthd,bhd->bht", q, slot_key) * scale + slot_bias[None, :, None]
  return _with_slot(scores, inside, slot, value.astype(F32), slot_value, "bhti,bihd->bthd")


def blocked_window_additive_attention(query: Array, key: Array, value: Array, real: Array,
                                      alpha_kernel: Array, beta_kernel: Array, slot_bias: Array,
                                      *, window: int) -> Array:
  """window_additive_attention's out in blocks of min(window, length) queries, each against its
  own block and its two neighbours (which hold its window); the length padded to a multiple
  of the block."""
  batch, length, heads, head_dim = query.shape
  slot_key, slot_value = global_slot(query, key, value, real, alpha_kernel, beta_kernel)
  block = max(1, min(window, length))
  blocks = functools.partial(to_blocks, block=block)
  neighbours = functools.partial(with_neighbours, causal=False)
  q = blocks(query.astype(F32))
  k, v = neighbours(blocks(key.astype(F32))), neighbours(blocks(value.astype(F32)))
  span = k.shape[2]
  offsets = block_offsets(block, span)  # [block, span]
  inside = neighbours(blocks(real))[:, :, None, None, :] & in_band(offsets, window, False)
  scale = head_dim ** -0.5
  scores = jnp.einsum("bnthd,bnihd->bnhti", q, k) * scale
  slot = (jnp.einsum("bnthd,bhd->bnht", q, slot_key) * scale
          + slot_bias[None, None, :, None])
  out = _with_slot(scores, inside, slot, v, slot_value, "bnhti,bnihd->bnthd")
  return out.reshape(batch, -1, heads, head_dim)[:, :length]


KERNELS = {"xla": window_additive_attention, "chunked": blocked_window_additive_attention}
IMPLEMENTATIONS = ("auto",) + tuple(KERNELS)
resolve = sliding_window.windows_resolve(CHUNKED_FROM_WINDOWS, WINDOW)


class WindowAdditiveAttention(nn.Module):
  """Multi-head window + additive-slot attention with softmax's Q/K/V/output parameters."""
  num_heads: int
  window: int = WINDOW
  implementation: str = "xla"
  dtype: Any = jnp.float32
  head_dim: int | None = None

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array, decode: bool = False) -> Array:
    if decode:
      raise ValueError("decode=True: window_additive is bidirectional and has no decoding step.")
    if self.window < 0:
      raise ValueError(f"window={self.window} must be 0 or more positions.")
    embed = x.shape[-1]
    heads = self.num_heads
    head_dim = self.head_dim or embed // heads
    dense = functools.partial(DenseGeneral, features=(heads, head_dim), dtype=self.dtype,
                              kernel_init=dense_init())
    query, key, value = (dense(name=name)(x) for name in ("query", "key", "value"))
    alpha = self.param("alpha_kernel", dense_init(), (heads * head_dim, heads), F32)
    beta = self.param("beta_kernel", dense_init(), (heads * head_dim, heads), F32)
    slot_bias = self.param("slot_bias", nn.initializers.zeros, (heads,), F32)
    kernel = KERNELS[resolve(self.implementation, length=x.shape[1], window=self.window)]
    out = kernel(query, key, value, padding_mask.astype(bool), alpha, beta, slot_bias,
                 window=self.window)
    return DenseGeneral(embed, axis=(-2, -1), dtype=self.dtype, kernel_init=dense_init(),
                        name="out")(out.astype(self.dtype))


def window_keywords(size: int) -> dict:
  """config.model.window.size -> the build keyword `window`; 0 allowed (the token and the
  slot only)."""
  if not isinstance(size, int) or isinstance(size, bool) or size < 0:
    raise UsageError(f"config.model.window.size={size!r} must be a number of positions, 0 or "
                     f"more (0: each token attends to itself and the global slot).")
  return {"window": size}


def forward_flops(batch: int, length: int, heads: int, head_dim: int,
                  window: int = WINDOW) -> float:
  """QK^T and PV over each query's band (min(2 window + 1, L) keys) and the slot: 4 B H L
  (keys + 1) d; the pooling's O(B L H d) terms are left out, as additive's are."""
  keys = min(2 * window + 1, length)
  return 4.0 * batch * heads * length * (keys + 1) * head_dim


registry.register(registry.Variant(
    name="window_additive",
    build=WindowAdditiveAttention,
    options="window",
    option_defaults=(("size", WINDOW),),
    option_keywords=window_keywords,
    implementations=IMPLEMENTATIONS,
    resolve=resolve,
    forward_flops=forward_flops,
    kernels=(("xla", "quadratic"), ("chunked", "blocked")),
    description=f"softmax within +-window (default {WINDOW}) + one Fastformer-pooled global "
                f"key/value slot, one normalisation"))
