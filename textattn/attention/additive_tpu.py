"""Fastformer additive attention as Pallas TPU (Mosaic) kernels, forward and backward.

`tpu_additive_attention` is the same function as `additive.additive_attention` (tests check
values and gradients against float64 in Pallas' TPU interpret mode on a CPU): implementation
"pallas_tpu" of the "additive" variant, benchmark label "pallas". The algorithm is that of the
Triton-style kernels (`additive_pallas`, implementation "pallas"); this is its TPU form, a
separate implementation name because the two lower through different compilers and each needs
its own allow-list entry (`pallas_allowlist`, keyed by device kind). Off a TPU it runs in TPU
interpret mode (`pltpu.InterpretParams()`, which fills uninitialised memory with NaN, so reads
past the end are proven unused); tests also lower it for the TPU platform (`jax.export`), which
checks block shapes and that every op has a Mosaic lowering. Not measured on a TPU.

Mosaic style: BlockSpecs over a (batch, row block) grid, ("parallel", "arbitrary"): the batch
splits over a chip's TensorCores, each core walks an example's row blocks in order, and the
length reductions accumulate in the output blocks (resident across the "arbitrary" axis,
initialised at block 0). A row tile is [block, F] with F = heads * head_dim whole (a full-dim
lane block is legal at any F; 128-multiples fill the lanes), block a multiple of 8 (16 for
bfloat16) sublanes; the last tile may run past the length (its rows are masked by position,
never trusted). The padding mask is an int32 [batch, length, 1] column (a [block, 1] tile).
Scores live in head space [block, Hp], Hp = heads rounded up to 128 lanes: s = x @ W (W the
[F, heads] scoring kernel, zero-padded), and head values reach the features through the 0/1
expansion E [Hp, F] (x @ W @ E is each head's score on its features). All dots are on the MXU at
HIGHEST precision (float32 accuracy), every sum and the softmax statistics are float32.

Forward, three kernels plus O(batch * F) XLA between them:
  1. alpha pooling over q: running max and sum of exp (head space) and sum of exp * q;
  2. beta pooling over p = k * g_q, giving g_k;
  3. u = q * g_k.
  Bytes moved: read q twice and k once, write u: 4 * B * L * F * itemsize.
Backward (the Triton kernels' algorithm: two pooling passes from the saved log-sum-exps):
  1. dg_k = sum_l du_l * q_l;
  2. beta backward: recompute p and beta; dk, and sums of dg_q and d(beta_kernel);
  3. alpha backward: recompute alpha; dq = du * g_k + alpha * dg_q + score term, d(alpha_kernel).
  Bytes: read q twice, k once, du twice, write dq and dk: 7 * B * L * F * itemsize.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from textattn.attention import common
from textattn.attention.common import MASK_VALUE, Array

F32 = jnp.float32
LANES = 128
HIGHEST = jax.lax.Precision.HIGHEST


class Tiling(NamedTuple):
  """Static shape of the kernels: rows per tile (a multiple of 8) and TPU interpret mode."""
  block: int = 512
  interpret: bool = False


def default_tiling(length: int, features: int, itemsize: int, interpret: bool) -> Tiling:
  """Tiles of about 256 KiB of input (up to 512 rows), a multiple of 16 rows (bfloat16 packs
  16 sublanes), no longer than the length rounded up to 16."""
  rows = max(16, min(512, (1 << 18) // max(features * itemsize, 1)) // 16 * 16)
  return Tiling(min(rows, -(-length // 16) * 16), interpret)


class _Shape(NamedTuple):
  length: int
  features: int
  heads: int
  head_dim: int
  lanes: int  # heads rounded up to a multiple of 128
  block: int


def _dot(a, b):
  return jnp.dot(a, b, preferred_element_type=F32, precision=HIGHEST)


def _rows_t(a, b):
  """a^T b over the rows of two tiles: [block, m], [block, n] -> [m, n]."""
  return jax.lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=F32,
                             precision=HIGHEST)


def _expand(vector, expand):
  """A head-space [1, Hp] vector on the features [1, F] (through 8 sublanes: an MXU tile)."""
  return _dot(jnp.broadcast_to(vector, (8, vector.shape[1])), expand)[:1]


def _in_bounds(shape: _Shape):
  """Which rows of this program's tile lie inside the length ([block, 1] bool): the last tile
  may run past it, and what its rows hold there is undefined."""
  rows = pl.program_id(1) * shape.block + jax.lax.broadcasted_iota(jnp.int32, (shape.block, 1), 0)
  return rows < shape.length


def _load(ref, in_bounds):
  return jnp.where(in_bounds, ref[...].astype(F32), 0.0)


def _real(mask_ref, in_bounds):
  return in_bounds & (mask_ref[...] > 0)


def _pool_kernel(x_ref, mask_ref, weight_ref, expand_ref, gate_ref, max_ref, sum_ref, acc_ref, *,
                 shape: _Shape, scale: float):
  """Softmax pooling of y = x * gate over an example's rows, one tile per program: running max
  and sum of exp(score - max) per head [1, Hp], and sum of exp(score - max) * y [1, F]."""
  @pl.when(pl.program_id(1) == 0)
  def _init():
    max_ref[...] = jnp.full(max_ref.shape, MASK_VALUE, F32)
    sum_ref[...] = jnp.zeros(sum_ref.shape, F32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, F32)

  in_bounds = _in_bounds(shape)
  y = _load(x_ref, in_bounds) * gate_ref[...]
  real = _real(mask_ref, in_bounds)
  scores = jnp.where(real, _dot(y, weight_ref[...]) * scale, MASK_VALUE)  # [block, Hp]
  running_max = max_ref[...]
  new_max = jnp.maximum(running_max, jnp.max(scores, axis=0, keepdims=True))
  # Padding rows are excluded, not down-weighted: before any real row the max is MASK_VALUE
  # and their exp(score - max) would be 1.
  e = jnp.where(real, jnp.exp(scores - new_max), 0.0)
  rescale = jnp.exp(running_max - new_max)
  max_ref[...] = new_max
  sum_ref[...] = sum_ref[...] * rescale + jnp.sum(e, axis=0, keepdims=True)
  expand = expand_ref[...]
  acc_ref[...] = (acc_ref[...] * _expand(rescale, expand)
                  + jnp.sum(_dot(e, expand) * y, axis=0, keepdims=True))


def _scale_kernel(x_ref, gate_ref, out_ref):
  """out = x * gate, row by row (u = q * g_k), padding rows included (as the XLA function);
  rows past the length are not written back."""
  out_ref[...] = (x_ref[...].astype(F32) * gate_ref[...]).astype(out_ref.dtype)


def _product_sum_kernel(a_ref, b_ref, out_ref, *, shape: _Shape):
  """Sum over an example's rows of a * b (dg_k = sum_l du_l * q_l), padding rows included."""
  @pl.when(pl.program_id(1) == 0)
  def _init():
    out_ref[...] = jnp.zeros(out_ref.shape, F32)

  in_bounds = _in_bounds(shape)
  out_ref[...] += jnp.sum(_load(a_ref, in_bounds) * _load(b_ref, in_bounds), axis=0,
                          keepdims=True)


