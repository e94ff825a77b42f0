"""Performer FAVOR+ attention (Choromanski et al. 2021, arXiv 2009.14794); registers "performer"
(bidirectional) and "causal_performer".

Softmax attention's kernel exp(q.k / sqrt(d)) estimated with positive random features: with
x' = x / d^(1/4) and rows w_j of a random matrix W [m, d],
    phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m),   E[phi(q).phi(k)] = exp(q'.k') = exp(q.k / sqrt(d)),
then linear attention (textattn/attention/linear.py) with phi as its feature map ("favor+",
registered there by this module), so the kernels (bidirectional xla; causal xla, chunked,
recurrent), segment ids and the decoding step are linear attention's. For a query, the constant
exp(-|q'|^2 / 2) and a stabilising exp(-max_j w_j.q') (no gradient) are divided out: they cancel
in the ratio phi(q) S / phi(q) z. Keys are not shifted by a data-dependent maximum (one taken
over the row would let a later key change an earlier output's rounding); their exponent is at
most |w_j|^2 / 2 (about d / 2) whatever the key, which float32 holds for head sizes up to ~128.
The other side of that choice: a key far from every w_j (|k'| beyond ~45 at d = 64) has features
that underflow to 0, so it gets no weight; merely tiny ones keep finite gradients
(common.merged_mean).

W: orthogonal random features by default (blocks of d orthogonal rows, from the QR decomposition
of Gaussian matrices, each row rescaled to the norm of a Gaussian vector), drawn by NumPy's
generator seeded with the build keyword `seed` (default 0), the same for every head. It is a
non-trainable variable: collection "constants", name "projection", under the attention module's
"feature_map", created by `init` from the seed alone (not from the init RNG), so a seed gives the
same matrix in every run and `init`'s variables hold it for a checkpoint; the optimizer never
sees it. A caller that keeps only "params" (textattn's train state does) applies the module
without it, and the matrix is drawn again from the seed while the call is traced: the same
values, a constant of the compiled step (no QR decomposition runs inside it).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from textattn.attention import linear, registry
from textattn.attention.common import Array
from textattn.errors import UsageError

COLLECTION = "constants"


def random_projection(seed: int, num_features: int, head_dim: int,
                      orthogonal: bool = True) -> np.ndarray:
  """W float32 [num_features, head_dim] from NumPy's generator seeded with `seed` (PCG64: the
  same numbers on every platform): iid Gaussian rows, or Performer's orthogonal random features,
  blocks of head_dim orthonormal rows (QR of Gaussian matrices) each rescaled to the norm of a
  Gaussian vector. Drawn in NumPy, float64, so no traced function holds a QR decomposition."""
  rng = np.random.default_rng(seed)
  if not orthogonal:
    return rng.standard_normal((num_features, head_dim)).astype(np.float32)
  blocks = -(-num_features // head_dim)
  q, r = np.linalg.qr(rng.standard_normal((blocks, head_dim, head_dim)))
  # Column signs as diag(R)'s: Householder QR fixes them by the Gaussian's own entries, which
  # biases the directions (measured: a 38% error in exp(q.k) at 32k features); with them Q is
  # Haar-distributed and the estimator unbiased.
  q = q * np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :]
  rows = q.swapaxes(1, 2).reshape(blocks * head_dim, head_dim)[:num_features]
  norms = np.linalg.norm(rng.standard_normal((num_features, head_dim)), axis=1)
  return (rows * norms[:, None]).astype(np.float32)


class FavorFeatures(nn.Module):
  """FAVOR+ positive random features phi(x [b, l, h, d]) -> float32 [b, l, h, num_features]."""
  head_dim: int
  num_features: int
  seed: int = 0
  orthogonal: bool = True

  def projection(self) -> Array:
    draw = lambda: jnp.asarray(random_projection(self.seed, self.num_features, self.head_dim,
                                                 self.orthogonal))
    if self.has_variable(COLLECTION, "projection") or self.is_mutable_collection(COLLECTION):
      return self.variable(COLLECTION, "projection", draw).value
    return draw()

  @nn.compact
  def __call__(self, x: Array, *, is_query: bool) -> Array:
    w = jax.lax.stop_gradient(self.projection())
    x = x.astype(jnp.float32) * self.head_dim ** -0.25
    exponent = jnp.einsum("blhd,md->blhm", x, w)
    if is_query:
      exponent = exponent - jax.lax.stop_gradient(jnp.max(exponent, axis=-1, keepdims=True))
    else:
      exponent = exponent - 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)
    return jnp.exp(exponent) * self.num_features ** -0.5


def default_features(head_dim: int) -> int:
  """m = 2 d random features unless the build says otherwise."""
  return 2 * head_dim


def favor_features(*, num_heads: int, head_dim: int, name: str, num_features: int | None = None,
                   seed: int = 0, orthogonal: bool = True) -> FavorFeatures:
  del num_heads  # one matrix for every head
  return FavorFeatures(head_dim, num_features or default_features(head_dim), seed, orthogonal,
                       name=name)


linear.register_feature_map("favor+", favor_features)


def build(*, num_heads: int, causal: bool = False, implementation: str = "xla",
          dtype: Any = jnp.float32, head_dim: int | None = None, name: str | None = None,
          num_features: int | None = None, seed: int = 0, orthogonal: bool = True,
          chunk_size: int = 64, rotary: bool = False) -> linear.LinearAttention:
  """linear.LinearAttention with the "favor+" feature map: num_features (None: 2 * head_dim),
  the projection's seed, orthogonal or iid rows; rotary: queries and keys turned by position
  before the features (registry.Variant.rotary)."""
  options = (("num_features", num_features), ("seed", seed), ("orthogonal", orthogonal))
  return linear.LinearAttention(num_heads=num_heads, causal=causal,
                                implementation=implementation, dtype=dtype, head_dim=head_dim,
                                feature_map="favor+", feature_options=options,
                                chunk_size=chunk_size, rotary=rotary, name=name)


def forward_flops(batch: int, length: int, heads: int, head_dim: int) -> float:
  """The features (W q', W k': 2 * 2 * B * H * L * m * d) and linear attention over m of them,
  with the default m = 2 d."""
  features = default_features(head_dim)
  return (4.0 * batch * heads * length * features * head_dim
          + linear.forward_flops(batch, length, heads, head_dim, features))


def performer_keywords(features: int, orthogonal: bool, seed: int, chunk_size: int) -> dict:
  """config.model.performer.{features (0: 2 * head_dim), orthogonal, seed, chunk_size} -> the
  build keywords num_features, orthogonal, seed, chunk_size."""
  if not isinstance(features, int) or isinstance(features, bool) or features < 0:
    raise UsageError(f"config.model.performer.features={features!r} must be a number of random "
                     f"features >= 1 (0: twice the head size).")
  if not isinstance(orthogonal, bool):
    raise UsageError(f"config.model.performer.orthogonal={orthogonal!r} must be True or False.")
  if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
    raise UsageError(f"config.model.performer.seed={seed!r} must be an integer >= 0.")
  linear.check_chunk_size(chunk_size, "performer")
  return {"num_features": features or None, "orthogonal": orthogonal, "seed": seed,
          "chunk_size": chunk_size}


def variant(name: str, causal: bool, description: str) -> registry.Variant:
  return registry.Variant(
      name=name,
      build=functools.partial(build, causal=causal),
      implementations=linear.IMPLEMENTATIONS[causal],
      resolve=functools.partial(linear.resolve, causal=causal),
      causal=causal,
      segment_ids=causal,
      rotary=True,
      options="performer",
      option_defaults=(("features", 0), ("orthogonal", True), ("seed", 0), ("chunk_size", 64)),
      option_keywords=performer_keywords,
      forward_flops=forward_flops,
      kernels=linear.KERNEL_LABELS[causal],
      description=description)


registry.register(variant(
    "performer", False, "Performer FAVOR+ (Choromanski et al. 2021): positive orthogonal random "
    "features of softmax's kernel, linear attention, O(length)"))
registry.register(variant(
    "causal_performer", True, "causal Performer FAVOR+: causal linear attention over positive "
    "orthogonal random features; O(1)-state decoding"))
