"""Fastformer additive attention as Pallas kernels (Triton style), forward and backward.

`pallas_additive_attention` is the same function as `additive.additive_attention` (tests check
values and gradients against float64 in Pallas interpret mode): implementation "pallas" of the
"additive" variant. Written with the generic Pallas ops the Triton lowering takes (masked
`load`/`store` of [block, features] tiles, `jnp` element-wise maths and reductions, `fori_loop`),
which also run in interpret mode on a CPU (`interpret=None` means: on a CPU). Not for TPUs: their
Mosaic lowering has no masked loads (the check refuses it there); `additive_tpu` is the same
algorithm in Mosaic's BlockSpec style (implementation "pallas_tpu").

Layout: q, k, u are [batch, length, F] with F = heads * head_dim (each head's score reads every
feature, so a tile holds whole rows); F is padded in the kernel to a power of two, as Triton's
tensors must be, by masked loads. Scores, softmax sums and every accumulation are float32
whatever the activations' dtype.

Forward, three kernels over a (batch, split) grid (splits of the length keep an accelerator's
cores busy at batch 4) plus O(batch * splits * F) combines in XLA:
  1. alpha pooling: per split, the running max, sum of exp(score - max) and weighted sum of q;
     combined in XLA into g_q and the alpha log-sum-exp;
  2. beta pooling: the same over p = k * g_q, giving g_k;
  3. output: u = q * g_k.
  Bytes moved (what a bandwidth target counts): read q twice and k once, write u once:
  4 * B * L * F * itemsize (plus the O(B * splits * F) partial sums).
Backward, three kernels (a documented mix: the sums over splits and the per-head dot products
<g, dg>_h of [batch, F] vectors are XLA, everything over the length is Pallas):
  1. dg_k = sum_l du_l * q_l;
  2. beta backward: recompute p and beta from the saved log-sum-exp; dk, and per-split partial
     sums of dg_q and d(beta_kernel);
  3. alpha backward: recompute alpha; dq = du * g_k + alpha * dg_q + score term, and partial
     sums of d(alpha_kernel).
  Bytes: read q twice, k once, du twice, write dq and dk: 7 * B * L * F * itemsize.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from textattn.attention import common
from textattn.attention.common import MASK_VALUE, Array

F32 = jnp.float32
# Triton's lowering on a GPU, whatever `jax_pallas_use_mosaic_gpu` says: these kernels are written
# for Triton (masked loads of any shape); Mosaic GPU refuses them (its async copies need 16-byte
# strides). tests/test_lowering.py exports each kernel for CUDA and checks the Triton call.
TRITON = plgpu.CompilerParams()


class Tiling(NamedTuple):
  """Static shape of the kernels: rows per tile, tiles per program, interpret mode."""
  block: int = 64
  blocks_per_split: int = 8
  interpret: bool = False


def default_tiling(batch: int, length: int, interpret: bool) -> Tiling:
  """64-row tiles; enough splits that batch * splits is about 128 programs (an H100 has 132
  SMs), each looping over its tiles so the partial sums stay small."""
  block = 64 if length >= 64 else max(8, pl.next_power_of_2(length))
  num_blocks = pl.cdiv(length, block)
  splits = max(1, min(num_blocks, 128 // max(batch, 1)))
  return Tiling(block, pl.cdiv(num_blocks, splits), interpret)


class _Shape(NamedTuple):
  """Static sizes the kernels are specialised for."""
  length: int
  features: int
  padded: int  # features rounded up to a power of two
  heads: int
  head_dim: int
  block: int
  blocks_per_split: int
  splits: int


def _rows(shape: _Shape, split, step):
  """Row indices of tile `step` of split `split` (pl.program_id(1), read outside the loop:
  interpret mode cannot read it inside one), and which of them exist."""
  start = (split * shape.blocks_per_split + step) * shape.block
  rows = start + jnp.arange(shape.block)
  return start, rows < shape.length


def _load_tile(ref, shape: _Shape, start, in_bounds):
  """A [block, padded] float32 tile of a [length, F] ref; rows past the end and padded features
  read as 0."""
  features = jnp.arange(shape.padded) < shape.features
  tile = plgpu.load(ref.at[pl.ds(start, shape.block), :],
                    mask=in_bounds[:, None] & features[None, :], other=0.0)
  return tile.astype(F32)


def _store_tile(ref, shape: _Shape, start, in_bounds, value):
  features = jnp.arange(shape.padded) < shape.features
  plgpu.store(ref.at[pl.ds(start, shape.block), :], value.astype(ref.dtype),
              mask=in_bounds[:, None] & features[None, :])


def _load_real(mask_ref, shape: _Shape, start, in_bounds):
  return plgpu.load(mask_ref.at[pl.ds(start, shape.block)], mask=in_bounds, other=0) > 0


def _head_masks(shape: _Shape):
  """Per head, a bool [padded] vector marking its features."""
  head_of = jnp.arange(shape.padded) // shape.head_dim
  return [head_of == h for h in range(shape.heads)]


def _head_value(vector, head_mask, shape: _Shape):
  """The value a head-replicated [padded] vector holds on that head's features (a scalar)."""
  return jnp.sum(jnp.where(head_mask, vector, 0.0)) / shape.head_dim


