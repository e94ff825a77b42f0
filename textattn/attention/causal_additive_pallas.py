"""The recurrent causal additive form, chunk by chunk, as Pallas kernels (Triton; pallas_gpu.py
says why), forward and backward.

`pallas_recurrent_causal_additive` is the same function as
`causal_additive.chunked_recurrent_causal_additive` (and so as the scan form; tests check values
and gradients in interpret mode against a float64 reference): implementation "pallas" of
"causal_additive_recurrent". Generic Pallas ops only (masked `load`/`store`, `jnp`, `dot`), so
the Triton lowering takes them and interpret mode runs them on a CPU; not for TPUs.

Notation, per head h and example: a_i = score_alpha(q_i), alpha[t, i] = exp(a_i - lse_a(t))
[i <= t, real_i] with lse_a(t) the log-sum-exp of the real a_i, i <= t; g_q(t) = sum_i alpha[t, i]
q_i; p_i = g_q(i) * k_i; b_i = score_beta(p_i), beta[t, i] likewise; g_k(t) = sum_i beta[t, i]
p_i; u_t = g_k(t) * q_t. With segments (packed documents: `runs`, as the XLA forms take them)
"i <= t" also asks i and t to be in the same run; the kernels read one int32 per position,
run * 2 + real, and each carry across chunks belongs to one run (the forward's to the last
run of the chunks so far, the backward's to the first run of the chunks after), reaching only
the rows of that run.

Forward: one program per example walks its chunks in order (the running sums carry across
chunks), [chunk, F] tiles with F = heads * head_dim padded to a power of two. Inside a chunk,
per head, each pooling is the masked [C, C] matrix W[t, i] = exp(s_i - m_t) [i <= t, real_i]
times the values (a `dot`, float32 at full precision) plus the carried sums rescaled by
exp(M - m_t), m_t the row's own running max; the alpha pooling of a chunk is finished before
its beta scores, which read g_q. On a GPU the chunk must be at least 16 (Triton's `dot`).
Under differentiation the forward also saves, per row, g_q and g_k (float32 [L, F]) and the
log-sum-exp of each pooling (float32 [L, heads padded to a power of two]; a row whose prefix
has no real position holds `_UNSEEN`).

Backward: one program per example walks its chunks in reverse, the beta pooling of a chunk
before its alpha pooling (the alpha pooling's cotangent dg_q(i) = dp_i * k_i needs the beta
pooling's dp_i, which depends on every later row). For one pooling g(t) = sum_{i<=t} w[t, i] x_i
given dg(t), with c_t = <g(t), dg(t)>_h:
  D_i = sum_{t>=i} w[t, i] dg(t)                 (dx_i's value term)
  E_i = sum_{t>=i} w[t, i] c_t
  ds_i = <x_i, D_i>_h - E_i                      (softmax backward)
  dx_i = D_i + scale * sum_h ds_i^h w_h,  d(kernel)_h += scale * sum_i ds_i^h x_i.
w[t, i] = exp(s_i - lse(t)) is recomputed from the saved lse, so each term <= 1. Inside a chunk
the sums over t are the transposed masked [C, C] matrix times dg (a `dot`) and times c; the
later chunks' part is carried as suffix sums over their rows, S = sum_t exp(R - lse(t)) dg(t)
and S_c = sum_t exp(R - lse(t)) c_t, with R the smallest lse of those rows (lse(t) grows with
t, and s_i <= lse(t) for a real i <= t, so exp(s_i - R) and exp(R - lse(t)) are both <= 1):
row i adds exp(s_i - R) S to D_i and exp(s_i - R) S_c to E_i. Then dk = dp * g_q,
dg_q = dp * k, and dq = (the alpha pooling's dx) + du * g_k. The kernels' gradients are
per-example partial sums, added over the batch in XLA.
Bytes the backward moves: reads q, k, du (input dtype), g_q, g_k (float32) and both lse (float32
[L, heads padded]), writes dq, dk.
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
# The configurations an autotune tries, the default first (the first that fits the device:
# pallas_gpu.choose). On the H200 (RESULTS section 28) chunk 64 with 3 stages was refused
# (344,576 bytes of shared memory, `shared_memory_bytes` reproduces it) and chunk 64 with one
# stage had not compiled after 220 s (each dot is a float32 FMA loop Triton unrolls: C x C x F
# per head and pooling).
CONFIGS = (TritonConfig(32, 4, 1), TritonConfig(16, 4, 2), TritonConfig(32, 4, 2),
           TritonConfig(64, 4, 1))
# The saved log-sum-exp of a row whose prefix has no real position (and the backward's suffix
# reference before any row): larger than any real one, finite so differences stay finite.
_UNSEEN = 1e30


def shared_memory_bytes(config: TritonConfig, features: int, itemsize: int,
                        heads: int = 1) -> dict[str, int]:
  """Shared memory per program of the forward and the backward kernel (pallas_gpu.estimate):
  every load in the chunk loop feeds a dot (the masked [C, C] weights times a [C, F] tile), so
  all are pipelined. Forward: q, k [C, F] in the input dtype, the mask [C] int32. Backward: q,
  k, du in the input dtype, g_q, g_k [C, F] float32, both log-sum-exps [C, heads padded] float32,
  the mask."""
  chunk, padded = config.rows, pl.next_power_of_2(features)
  rows, mask = chunk * padded, chunk * 4
  dots = [(chunk, chunk, padded)]
  forward = pallas_gpu.estimate(config, (rows * itemsize,) * 2 + (mask,), dots, padded)
  backward = pallas_gpu.estimate(
      config, (rows * itemsize,) * 3 + (rows * 4,) * 2
      + (chunk * pl.next_power_of_2(heads) * 4,) * 2 + (mask,), dots, padded)
  return {"forward": forward, "backward": backward}


def default_config(features: int, itemsize: int, heads: int,
                   limit: int | None = None) -> TritonConfig:
  """The first of CONFIGS whose forward and backward fit this GPU's shared memory."""
  return pallas_gpu.choose(
      CONFIGS, lambda c: max(shared_memory_bytes(c, features, itemsize, heads).values()), limit)


