"""A toy attention variant registered from outside textattn: the proof that a new variant is one
new module (tests/test_registry.py trains and benchmarks it with no edit under textattn/).

"toy_mean": every position gets the mean of the value projections of the real tokens of its
example (padding_mask True), the same for all positions; an example with no real token gets
zeros. Load it with `--plugin=tests.toy_attention` (textattn.main, textattn.benchmark).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from textattn import attention

IMPLEMENTATIONS = ("auto", "xla")  # one kernel, plain XLA; "auto" resolves to it


class MeanAttention(nn.Module):
  num_heads: int  # a mean needs no heads; accepted for the common signature
  implementation: str = "xla"
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, padding_mask):
    value = nn.Dense(x.shape[-1], dtype=self.dtype, name="value")(x)
    weights = padding_mask[..., None].astype(value.dtype)
    total = jnp.sum(value * weights, axis=1, keepdims=True)
    count = jnp.maximum(jnp.sum(weights, axis=1, keepdims=True), 1)  # 0 real tokens: zeros
    return jnp.broadcast_to(total / count, value.shape)


VARIANT = attention.register(attention.Variant(
    name="toy_mean",
    build=MeanAttention,
    implementations=IMPLEMENTATIONS,
    resolve=lambda implementation, head_dim=None, dtype="float32": "xla",
    description="test-only: every position gets the masked mean of the value projections"))