def _pool_kernel(x_ref, mask_ref, weight_ref, gate_ref, max_ref, sum_ref, acc_ref, *,
                 shape: _Shape, scale: float):
  """Softmax pooling over one split of the length: of x * gate (q * 1 for alpha, k * g_q for
  beta), scored per head by the rows of weight_ref [heads, padded]. Writes the split's running
  max, sum of exp(score - max) and sum of exp(score - max) * x * gate, head-replicated [padded]."""
  heads = _head_masks(shape)
  weights = [weight_ref[h, :].astype(F32) for h in range(shape.heads)]
  gate = gate_ref[...]
  split = pl.program_id(1)

  def body(step, carry):
    running_max, total, acc = carry
    start, in_bounds = _rows(shape, split, step)
    x = _load_tile(x_ref, shape, start, in_bounds) * gate[None, :]
    real = _load_real(mask_ref, shape, start, in_bounds)
    scores = jnp.zeros_like(x)
    for head, weight in zip(heads, weights):
      head_score = jnp.sum(x * weight[None, :], axis=1) * scale
      scores = jnp.where(head[None, :], head_score[:, None], scores)
    scores = jnp.where(real[:, None], scores, MASK_VALUE)
    new_max = jnp.maximum(running_max, jnp.max(scores, axis=0))
    # Padding rows are excluded, not down-weighted: before any real row the max is MASK_VALUE
    # and their exp(score - max) would be 1.
    e = jnp.where(real[:, None], jnp.exp(scores - new_max[None, :]), 0.0)
    rescale = jnp.exp(running_max - new_max)
    return new_max, total * rescale + jnp.sum(e, axis=0), acc * rescale + jnp.sum(e * x, axis=0)

  init = (jnp.full((shape.padded,), MASK_VALUE, F32), jnp.zeros((shape.padded,), F32),
          jnp.zeros((shape.padded,), F32))
  running_max, total, acc = jax.lax.fori_loop(0, shape.blocks_per_split, body, init)
  max_ref[...], sum_ref[...], acc_ref[...] = running_max, total, acc


def _scale_kernel(x_ref, mask_ref, gate_ref, out_ref, *, shape: _Shape):
  """out = x * gate, row by row (u = q * g_k), padding rows included (as the XLA function)."""
  del mask_ref
  gate = gate_ref[...]
  split = pl.program_id(1)

  def body(step, carry):
    start, in_bounds = _rows(shape, split, step)
    _store_tile(out_ref, shape, start, in_bounds,
                _load_tile(x_ref, shape, start, in_bounds) * gate[None, :])
    return carry

  jax.lax.fori_loop(0, shape.blocks_per_split, body, 0)