class _Shape(NamedTuple):
  length: int
  features: int
  padded: int
  heads: int
  heads_padded: int  # heads rounded up to a power of two (the saved log-sum-exp's columns)
  head_dim: int
  chunk: int
  num_chunks: int


def _head_value(vector, head_mask, shape: _Shape):
  """The value a head-replicated [padded] vector holds on that head's features (a scalar)."""
  return jnp.sum(jnp.where(head_mask, vector, 0.0)) / shape.head_dim


def _column(tile, h):
  """Column h of a [C, heads_padded] tile, as a [C] vector."""
  return jnp.sum(jnp.where(jnp.arange(tile.shape[1])[None, :] == h, tile, 0.0), axis=1)


def _unpack_mask(packed):
  """The kernels' int32 mask: run * 2 + real (`pallas_recurrent_causal_additive`) -> (real
  bool, run int32)."""
  return jnp.bitwise_and(packed, 1) > 0, jnp.right_shift(packed, 1)


def _row(vector, row: int, shape: _Shape):
  """Entry `row` of a [C] int32 vector, as a scalar."""
  return jnp.sum(jnp.where(jnp.arange(shape.chunk) == row, vector, 0))


def _pool_chunk(x, real, run, carry, carried_run, weights, heads, shape: _Shape, scale: float):
  """One chunk of a prefix softmax pooling of x [C, padded] (its own scores), each row over the
  earlier real positions of its own run (segment): returns the pooled means [C, padded] (0 where
  that prefix has no real position), the new carry (max, weighted sum, sum of weights;
  head-replicated [padded] vectors, over the positions so far of the chunk's last run, which is
  the new carried run) and each row's log-sum-exp [C, heads_padded] (`_UNSEEN` where the prefix
  has no real position). The carry reaches the rows of the carried run only."""
  carried_max, carried_acc, carried_sum = carry
  positions = jnp.arange(shape.chunk)
  visible = ((positions[:, None] >= positions[None, :]) & real[None, :]
             & (run[:, None] == run[None, :]))  # [t, i]
  uses_carry = run == carried_run  # [t]
  last_run = _row(run, shape.chunk - 1, shape)
  in_last_run = real & (run == last_run)  # [i]: the positions the next carry sums
  carry_goes_on = carried_run == last_run
  column = jnp.arange(shape.heads_padded)
  num = jnp.zeros_like(x)
  den = jnp.zeros_like(x)
  lse = jnp.full((shape.chunk, shape.heads_padded), _UNSEEN, F32)
  new_max = jnp.zeros_like(carried_max)
  new_acc = jnp.zeros_like(carried_acc)
  new_sum = jnp.zeros_like(carried_sum)
  for h, (head, weight) in enumerate(zip(heads, weights)):
    scores = jnp.where(real, jnp.sum(x * weight[None, :], axis=1) * scale, MASK_VALUE)
    previous_max = _head_value(carried_max, head, shape)
    previous_sum = _head_value(carried_sum, head, shape)
    masked = jnp.where(visible, scores[None, :], MASK_VALUE)
    row_previous_max = jnp.where(uses_carry, previous_max, MASK_VALUE)
    row_max = jnp.maximum(jnp.max(masked, axis=1), row_previous_max)  # m_t
    # exp only where visible: a later, larger score would overflow (and inf * 0 = NaN).
    w = jnp.where(visible, jnp.exp(masked - row_max[:, None]), 0.0)  # [t, i]
    rescale = jnp.where(uses_carry, jnp.exp(row_previous_max - row_max), 0.0)  # exp(M - m_t)
    x_head = jnp.where(head[None, :], x, 0.0)
    acc_head = jnp.where(head, carried_acc, 0.0)
    num = (num + plgpu.dot(w, x_head, precision=jax.lax.Precision.HIGHEST)
           + rescale[:, None] * acc_head[None, :])
    row_sum = jnp.sum(w, axis=1) + rescale * previous_sum  # [t]
    den = den + jnp.where(head[None, :], row_sum[:, None], 0.0)
    row_lse = jnp.where(row_sum > 0, row_max + jnp.log(jnp.maximum(row_sum, 1e-30)), _UNSEEN)
    lse = jnp.where(column[None, :] == h, row_lse[:, None], lse)
    # The carry after the chunk: the last row's sums (its run's positions), computed directly.
    chunk_max = jnp.maximum(jnp.where(carry_goes_on, previous_max, MASK_VALUE),
                            jnp.max(jnp.where(in_last_run, scores, MASK_VALUE)))
    e = jnp.where(in_last_run, jnp.exp(scores - chunk_max), 0.0)
    carried_scale = jnp.where(carry_goes_on, jnp.exp(previous_max - chunk_max), 0.0)
    new_max = jnp.where(head, chunk_max, new_max)
    new_acc = new_acc + jnp.sum(e[:, None] * x_head, axis=0) + carried_scale * acc_head
    new_sum = jnp.where(head, jnp.sum(e) + carried_scale * previous_sum, new_sum)
  mean = jnp.where(den > 0, num / jnp.maximum(den, 1e-30), 0.0)
  return mean, (new_max, new_acc, new_sum), lse, last_run


