"""Softmax attention through JAX's Pallas TPU splash attention kernel (kernel "splash").

`splash_attention` is the same function as `softmax.softmax_attention` (padding and look-ahead
masks, rows without a visible key output 0); "auto" picks it for softmax/causal on a TPU
(`softmax.resolve`), the counterpart of cuDNN flash attention on a GPU. The kernel is
`jax.experimental.pallas.ops.tpu.splash_attention` (Mosaic TPU; forward and backward are its
own Pallas kernels, imported when first called). Elsewhere it runs in Pallas' TPU interpret mode
(`interpret=None` means: off a TPU), which is how tests/test_attention.py checks it against the
float64 reference on a CPU; the suite proves the wiring (layout, masks, scale), not its speed.

Wiring: tensors go to the kernel's [heads, length, head_dim] per example (vmapped over the
batch); the query is pre-scaled by 1/sqrt(head_dim) (splash applies no scale); the look-ahead
mask is its static CausalMask, padding its segment ids (every query in segment 1, a key in 1 if
real, 0 if padding, so queries see the real keys only, as the reference). The length is padded
to a multiple of 128 (Mosaic's key blocks are multiples of 128 lanes) with padding keys, and the
extra query rows are cut off. Block sizes are the kernel's defaults (128): a tuned TPU run may
want larger ones. Not sharded: under a multi-device mesh, wrap it in shard_map (untested).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from textattn.attention import common
from textattn.attention.common import Array, rows_with_a_key

BLOCK = 128  # the padded length's multiple: Mosaic's key blocks are multiples of 128 lanes


def splash_attention(query: Array, key: Array, value: Array, padding_mask: Array, *,
                     causal: bool = False, interpret: bool | None = None) -> Array:
  """Softmax attention [batch, length, heads, head_dim] by the Pallas TPU splash kernel (module
  docstring); `interpret` None: interpret mode unless on a TPU."""
  from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_kernel as kernels,
  )
  from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_mask as masks,
  )
  if interpret is None:
    interpret = common.backend() != "tpu"
  _, length, heads, head_dim = query.shape
  padded = -(-length // BLOCK) * BLOCK

  def layout(x):  # [b, L, h, d] -> [b, h, padded, d]
    return jnp.pad(x, ((0, 0), (0, padded - length), (0, 0), (0, 0))).transpose(0, 2, 1, 3)

  one_head = (masks.CausalMask((padded, padded)) if causal
              else masks.FullMask((padded, padded)))
  kernel = kernels.make_splash_mha(masks.MultiHeadMask([one_head] * heads), head_shards=1,
                                   q_seq_shards=1, interpret=interpret)
  real = jnp.pad(padding_mask.astype(jnp.int32), ((0, 0), (0, padded - length)))
  segments = kernels.SegmentIds(q=jnp.ones_like(real), kv=real)
  scaled = query * jnp.asarray(head_dim ** -0.5, query.dtype)
  out = jax.vmap(kernel)(layout(scaled), layout(key), layout(value), segment_ids=segments)
  out = out.transpose(0, 2, 1, 3)[:, :length]
  return jnp.where(rows_with_a_key(padding_mask, causal), out, 0).astype(value.dtype)
