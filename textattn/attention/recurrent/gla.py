"""Gated linear attention, GLA (Yang et al. 2024, arXiv 2312.06635); registers "gla".

    q, k = x W_q, x W_k  [heads, key]  (key = embed / 2 / heads);  v = x W_v  [heads, embed/heads]
    log alpha_t = logsigmoid(x W_a1 W_a2 + b) / 16   (a rank-16 projection; per key dimension)
    S_t = diag(alpha_t) S_{t-1} + k_t v_t^T,  o_t = key^-0.5 S_t^T q_t
    out = (RMSNorm(o) * silu(x W_g)) W_o                          (the norm per head)

As flash-linear-attention's GatedLinearAttention defaults (expand_k 0.5, expand_v 1, gate low
rank 16, gate_logit_normalizer 16, no short convolution, no feature map, swish output gate). The
core: recurrent/gated.py with per-key-dimension log-gates (GLA's secondary chunking).
"""

from __future__ import annotations

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
  apply_core,
  decode_mode,
  decode_signals,
  gated_output,
)
from textattn.errors import UsageError
from textattn.flax_layers import Dense, DenseGeneral

Array = jax.Array


class GLA(nn.Module):
  num_heads: int
  implementation: str = "chunked"
  dtype: Any = jnp.float32
  mesh: Any = None  # sequence parallelism: the core split over its "sequence" axis
  chunk_size: int = 64
  key_factor: float = 0.5  # key width / embed (expand_k)
  value_factor: float = 1.0  # value width / embed (expand_v)
  gate_rank: int = 16  # the gate projection's low rank
  gate_temperature: float = 16.0  # log-gates = logsigmoid(.) / this (gate_logit_normalizer)
  output_gate: bool = True

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array, decode: bool = False, *,
               segment_ids: Array | None = None) -> Array:
    batch, length, embed = x.shape
    heads = self.num_heads
    key_dim = int(embed * self.key_factor) // heads
    value_dim = int(embed * self.value_factor) // heads
    mode = decode_mode(self, decode)
    real, reset = decode_signals(self, mode, padding_mask, segment_ids)
    dense = lambda dim, name: DenseGeneral(features=(heads, dim), use_bias=False, dtype=self.dtype,
                                           kernel_init=dense_init(), name=name)(x)
    q, k, v = dense(key_dim, "query"), dense(key_dim, "key"), dense(value_dim, "value")
    low = Dense(self.gate_rank, use_bias=False, dtype=self.dtype, kernel_init=dense_init(),
                name="gate_low_rank")(x)
    gate_logits = DenseGeneral(features=(heads, key_dim), dtype=self.dtype,
                               kernel_init=dense_init(), name="gate_key")(low)
    log_gates = jax.nn.log_sigmoid(wide(gate_logits)) / self.gate_temperature
    o = apply_core(self, GATED, mode, q, k, v, (log_gates,), scale=key_dim ** -0.5,
                   padding_mask=padding_mask, segment_ids=segment_ids, real=real, reset=reset)
    return gated_output(self, x, o, self.output_gate)


def forward_flops(batch: int, length: int, heads: int, head_dim: int, chunk: int = 64) -> float:
  """Chunked form with key = value = head_dim: Q K^T and its product with V within chunks, the
  state's read and write: 2 L (2 C d + 2 d^2) per batch and head (the gates' elementwise work and
  the sub-chunks' pairwise terms left out)."""
  return 2.0 * batch * heads * length * (2 * chunk * head_dim + 2 * head_dim * head_dim)


def _check(fields: dict) -> None:
  for name in ("key_factor", "value_factor"):
    if fields[name] > 8:
      raise UsageError(f"config.model.gla.{name}={fields[name]} must be a width ratio in (0, 8].")


registry.register(family.variant(
    "gla", GLA, options="gla",
    defaults=(("chunk_size", 64), ("key_factor", 0.5), ("value_factor", 1.0), ("gate_rank", 16),
              ("gate_temperature", 16.0), ("output_gate", True)),
    forward_flops=forward_flops, check=_check,
    description="gated linear attention, GLA (Yang et al. 2024): data-dependent decay per key "
                "dimension, chunked (secondary chunks) or recurrent, O(1)-state decoding"))