def _head_setup(alpha_ref, beta_ref, shape: _Shape):
  head_of = jnp.arange(shape.padded) // shape.head_dim
  heads = [head_of == h for h in range(shape.heads)]
  alpha = [alpha_ref[h, :].astype(F32) for h in range(shape.heads)]
  beta = [beta_ref[h, :].astype(F32) for h in range(shape.heads)]
  return heads, alpha, beta


def _chunk_rows(index, shape: _Shape):
  """Chunk `index`'s rows: (the ref slice, which rows exist, [C, padded] tile mask)."""
  start = index * shape.chunk
  in_bounds = start + jnp.arange(shape.chunk) < shape.length
  features = jnp.arange(shape.padded) < shape.features
  return pl.ds(start, shape.chunk), in_bounds, in_bounds[:, None] & features[None, :]


def _kernel(q_ref, k_ref, mask_ref, alpha_ref, beta_ref, u_ref, *residual_refs, shape: _Shape,
            scale: float):
  """The forward; with residual_refs (g_q, g_k, lse_a, lse_b), it also saves those."""
  heads, alpha, beta = _head_setup(alpha_ref, beta_ref, shape)

  def body(index, carry):
    alpha_carry, beta_carry, carried_run = carry
    rows, in_bounds, tile_mask = _chunk_rows(index, shape)
    q = plgpu.load(q_ref.at[rows, :], mask=tile_mask, other=0.0).astype(F32)
    k = plgpu.load(k_ref.at[rows, :], mask=tile_mask, other=0.0).astype(F32)
    real, run = _unpack_mask(plgpu.load(mask_ref.at[rows], mask=in_bounds, other=0))
    global_query, alpha_carry, alpha_lse, last_run = _pool_chunk(
        q, real, run, alpha_carry, carried_run, alpha, heads, shape, scale)
    mixed = k * global_query  # p_i = g_q(i) * k_i: needs this chunk's alpha pooling first
    global_key, beta_carry, beta_lse, _ = _pool_chunk(
        mixed, real, run, beta_carry, carried_run, beta, heads, shape, scale)
    plgpu.store(u_ref.at[rows, :], (q * global_key).astype(u_ref.dtype), mask=tile_mask)
    if residual_refs:
      query_ref, key_ref, alpha_lse_ref, beta_lse_ref = residual_refs
      plgpu.store(query_ref.at[rows, :], global_query, mask=tile_mask)
      plgpu.store(key_ref.at[rows, :], global_key, mask=tile_mask)
      plgpu.store(alpha_lse_ref.at[rows, :], alpha_lse, mask=in_bounds[:, None])
      plgpu.store(beta_lse_ref.at[rows, :], beta_lse, mask=in_bounds[:, None])
    return alpha_carry, beta_carry, last_run

  empty = (jnp.full((shape.padded,), MASK_VALUE, F32), jnp.zeros((shape.padded,), F32),
           jnp.zeros((shape.padded,), F32))
  jax.lax.fori_loop(0, shape.num_chunks, body, (empty, empty, jnp.int32(-1)))