def _product_sum_kernel(a_ref, b_ref, mask_ref, out_ref, *, shape: _Shape):
  """One split's sum over rows of a * b (dg_k = sum_l du_l * q_l), padding rows included."""
  del mask_ref
  split = pl.program_id(1)

  def body(step, acc):
    start, in_bounds = _rows(shape, split, step)
    return acc + jnp.sum(_load_tile(a_ref, shape, start, in_bounds)
                         * _load_tile(b_ref, shape, start, in_bounds), axis=0)

  out_ref[...] = jax.lax.fori_loop(0, shape.blocks_per_split, body,
                                   jnp.zeros((shape.padded,), F32))


def _pool_backward_kernel(x_ref, du_ref, mask_ref, weight_ref, gate_ref, lse_ref, d_pooled_ref,
                          dot_ref, direct_ref, dx_ref, d_gate_ref, d_weight_ref, *,
                          shape: _Shape, scale: float, with_direct: bool):
  """Backward of one softmax pooling g = sum_l softmax_l(score(y_l)) y_l, y = x * gate, given
  d_pooled = dL/dg, lse (the forward's log-sum-exp) and dot = <g, dg>_h (head-replicated).
  Writes dx = dy * gate (+ du * direct for the alpha pooling, where u = q * g_k also reads q),
  and this split's sums of dy * x (dL/dgate) and of d(score) * y per head (d weight).

  Softmax backward per head: d score_l = w_l (<y_l, dg>_h - <g, dg>_h); dy_l = w_l dg +
  scale * d score_l * weight_h.
  """
  heads = _head_masks(shape)
  weights = [weight_ref[h, :].astype(F32) for h in range(shape.heads)]
  gate, lse, d_pooled, dots = gate_ref[...], lse_ref[...], d_pooled_ref[...], dot_ref[...]
  direct = direct_ref[...]
  lse_h = [_head_value(lse, head, shape) for head in heads]
  dot_h = [_head_value(dots, head, shape) for head in heads]
  split = pl.program_id(1)

  def body(step, carry):
    d_gate, d_weight = carry
    start, in_bounds = _rows(shape, split, step)
    x = _load_tile(x_ref, shape, start, in_bounds)
    y = x * gate[None, :]
    real = _load_real(mask_ref, shape, start, in_bounds)
    y_dg = y * d_pooled[None, :]
    dy = jnp.zeros_like(y)
    new_d_weight = []
    for h, (head, weight) in enumerate(zip(heads, weights)):
      score = jnp.sum(y * weight[None, :], axis=1) * scale
      w = jnp.where(real, jnp.exp(score - lse_h[h]), 0.0)  # [block]
      d_score = w * (jnp.sum(jnp.where(head[None, :], y_dg, 0.0), axis=1) - dot_h[h])
      dy = (dy + jnp.where(head[None, :], w[:, None] * d_pooled[None, :], 0.0)
            + scale * d_score[:, None] * weight[None, :])
      new_d_weight.append(d_weight[h] + scale * jnp.sum(d_score[:, None] * y, axis=0))
    dx = dy * gate[None, :]
    if with_direct:
      dx = dx + _load_tile(du_ref, shape, start, in_bounds) * direct[None, :]
    _store_tile(dx_ref, shape, start, in_bounds, dx)
    return d_gate + jnp.sum(dy * x, axis=0), tuple(new_d_weight)

  zeros = jnp.zeros((shape.padded,), F32)
  d_gate, d_weight = jax.lax.fori_loop(0, shape.blocks_per_split, body,
                                       (zeros, (zeros,) * shape.heads))
  d_gate_ref[...] = d_gate
  for h in range(shape.heads):
    d_weight_ref[h, :] = d_weight[h]


