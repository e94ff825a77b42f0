"""Learned feature maps for linear attention (textattn/attention/linear.py): "hedgehog" and "t2r".

Both are Flax modules built inside the linear attention module under the name "feature_map",
so their parameters live with the attention's and train with them (or alone, in a transfer
stage). Each is a per-head affine map z = x W_h + b_h of the projected queries/keys
x [batch, length, heads, head_dim], then:

  hedgehog  Hedgehog's (Zhang et al., ICLR 2024, arXiv 2402.04347) as LoLCATs uses it
            (arXiv 2410.10254): phi(x) = [softmax_f(z), softmax_f(-z)], 2 * features positive
            values summing to 2, so phi(q).phi(k) is bounded and never 0; queries and keys have
            maps of their own (W_q, b_q and W_k, b_k), initialised to the identity (W = I,
            b = 0, features = head_dim) as LoLCATs does, so training starts from the softmax of
            the projected vector itself.
  t2r       T2R's (Kasai et al., EMNLP 2021, arXiv 2103.13076): phi(x) = relu(z), one map for
            queries and keys, random init (features default head_dim). A query whose features
            meet none of a key's gets weight 0 there; one that meets no key outputs 0.

`features` (config.model.linear.features; 0: head_dim) is the width of z. Register more with
`linear.register_feature_map(name, build)`; a builder taking `features` is given it.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from textattn.attention import linear
from textattn.attention.common import Array

F32 = jnp.float32


def _identity(key, shape, dtype=F32):
  """W [heads, head_dim, features]: the identity (rectangular where features != head_dim), as
  LoLCATs' "eye" init."""
  del key
  _, head_dim, width = shape
  return jnp.broadcast_to(jnp.eye(head_dim, width, dtype=dtype), shape)


def _affine(module: nn.Module, x: Array, name: str, features: int, init) -> Array:
  heads, head_dim = x.shape[-2], x.shape[-1]
  kernel = module.param(f"{name}_kernel", init, (heads, head_dim, features))
  bias = module.param(f"{name}_bias", nn.initializers.zeros, (heads, features))
  return jnp.einsum("blhd,hdf->blhf", x.astype(F32), kernel.astype(F32)) + bias.astype(F32)


class HedgehogFeatures(nn.Module):
  """phi(x) = [softmax(x W + b), softmax(-(x W + b))] over features, per head; separate maps
  for queries and keys."""
  num_heads: int
  head_dim: int
  features: int = 0  # 0: head_dim

  @nn.compact
  def __call__(self, x: Array, *, is_query: bool) -> Array:
    width = self.features or self.head_dim
    z = _affine(self, x, "query" if is_query else "key", width, _identity)
    return jnp.concatenate([jax.nn.softmax(z, axis=-1), jax.nn.softmax(-z, axis=-1)], axis=-1)


class T2RFeatures(nn.Module):
  """phi(x) = relu(x W + b), per head, one map for queries and keys."""
  num_heads: int
  head_dim: int
  features: int = 0  # 0: head_dim

  @nn.compact
  def __call__(self, x: Array, *, is_query: bool) -> Array:
    del is_query
    width = self.features or self.head_dim
    init = nn.initializers.variance_scaling(1.0, "fan_in", "normal", in_axis=-2, out_axis=-1,
                                            batch_axis=(0,))
    return jax.nn.relu(_affine(self, x, "map", width, init))


def hedgehog(*, num_heads: int, head_dim: int, name: str, features: int = 0) -> HedgehogFeatures:
  return HedgehogFeatures(num_heads, head_dim, features, name=name)


def t2r(*, num_heads: int, head_dim: int, name: str, features: int = 0) -> T2RFeatures:
  return T2RFeatures(num_heads, head_dim, features, name=name)


linear.register_feature_map("hedgehog", hedgehog)
linear.register_feature_map("t2r", t2r)
