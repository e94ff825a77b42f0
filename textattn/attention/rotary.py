"""Rotary position embedding (RoPE, Su et al. 2021, arXiv 2104.09864): queries and keys rotated
by an angle proportional to their position, so q_i . k_j depends on i - j only.

The half-split layout (GPT-NeoX's, flash-linear-attention's `interleaved=False`): feature d of
the first half pairs with d + dim/2, pair p turns at frequency base^(-2p/dim). Only the first
`rotary_dim` features (even, <= head_dim; None: all) turn, the rest pass through. Positions may
be any integers: a packed row can use 0..length-1 throughout, since a rotation shared by a
document's tokens cancels in q_i . k_j; decoding passes the cache's running index.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
BASE = 10000.0


def rotary_angles(positions: Array, rotary_dim: int, base: float = BASE) -> Array:
  """float32 [..., rotary_dim // 2] angles for integer `positions` [...]."""
  if rotary_dim % 2:
    raise ValueError(f"rotary_dim={rotary_dim} must be even.")
  inverse = base ** (-jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim)
  return positions.astype(jnp.float32)[..., None] * inverse


def apply_rotary(x: Array, positions: Array, rotary_dim: int | None = None,
                 base: float = BASE) -> Array:
  """x [batch, length, heads, head_dim] rotated by `positions` int [batch or 1, length] (or
  [length]); returned in x's dtype (the rotation computed in float32, float64 kept)."""
  head_dim = x.shape[-1]
  rotary_dim = head_dim if rotary_dim is None else rotary_dim
  if not 0 < rotary_dim <= head_dim:
    raise ValueError(f"rotary_dim={rotary_dim} must be in [2, head_dim={head_dim}].")
  positions = jnp.asarray(positions)
  if positions.ndim == 1:
    positions = positions[None]
  angles = rotary_angles(positions, rotary_dim, base)[:, :, None, :]  # [b, l, 1, r/2]
  compute = jnp.promote_types(x.dtype, jnp.float32)
  # cos and sin per feature [b, l, 1, r], and x turned as x cos + (-second, first) sin: the same
  # numbers as (first cos - second sin, second cos + first sin), without concatenating two
  # computed halves, which XLA:CPU ran 5-7x slower (forward and backward, [64, 256, 1, 128]).
  cos, sin = (jnp.concatenate([f, f], axis=-1).astype(compute)
              for f in (jnp.cos(angles), jnp.sin(angles)))
  turned, rest = x[..., :rotary_dim].astype(compute), x[..., rotary_dim:]
  first, second = jnp.split(turned, 2, axis=-1)
  rotated = (turned * cos + jnp.concatenate([-second, first], axis=-1) * sin).astype(x.dtype)
  return jnp.concatenate([rotated, rest], axis=-1) if rest.shape[-1] else rotated