def _pool_chunk_backward(x, real, run, pooled, d_pooled, lse, carry, carried_run, weights,
                         heads, d_weights, shape: _Shape, scale: float):
  """Backward of one chunk of a prefix softmax pooling g(t) = sum_{i<=t, same run} w[t, i] x_i
  (module docstring): x, g, dg [C, padded]; lse [C, heads_padded] saved by the forward; carry
  (R, S, S_c) of the later rows of the carried run (R and S_c head-replicated [padded], S per
  feature), which only this chunk's rows of that run see. Returns dx [C, padded], the carry
  over the later rows of this chunk's first run (the new carried run, also returned) and the
  updated d_weights (per head, [padded])."""
  carried_min, carried_sum, carried_dot = carry
  positions = jnp.arange(shape.chunk)
  visible = ((positions[:, None] <= positions[None, :]) & real[:, None]
             & (run[:, None] == run[None, :]))  # [i, t]: w[t, i]
  first_run = _row(run, 0, shape)
  carry_goes_on = carried_run == first_run
  in_first_run = run == first_run  # [t]: the rows the next carry sums
  d_x = jnp.zeros_like(x)
  new_min = jnp.zeros_like(carried_min)
  new_sum = jnp.zeros_like(carried_sum)
  new_dot = jnp.zeros_like(carried_dot)
  new_d_weights = []
  for h, (head, weight, d_weight) in enumerate(zip(heads, weights, d_weights)):
    scores = jnp.where(real, jnp.sum(x * weight[None, :], axis=1) * scale, MASK_VALUE)  # [i]
    row_lse = _column(lse, h)  # [t]
    reference = _head_value(carried_min, head, shape)  # R
    previous_dot = _head_value(carried_dot, head, shape)
    # exp only where visible (elsewhere s_i - lse(t) may be large); visible entries are <= 0.
    w_t = jnp.where(visible, jnp.exp(jnp.where(visible, scores[:, None] - row_lse[None, :],
                                                MASK_VALUE)), 0.0)  # [i, t]
    from_later = jnp.where(real & (run == carried_run), jnp.exp(scores - reference),
                           0.0)  # exp(s_i - R) [i]
    d_head = jnp.where(head[None, :], d_pooled, 0.0)
    dots = jnp.sum(jnp.where(head[None, :], pooled * d_pooled, 0.0), axis=1)  # c_t
    value_term = (plgpu.dot(w_t, d_head, precision=jax.lax.Precision.HIGHEST)
                  + from_later[:, None] * jnp.where(head, carried_sum, 0.0)[None, :])  # D_i
    d_scores = (jnp.sum(x * value_term, axis=1)
                - jnp.sum(w_t * dots[None, :], axis=1) - from_later * previous_dot)  # ds_i
    d_x = d_x + value_term + scale * d_scores[:, None] * weight[None, :]
    new_d_weights.append(d_weight + scale * jnp.sum(d_scores[:, None] * x, axis=0))
    # The carry with this chunk's rows of its first run: reference min(R, lse of those rows).
    seen = (row_lse < _UNSEEN / 2) & in_first_run
    smallest = jnp.minimum(jnp.where(carry_goes_on, reference, _UNSEEN),
                           jnp.min(jnp.where(seen, row_lse, _UNSEEN)))
    row_weight = jnp.where(seen, jnp.exp(jnp.minimum(smallest - row_lse, 0.0)), 0.0)  # [t]
    shift = jnp.where(carry_goes_on, jnp.exp(smallest - reference), 0.0)
    new_min = jnp.where(head, smallest, new_min)
    new_sum = (new_sum + shift * jnp.where(head, carried_sum, 0.0)
               + jnp.sum(row_weight[:, None] * d_head, axis=0))
    new_dot = jnp.where(head, shift * previous_dot + jnp.sum(row_weight * dots), new_dot)
  return d_x, (new_min, new_sum, new_dot), tuple(new_d_weights), first_run


