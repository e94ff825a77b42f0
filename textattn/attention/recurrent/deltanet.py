"""DeltaNet (Schlag et al. 2021; trained in parallel by Yang et al. 2024, arXiv 2406.06484) and
Gated DeltaNet (Yang et al. 2025, arXiv 2412.06464); registers "deltanet" and "gated_deltanet".

    q, k, v = silu(conv(x W_q)), silu(conv(x W_k)), silu(conv(x W_v))   (short convolutions)
    q, k = q / |q|, k / |k|                                             (L2, per head)
    beta_t = sigmoid(x W_b)                                              (per head)
    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,  o_t = key^-0.5 S_t^T q_t
    DeltaNet:        g = 0; out = RMSNorm(o) W_o  (the output gate optional, off by default)
    Gated DeltaNet:  g_t = -exp(A_log) softplus(x W_a + dt_bias) (Mamba-2's decay);
                     out = (RMSNorm(o) * silu(x W_g)) W_o; value dim twice the key dim

As flash-linear-attention's DeltaNet and GatedDeltaNet layers (the authors' released code): SiLU
in the convolutions of q, k and v (width 4, no bias), the L2 norm with eps 1e-6, the norm per
head, no biases in the projections, Gated DeltaNet's A = U[0, 16] and dt log-uniform in
[0.001, 0.1] (floor 1e-4). The core: recurrent/delta_rule.py.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from textattn.attention import registry
from textattn.attention.common import dense_init
from textattn.attention.recurrent import family
from textattn.attention.recurrent.chunking import wide
from textattn.attention.recurrent.delta_rule import DELTA_RULE
from textattn.attention.recurrent.layer import (
  ShortConvolution,
  apply_core,
  conv_inputs,
  decode_mode,
  decode_signals,
  gated_output,
)
from textattn.attention.recurrent.mamba2 import dt_bias_init
from textattn.flax_layers import Dense

Array = jax.Array
L2_EPSILON = 1e-6  # flash-linear-attention's l2norm


def l2_normalise(x: Array) -> Array:
  x = wide(x)
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2_EPSILON)


def a_log_init(key, shape, dtype=jnp.float32):
  """Gated DeltaNet's A_log = log U[0, 16] (flash-linear-attention's)."""
  return jnp.log(jax.random.uniform(key, shape, jnp.float32, 0.0, 16.0)).astype(dtype)


class DeltaNet(nn.Module):
  """gated=False: DeltaNet; gated=True: Gated DeltaNet (module docstring)."""
  num_heads: int
  implementation: str = "chunked"
  dtype: Any = jnp.float32
  mesh: Any = None  # sequence parallelism: the core split over its "sequence" axis
  gated: bool = False
  chunk_size: int = 64
  value_factor: int = 1  # value dim / key dim (Gated DeltaNet's expand_v: 2)
  short_conv: bool = True
  conv_width: int = 4
  output_gate: bool = False  # RMSNorm(o) * silu(x W_g) (Gated DeltaNet's; off in DeltaNet's)
  dt_min: float = 0.001
  dt_max: float = 0.1

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array, decode: bool = False, *,
               segment_ids: Array | None = None) -> Array:
    batch, length, embed = x.shape
    heads = self.num_heads
    key_dim = embed // heads
    value_dim = key_dim * self.value_factor
    mode = decode_mode(self, decode)
    real, reset = decode_signals(self, mode, padding_mask, segment_ids)
    project = lambda width, name: Dense(width, use_bias=False, dtype=self.dtype,
                                        kernel_init=dense_init(), name=name)(x)
    q, k = project(heads * key_dim, "query"), project(heads * key_dim, "key")
    v = project(heads * value_dim, "value")
    if self.short_conv:
      conv_real, conv_runs = conv_inputs(mode, padding_mask, segment_ids, real)
      conv = lambda t, name: ShortConvolution(self.conv_width, use_bias=False, dtype=self.dtype,
                                              name=name)(t, conv_real, conv_runs, mode, reset)
      q, k, v = conv(q, "conv_query"), conv(k, "conv_key"), conv(v, "conv_value")
    else:
      q, k, v = nn.silu(q), nn.silu(k), nn.silu(v)
    q = l2_normalise(q.reshape(batch, length, heads, key_dim)).astype(self.dtype)
    k = l2_normalise(k.reshape(batch, length, heads, key_dim)).astype(self.dtype)
    v = v.reshape(batch, length, heads, value_dim)
    beta = jax.nn.sigmoid(wide(project(heads, "beta")))
    gates = (beta,)
    if self.gated:
      dt_bias = self.param("dt_bias", dt_bias_init(self.dt_min, self.dt_max), (heads,))
      a_log = self.param("A_log", a_log_init, (heads,))
      gates = (beta, -jnp.exp(a_log) * jax.nn.softplus(wide(project(heads, "decay")) + dt_bias))
    o = apply_core(self, DELTA_RULE, mode, q, k, v, gates, scale=key_dim ** -0.5,
                   padding_mask=padding_mask, segment_ids=segment_ids, real=real, reset=reset)
    return gated_output(self, x, o, self.output_gate)


def forward_flops(batch: int, length: int, heads: int, head_dim: int, chunk: int = 64) -> float:
  """Chunked UT form per head, key = value = d: K K^T, Q K^T and their products with the values
  within chunks (~4 L C d), the T solve (~L C^2 / 3), W S, the output and the state update
  (3 * 2 L d^2)."""
  return batch * heads * length * (4.0 * chunk * head_dim + chunk * chunk / 3.0
                                   + 6.0 * head_dim * head_dim)


COMMON = (("chunk_size", 64), ("short_conv", True), ("conv_width", 4))
registry.register(family.variant(
    "deltanet", DeltaNet, options="deltanet",
    defaults=COMMON + (("value_factor", 1), ("output_gate", False)),
    forward_flops=forward_flops,
    description="DeltaNet (Schlag et al. 2021; Yang et al. 2024): the delta rule, chunked (UT "
                "transform) or recurrent, O(1)-state decoding"))


registry.register(family.variant(
    "gated_deltanet", functools.partial(DeltaNet, gated=True), options="gated_deltanet",
    defaults=COMMON + (("value_factor", 2), ("output_gate", True), ("dt_min", 0.001),
                       ("dt_max", 0.1)),
    forward_flops=forward_flops,
    description="Gated DeltaNet (Yang et al. 2025): the delta rule with Mamba-2's decay, "
                "chunked or recurrent, O(1)-state decoding"))