def _pool_backward_kernel(x_ref, du_ref, mask_ref, weight_ref, weight_t_ref, expand_ref,
                          expand_t_ref, gate_ref, lse_ref, d_pooled_ref, dot_ref, direct_ref,
                          dx_ref, d_gate_ref, d_weight_ref, *, shape: _Shape, scale: float,
                          with_direct: bool):
  """Backward of one softmax pooling g = sum_l softmax_l(score(y_l)) y_l, y = x * gate, given
  d_pooled = dL/dg [1, F], lse (the forward's log-sum-exp) and dot = <g, dg>_h, both [1, Hp].
  Writes dx = dy * gate (+ du * direct for the alpha pooling, where u = q * g_k also reads q)
  and accumulates dL/dgate = sum dy * x [1, F] and d weight = scale * y^T d score [F, Hp].

  Per head: d score_l = w_l (<y_l, dg>_h - <g, dg>_h); dy_l = w_l dg + scale * d score_l W_h.
  """
  @pl.when(pl.program_id(1) == 0)
  def _init():
    d_gate_ref[...] = jnp.zeros(d_gate_ref.shape, F32)
    d_weight_ref[...] = jnp.zeros(d_weight_ref.shape, F32)

  in_bounds = _in_bounds(shape)
  x = _load(x_ref, in_bounds)
  y = x * gate_ref[...]
  real = _real(mask_ref, in_bounds)
  d_pooled = d_pooled_ref[...]
  w = jnp.where(real, jnp.exp(_dot(y, weight_ref[...]) * scale - lse_ref[...]), 0.0)
  d_score = w * (_dot(y * d_pooled, expand_t_ref[...]) - dot_ref[...])  # [block, Hp]
  dy = _dot(w, expand_ref[...]) * d_pooled + scale * _dot(d_score, weight_t_ref[...])
  dx = dy * gate_ref[...]
  if with_direct:
    dx = dx + _load(du_ref, in_bounds) * direct_ref[...]
  dx_ref[...] = dx.astype(dx_ref.dtype)
  d_gate_ref[...] += jnp.sum(dy * x, axis=0, keepdims=True)
  d_weight_ref[...] += scale * _rows_t(y, d_score)