def _backward_kernel(q_ref, k_ref, du_ref, mask_ref, query_ref, key_ref, alpha_lse_ref,
                     beta_lse_ref, alpha_ref, beta_ref, dq_ref, dk_ref, d_alpha_ref, d_beta_ref,
                     *, shape: _Shape, scale: float):
  """The backward (module docstring): chunks in reverse, each chunk's beta pooling, then its
  alpha pooling."""
  heads, alpha, beta = _head_setup(alpha_ref, beta_ref, shape)

  def body(index, carry):
    alpha_carry, beta_carry, d_alpha, d_beta, carried_run = carry
    rows, in_bounds, tile_mask = _chunk_rows(shape.num_chunks - 1 - index, shape)

    def load(ref):
      return plgpu.load(ref.at[rows, :], mask=tile_mask, other=0.0).astype(F32)

    q, k, d_u, global_query, global_key = (load(ref) for ref in (q_ref, k_ref, du_ref,
                                                                   query_ref, key_ref))
    real, run = _unpack_mask(plgpu.load(mask_ref.at[rows], mask=in_bounds, other=0))
    alpha_lse, beta_lse = (plgpu.load(ref.at[rows, :], mask=in_bounds[:, None], other=_UNSEEN)
                           for ref in (alpha_lse_ref, beta_lse_ref))
    mixed = k * global_query
    d_mixed, beta_carry, d_beta, first_run = _pool_chunk_backward(
        mixed, real, run, global_key, d_u * q, beta_lse, beta_carry, carried_run, beta, heads,
        d_beta, shape, scale)
    d_q, alpha_carry, d_alpha, _ = _pool_chunk_backward(
        q, real, run, global_query, d_mixed * k, alpha_lse, alpha_carry, carried_run, alpha,
        heads, d_alpha, shape, scale)
    plgpu.store(dq_ref.at[rows, :], (d_q + d_u * global_key).astype(dq_ref.dtype),
                mask=tile_mask)
    plgpu.store(dk_ref.at[rows, :], (d_mixed * global_query).astype(dk_ref.dtype),
                mask=tile_mask)
    return alpha_carry, beta_carry, d_alpha, d_beta, first_run

  zeros = jnp.zeros((shape.padded,), F32)
  empty = (jnp.full((shape.padded,), _UNSEEN, F32), zeros, zeros)
  no_gradient = (zeros,) * shape.heads
  _, _, d_alpha, d_beta, _ = jax.lax.fori_loop(
      0, shape.num_chunks, body, (empty, empty, no_gradient, no_gradient, jnp.int32(-1)))
  for h in range(shape.heads):
    d_alpha_ref[h, :] = d_alpha[h]
    d_beta_ref[h, :] = d_beta[h]


