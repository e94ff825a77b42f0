"""The recurrent causal additive form, chunk by chunk, as a Pallas kernel (Triton style).

`pallas_recurrent_causal_additive` is the same function as
`causal_additive.chunked_recurrent_causal_additive` (and so as the scan form; tests check it in
interpret mode against a float64 reference): implementation "pallas" of
"causal_additive_recurrent". Generic Pallas ops only (masked `load`/`store`, `jnp`, `dot`), so
the Triton lowering takes it and interpret mode runs it on a CPU; not for TPUs.

Forward: one program per example walks its chunks in order (the running sums carry across
chunks), [chunk, F] tiles with F = heads * head_dim padded to a power of two. Inside a chunk,
per head, each pooling is the masked [C, C] matrix W[t, i] = exp(s_i - m_t) [i <= t, real_i]
times the values (a `dot`, float32 at full precision) plus the carried sums rescaled by
exp(M - m_t), m_t the row's own running max; the alpha pooling of a chunk is finished before
its beta scores, which read g_q. On a GPU the chunk must be at least 16 (Triton's `dot`).
Backward: a documented mix: not a Pallas kernel yet; the custom VJP recomputes the XLA chunked
form and differentiates it (jax.vjp), so gradients are exactly those of
`chunked_recurrent_causal_additive`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from textattn.attention.common import MASK_VALUE, Array

F32 = jnp.float32


class _Shape(NamedTuple):
  length: int
  features: int
  padded: int
  heads: int
  head_dim: int
  chunk: int
  num_chunks: int


def _head_value(vector, head_mask, shape: _Shape):
  """The value a head-replicated [padded] vector holds on that head's features (a scalar)."""
  return jnp.sum(jnp.where(head_mask, vector, 0.0)) / shape.head_dim


def _pool_chunk(x, real, carry, weights, heads, shape: _Shape, scale: float):
  """One chunk of a prefix softmax pooling of x [C, padded] (its own scores): returns the
  pooled means [C, padded] (0 where the prefix has no real position) and the new carry
  (max, weighted sum, sum of weights), head-replicated [padded] vectors."""
  carried_max, carried_acc, carried_sum = carry
  positions = jnp.arange(shape.chunk)
  visible = (positions[:, None] >= positions[None, :]) & real[None, :]  # [t, i]
  num = jnp.zeros_like(x)
  den = jnp.zeros_like(x)
  new_max = jnp.zeros_like(carried_max)
  new_acc = jnp.zeros_like(carried_acc)
  new_sum = jnp.zeros_like(carried_sum)
  for head, weight in zip(heads, weights):
    scores = jnp.where(real, jnp.sum(x * weight[None, :], axis=1) * scale, MASK_VALUE)
    previous_max = _head_value(carried_max, head, shape)
    previous_sum = _head_value(carried_sum, head, shape)
    masked = jnp.where(visible, scores[None, :], MASK_VALUE)
    row_max = jnp.maximum(jnp.max(masked, axis=1), previous_max)  # m_t
    # exp only where visible: a later, larger score would overflow (and inf * 0 = NaN).
    w = jnp.where(visible, jnp.exp(masked - row_max[:, None]), 0.0)  # [t, i]
    rescale = jnp.exp(previous_max - row_max)  # exp(M - m_t) [t]
    x_head = jnp.where(head[None, :], x, 0.0)
    acc_head = jnp.where(head, carried_acc, 0.0)
    num = (num + plgpu.dot(w, x_head, precision=jax.lax.Precision.HIGHEST)
           + rescale[:, None] * acc_head[None, :])
    den = den + jnp.where(head[None, :],
                          (jnp.sum(w, axis=1) + rescale * previous_sum)[:, None], 0.0)
    # The carry after the chunk: the whole chunk's sums (its last row's, computed directly).
    chunk_max = jnp.maximum(previous_max, jnp.max(scores))
    e = jnp.where(real, jnp.exp(scores - chunk_max), 0.0)
    carried_scale = jnp.exp(previous_max - chunk_max)
    new_max = jnp.where(head, chunk_max, new_max)
    new_acc = new_acc + jnp.sum(e[:, None] * x_head, axis=0) + carried_scale * acc_head
    new_sum = jnp.where(head, jnp.sum(e) + carried_scale * previous_sum, new_sum)
  mean = jnp.where(den > 0, num / jnp.maximum(den, 1e-30), 0.0)
  return mean, (new_max, new_acc, new_sum)


