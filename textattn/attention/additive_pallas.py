"""Fastformer additive attention as Pallas kernels (Triton), forward and backward, written for
memory bandwidth.

`pallas_additive_attention` is `additive.additive_attention` (values and gradients checked
against float64 in Pallas interpret mode): implementation "pallas" of "additive", lowered through
Triton (pallas_gpu.py says why not Mosaic GPU) with generic Pallas ops, which also run in
interpret mode on a CPU (`interpret=None`: on a CPU). Not for TPUs (Mosaic has no masked loads):
`additive_tpu` is the same algorithm in Mosaic's BlockSpec style ("pallas_tpu").

Layout: q, k, u [batch, length, F], F = heads * head_dim (a head's score reads all its features,
so a tile holds whole rows), padded in the kernel to a power of two by masked loads. Tiles load
in the activations' dtype; scores, softmax sums and accumulations are float32. The core is
memory-bound, so each kernel streams its inputs once, in row tiles, over a (batch, split) grid of
about `PROGRAMS` programs (every SM's loads in flight at batch 4); per-split partial sums
([heads] softmax statistics, [F] sums) are combined in XLA (a few percent of a pass). Softmax
statistics are per head (the earlier kernels replicated them per feature: 64x the exps).

Forward, three kernels (a pass each, as the maths needs: g_q pools all of q before any beta
score exists, u = q * g_k needs all of k): 1. alpha pooling over q (per split, each head's
running max and sum of exp(score - max), and of exp(score - max) * q; combined in XLA into g_q
and the alpha log-sum-exp); 2. beta pooling over p = k * g_q, giving g_k; 3. u = q * g_k.
Backward, three kernels (sums over splits and per-head dot products <g, dg>_h are XLA): 1. dg_k =
sum_l du_l * q_l; 2. beta backward: recompute p and beta from the saved log-sum-exp; dk, partial
sums of dg_q and d(beta_kernel); 3. alpha backward: recompute alpha; dq = du * g_k + alpha *
dg_q + score term, partial sums of d(alpha_kernel).
Bytes the core moves (`core_bytes`, what a bandwidth figure counts): forward reads q twice and
k once and writes u, backward reads du and q twice and k once and writes dq and dk: 11 passes
of B * L * F * itemsize (369 MB at [4, 16384, 256] in bfloat16), plus the padding mask.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from textattn.attention import common, pallas_gpu
from textattn.attention.common import MASK_VALUE, Array
from textattn.attention.pallas_gpu import TritonConfig

F32 = jnp.float32
# Programs in all (batch x splits) the default tiling aims at: 8 per SM of an H100 (132 SMs).
PROGRAMS = 1024
# The configurations an autotune tries, the default first (the first that fits the device is
# the default: pallas_gpu.choose). Rows x features over the threads (32 x warps) is the
# float32 elements a thread holds per tile: 32 for the first at 256 features.
CONFIGS = (TritonConfig(32, 8), TritonConfig(16, 4), TritonConfig(64, 8), TritonConfig(32, 4))


class Tiling(NamedTuple):
  """Static shape of the kernels: rows per tile, tiles per program, interpret mode, and the
  Triton warps and pipeline stages of each program."""
  block: int = 32
  blocks_per_split: int = 4
  interpret: bool = False
  num_warps: int = 8
  num_stages: int = 1

  def config(self) -> TritonConfig:
    return TritonConfig(self.block, self.num_warps, self.num_stages)


def default_tiling(batch: int, length: int, interpret: bool, features: int = 256,
                   config: TritonConfig | None = None) -> Tiling:
  """`config` (default: the first of CONFIGS that fits this GPU's shared memory), its rows
  capped at the length rounded up to a power of two (at least 8); tiles per program so that
  batch * splits is about PROGRAMS."""
  if config is None:
    config = pallas_gpu.choose(CONFIGS, lambda c: shared_memory_bytes(c, features))
  block = min(config.rows, max(8, pl.next_power_of_2(length)))
  num_blocks = pl.cdiv(length, block)
  splits = max(1, min(num_blocks, pl.cdiv(PROGRAMS, max(batch, 1))))
  return Tiling(block, pl.cdiv(num_blocks, splits), interpret, config.num_warps,
                config.num_stages)


def shared_memory_bytes(config: TritonConfig, features: int, itemsize: int = 4) -> int:
  """The kernels' shared memory per program (pallas_gpu.estimate): no dot, so no pipelined
  load; a cross-warp reduction over the rows of a [rows, F padded] tile."""
  del itemsize  # (no load is staged in shared memory)
  return pallas_gpu.estimate(config, (), (), reduced_features=pl.next_power_of_2(features))


def core_bytes(batch: int, length: int, features: int, itemsize: int,
               backward: bool = True) -> int:
  """Bytes the core must move (module docstring): 4 passes of [batch, length, F] forward, 7
  more backward, and the int32 padding mask read by the two pooling kernels of each."""
  passes = 11 if backward else 4
  mask_reads = 4 if backward else 2
  return batch * length * (passes * features * itemsize + mask_reads * 4)


class _Shape(NamedTuple):
  """Static sizes the kernels are specialised for."""
  length: int
  features: int
  padded: int  # features rounded up to a power of two
  heads: int
  heads_padded: int  # heads rounded up to a power of two (the softmax statistics' width)
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


def _tile_mask(shape: _Shape, in_bounds):
  """The [block, padded] mask of a tile: rows that exist, and real features where F is
  padded (none to mask where F is a power of two: a row-constant mask keeps loads vector-wide)."""
  if shape.padded == shape.features:
    return in_bounds[:, None]
  return in_bounds[:, None] & (jnp.arange(shape.padded) < shape.features)[None, :]


def _load_tile(ref, shape: _Shape, start, in_bounds):
  """A [block, padded] float32 tile of a [length, F] ref (loaded in its dtype); rows past the end
  and padded features read as 0."""
  tile = plgpu.load(ref.at[pl.ds(start, shape.block), :], mask=_tile_mask(shape, in_bounds),
                    other=0.0)
  return tile.astype(F32)


def _store_tile(ref, shape: _Shape, start, in_bounds, value):
  plgpu.store(ref.at[pl.ds(start, shape.block), :], value.astype(ref.dtype),
              mask=_tile_mask(shape, in_bounds))


def _load_real(mask_ref, shape: _Shape, start, in_bounds):
  return plgpu.load(mask_ref.at[pl.ds(start, shape.block)], mask=in_bounds, other=0) > 0


def _head_masks(shape: _Shape):
  """Per head, a bool [padded] vector marking its features."""
  head_of = jnp.arange(shape.padded) // shape.head_dim
  return [head_of == h for h in range(shape.heads)]


def _head_vector(values, shape: _Shape, fill: float):
  """Per-head scalars as a [heads_padded] vector (`fill` past the last head)."""
  column = jnp.arange(shape.heads_padded)
  vector = jnp.full((shape.heads_padded,), fill, F32)
  for h, value in enumerate(values):
    vector = jnp.where(column == h, value, vector)
  return vector


def _head_scalars(vector, shape: _Shape):
  """A [heads_padded] vector's first `heads` entries, as scalars."""
  column = jnp.arange(shape.heads_padded)
  return [jnp.sum(jnp.where(column == h, vector, 0.0)) for h in range(shape.heads)]


def _on_features(values, heads, like):
  """Per-head values (scalars, or [block] columns) spread over each head's features: [padded]
  or [block, padded] (0 on padded features)."""
  out = jnp.zeros_like(like)
  for value, head in zip(values, heads):
    if jnp.ndim(value) == 0:
      out = jnp.where(head, value, out)
    else:
      out = jnp.where(head[None, :], value[:, None], out)
  return out


def _pool_kernel(x_ref, mask_ref, weight_ref, gate_ref, max_ref, sum_ref, acc_ref, *,
                 shape: _Shape, scale: float, gated: bool):
  """Softmax pooling over one split of the length: of y = x * gate (q for alpha, k * g_q for
  beta), scored per head by the rows of weight_ref [heads, padded]. Writes the split's running
  max and sum of exp(score - max) per head [heads_padded] and sum of exp(score - max) * y
  [padded]."""
  heads = _head_masks(shape)
  weights = [weight_ref[h, :].astype(F32) for h in range(shape.heads)]
  gate = gate_ref[...] if gated else None
  split = pl.program_id(1)

  def body(step, carry):
    maxima, totals, acc = carry
    start, in_bounds = _rows(shape, split, step)
    y = _load_tile(x_ref, shape, start, in_bounds)
    if gated:
      y = y * gate[None, :]
    real = _load_real(mask_ref, shape, start, in_bounds)
    new_maxima, new_totals, columns, rescales = [], [], [], []
    for h, weight in enumerate(weights):
      scores = jnp.where(real, jnp.sum(y * weight[None, :], axis=1) * scale, MASK_VALUE)
      new_max = jnp.maximum(maxima[h], jnp.max(scores))
      # Padding rows are excluded, not down-weighted: before any real row the max is
      # MASK_VALUE and their exp(score - max) would be 1.
      e = jnp.where(real, jnp.exp(scores - new_max), 0.0)
      rescale = jnp.exp(maxima[h] - new_max)
      new_maxima.append(new_max)
      new_totals.append(totals[h] * rescale + jnp.sum(e))
      columns.append(e)
      rescales.append(rescale)
    acc = (acc * _on_features(rescales, heads, acc)
           + jnp.sum(_on_features(columns, heads, y) * y, axis=0))
    return tuple(new_maxima), tuple(new_totals), acc

  init = ((jnp.float32(MASK_VALUE),) * shape.heads, (jnp.float32(0.0),) * shape.heads,
          jnp.zeros((shape.padded,), F32))
  maxima, totals, acc = jax.lax.fori_loop(0, shape.blocks_per_split, body, init)
  max_ref[...] = _head_vector(maxima, shape, MASK_VALUE)
  sum_ref[...] = _head_vector(totals, shape, 0.0)
  acc_ref[...] = acc


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
  d_pooled = dL/dg [padded], lse (the forward's log-sum-exp) and dot = <g, dg>_h, both
  [heads_padded]. Writes dx = dy * gate (+ du * direct for the alpha pooling, where u = q * g_k
  also reads q), and this split's sums of dy * x (dL/dgate) and of d(score) * y per head
  (d weight).

  Softmax backward per head: d score_l = w_l (<y_l, dg>_h - <g, dg>_h); dy_l = w_l dg +
  scale * d score_l * weight_h.
  """
  heads = _head_masks(shape)
  weights = [weight_ref[h, :].astype(F32) for h in range(shape.heads)]
  gate, d_pooled, direct = gate_ref[...], d_pooled_ref[...], direct_ref[...]
  lse_h = _head_scalars(lse_ref[...], shape)
  dot_h = _head_scalars(dot_ref[...], shape)
  split = pl.program_id(1)

  def body(step, carry):
    d_gate, d_weight = carry
    start, in_bounds = _rows(shape, split, step)
    x = _load_tile(x_ref, shape, start, in_bounds)
    y = x * gate[None, :]
    real = _load_real(mask_ref, shape, start, in_bounds)
    y_dg = y * d_pooled[None, :]
    dy = jnp.zeros_like(y)
    columns, new_d_weight = [], []
    for h, (head, weight) in enumerate(zip(heads, weights)):
      score = jnp.sum(y * weight[None, :], axis=1) * scale
      w = jnp.where(real, jnp.exp(score - lse_h[h]), 0.0)  # [block]
      d_score = w * (jnp.sum(jnp.where(head[None, :], y_dg, 0.0), axis=1) - dot_h[h])
      dy = dy + scale * d_score[:, None] * weight[None, :]
      columns.append(w)
      new_d_weight.append(d_weight[h] + scale * jnp.sum(d_score[:, None] * y, axis=0))
    dy = dy + _on_features(columns, heads, y) * d_pooled[None, :]
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


def _call(kernel, shape: _Shape, tiling: Tiling, rows_in, vectors_in, rows_out, vectors_out,
          weights=(), weight_out=None):
  """pallas_call over the (batch, split) grid. rows_in/rows_out: [batch, length, F] arrays (or
  out dtypes), one program's block is its whole example (it loads its own tiles); the mask
  [batch, length] goes with rows_in; vectors_in: [batch, width] per-example vectors (head
  statistics [heads_padded] or features [padded]); weights: [heads, padded] arrays shared by
  all; vectors_out: the widths of [batch, splits, width] partial sums; weight_out: a [batch,
  splits, heads, padded] partial sum, if any."""
  batch = rows_in[0].shape[0]
  row_spec = pl.BlockSpec((None, shape.length, shape.padded), lambda b, s: (b, 0, 0))
  mask_spec = pl.BlockSpec((None, shape.length), lambda b, s: (b, 0))
  weight_spec = pl.BlockSpec((shape.heads, shape.padded), lambda b, s: (0, 0))

  def vector_spec(width):
    return pl.BlockSpec((None, width), lambda b, s: (b, 0))

  def partial_spec(width):
    return pl.BlockSpec((None, None, width), lambda b, s: (b, s, 0))
  *rows, mask = rows_in
  in_specs = ([row_spec] * len(rows) + [mask_spec] + [weight_spec] * len(weights)
              + [vector_spec(v.shape[-1]) for v in vectors_in])
  out_shape = [jax.ShapeDtypeStruct((batch, shape.length, shape.features), dtype)
               for dtype in rows_out]
  out_specs = [row_spec] * len(rows_out)
  out_shape += [jax.ShapeDtypeStruct((batch, shape.splits, width), F32) for width in vectors_out]
  out_specs += [partial_spec(width) for width in vectors_out]
  if weight_out:
    out_shape.append(jax.ShapeDtypeStruct((batch, shape.splits, shape.heads, shape.padded), F32))
    out_specs.append(pl.BlockSpec((None, None, shape.heads, shape.padded),
                                  lambda b, s: (b, s, 0, 0)))
  return pl.pallas_call(
      kernel, grid=(batch, shape.splits), in_specs=in_specs, out_specs=out_specs,
      out_shape=out_shape, interpret=tiling.interpret,
      compiler_params=plgpu.CompilerParams(num_warps=tiling.num_warps,
                                           num_stages=tiling.num_stages),
      name=getattr(kernel, "func", kernel).__name__.strip("_"),
  )(*rows, mask, *weights, *vectors_in)


def _on_feature_axis(head_values, shape: _Shape):
  """[..., heads_padded] -> [..., padded]: each head's value on its features (0 on padded
  features)."""
  replicated = jnp.repeat(head_values[..., :shape.heads], shape.head_dim, axis=-1)
  padding = [(0, 0)] * (replicated.ndim - 1) + [(0, shape.padded - shape.features)]
  return jnp.pad(replicated, padding)


def _combine(partial_max, partial_sum, partial_acc, shape: _Shape):
  """Merges the splits' softmax sums (max and sum [batch, splits, heads_padded], acc [batch,
  splits, padded]): (pooled mean [batch, padded], log-sum-exp [batch, heads_padded])."""
  top = jnp.max(partial_max, axis=1)
  rescale = jnp.exp(partial_max - top[:, None])
  total = jnp.sum(partial_sum * rescale, axis=1)
  acc = jnp.sum(partial_acc * _on_feature_axis(rescale, shape), axis=1)
  seen = total > 0  # an example without a real token pools to 0
  pooled = jnp.where(_on_feature_axis(seen, shape),
                     acc / _on_feature_axis(jnp.maximum(total, 1e-30), shape), 0.0)
  return pooled, jnp.where(seen, top + jnp.log(jnp.maximum(total, 1e-30)), 0.0)


def _head_dot(a, b, shape: _Shape):
  """<a, b>_h per head of [batch, padded] vectors: [batch, heads_padded]."""
  per_feature = (a * b)[:, :shape.features]
  per_head = jnp.sum(per_feature.reshape(a.shape[0], shape.heads, shape.head_dim), axis=-1)
  return jnp.pad(per_head, ((0, 0), (0, shape.heads_padded - shape.heads)))


def _padded_weight(kernel, shape: _Shape):
  """[F, heads] scoring kernel -> float32 [heads, padded] rows."""
  return jnp.pad(kernel.astype(F32).T, ((0, 0), (0, shape.padded - shape.features)))


def _forward(q, k, mask, alpha_kernel, beta_kernel, shape, tiling):
  scale = shape.head_dim ** -0.5
  pool = functools.partial(_pool_kernel, shape=shape, scale=scale)
  widths = (shape.heads_padded, shape.heads_padded, shape.padded)
  batch = q.shape[0]
  global_query, alpha_lse = _combine(
      *_call(functools.partial(pool, gated=False), shape, tiling, (q, mask),
             (jnp.zeros((batch, shape.padded), F32),), (), widths,
             (_padded_weight(alpha_kernel, shape),)), shape)
  global_key, beta_lse = _combine(
      *_call(functools.partial(pool, gated=True), shape, tiling, (k, mask), (global_query,), (),
             widths, (_padded_weight(beta_kernel, shape),)), shape)
  (u,) = _call(functools.partial(_scale_kernel, shape=shape), shape, tiling, (q, mask),
               (global_key,), (q.dtype,), ())
  return u, (q, k, mask, alpha_kernel, beta_kernel, global_query, global_key, alpha_lse,
             beta_lse)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _core(q, k, mask, alpha_kernel, beta_kernel, shape, tiling):
  return _forward(q, k, mask, alpha_kernel, beta_kernel, shape, tiling)[0]


def _core_forward(q, k, mask, alpha_kernel, beta_kernel, shape, tiling):
  return _forward(q, k, mask, alpha_kernel, beta_kernel, shape, tiling)


def _core_backward(shape, tiling, residuals, d_u):
  q, k, mask, alpha_kernel, beta_kernel, global_query, global_key, alpha_lse, beta_lse = residuals
  scale = shape.head_dim ** -0.5
  batch = q.shape[0]
  (d_key_partial,) = _call(functools.partial(_product_sum_kernel, shape=shape), shape, tiling,
                           (d_u, q, mask), (), (), (shape.padded,))
  d_global_key = jnp.sum(d_key_partial, axis=1)
  backward = functools.partial(_pool_backward_kernel, shape=shape, scale=scale)
  zeros = jnp.zeros((batch, shape.padded), F32)
  # Beta pooling over p = k * g_q: dk, dg_q and d(beta_kernel). (du is not read: with_direct.)
  d_k, d_query_partial, d_beta = _call(
      functools.partial(backward, with_direct=False), shape, tiling, (k, d_u, mask),
      (global_query, beta_lse, d_global_key, _head_dot(global_key, d_global_key, shape), zeros),
      (k.dtype,), (shape.padded,), (_padded_weight(beta_kernel, shape),), weight_out=True)
  d_global_query = jnp.sum(d_query_partial, axis=1)
  # Alpha pooling over q (gate 1), plus u = q * g_k's direct term du * g_k.
  d_q, _, d_alpha = _call(
      functools.partial(backward, with_direct=True), shape, tiling, (q, d_u, mask),
      (jnp.ones((batch, shape.padded), F32), alpha_lse, d_global_query,
       _head_dot(global_query, d_global_query, shape), global_key),
      (q.dtype,), (shape.padded,), (_padded_weight(alpha_kernel, shape),), weight_out=True)

  def kernel_gradient(partial, kernel):
    return jnp.sum(partial, axis=(0, 1))[:, :shape.features].T.astype(kernel.dtype)

  return (d_q, d_k, None, kernel_gradient(d_alpha, alpha_kernel),
          kernel_gradient(d_beta, beta_kernel))


_core.defvjp(_core_forward, _core_backward)


def pallas_additive_attention(query: Array, key: Array, padding_mask: Array, alpha_kernel: Array,
                              beta_kernel: Array, *, tiling: Tiling | None = None) -> Array:
  """`additive.additive_attention` as Pallas kernels (module docstring): u [batch, length,
  heads, head_dim] in query's dtype. First-order reverse-mode gradients (custom VJP). `tiling`
  None: `default_tiling`, interpret mode on a CPU. A tiling whose shared memory (by estimate)
  exceeds the GPU's is refused before compiling."""
  if key.shape != query.shape:
    raise ValueError(f"pallas_additive_attention: key {key.shape} and query {query.shape} must "
                     f"have the same [batch, length, heads, head_dim] shape.")
  batch, length, heads, head_dim = query.shape
  features = heads * head_dim
  if tiling is None:
    tiling = default_tiling(batch, length, common.backend() == "cpu", features)
  elif not tiling.interpret:
    pallas_gpu.check_fits("pallas_additive_attention", tiling.config(),
                          shared_memory_bytes(tiling.config(), features))
  num_blocks = pl.cdiv(length, tiling.block)
  shape = _Shape(length, features, pl.next_power_of_2(features), heads,
                 pl.next_power_of_2(heads), head_dim, tiling.block, tiling.blocks_per_split,
                 pl.cdiv(num_blocks, tiling.blocks_per_split))
  u = _core(query.reshape(batch, length, features), key.reshape(batch, length, features),
            padding_mask.astype(jnp.int32), alpha_kernel, beta_kernel, shape, tiling)
  return u.reshape(query.shape)
