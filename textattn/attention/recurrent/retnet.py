"""RetNet's multi-scale retention (Sun et al. 2023, arXiv 2307.08621); registers "retnet".

    q, k = rotary(x W_q), rotary(x W_k)   [heads, key]; value = x W_v [heads, 2 key]
    S_t = gamma_h S_{t-1} + k_t v_t^T,  o_t = key^-0.5 S_t^T q_t,  gamma_h = 1 - 2^(-5 - h)
    out = (RMSNorm(o) * silu(x W_g)) W_o                          (the norm per head)

As flash-linear-attention's MultiScaleRetention: standard rotary (xPos without its scale), no
normalisation of the scores, value dim twice the key dim, RMSNorm per head where the paper has
GroupNorm (flash-linear-attention's choice, kept here). The core: recurrent/gated.py with a fixed
log-gate log(gamma_h) per head.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from textattn.attention import registry
from textattn.attention.common import dense_init
from textattn.attention.recurrent import family
from textattn.attention.recurrent.chunking import wide
from textattn.attention.recurrent.gated import GATED
from textattn.attention.recurrent.layer import (
  apply_core,
  decode_mode,
  decode_signals,
  gated_output,
)
from textattn.attention.rotary import apply_rotary
from textattn.flax_layers import DenseGeneral

Array = jax.Array


def decays(num_heads: int) -> np.ndarray:
  """gamma_h = 1 - 2^(-5 - h), h = 0..H-1 (the paper's multi-scale decays)."""
  return 1.0 - 2.0 ** (-5.0 - np.arange(num_heads, dtype=np.float64))


class RetNet(nn.Module):
  num_heads: int
  implementation: str = "chunked"
  dtype: Any = jnp.float32
  mesh: Any = None  # sequence parallelism: the core split over its "sequence" axis
  chunk_size: int = 64
  value_factor: int = 2  # value dim / key dim (the paper's 2)
  rotary: bool = True  # rotate q and k (the paper's xPos, without its scale)
  output_gate: bool = True  # RMSNorm(o) * silu(x W_g); False: RMSNorm(o)

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array, decode: bool = False, *,
               segment_ids: Array | None = None) -> Array:
    batch, length, embed = x.shape
    heads = self.num_heads
    key_dim = embed // heads
    value_dim = key_dim * self.value_factor
    mode = decode_mode(self, decode)
    real, reset = decode_signals(self, mode, padding_mask, segment_ids)
    dense = lambda dim, name: DenseGeneral(features=(heads, dim), use_bias=False, dtype=self.dtype,
                                           kernel_init=dense_init(), name=name)(x)
    q, k, v = dense(key_dim, "query"), dense(key_dim, "key"), dense(value_dim, "value")
    if self.rotary:
      positions = family.positions(self, mode, length)
      q, k = apply_rotary(q, positions), apply_rotary(k, positions)
    log_gates = jnp.broadcast_to(jnp.log(jnp.asarray(decays(heads), wide(x).dtype)),
                                 (batch, length, heads))
    o = apply_core(self, GATED, mode, q, k, v, (log_gates,), scale=key_dim ** -0.5,
                   padding_mask=padding_mask, segment_ids=segment_ids, real=real, reset=reset)
    return gated_output(self, x, o, self.output_gate)


def forward_flops(batch: int, length: int, heads: int, head_dim: int, chunk: int = 64) -> float:
  """Chunked form: Q K^T and its product with V within chunks (2 L C (d + 2d)) plus the state's
  read and write (2 * 2 L d 2d), per batch and head; value dim 2 d."""
  return 2.0 * batch * heads * length * (chunk * 3 * head_dim + 4 * head_dim * head_dim)


registry.register(family.variant(
    "retnet", functools.partial(RetNet), options="retnet",
    defaults=(("chunk_size", 64), ("value_factor", 2), ("rotary", True), ("output_gate", True)),
    forward_flops=forward_flops,
    description="RetNet retention (Sun et al. 2023): fixed multi-scale decays, rotary q/k, "
                "chunked or recurrent, O(1)-state decoding"))
