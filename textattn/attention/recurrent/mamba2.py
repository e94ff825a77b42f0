"""Mamba-2's selective state-space layer, SSD (Dao & Gu 2024, arXiv 2405.21060); registers
"mamba2".

    z, xBC, dt = x W_in                     (inner = expand * embed, heads of inner / num_heads)
    x', B, C = silu(conv1d(xBC) + bias)     (causal depthwise, width 4; B and C shared by the
                                             heads of each of `groups` groups)
    dt = softplus(dt + dt_bias),  A = -exp(A_log) < 0 per head
    h_t = exp(dt_t A) h_{t-1} + B_t (dt_t x'_t)^T,   y_t = h_t^T C_t + D x'_t
    out = RMSNorm(y * silu(z)) W_out         (the norm per group of heads)

That is the gated core (recurrent/gated.py) with q = C, k = B, v = dt x', log-gate dt A and scale
1. As the authors' mamba_ssm Mamba2 (and flash-linear-attention's): d_state 128, expand 2, conv
width 4 with bias, ngroups 1, dt drawn log-uniform in [0.001, 0.1] (floor 1e-4) and stored as its
inverse softplus in dt_bias, A_log = log U[1, 16], D = 1, no biases in the projections,
norm_before_gate=False. The layer's heads are config.model.num_heads (the authors fix headdim 64
instead: with embed 128 and 4 heads the two agree).
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from textattn.attention import registry
from textattn.attention.common import dense_init
from textattn.attention.recurrent import family
from textattn.attention.recurrent.chunking import wide
from textattn.attention.recurrent.gated import GATED
from textattn.attention.recurrent.layer import (
  GatedRMSNorm,
  ShortConvolution,
  apply_core,
  conv_inputs,
  decode_mode,
  decode_signals,
)
from textattn.errors import UsageError
from textattn.flax_layers import Dense

Array = jax.Array


def dt_bias_init(dt_min: float, dt_max: float, floor: float = 1e-4):
  """mamba_ssm's: dt ~ exp(U[log dt_min, log dt_max]), at least `floor`, stored as softplus^-1."""
  def init(key, shape, dtype=jnp.float32):
    u = jax.random.uniform(key, shape, jnp.float32)
    dt = jnp.maximum(jnp.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)), floor)
    return (dt + jnp.log(-jnp.expm1(-dt))).astype(dtype)
  return init


def a_log_init(key, shape, dtype=jnp.float32):
  return jnp.log(jax.random.uniform(key, shape, jnp.float32, 1.0, 16.0)).astype(dtype)


class Mamba2(nn.Module):
  num_heads: int
  implementation: str = "chunked"
  dtype: Any = jnp.float32
  mesh: Any = None  # sequence parallelism: the core split over its "sequence" axis
  chunk_size: int = 64
  state_dim: int = 128  # d_state: the width of B and C
  expand: int = 2  # inner width / embed
  groups: int = 1  # B and C shared by the heads of a group; the norm per group
  conv_width: int = 4
  use_d: bool = True  # the D skip term
  dt_min: float = 0.001
  dt_max: float = 0.1

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array, decode: bool = False, *,
               segment_ids: Array | None = None) -> Array:
    batch, length, embed = x.shape
    heads, groups, n = self.num_heads, self.groups, self.state_dim
    inner = self.expand * embed
    if inner % heads or heads % groups:
      raise ValueError(f"mamba2: num_heads={heads} must divide expand * embed_dim={inner} and be "
                       f"a multiple of groups={groups}.")
    head_dim = inner // heads
    mode = decode_mode(self, decode)
    real, reset = decode_signals(self, mode, padding_mask, segment_ids)
    projected = Dense(2 * inner + 2 * groups * n + heads, use_bias=False, dtype=self.dtype,
                      kernel_init=dense_init(), name="in_proj")(x)
    z, xbc, dt = jnp.split(projected, [inner, 2 * inner + 2 * groups * n], axis=-1)
    conv_real, conv_runs = conv_inputs(mode, padding_mask, segment_ids, real)
    xbc = ShortConvolution(self.conv_width, use_bias=True, dtype=self.dtype, name="conv")(
        xbc, conv_real, conv_runs, mode, reset)
    xs, b, c = jnp.split(xbc, [inner, inner + groups * n], axis=-1)
    dt_bias = self.param("dt_bias", dt_bias_init(self.dt_min, self.dt_max), (heads,))
    a_log = self.param("A_log", a_log_init, (heads,))
    dt = jax.nn.softplus(wide(dt) + dt_bias)  # [b, l, heads]
    log_gates = -jnp.exp(a_log) * dt
    xs = xs.reshape(batch, length, heads, head_dim)
    v = xs * dt[..., None].astype(xs.dtype)
    k, q = (t.reshape(batch, length, groups, n) for t in (b, c))
    y = apply_core(self, GATED, mode, q, k, v, (log_gates,), scale=1.0,
                   padding_mask=padding_mask, segment_ids=segment_ids, real=real, reset=reset)
    if self.use_d:
      d = self.param("D", nn.initializers.ones, (heads,))
      y = y + (d[:, None] * wide(xs)).astype(y.dtype)
    y = GatedRMSNorm(norm_before_gate=False, groups=groups, dtype=self.dtype, name="norm")(
        y, z.reshape(batch, length, heads, head_dim))
    return Dense(embed, use_bias=False, dtype=self.dtype, kernel_init=dense_init(),
                 name="out_proj")(y.reshape(batch, length, inner))


def forward_flops(batch: int, length: int, heads: int, head_dim: int, chunk: int = 64,
                  state_dim: int = 128) -> float:
  """Chunked SSD per head (key = state_dim N, value = head_dim P): C B^T and its product with
  the inputs within chunks, 2 L C (N + P), and the state's read and write, 2 * 2 L N P."""
  return 2.0 * batch * heads * length * (chunk * (state_dim + head_dim)
                                         + 2 * state_dim * head_dim)


def _check(fields: dict) -> None:
  if fields["dt_min"] > fields["dt_max"]:
    raise UsageError(f"config.model.mamba2.dt_min={fields['dt_min']} must not exceed "
                     f"dt_max={fields['dt_max']}.")


registry.register(family.variant(
    "mamba2", Mamba2, options="mamba2",
    defaults=(("chunk_size", 64), ("state_dim", 128), ("expand", 2), ("groups", 1),
              ("conv_width", 4), ("use_d", True), ("dt_min", 0.001), ("dt_max", 0.1)),
    forward_flops=forward_flops, check=_check,
    description="Mamba-2 / SSD (Dao & Gu 2024): input-dependent scalar decay per head, short "
                "convolution, chunked or recurrent, O(1)-state decoding"))