def _specs(shape: _Shape):
  """BlockSpecs over the (batch, row block) grid, by role."""
  rows = pl.BlockSpec((None, shape.block, shape.features), lambda b, i: (b, i, 0))
  mask = pl.BlockSpec((None, shape.block, 1), lambda b, i: (b, i, 0))

  def whole(*dims):  # one block per example ([batch, *dims] arrays)
    return pl.BlockSpec((None, *dims), lambda b, i: (b,) + (0,) * len(dims))

  def shared(*dims):  # the same block for every program (an unbatched array)
    return pl.BlockSpec(dims, lambda b, i: (0,) * len(dims))
  return rows, mask, whole, shared


def _call(kernel, shape: _Shape, interpret: bool, args, in_specs, out_shape, out_specs):
  batch = args[0].shape[0]
  return pl.pallas_call(
      kernel, grid=(batch, pl.cdiv(shape.length, shape.block)), in_specs=in_specs,
      out_specs=out_specs, out_shape=out_shape,
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
      interpret=pltpu.InterpretParams() if interpret else False,
      name=getattr(kernel, "func", kernel).__name__.strip("_"),
  )(*args)


class _Constants(NamedTuple):
  """Per-call [F, Hp] / [Hp, F] matrices: scoring kernels, head expansion."""
  alpha: Array
  beta: Array
  expand: Array  # E[h, f] = 1 where feature f belongs to head h


def _constants(alpha_kernel, beta_kernel, shape: _Shape) -> _Constants:
  def padded(kernel):
    return jnp.pad(kernel.astype(F32), ((0, 0), (0, shape.lanes - shape.heads)))
  head_of = jnp.arange(shape.features) // shape.head_dim
  expand = (jnp.arange(shape.lanes)[:, None] == head_of[None, :]).astype(F32)
  return _Constants(padded(alpha_kernel), padded(beta_kernel), expand)


def _pool(x, mask, weight, expand, gate, shape: _Shape, interpret: bool):
  """One pooling: (pooled [batch, F], log-sum-exp per head [batch, Hp])."""
  rows, mask_spec, whole, shared = _specs(shape)
  batch = x.shape[0]
  head_vector = jax.ShapeDtypeStruct((batch, 1, shape.lanes), F32)
  feature_vector = jax.ShapeDtypeStruct((batch, 1, shape.features), F32)
  top, total, acc = _call(
      functools.partial(_pool_kernel, shape=shape, scale=shape.head_dim ** -0.5), shape,
      interpret, (x, mask, weight, expand, gate),
      [rows, mask_spec, shared(shape.features, shape.lanes), shared(shape.lanes, shape.features),
       whole(1, shape.features)],
      [head_vector, head_vector, feature_vector],
      [whole(1, shape.lanes), whole(1, shape.lanes), whole(1, shape.features)])
  seen = total > 0  # an example without a real token pools to 0
  pooled = jnp.where(_features(seen, shape), acc / _features(jnp.maximum(total, 1e-30), shape),
                     0.0)
  return pooled, jnp.where(seen, top + jnp.log(jnp.maximum(total, 1e-30)), 0.0)


def _features(head_vector, shape: _Shape):
  """[batch, 1, Hp] -> [batch, 1, F]: each head's value on its features."""
  return jnp.repeat(head_vector[..., :shape.heads], shape.head_dim, axis=-1)


def _head_dot(a, b, shape: _Shape):
  """<a, b>_h per head of [batch, 1, F] vectors: [batch, 1, Hp]."""
  per_head = jnp.sum((a * b).reshape(a.shape[0], 1, shape.heads, shape.head_dim), axis=-1)
  return jnp.pad(per_head, ((0, 0), (0, 0), (0, shape.lanes - shape.heads)))


def _forward(q, k, mask, alpha_kernel, beta_kernel, shape, interpret):
  c = _constants(alpha_kernel, beta_kernel, shape)
  ones = jnp.ones((q.shape[0], 1, shape.features), F32)
  global_query, alpha_lse = _pool(q, mask, c.alpha, c.expand, ones, shape, interpret)
  global_key, beta_lse = _pool(k, mask, c.beta, c.expand, global_query, shape, interpret)
  rows, _, whole, _ = _specs(shape)
  (u,) = _call(_scale_kernel, shape, interpret, (q, global_key), [rows, whole(1, shape.features)],
               [jax.ShapeDtypeStruct(q.shape, q.dtype)], [rows])
  return u, (q, k, mask, alpha_kernel, beta_kernel, global_query, global_key, alpha_lse,
             beta_lse)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _core(q, k, mask, alpha_kernel, beta_kernel, shape, interpret):
  return _forward(q, k, mask, alpha_kernel, beta_kernel, shape, interpret)[0]


