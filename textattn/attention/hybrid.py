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
"hedgehog", learned, under "feature_map"). Kernel: "xla", the quadratic form ([length, length]
scores; O(length^2), as the softmax reference): what a transfer study at a few hundred tokens
needs. A linear-time chunked form (LoLCATs' tiles) and cached decoding are not written; segment
ids are not taken, so the language model refuses this variant in one sentence.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from textattn.attention import linear, registry
from textattn.attention.common import Array, dense_init, merged_mean
from textattn.attention.sliding_window import in_band
from textattn.errors import UsageError

WINDOW = 64


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
    if decode:
      raise ValueError("decode=True: the window + linear hybrid has no cached decoding step.")
    embed = x.shape[-1]
    head_dim = self.head_dim or embed // self.num_heads
    dense = functools.partial(nn.DenseGeneral, features=(self.num_heads, head_dim),
                              dtype=self.dtype, kernel_init=dense_init())
    query, key, value = (dense(name=name)(x) for name in ("query", "key", "value"))
    phi = linear.build_feature_map(self.feature_map, num_heads=self.num_heads,
                                   head_dim=head_dim, options=self.feature_options)
    mix = jax.nn.sigmoid(self.param("window_factor", nn.initializers.zeros, (self.num_heads,)))
    out = hybrid_attention(query, key, value, phi(query, is_query=True),
                           phi(key, is_query=False), padding_mask.astype(bool), mix,
                           window=self.window, causal=self.causal)
    return nn.DenseGeneral(embed, axis=(-2, -1), dtype=self.dtype, kernel_init=dense_init(),
                           name="out")(out.astype(self.dtype))


def hybrid_keywords(window: int, feature_map: str, features: int) -> dict:
  """config.model.hybrid.{window, feature_map, features} -> build keywords."""
  if not isinstance(window, int) or isinstance(window, bool) or window < 1:
    raise UsageError(f"config.model.hybrid.window={window!r} must be a positive number of "
                     f"positions.")
  keywords = linear.linear_keywords(feature_map, 64, features, sub_config="hybrid")
  del keywords["chunk_size"]
  return {"window": window, **keywords}


def forward_flops(batch: int, length: int, heads: int, head_dim: int) -> float:
  """The quadratic form: QK^T, the features' products and AV over [length, length] (the
  default map's features = 2 head_dim): (4 + 4) B H L^2 d."""
  return 8.0 * batch * heads * length * length * head_dim


def variant(name: str, causal: bool, description: str) -> registry.Variant:
  return registry.Variant(
      name=name,
      build=functools.partial(WindowLinearAttention, causal=causal),
      causal=causal,
      options="hybrid",
      option_defaults=(("window", WINDOW), ("feature_map", "hedgehog"), ("features", 0)),
      option_keywords=hybrid_keywords,
      forward_flops=forward_flops,
      kernels=(("xla", "quadratic"),),
      description=description)


registry.register(variant(
    "window_linear", False, f"softmax within +-window (default {WINDOW}) + linear attention "
    "(hedgehog features) outside, one normalisation (LoLCATs); quadratic form"))
registry.register(variant(
    "causal_window_linear", True, f"causal: softmax over the last window positions (default "
    f"{WINDOW}) + linear attention before them (LoLCATs); quadratic form"))