def _call(kernel, shape: _Shape, interpret: bool, rows_in, vectors_in, rows_out, vectors_out,
          weights=(), weight_out=None):
  """pallas_call over the (batch, split) grid. rows_in/rows_out: [batch, length, F] arrays (or
  out dtypes), one program's block is its whole example (it loads its own tiles); the mask
  [batch, length] goes with rows_in; vectors_in: [batch, padded] per-example vectors; weights:
  [heads, padded] arrays shared by all; vectors_out: how many [batch, splits, padded] partial
  sums; weight_out: a [batch, splits, heads, padded] partial sum, if any."""
  batch = rows_in[0].shape[0]
  row_spec = pl.BlockSpec((None, shape.length, shape.padded), lambda b, s: (b, 0, 0))
  mask_spec = pl.BlockSpec((None, shape.length), lambda b, s: (b, 0))
  vector_spec = pl.BlockSpec((None, shape.padded), lambda b, s: (b, 0))
  weight_spec = pl.BlockSpec((shape.heads, shape.padded), lambda b, s: (0, 0))
  partial_spec = pl.BlockSpec((None, None, shape.padded), lambda b, s: (b, s, 0))
  *rows, mask = rows_in
  in_specs = ([row_spec] * len(rows) + [mask_spec] + [weight_spec] * len(weights)
              + [vector_spec] * len(vectors_in))
  out_shape = [jax.ShapeDtypeStruct((batch, shape.length, shape.features), dtype)
               for dtype in rows_out]
  out_specs = [row_spec] * len(rows_out)
  out_shape += [jax.ShapeDtypeStruct((batch, shape.splits, shape.padded), F32)] * vectors_out
  out_specs += [partial_spec] * vectors_out
  if weight_out:
    out_shape.append(jax.ShapeDtypeStruct((batch, shape.splits, shape.heads, shape.padded), F32))
    out_specs.append(pl.BlockSpec((None, None, shape.heads, shape.padded),
                                  lambda b, s: (b, s, 0, 0)))
  return pl.pallas_call(
      kernel, grid=(batch, shape.splits), in_specs=in_specs, out_specs=out_specs,
      out_shape=out_shape, interpret=interpret, compiler_params=TRITON,
      name=getattr(kernel, "func", kernel).__name__.strip("_"),
  )(*rows, mask, *weights, *vectors_in)


def _combine(partial_max, partial_sum, partial_acc):
  """Merges the splits' softmax sums [batch, splits, padded]: (pooled mean, log-sum-exp)."""
  top = jnp.max(partial_max, axis=1)
  rescale = jnp.exp(partial_max - top[:, None])
  total = jnp.sum(partial_sum * rescale, axis=1)
  acc = jnp.sum(partial_acc * rescale, axis=1)
  seen = total > 0  # an example without a real token pools to 0
  pooled = jnp.where(seen, acc / jnp.maximum(total, 1e-30), 0.0)
  return pooled, jnp.where(seen, top + jnp.log(jnp.maximum(total, 1e-30)), 0.0)


def _head_dot(a, b, shape: _Shape):
  """<a, b>_h per head, replicated over the head's features: [batch, padded]."""
  per_feature = a * b
  batch = a.shape[0]
  real = per_feature[:, :shape.features].reshape(batch, shape.heads, shape.head_dim)
  replicated = jnp.repeat(jnp.sum(real, axis=-1), shape.head_dim, axis=-1)
  return jnp.pad(replicated, ((0, 0), (0, shape.padded - shape.features)))


def _padded_weight(kernel, shape: _Shape):
  """[F, heads] scoring kernel -> float32 [heads, padded] rows."""
  return jnp.pad(kernel.astype(F32).T, ((0, 0), (0, shape.padded - shape.features)))


def _forward(q, k, mask, alpha_kernel, beta_kernel, shape, interpret):
  scale = shape.head_dim ** -0.5
  pool = functools.partial(_pool_kernel, shape=shape, scale=scale)
  batch = q.shape[0]
  ones = jnp.ones((batch, shape.padded), F32)
  global_query, alpha_lse = _combine(*_call(pool, shape, interpret, (q, mask), (ones,), (), 3,
                                            (_padded_weight(alpha_kernel, shape),)))
  global_key, beta_lse = _combine(*_call(pool, shape, interpret, (k, mask), (global_query,), (),
                                         3, (_padded_weight(beta_kernel, shape),)))
  (u,) = _call(functools.partial(_scale_kernel, shape=shape), shape, interpret, (q, mask),
               (global_key,), (q.dtype,), 0)
  return u, (q, k, mask, alpha_kernel, beta_kernel, global_query, global_key, alpha_lse,
             beta_lse)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _core(q, k, mask, alpha_kernel, beta_kernel, shape, interpret):
  return _forward(q, k, mask, alpha_kernel, beta_kernel, shape, interpret)[0]