def _kernel(q_ref, k_ref, mask_ref, alpha_ref, beta_ref, u_ref, *, shape: _Shape, scale: float):
  head_of = jnp.arange(shape.padded) // shape.head_dim
  heads = [head_of == h for h in range(shape.heads)]
  alpha = [alpha_ref[h, :].astype(F32) for h in range(shape.heads)]
  beta = [beta_ref[h, :].astype(F32) for h in range(shape.heads)]
  features = jnp.arange(shape.padded) < shape.features

  def body(index, carry):
    alpha_carry, beta_carry = carry
    start = index * shape.chunk
    in_bounds = start + jnp.arange(shape.chunk) < shape.length
    tile_mask = in_bounds[:, None] & features[None, :]
    rows = pl.ds(start, shape.chunk)
    q = plgpu.load(q_ref.at[rows, :], mask=tile_mask, other=0.0).astype(F32)
    k = plgpu.load(k_ref.at[rows, :], mask=tile_mask, other=0.0).astype(F32)
    real = plgpu.load(mask_ref.at[rows], mask=in_bounds, other=0) > 0
    global_query, alpha_carry = _pool_chunk(q, real, alpha_carry, alpha, heads, shape, scale)
    mixed = k * global_query  # p_i = g_q(i) * k_i: needs this chunk's alpha pooling first
    global_key, beta_carry = _pool_chunk(mixed, real, beta_carry, beta, heads, shape, scale)
    plgpu.store(u_ref.at[rows, :], (q * global_key).astype(u_ref.dtype), mask=tile_mask)
    return alpha_carry, beta_carry

  empty = (jnp.full((shape.padded,), MASK_VALUE, F32), jnp.zeros((shape.padded,), F32),
           jnp.zeros((shape.padded,), F32))
  jax.lax.fori_loop(0, shape.num_chunks, body, (empty, empty))


def _forward(q, k, mask, alpha_kernel, beta_kernel, shape: _Shape, interpret: bool):
  batch = q.shape[0]

  def rows(kernel):  # [F, heads] -> float32 [heads, padded]
    return jnp.pad(kernel.astype(F32).T, ((0, 0), (0, shape.padded - shape.features)))

  row_spec = pl.BlockSpec((None, shape.length, shape.padded), lambda b: (b, 0, 0))
  weight_spec = pl.BlockSpec((shape.heads, shape.padded), lambda b: (0, 0))
  return pl.pallas_call(
      functools.partial(_kernel, shape=shape, scale=shape.head_dim ** -0.5), grid=(batch,),
      in_specs=[row_spec, row_spec, pl.BlockSpec((None, shape.length), lambda b: (b, 0)),
                weight_spec, weight_spec],
      out_specs=row_spec,
      out_shape=jax.ShapeDtypeStruct((batch, shape.length, shape.features), q.dtype),
      interpret=interpret, name="chunked_causal_additive",
  )(q, k, mask.astype(jnp.int32), rows(alpha_kernel), rows(beta_kernel))


def _xla_form(q, k, mask, alpha_kernel, beta_kernel, shape: _Shape):
  """The same function in XLA, on the [batch, length, F] layout (the backward differentiates
  it)."""
  from textattn.attention import causal_additive  # (which imports this module)

  def split(x):
    return x.reshape(x.shape[:2] + (shape.heads, shape.head_dim))

  u = causal_additive.chunked_recurrent_causal_additive(
      split(q), split(k), mask, alpha_kernel, beta_kernel, chunk_size=shape.chunk)
  return u.reshape(q.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _core(q, k, mask, alpha_kernel, beta_kernel, shape, interpret):
  return _forward(q, k, mask, alpha_kernel, beta_kernel, shape, interpret)


def _core_forward(q, k, mask, alpha_kernel, beta_kernel, shape, interpret):
  return (_forward(q, k, mask, alpha_kernel, beta_kernel, shape, interpret),
          (q, k, mask, alpha_kernel, beta_kernel))


def _core_backward(shape, interpret, residuals, d_u):
  del interpret
  q, k, mask, alpha_kernel, beta_kernel = residuals
  _, pullback = jax.vjp(lambda q, k, a, b: _xla_form(q, k, mask, a, b, shape),
                        q, k, alpha_kernel, beta_kernel)
  d_q, d_k, d_alpha, d_beta = pullback(d_u)
  return d_q, d_k, None, d_alpha, d_beta


_core.defvjp(_core_forward, _core_backward)


def pallas_recurrent_causal_additive(query: Array, key: Array, padding_mask: Array,
                                     alpha_kernel: Array, beta_kernel: Array, *,
                                     chunk_size: int = 64, interpret: bool | None = None) -> Array:
  """The recurrent form's u [batch, length, heads, dim] (module docstring). `interpret` None:
  interpret mode on a CPU."""
  batch, length, heads, head_dim = query.shape
  if interpret is None:
    interpret = jax.default_backend() == "cpu"
  features = heads * head_dim
  chunk = min(chunk_size, pl.next_power_of_2(length))
  shape = _Shape(length, features, pl.next_power_of_2(features), heads, head_dim, chunk,
                 pl.cdiv(length, chunk))
  u = _core(query.reshape(batch, length, features), key.reshape(batch, length, features),
            padding_mask, alpha_kernel, beta_kernel, shape, interpret)
  return u.reshape(query.shape)