def _specs(shape: _Shape):
  """BlockSpecs over the (batch,) grid: [L, F] rows, the mask, [L, heads_padded] rows,
  [heads, padded] weights."""
  return (pl.BlockSpec((None, shape.length, shape.padded), lambda b: (b, 0, 0)),
          pl.BlockSpec((None, shape.length), lambda b: (b, 0)),
          pl.BlockSpec((None, shape.length, shape.heads_padded), lambda b: (b, 0, 0)),
          pl.BlockSpec((shape.heads, shape.padded), lambda b: (0, 0)))


def _weight_rows(kernel, shape: _Shape):
  """[F, heads] scoring kernel -> float32 [heads, padded] rows."""
  return jnp.pad(kernel.astype(F32).T, ((0, 0), (0, shape.padded - shape.features)))


def _compiler_params(config: TritonConfig):
  return plgpu.CompilerParams(num_warps=config.num_warps, num_stages=config.num_stages)


def _forward(q, k, mask, alpha_kernel, beta_kernel, shape: _Shape, interpret: bool,
             save: bool, config: TritonConfig):
  """u (and with `save`, the residuals g_q, g_k, lse_a, lse_b)."""
  batch = q.shape[0]
  row_spec, mask_spec, lse_spec, weight_spec = _specs(shape)
  out_shape = [jax.ShapeDtypeStruct((batch, shape.length, shape.features), q.dtype)]
  out_specs = [row_spec]
  if save:
    out_shape += [jax.ShapeDtypeStruct((batch, shape.length, shape.features), F32)] * 2
    out_shape += [jax.ShapeDtypeStruct((batch, shape.length, shape.heads_padded), F32)] * 2
    out_specs += [row_spec] * 2 + [lse_spec] * 2
  return pl.pallas_call(
      functools.partial(_kernel, shape=shape, scale=shape.head_dim ** -0.5), grid=(batch,),
      in_specs=[row_spec, row_spec, mask_spec, weight_spec, weight_spec],
      out_specs=out_specs, out_shape=out_shape, interpret=interpret,
      compiler_params=_compiler_params(config), name="chunked_causal_additive",
  )(q, k, mask, _weight_rows(alpha_kernel, shape), _weight_rows(beta_kernel, shape))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _core(q, k, mask, alpha_kernel, beta_kernel, shape, interpret, config):
  return _forward(q, k, mask, alpha_kernel, beta_kernel, shape, interpret, False, config)[0]