def _core_forward(q, k, mask, alpha_kernel, beta_kernel, shape, interpret):
  return _forward(q, k, mask, alpha_kernel, beta_kernel, shape, interpret)


def _core_backward(shape, interpret, residuals, d_u):
  q, k, mask, alpha_kernel, beta_kernel, global_query, global_key, alpha_lse, beta_lse = residuals
  scale = shape.head_dim ** -0.5
  batch = q.shape[0]
  (d_key_partial,) = _call(functools.partial(_product_sum_kernel, shape=shape), shape, interpret,
                           (d_u, q, mask), (), (), 1)
  d_global_key = jnp.sum(d_key_partial, axis=1)
  backward = functools.partial(_pool_backward_kernel, shape=shape, scale=scale)
  zeros = jnp.zeros((batch, shape.padded), F32)
  # Beta pooling over p = k * g_q: dk, dg_q and d(beta_kernel). (du is not read: with_direct.)
  d_k, d_query_partial, d_beta = _call(
      functools.partial(backward, with_direct=False), shape, interpret, (k, d_u, mask),
      (global_query, beta_lse, d_global_key, _head_dot(global_key, d_global_key, shape), zeros),
      (k.dtype,), 1, (_padded_weight(beta_kernel, shape),), weight_out=True)
  d_global_query = jnp.sum(d_query_partial, axis=1)
  # Alpha pooling over q (gate 1), plus u = q * g_k's direct term du * g_k.
  d_q, _, d_alpha = _call(
      functools.partial(backward, with_direct=True), shape, interpret, (q, d_u, mask),
      (jnp.ones((batch, shape.padded), F32), alpha_lse, d_global_query,
       _head_dot(global_query, d_global_query, shape), global_key),
      (q.dtype,), 1, (_padded_weight(alpha_kernel, shape),), weight_out=True)

  def kernel_gradient(partial, kernel):
    return jnp.sum(partial, axis=(0, 1))[:, :shape.features].T.astype(kernel.dtype)

  return (d_q, d_k, None, kernel_gradient(d_alpha, alpha_kernel),
          kernel_gradient(d_beta, beta_kernel))


_core.defvjp(_core_forward, _core_backward)


def pallas_additive_attention(query: Array, key: Array, padding_mask: Array, alpha_kernel: Array,
                              beta_kernel: Array, *, tiling: Tiling | None = None) -> Array:
  """`additive.additive_attention` as Pallas kernels (module docstring): u [batch, length,
  heads, head_dim] in query's dtype. First-order reverse-mode gradients (custom VJP). `tiling`
  None: `default_tiling`, interpret mode on a CPU."""
  if key.shape != query.shape:
    raise ValueError(f"pallas_additive_attention: key {key.shape} and query {query.shape} must "
                     f"have the same [batch, length, heads, head_dim] shape.")
  batch, length, heads, head_dim = query.shape
  if tiling is None:
    tiling = default_tiling(batch, length, common.backend() == "cpu")
  features = heads * head_dim
  num_blocks = pl.cdiv(length, tiling.block)
  shape = _Shape(length, features, pl.next_power_of_2(features), heads, head_dim, tiling.block,
                 tiling.blocks_per_split, pl.cdiv(num_blocks, tiling.blocks_per_split))
  u = _core(query.reshape(batch, length, features), key.reshape(batch, length, features),
            padding_mask.astype(jnp.int32), alpha_kernel, beta_kernel, shape, tiling.interpret)
  return u.reshape(query.shape)
