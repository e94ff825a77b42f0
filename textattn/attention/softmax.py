"""Softmax multi-head self-attention and its exact kernels; registers "softmax".

Kernels (pure functions over projected tensors [batch, length, heads, head_dim]; `causal=True`
adds the look-ahead mask, which is how textattn/attention/causal.py reuses them):
  xla          `softmax_attention`, the reference einsum, float32 logits and softmax.
  dot_product  `jax.nn.dot_product_attention`, its default (XLA) implementation.
  cudnn        its cuDNN flash attention (NVIDIA GPU, bfloat16/float16; padding as key lengths;
               against float64 on an H200, RESULTS §28).
  splash       JAX's Pallas TPU splash attention (splash.py; TPU, any dtype; padding as segment
               ids; tested in TPU interpret mode on a CPU, never on a TPU).
  chunked      exact, query-chunked and rematerialised: memory O(length * chunk), not O(length^2).
  fused        the CPU fast path: batched matmuls, the mask as one bias, a flash-style backward.
  native       the same maths as two C++ XLA FFI kernels (CPU, one device; built on first use by
               textattn.attention.native).
  auto         on a one-device CPU run where native builds, native where it was measured faster
               than fused for the shape (textattn/attention/calibration.py), else fused; cudnn
               on a GPU in bfloat16, dot_product there in float32; splash on a TPU (`resolve`).
Every kernel is checked against a float64 NumPy transcription in tests/test_attention.py.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import logging

from textattn.attention import calibration, common, native, registry, splash
from textattn.attention.common import (MASK_VALUE, Array, dense_init, key_visibility,
                                       rows_with_a_key, usable_cores)
from textattn.attention.rotary import apply_rotary
from textattn.errors import UsageError
from textattn.flax_layers import DenseGeneral

IMPLEMENTATIONS = ("auto", "xla", "dot_product", "chunked", "fused", "native", "cudnn", "splash")
SEGMENT_KERNELS = ("xla", "dot_product")  # the kernels that take segment ids


def _segments(segment_ids: Array, seeing: Array) -> tuple[Array, Array]:
  """Packed documents: (query and key in one segment [batch, 1, q, k], `seeing` less padding)."""
  same = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
  return same, seeing & (segment_ids != 0)[:, :, None, None]


def softmax_attention(query: Array, key: Array, value: Array, padding_mask: Array, *,
                      causal: bool = False, q_positions: Array | None = None,
                      segment_ids: Array | None = None) -> Array:
  """Reference multi-head scaled dot-product attention. Shapes [batch, length, heads, head_dim].

  `q_positions` (absolute positions of the given queries) lets a caller pass a slice of queries
  against all keys; it only matters for the causal mask. `segment_ids`: see `SelfAttention`.
  """
  head_dim = query.shape[-1]
  query = query * jnp.asarray(head_dim ** -0.5, query.dtype)
  logits = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=jnp.float32)
  visible = key_visibility(padding_mask, causal, q_positions, key.shape[1])
  seeing = rows_with_a_key(padding_mask, causal, q_positions)
  same, seeing = (True, seeing) if segment_ids is None else _segments(segment_ids, seeing)
  logits = jnp.where(visible & same, logits, MASK_VALUE)
  weights = jax.nn.softmax(logits, axis=-1).astype(value.dtype)
  out = jnp.einsum("bhqk,bkhd->bqhd", weights, value)
  return jnp.where(seeing, out, 0).astype(value.dtype)


def dot_product_attention(query: Array, key: Array, value: Array, padding_mask: Array, *,
                          causal: bool = False, segment_ids: Array | None = None) -> Array:
  """`jax.nn.dot_product_attention` with its default implementation, which in jax 0.10 is the
  XLA path on every platform (use `cudnn_attention` for cuDNN flash attention)."""
  mask, seeing = padding_mask[:, None, None, :], rows_with_a_key(padding_mask, causal)
  same, seeing = (True, seeing) if segment_ids is None else _segments(segment_ids, seeing)
  out = jax.nn.dot_product_attention(query, key, value, mask=mask & same, is_causal=causal)
  return jnp.where(seeing, out, 0).astype(value.dtype)


def cudnn_attention(query: Array, key: Array, value: Array, padding_mask: Array, *,
                    causal: bool = False) -> Array:
  """`jax.nn.dot_product_attention(implementation="cudnn")`: cuDNN flash attention; NVIDIA GPU
  and bfloat16/float16 only. Tokens are left-aligned, so the padding mask is passed in cuDNN's
  form, per-example key lengths. (Untested here: no GPU was available when it was written.)"""
  key_lengths = jnp.sum(padding_mask, axis=-1).astype(jnp.int32)
  out = jax.nn.dot_product_attention(query, key, value, is_causal=causal,
                                     key_value_seq_lengths=key_lengths, implementation="cudnn")
  return jnp.where(rows_with_a_key(padding_mask, causal), out, 0).astype(value.dtype)


def chunked_softmax_attention(query: Array, key: Array, value: Array, padding_mask: Array, *,
                              causal: bool = False, chunk_size: int = 256) -> Array:
  """Exact softmax attention computed one block of queries at a time.

  Each block sees all keys, so its softmax is exact; the block is wrapped in `jax.checkpoint`, so
  neither the forward nor the backward pass ever holds more than one [batch, heads, chunk, length]
  block of scores. Peak memory is O(length * chunk) instead of O(length^2).
  """
  batch, length, heads, head_dim = query.shape
  chunk = min(chunk_size, length)
  num_chunks = -(-length // chunk)
  padded = num_chunks * chunk
  query = jnp.pad(query, ((0, 0), (0, padded - length), (0, 0), (0, 0)))
  blocks = query.reshape(batch, num_chunks, chunk, heads, head_dim).swapaxes(0, 1)
  starts = jnp.arange(num_chunks) * chunk

  @jax.checkpoint
  def one_block(args):
    q_block, start = args
    positions = start + jnp.arange(chunk)
    # Keep the (padded) positions in range for indexing; those rows are cut off below.
    positions = jnp.minimum(positions, length - 1)
    return softmax_attention(q_block, key, value, padding_mask, causal=causal,
                             q_positions=positions)

  out = jax.lax.map(one_block, (blocks, starts))
  return out.swapaxes(0, 1).reshape(batch, padded, heads, head_dim)[:, :length]


def mask_bias(padding_mask: Array, causal: bool, length: int) -> Array:
  """Padding (and look-ahead) mask as one additive float32 bias, [batch or 1, 1, q or 1, k]."""
  bias = jnp.where(padding_mask, 0.0, MASK_VALUE).astype(jnp.float32)[:, None, None, :]
  if causal:
    look_ahead = jnp.arange(length)[:, None] >= jnp.arange(length)[None, :]
    bias = bias + jnp.where(look_ahead, 0.0, MASK_VALUE).astype(jnp.float32)[None, None]
  return bias


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _fused_core(q: Array, k: Array, v: Array, padding_mask: Array, causal: bool) -> Array:
  return _fused_forward(q, k, v, padding_mask, causal)[0]


def _fused_forward(q, k, v, padding_mask, causal):
  # q (pre-scaled), k, v: [batch, heads, length, head_dim].
  scores = jnp.matmul(q, jnp.swapaxes(k, -1, -2), preferred_element_type=jnp.float32)
  scores = scores + mask_bias(padding_mask, causal, q.shape[2])
  unnormalised = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
  row_sum = jnp.sum(unnormalised, axis=-1, keepdims=True)
  # Normalise the [.., length, head_dim] output, not the [.., length, length] weights.
  out = jnp.matmul(unnormalised.astype(v.dtype), v, preferred_element_type=jnp.float32) / row_sum
  out = out.astype(v.dtype)
  return out, (q, k, v, unnormalised, row_sum, out)


def _fused_backward(causal, residuals, d_out):
  del causal
  q, k, v, unnormalised, row_sum, out = residuals
  f32 = jnp.float32
  d_out = d_out.astype(f32) / row_sum  # folds the 1/row_sum of the weights into d_out
  d_v = jnp.matmul(jnp.swapaxes(unnormalised, -1, -2), d_out)
  d_weights = jnp.matmul(d_out, jnp.swapaxes(v, -1, -2).astype(f32))
  # Softmax backward with the flash-attention identity sum_j P_ij dP_ij = sum_d dO_id O_id.
  d_scores = unnormalised * (d_weights - jnp.sum(d_out * out.astype(f32), -1, keepdims=True))
  d_q = jnp.matmul(d_scores, k.astype(f32))
  d_k = jnp.matmul(jnp.swapaxes(d_scores, -1, -2), q.astype(f32))
  return d_q.astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype), None


_fused_core.defvjp(_fused_forward, _fused_backward)


def fused_softmax_attention(query: Array, key: Array, value: Array, padding_mask: Array, *,
                            causal: bool = False) -> Array:
  """Exact softmax attention with a hand-written backward pass, arranged for XLA:CPU.

  The same function as `softmax_attention` (tests check values and gradients against it), laid
  out to touch the [batch, heads, length, length] scores as few times as possible, which is what
  bounds it on a CPU: heads next to the batch so each product is one batched matmul; the mask as
  one additive bias fused into the scores; the output normalised after the weighted sum; and a
  custom VJP (the flash-attention backward) instead of autodiff through softmax, which
  materialised extra full-size tensors. See experiments/RESULTS.md (speed) for measurements.
  """
  head_dim = query.shape[-1]
  q = (query * jnp.asarray(head_dim ** -0.5, query.dtype)).transpose(0, 2, 1, 3)
  out = _fused_core(q, key.transpose(0, 2, 1, 3), value.transpose(0, 2, 1, 3), padding_mask,
                    causal).transpose(0, 2, 1, 3)
  return jnp.where(rows_with_a_key(padding_mask, causal), out, 0).astype(value.dtype)


def _native_forward_call(causal, q, k, v, mask):
  native.load()
  return jax.ffi.ffi_call(
      native.FORWARD_TARGET,
      (jax.ShapeDtypeStruct(q.shape, jnp.float32),
       jax.ShapeDtypeStruct((q.shape[0], q.shape[2], q.shape[1]), jnp.float32)),
      vmap_method="sequential")(q, k, v, mask, causal=causal, threads=usable_cores(),
                                xla_pool=True)


def _native_backward_call(causal, q, k, v, mask, out, lse, d_out):
  native.load()
  return jax.ffi.ffi_call(
      native.BACKWARD_TARGET, (jax.ShapeDtypeStruct(q.shape, jnp.float32),) * 3,
      vmap_method="sequential")(q, k, v, mask, out, lse, d_out, causal=causal,
                                threads=usable_cores(), xla_pool=True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _native_core(q: Array, k: Array, v: Array, mask: Array, causal: bool) -> Array:
  return _native_forward(q, k, v, mask, causal)[0]


def _native_forward(q, k, v, mask, causal):
  out, lse = _native_forward_call(causal, q, k, v, mask)  # lse: [batch, heads, length]
  return out, (q, k, v, mask, out, lse)


def _native_backward(causal, residuals, d_out):
  q, k, v, mask, out, lse = residuals
  d_q, d_k, d_v = _native_backward_call(causal, q, k, v, mask, out, lse,
                                        d_out.astype(jnp.float32))
  return d_q, d_k, d_v, None


_native_core.defvjp(_native_forward, _native_backward)


def native_softmax_attention(query: Array, key: Array, value: Array, padding_mask: Array, *,
                             causal: bool = False) -> Array:
  """Exact softmax attention as one hand-written C++ kernel per pass (XLA FFI, CPU only).

  The same function as `softmax_attention` (tests check values and gradients against float64
  NumPy and the reference): a block of query rows is scored, masked, exponentiated, normalised
  and applied to V in a small scratch buffer, instead of XLA:CPU's skinny batched matmuls over
  scores materialised several times; only each row's log-sum-exp ([batch, heads, L]) is kept
  for the backward, which recomputes the weights from it (flash attention's backward), so the
  memory the kernel keeps is linear in L. For head_dim 8, 16, 32 or 64,
  all-padding key blocks and rows without output gradient (padding positions, which pooling
  ignores) are skipped exactly. First-order reverse-mode gradients only (custom VJP). Computes
  in float32 (bfloat16 inputs are upcast), on every core of the process. The kernels are
  compiled on first use by `textattn.attention.native` (needs a C++ compiler). One device only
  (`check_native_devices`).
  """
  dtype = value.dtype
  f32 = jnp.float32
  out = _native_core(query.astype(f32), key.astype(f32), value.astype(f32),
                     padding_mask.astype(jnp.int32), causal)
  return out.astype(dtype)


KERNEL_LABELS = (("xla", "naive"), ("dot_product", "naive (XLA)"), ("chunked", "chunked"),
                 ("fused", "fused"), ("native", "native"), ("cudnn", "flash"),
                 ("splash", "splash"))


def forward_flops(batch: int, length: int, heads: int, head_dim: int) -> float:
  """QK^T and PV: 2 * (2 * B * H * L^2 * d)."""
  return 4.0 * batch * heads * length * length * head_dim


KERNELS = {"xla": softmax_attention, "dot_product": dot_product_attention,
           "chunked": chunked_softmax_attention, "fused": fused_softmax_attention,
           "native": native_softmax_attention, "cudnn": cudnn_attention,
           "splash": splash.splash_attention}


def native_runs_here() -> bool:
  """Whether the native kernels serve this run: one device, a CPU, and they build here."""
  if common.backend() == "cpu" and jax.device_count() == 1:
    return native.available()
  return False


@functools.cache
def warn_fallback(variant: str, fallback: str, reason: str | None = None) -> None:
  """Once per (variant, kernel, reason): why 'auto' did not pick the platform's fastest kernel."""
  if reason is None:
    if common.backend() != "cpu":
      reason = f"the {common.backend()} backend"
    elif jax.device_count() > 1:
      reason = f"{jax.device_count()} devices (the native kernel runs with one)"
    else:
      reason = native.unavailable_reason() or "unknown"
  logging.warning("%s attention_impl='auto': using the %r kernel (%s).", variant, fallback, reason)


FLASH_DTYPES = ("bfloat16", "float16")  # what cuDNN's flash attention takes


def calibration_problem(shape, causal: bool):
  """The problem textattn.attention.calibration times for a softmax shape class: forward and
  backward of the attention core (sum of the output times a fixed cotangent) on `rows` one-head
  examples of the bucket's length -- the kernels treat heads as more batch rows, so the head
  count is not part of the class -- where rows is a multiple of the thread count (the native
  kernel runs one (example, head) pair per thread) with rows * length^2 about 4M scores, and the
  examples padded as calibration.padding_lengths says."""
  import numpy as np

  length, threads = shape.length, shape.threads
  rows = threads * max(1, (1 << 22) // (threads * length * length))
  dtype = jnp.dtype(shape.dtype)
  rng = np.random.default_rng(0)
  q, k, v, cotangent = (jnp.asarray(rng.standard_normal((rows, length, 1, shape.head_dim)),
                                    dtype) for _ in range(4))
  real = np.asarray(calibration.padding_lengths(rows, length))
  mask = jnp.asarray(np.arange(length)[None, :] < real[:, None])

  def problem(name):
    def loss(q, k, v):
      out = KERNELS[name](q, k, v, mask, causal=causal)
      return jnp.sum((out * cotangent).astype(jnp.float32))
    return jax.value_and_grad(loss, argnums=(0, 1, 2)), (q, k, v)
  return problem


def resolve(implementation: str, head_dim: int | None = None, dtype: str = "float32",
            variant: str = "softmax", *, length: int | None = None,
            num_heads: int | None = None) -> str:
  """The kernel `implementation` means here; other names than 'auto' are returned as they are.

  'auto': on a CPU, for a one-device run where the native kernels build, 'native' where
  textattn.attention.calibration measured it faster than 'fused' for this shape class (the
  `length` and `head_dim` given; without them, 'native'), else 'fused' (both exact); where
  native cannot run, 'fused'; on a GPU, 'cudnn' (flash attention) for bfloat16/float16
  compute, else 'dot_product' (XLA's default path; cuDNN's flash kernel takes no float32); on a
  TPU, 'splash' (JAX's Pallas TPU splash attention, every dtype); anything else, 'dot_product'
  (XLA's default path). Each fallback's reason is warned once."""
  del num_heads  # (heads are batch rows to these kernels: not part of the shape class)
  if implementation != "auto":
    return implementation
  backend = common.backend()
  if backend == "cpu":
    if native_runs_here():
      if length is None or head_dim is None:
        return "native"
      causal = variant == "causal"
      shape = calibration.shape(variant, length, head_dim, str(dtype))
      return calibration.choose(shape, "fused", lambda: calibration_problem(shape, causal))
    warn_fallback(variant, "fused")
    return "fused"
  if backend == "gpu":
    if str(dtype) in FLASH_DTYPES:
      return "cudnn"
    warn_fallback(variant, "dot_product", f"model.dtype={str(dtype)!r}: cuDNN flash attention "
                   f"needs bfloat16 or float16")
    return "dot_product"
  if backend == "tpu":
    return "splash"
  warn_fallback(variant, "dot_product", f"no flash kernel is used on the {backend} backend")
  return "dot_product"


def check_native_devices() -> None:
  """The native kernel runs with one device only (it uses every core itself). With several CPU
  devices in one process, XLA's in-process all-reduce was seen to hang around it (one run in
  about ten here; XLA then aborts the process), so it is refused rather than risked."""
  if jax.device_count() > 1:
    raise UsageError(f"config.model.attention_impl='native' needs a single device, and this "
                     f"run has {jax.device_count()}; use num_cpu_devices=0 or 1 (the kernel "
                     f"uses every core itself), or attention_impl 'auto' or 'fused'.")


def check_native_here() -> None:
  """ValueError unless an explicit attention_impl='native' can run in this process."""
  if common.backend() != "cpu":
    raise UsageError(f"config.model.attention_impl='native' runs on a CPU only (here: "
                     f"{common.backend()}); use 'auto' or 'fused'.")
  check_native_devices()
  if (reason := native.unavailable_reason()) is not None:
    raise UsageError(f"config.model.attention_impl='native' is not available: {reason}")


def check(implementation: str, embed_dim: int, num_heads: int, dtype: str = "float32") -> None:
  """ValueError naming the field, its value and what is allowed, for a softmax/causal module."""
  registry.check_choice("model.attention_impl", implementation, IMPLEMENTATIONS)
  registry.check_heads(embed_dim, num_heads)
  if implementation == "native":
    check_native_here()
  if implementation == "cudnn" and (dtype != "bfloat16" or common.backend() != "gpu"):
    raise UsageError(f"config.model.attention_impl='cudnn' needs a GPU and "
                     f"config.model.dtype='bfloat16' (here: {common.backend()}, "
                     f"{dtype!r}); use 'fused' or 'dot_product' otherwise.")
  if implementation == "splash" and common.backend() not in ("tpu", "cpu"):
    raise UsageError(f"config.model.attention_impl='splash' runs on a TPU (or in interpret mode "
                     f"on a CPU), not on the {common.backend()} backend; use 'auto' or "
                     f"'cudnn' on a GPU.")


class SelfAttention(nn.Module):
  """Multi-head softmax self-attention (optionally causal) with Q/K/V/output projections."""
  num_heads: int
  causal: bool = False
  implementation: str = "xla"  # a key of KERNELS, or "auto" (resolved when called)
  dtype: Any = jnp.float32
  head_dim: int | None = None  # None: embed // num_heads (Keras' key_dim, e.g. 256 x 8 heads)
  rotary: bool = False  # queries and keys turned by position (registry.Variant.rotary)

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array, decode: bool = False,
               segment_ids: Array | None = None) -> Array:
    """decode=True (causal only), as Flax's examples/wmt: a first call on the whole [batch,
    max_len] allocates the "cache" (keys, values, their mask, the next position); each later
    call gives one position [batch, 1, embed], attending to the cached ones and itself.
    `segment_ids` int32 [batch, length] (0 = padding; SEGMENT_KERNELS): packed documents."""
    embed = x.shape[-1]
    head_dim = self.head_dim or embed // self.num_heads
    dense = functools.partial(DenseGeneral, features=(self.num_heads, head_dim),
                              dtype=self.dtype, kernel_init=dense_init())
    query, key, value = (dense(name=name)(x) for name in ("query", "key", "value"))
    stepping = decode and self.has_variable("cache", "keys")
    if self.rotary:  # (decoding: the cache's next position; else 0 .. length - 1)
      positions = self.get_variable("cache", "index")[None] if stepping else jnp.arange(x.shape[1])
      query, key = apply_rotary(query, positions), apply_rotary(key, positions)
    self.sow("intermediates", "query_key", (query, key))  # (attention transfer, if mutable)
    if stepping:
      out = self._decode_step(query, key, value, padding_mask)
    else:
      if decode:
        if not self.causal:
          raise ValueError("decode=True needs a causal attention variant.")
        self.variable("cache", "keys", jnp.zeros, key.shape, key.dtype)
        self.variable("cache", "values", jnp.zeros, value.shape, value.dtype)
        self.variable("cache", "mask", jnp.zeros, padding_mask.shape, bool)
        self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
      # ('auto' with packed documents: "xla", a kernel that takes segment ids)
      name = "xla" if segment_ids is not None and self.implementation == "auto" else resolve(
          self.implementation, head_dim, jnp.dtype(self.dtype).name,
          "causal" if self.causal else "softmax", length=x.shape[1], num_heads=self.num_heads)
      if segment_ids is not None and name not in SEGMENT_KERNELS:
        raise UsageError(f"attention_impl={name!r} takes no segment ids (packed documents); "
                         f"use one of {', '.join(SEGMENT_KERNELS)}.")
      segments = {} if segment_ids is None else {"segment_ids": segment_ids}
      out = KERNELS[name](query, key, value, padding_mask, causal=self.causal, **segments)
    return DenseGeneral(embed, axis=(-2, -1), dtype=self.dtype, kernel_init=dense_init(),
                        name="out")(out)

  def _decode_step(self, query, key, value, padding_mask):
    """One position against the cache: O(positions cached) work, like the full attention."""
    keys, values = self.variable("cache", "keys"), self.variable("cache", "values")
    mask, index = self.variable("cache", "mask"), self.variable("cache", "index")
    i = index.value
    keys.value = jax.lax.dynamic_update_slice(keys.value, key, (0, i, 0, 0))
    values.value = jax.lax.dynamic_update_slice(values.value, value, (0, i, 0, 0))
    mask.value = jax.lax.dynamic_update_slice(mask.value, padding_mask.astype(bool), (0, i))
    index.value = i + 1
    return softmax_attention(query, keys.value, values.value, mask.value, causal=True,
                             q_positions=i[None])


registry.register(registry.Variant(
    name="softmax",
    build=functools.partial(SelfAttention, causal=False),
    implementations=IMPLEMENTATIONS, resolve=resolve, check=check, forward_flops=forward_flops,
    kernels=KERNEL_LABELS, rotary=True,
    description="multi-head scaled dot-product self-attention (Vaswani et al. 2017)"))