def _core_forward(q, k, mask, alpha_kernel, beta_kernel, shape, interpret, config):
  u, *saved = _forward(q, k, mask, alpha_kernel, beta_kernel, shape, interpret, True, config)
  return u, (q, k, mask, alpha_kernel, beta_kernel, *saved)


def _core_backward(shape, interpret, config, residuals, d_u):
  q, k, mask, alpha_kernel, beta_kernel, global_query, global_key, alpha_lse, beta_lse = residuals
  batch = q.shape[0]
  row_spec, mask_spec, lse_spec, weight_spec = _specs(shape)
  gradient_spec = pl.BlockSpec((None, shape.heads, shape.padded), lambda b: (b, 0, 0))
  gradient_shape = jax.ShapeDtypeStruct((batch, shape.heads, shape.padded), F32)
  d_q, d_k, d_alpha, d_beta = pl.pallas_call(
      functools.partial(_backward_kernel, shape=shape, scale=shape.head_dim ** -0.5),
      grid=(batch,),
      in_specs=[row_spec] * 3 + [mask_spec] + [row_spec] * 2 + [lse_spec] * 2
      + [weight_spec] * 2,
      out_specs=[row_spec, row_spec, gradient_spec, gradient_spec],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
                 gradient_shape, gradient_shape],
      interpret=interpret, compiler_params=_compiler_params(config),
      name="chunked_causal_additive_backward",
  )(q, k, d_u, mask, global_query, global_key, alpha_lse, beta_lse,
    _weight_rows(alpha_kernel, shape), _weight_rows(beta_kernel, shape))

  def kernel_gradient(partial, kernel):
    return jnp.sum(partial, axis=0)[:, :shape.features].T.astype(kernel.dtype)

  return (d_q, d_k, None, kernel_gradient(d_alpha, alpha_kernel),
          kernel_gradient(d_beta, beta_kernel))


_core.defvjp(_core_forward, _core_backward)


def pallas_recurrent_causal_additive(query: Array, key: Array, padding_mask: Array,
                                     alpha_kernel: Array, beta_kernel: Array,
                                     runs: Array | None = None, *,
                                     chunk_size: int | None = None, interpret: bool | None = None,
                                     config: TritonConfig | None = None) -> Array:
  """The recurrent form's u [batch, length, heads, dim] (module docstring), first-order
  reverse-mode gradients through the backward kernel. `runs` (int32 [batch, length], None: one
  run), as the XLA forms take them (`common.segment_runs`): a position pools only the earlier
  positions of its own run (packed documents). `config` None: `default_config` (with
  `chunk_size`, when given, as its rows); a configuration whose shared memory (by estimate)
  exceeds the GPU's is refused before compiling. `interpret` None: interpret mode on a CPU."""
  batch, length, heads, head_dim = query.shape
  if interpret is None:
    interpret = common.backend() == "cpu"
  features = heads * head_dim
  if config is None:
    config = default_config(features, query.dtype.itemsize, heads)
    if chunk_size is not None:
      config = config._replace(rows=chunk_size)
  chunk = min(config.rows, pl.next_power_of_2(length))
  if not interpret:
    needed = shared_memory_bytes(config._replace(rows=chunk), features, query.dtype.itemsize,
                                 heads)
    pallas_gpu.check_fits("pallas_recurrent_causal_additive", config._replace(rows=chunk),
                          max(needed.values()))
  shape = _Shape(length, features, pl.next_power_of_2(features), heads,
                 pl.next_power_of_2(heads), head_dim, chunk, pl.cdiv(length, chunk))
  # One int32 per position for both: run * 2 + real (`_unpack_mask`).
  packed = padding_mask.astype(jnp.int32)
  if runs is not None:
    packed = packed + 2 * runs.astype(jnp.int32)
  u = _core(query.reshape(batch, length, features), key.reshape(batch, length, features),
            packed, alpha_kernel, beta_kernel, shape, interpret, config)
  return u.reshape(query.shape)