def _core_forward(q, k, mask, alpha_kernel, beta_kernel, shape, interpret):
  return _forward(q, k, mask, alpha_kernel, beta_kernel, shape, interpret)


def _pool_backward(x, d_u, mask, weight, c: _Constants, gate, lse, d_pooled, dots, direct,
                   shape: _Shape, interpret: bool):
  """(dx [batch, L, F], dL/dgate [batch, 1, F], d weight [F, heads])."""
  rows, mask_spec, whole, shared = _specs(shape)
  batch, f, lanes = x.shape[0], shape.features, shape.lanes
  kernel = functools.partial(_pool_backward_kernel, shape=shape, scale=shape.head_dim ** -0.5,
                             with_direct=direct is not None)
  if direct is None:
    direct = jnp.zeros((batch, 1, f), F32)  # (du is not read)
  dx, d_gate, d_weight = _call(
      kernel, shape, interpret,
      (x, d_u, mask, weight, weight.T, c.expand, c.expand.T, gate, lse, d_pooled, dots, direct),
      [rows, rows, mask_spec, shared(f, lanes), shared(lanes, f), shared(lanes, f),
       shared(f, lanes), whole(1, f), whole(1, lanes), whole(1, f), whole(1, lanes), whole(1, f)],
      [jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct((batch, 1, f), F32),
       jax.ShapeDtypeStruct((batch, f, lanes), F32)],
      [rows, whole(1, f), whole(f, lanes)])
  return dx, d_gate, jnp.sum(d_weight, axis=0)[:, :shape.heads]


def _core_backward(shape, interpret, residuals, d_u):
  q, k, mask, alpha_kernel, beta_kernel, global_query, global_key, alpha_lse, beta_lse = residuals
  c = _constants(alpha_kernel, beta_kernel, shape)
  rows, _, whole, _ = _specs(shape)
  batch, f = q.shape[0], shape.features
  (d_global_key,) = _call(functools.partial(_product_sum_kernel, shape=shape), shape, interpret,
                          (d_u, q), [rows, rows], [jax.ShapeDtypeStruct((batch, 1, f), F32)],
                          [whole(1, f)])
  # Beta pooling over p = k * g_q: dk, dg_q and d(beta_kernel).
  d_k, d_global_query, d_beta = _pool_backward(
      k, d_u, mask, c.beta, c, global_query, beta_lse, d_global_key,
      _head_dot(global_key, d_global_key, shape), None, shape, interpret)
  # Alpha pooling over q (gate 1), plus u = q * g_k's direct term du * g_k.
  d_q, _, d_alpha = _pool_backward(
      q, d_u, mask, c.alpha, c, jnp.ones((batch, 1, f), F32), alpha_lse, d_global_query,
      _head_dot(global_query, d_global_query, shape), global_key, shape, interpret)
  return (d_q, d_k, None, d_alpha.astype(alpha_kernel.dtype), d_beta.astype(beta_kernel.dtype))


_core.defvjp(_core_forward, _core_backward)


def tpu_additive_attention(query: Array, key: Array, padding_mask: Array, alpha_kernel: Array,
                           beta_kernel: Array, *, tiling: Tiling | None = None) -> Array:
  """`additive.additive_attention` as Pallas TPU kernels (module docstring): u [batch, length,
  heads, head_dim] in query's dtype. First-order reverse-mode gradients (custom VJP). `tiling`
  None: `default_tiling`, TPU interpret mode off a TPU."""
  if key.shape != query.shape:
    raise ValueError(f"tpu_additive_attention: key {key.shape} and query {query.shape} must "
                     f"have the same [batch, length, heads, head_dim] shape.")
  batch, length, heads, head_dim = query.shape
  features = heads * head_dim
  if tiling is None:
    tiling = default_tiling(length, features, query.dtype.itemsize,
                            common.backend() != "tpu")
  if tiling.block % 8:
    raise ValueError(f"tpu_additive_attention: block={tiling.block} rows must be a multiple of "
                     f"8 (TPU sublanes).")
  shape = _Shape(length, features, heads, head_dim, -(-heads // LANES) * LANES, tiling.block)
  mask = padding_mask.astype(jnp.int32)[..., None]
  u = _core(query.reshape(batch, length, features), key.reshape(batch, length, features), mask,
            alpha_kernel, beta_kernel, shape, tiling.interpret)
  return u.reshape(query.shape)
