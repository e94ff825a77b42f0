"""Attention variants: one pure function per kernel, thin Linen modules owning the projections.

Every module here has the same call signature,

    module(x: [batch, length, embed], padding_mask: bool[batch, length]) -> [batch, length, embed]

and is built by name with `make_attention(name, ...)`, so the encoder, the classifier and the
benchmark never branch on the variant. `padding_mask` is True for real tokens.

Kernels (pure functions over projected tensors laid out [batch, length, heads, head_dim]):
  * `softmax_attention`        reference einsum ("xla"), float32 logits and softmax.
  * `dot_product_attention`    `jax.nn.dot_product_attention`, default (XLA) implementation.
  * `cudnn_attention`          its cuDNN flash attention (GPU, bfloat16/float16).
  * `chunked_softmax_attention` exact softmax attention, query-chunked and rematerialised, so the
                                full L x L score matrix is never materialised (memory ~ L * chunk).
  * `fused_softmax_attention`  the CPU fast path: batched-matmul layout, mask as one additive
                                bias, hand-written flash-style backward (see experiments/).
  * `native_softmax_attention` the same maths as two C++ XLA FFI kernels (CPU, one device;
                                built on first use by `textattn.attention.native`).
  * `additive_attention`       Fastformer (arXiv 2108.09084), linear in length.
  * `native_additive_attention` the same maths as two C++ XLA FFI kernels (CPU, one device).
"auto" (the configs' default) picks native on a one-device CPU run where it builds, else fused
(softmax) or the XLA function (additive) (`resolve_implementation`).

Invariants every kernel keeps (tests/test_attention.py checks them):
  * padding keys never receive weight; a query with no valid key at all (a fully padded row, or
    a causal row whose visible prefix is all padding) outputs exactly zero, never NaN/Inf;
  * softmax is computed in float32 even when activations are bfloat16.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array

ATTENTIONS = ("softmax", "causal", "additive")
SOFTMAX_IMPLEMENTATIONS = ("auto", "xla", "dot_product", "chunked", "fused", "native", "cudnn")
ADDITIVE_SCORINGS = ("shared", "per_head")

# Added to the logits of masked positions. Finite (so a row with every key masked stays finite)
# and far below any real logit; rows with no valid key are zeroed explicitly afterwards.
_MASK_VALUE = -1e30


def _key_visibility(padding_mask: Array, causal: bool, q_positions: Array | None = None,
                    num_keys: int | None = None) -> Array:
  """Boolean [batch, 1, q, k] (or [batch, 1, 1, k]) mask of the keys each query may see."""
  visible = padding_mask[:, None, None, :]
  if causal:
    num_keys = padding_mask.shape[-1] if num_keys is None else num_keys
    if q_positions is None:
      q_positions = jnp.arange(num_keys)
    look_ahead = q_positions[:, None] >= jnp.arange(num_keys)[None, :]
    visible = visible & look_ahead[None, None, :, :]
  return visible


def _rows_with_a_key(padding_mask: Array, causal: bool, q_positions: Array | None = None) -> Array:
  """Boolean [batch, q, 1, 1]: does query q see at least one real key? O(length) to compute."""
  if causal:
    seen = jnp.cumsum(padding_mask.astype(jnp.int32), axis=-1) > 0  # [batch, length]
    if q_positions is not None:
      seen = seen[:, q_positions]
    return seen[:, :, None, None]
  return jnp.any(padding_mask, axis=-1)[:, None, None, None]


def softmax_attention(query: Array, key: Array, value: Array, padding_mask: Array, *,
                      causal: bool = False, q_positions: Array | None = None) -> Array:
  """Reference multi-head scaled dot-product attention. Shapes [batch, length, heads, head_dim].

  `q_positions` (absolute positions of the given queries) lets a caller pass a slice of queries
  against all keys; it only matters for the causal mask.
  """
  head_dim = query.shape[-1]
  query = query * jnp.asarray(head_dim ** -0.5, query.dtype)
  logits = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=jnp.float32)
  visible = _key_visibility(padding_mask, causal, q_positions, key.shape[1])
  logits = jnp.where(visible, logits, _MASK_VALUE)
  weights = jax.nn.softmax(logits, axis=-1).astype(value.dtype)
  out = jnp.einsum("bhqk,bkhd->bqhd", weights, value)
  return jnp.where(_rows_with_a_key(padding_mask, causal, q_positions), out, 0).astype(value.dtype)


def dot_product_attention(query: Array, key: Array, value: Array, padding_mask: Array, *,
                          causal: bool = False) -> Array:
  """`jax.nn.dot_product_attention` with its default implementation, which in jax 0.10 is the
  XLA path on every platform (use `cudnn_attention` for cuDNN flash attention)."""
  out = jax.nn.dot_product_attention(
      query, key, value, mask=padding_mask[:, None, None, :], is_causal=causal)
  return jnp.where(_rows_with_a_key(padding_mask, causal), out, 0).astype(value.dtype)


def cudnn_attention(query: Array, key: Array, value: Array, padding_mask: Array, *,
                    causal: bool = False) -> Array:
  """`jax.nn.dot_product_attention(implementation="cudnn")`: cuDNN flash attention; NVIDIA GPU
  and bfloat16/float16 only. Tokens are left-aligned, so the padding mask is passed in cuDNN's
  form, per-example key lengths. (Untested here: no GPU was available when it was written.)"""
  key_lengths = jnp.sum(padding_mask, axis=-1).astype(jnp.int32)
  out = jax.nn.dot_product_attention(query, key, value, is_causal=causal,
                                     key_value_seq_lengths=key_lengths, implementation="cudnn")
  return jnp.where(_rows_with_a_key(padding_mask, causal), out, 0).astype(value.dtype)


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


def _mask_bias(padding_mask: Array, causal: bool, length: int) -> Array:
  """Padding (and look-ahead) mask as one additive float32 bias, [batch or 1, 1, q or 1, k]."""
  bias = jnp.where(padding_mask, 0.0, _MASK_VALUE).astype(jnp.float32)[:, None, None, :]
  if causal:
    look_ahead = jnp.arange(length)[:, None] >= jnp.arange(length)[None, :]
    bias = bias + jnp.where(look_ahead, 0.0, _MASK_VALUE).astype(jnp.float32)[None, None]
  return bias


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _fused_core(q: Array, k: Array, v: Array, padding_mask: Array, causal: bool) -> Array:
  return _fused_forward(q, k, v, padding_mask, causal)[0]


def _fused_forward(q, k, v, padding_mask, causal):
  # q (pre-scaled), k, v: [batch, heads, length, head_dim].
  scores = jnp.matmul(q, jnp.swapaxes(k, -1, -2), preferred_element_type=jnp.float32)
  scores = scores + _mask_bias(padding_mask, causal, q.shape[2])
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
  return jnp.where(_rows_with_a_key(padding_mask, causal), out, 0).astype(value.dtype)


# Where the native kernels run their workers: "xla" = XLA's own intra-op thread pool (the
# FFI's Ctx<ThreadPool>; the calling thread works too and takes whatever a busy pool thread has
# not started), or "own" = std::threads started for each call. Results are the same either way
# (tested); the speed was measured with experiments/native_pool_ab.py (experiments/RESULTS.md).
NATIVE_WORKERS = "xla"


def _native_pool() -> bool:
  if NATIVE_WORKERS not in ("xla", "own"):
    raise ValueError(f"attention.NATIVE_WORKERS={NATIVE_WORKERS!r} is invalid; allowed: 'xla' "
                     f"(XLA's thread pool), 'own' (std::threads per call).")
  return NATIVE_WORKERS == "xla"


def usable_cores() -> int:
  """The CPU cores this process may use (its affinity mask, where the OS has one)."""
  try:
    return max(1, len(os.sched_getaffinity(0)))
  except AttributeError:  # macOS
    return os.cpu_count() or 1


def _native_threads() -> int:
  """Threads per native call: the cores this process may use."""
  return usable_cores()


def _native_forward_call(causal, q, k, v, mask):
  from textattn.attention import native  # (builds the kernels on first use)
  native.load()
  return jax.ffi.ffi_call(
      native.FORWARD_TARGET,
      (jax.ShapeDtypeStruct(q.shape, jnp.float32),
       jax.ShapeDtypeStruct((q.shape[0], q.shape[2], q.shape[1], k.shape[1]), jnp.float32)),
      vmap_method="sequential")(q, k, v, mask, causal=causal, threads=_native_threads(),
                                xla_pool=_native_pool())


def _native_backward_call(causal, q, k, v, mask, out, probs, d_out):
  from textattn.attention import native
  native.load()
  return jax.ffi.ffi_call(
      native.BACKWARD_TARGET, (jax.ShapeDtypeStruct(q.shape, jnp.float32),) * 3,
      vmap_method="sequential")(q, k, v, mask, out, probs, d_out, causal=causal,
                                threads=_native_threads(), xla_pool=_native_pool())


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _native_core(q: Array, k: Array, v: Array, mask: Array, causal: bool) -> Array:
  return _native_forward(q, k, v, mask, causal)[0]


def _native_forward(q, k, v, mask, causal):
  out, probs = _native_forward_call(causal, q, k, v, mask)
  return out, (q, k, v, mask, out, probs)


def _native_backward(causal, residuals, d_out):
  q, k, v, mask, out, probs = residuals
  d_q, d_k, d_v = _native_backward_call(causal, q, k, v, mask, out, probs,
                                        d_out.astype(jnp.float32))
  return d_q, d_k, d_v, None


_native_core.defvjp(_native_forward, _native_backward)


def native_softmax_attention(query: Array, key: Array, value: Array, padding_mask: Array, *,
                             causal: bool = False) -> Array:
  """Exact softmax attention as one hand-written C++ kernel per pass (XLA FFI, CPU only).

  The same function as `softmax_attention` (tests check values and gradients against float64
  NumPy and the reference): a block of query rows is scored, masked, exponentiated, normalised
  and applied to V in a small scratch buffer, instead of XLA:CPU's skinny batched matmuls over
  scores materialised several times; only the weights ([batch, heads, L, L]) are written, for
  the backward, which is the flash-attention one over them. For head_dim 8, 16, 32 or 64,
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


def _masked_softmax_over_tokens(scores: Array, padding_mask: Array) -> Array:
  """Softmax over the length axis of float32 scores [batch, length, heads]; padding gets 0."""
  scores = jnp.where(padding_mask[:, :, None], scores.astype(jnp.float32), _MASK_VALUE)
  weights = jax.nn.softmax(scores, axis=1)
  return jnp.where(padding_mask[:, :, None], weights, 0.0)


def additive_attention(query: Array, key: Array, padding_mask: Array, alpha_kernel: Array,
                       beta_kernel: Array) -> Array:
  """Fastformer additive attention core; returns u = g_k * q, shape [batch, length, heads, dim].

  alpha_kernel / beta_kernel score tokens. Shape [heads*dim, heads] ("shared", the authors'
  code: every head's score reads all heads' features) or [heads, dim] ("per_head", the paper's
  one scoring vector per head). The authors' scoring layers also have biases; a bias is constant
  over tokens, so softmax over tokens cancels it (its gradient is exactly zero) and it is omitted.

    alpha = softmax_tokens(score_alpha(q) / sqrt(d))      global query g_q = sum_i alpha_i q_i
    p_i = k_i * g_q                                       (element-wise, per head)
    beta = softmax_tokens(score_beta(p) / sqrt(d))        global key   g_k = sum_i beta_i p_i
    u_i = g_k * q_i                                       (the query doubles as the value)

  Every step is O(length): cost is linear in sequence length.
  """
  batch, length, heads, head_dim = query.shape
  scale = head_dim ** -0.5

  def scores(x, kernel):
    if kernel.ndim == 2 and kernel.shape == (heads * head_dim, heads):
      s = jnp.einsum("blf,fh->blh", x.reshape(batch, length, heads * head_dim), kernel,
                     preferred_element_type=jnp.float32)
    else:
      s = jnp.einsum("blhd,hd->blh", x, kernel, preferred_element_type=jnp.float32)
    return s * scale

  alpha = _masked_softmax_over_tokens(scores(query, alpha_kernel), padding_mask)
  global_query = jnp.einsum("blh,blhd->bhd", alpha.astype(query.dtype), query)
  mixed = key * global_query[:, None]
  beta = _masked_softmax_over_tokens(scores(mixed, beta_kernel), padding_mask)
  global_key = jnp.einsum("blh,blhd->bhd", beta.astype(mixed.dtype), mixed)
  return query * global_key[:, None]


def _shared_scoring(kernel: Array, heads: int, head_dim: int) -> Array:
  """A scoring kernel in the shared [heads*dim, heads] form; the per-head [heads, dim] form
  becomes its block-diagonal equivalent (same scores, same gradients through autodiff)."""
  if kernel.shape == (heads * head_dim, heads):
    return kernel
  return jnp.einsum("hd,hg->hdg", kernel, jnp.eye(heads, dtype=kernel.dtype)).reshape(
      heads * head_dim, heads)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _native_additive_core(q, k, mask, w_alpha, w_beta, heads):
  return _native_additive_forward(q, k, mask, w_alpha, w_beta, heads)[0]


def _native_additive_forward(q, k, mask, w_alpha, w_beta, heads):
  from textattn.attention import native  # (builds the kernels on first use)
  native.load()
  batch, length, features = q.shape
  f32 = jnp.float32
  u, alpha, beta, g_q, g_k = jax.ffi.ffi_call(
      native.ADDITIVE_FORWARD_TARGET,
      (jax.ShapeDtypeStruct(q.shape, f32),
       jax.ShapeDtypeStruct((batch, length, heads), f32),
       jax.ShapeDtypeStruct((batch, length, heads), f32),
       jax.ShapeDtypeStruct((batch, features), f32),
       jax.ShapeDtypeStruct((batch, features), f32)),
      vmap_method="sequential")(q, k, mask, w_alpha, w_beta, heads=heads,
                                threads=_native_threads(), xla_pool=_native_pool())
  return u, (q, k, mask, w_alpha, w_beta, alpha, beta, g_q, g_k)


def _native_additive_backward(heads, residuals, d_u):
  from textattn.attention import native
  q, k, mask, w_alpha, w_beta, alpha, beta, g_q, g_k = residuals
  d_q, d_k, d_w_alpha, d_w_beta = jax.ffi.ffi_call(
      native.ADDITIVE_BACKWARD_TARGET,
      (jax.ShapeDtypeStruct(q.shape, jnp.float32),) * 2
      + (jax.ShapeDtypeStruct(w_alpha.shape, jnp.float32),) * 2,
      vmap_method="sequential")(q, k, mask, w_alpha, w_beta, alpha, beta, g_q, g_k,
                                d_u.astype(jnp.float32), heads=heads, threads=_native_threads(),
                                xla_pool=_native_pool())
  return d_q, d_k, None, d_w_alpha, d_w_beta


_native_additive_core.defvjp(_native_additive_forward, _native_additive_backward)


def native_additive_attention(query: Array, key: Array, padding_mask: Array, alpha_kernel: Array,
                              beta_kernel: Array) -> Array:
  """`additive_attention` as one hand-written C++ kernel per pass (XLA FFI, CPU only).

  The same function (tests check values and gradients against float64 NumPy and
  `additive_attention`): each example's scores, masked softmaxes, pooled global query and key
  and output are computed in one pass over its [length, heads*dim] rows while they sit in
  cache, instead of XLA:CPU's ~50 ops (batched matrix-vector products with transposes, length
  reductions as reduce-window trees). First-order reverse-mode gradients only (custom VJP).
  Computes in float32 (bfloat16 inputs are upcast), on every core of the process; compiled on
  first use by `textattn.attention.native`. One device only (`check_native_devices`).
  """
  if key.shape != query.shape:
    raise ValueError(f"native_additive_attention: key {key.shape} and query {query.shape} "
                     f"must have the same [batch, length, heads, head_dim] shape.")
  batch, length, heads, head_dim = query.shape
  f32 = jnp.float32
  u = _native_additive_core(
      query.astype(f32).reshape(batch, length, heads * head_dim),
      key.astype(f32).reshape(batch, length, heads * head_dim), padding_mask.astype(jnp.int32),
      _shared_scoring(alpha_kernel.astype(f32), heads, head_dim),
      _shared_scoring(beta_kernel.astype(f32), heads, head_dim), heads)
  return u.reshape(query.shape).astype(query.dtype)


def resolve_implementation(implementation: str, attention: str = "softmax",
                           head_dim: int | None = None) -> str:
  """The kernel `implementation` means for `attention`, with 'auto' resolved.

  Softmax/causal: 'auto' -> 'native' when the run has one device and it is a CPU on which the
  native kernels build, else 'fused' (both exact; native measured faster on CPU,
  experiments/RESULTS.md; see `check_native_devices` for why not with several devices); other
  names are returned as is. Additive attention has two implementations, 'native' and 'xla' (the
  XLA function, which every other name means); 'auto' -> 'native' under the same conditions
  and head_dim a multiple of 8 (its kernel needs that), else 'xla'."""
  if attention == "additive":
    if implementation == "auto" and (head_dim is None or head_dim % 8 == 0):
      return "native" if _native_runs_here() else "xla"
    return "native" if implementation == "native" else "xla"
  if implementation != "auto":
    return implementation
  return "native" if _native_runs_here() else "fused"


def _native_runs_here() -> bool:
  if jax.default_backend() == "cpu" and jax.device_count() == 1:
    from textattn.attention import native
    return native.available()
  return False


def check_native_devices() -> None:
  """The native kernel runs with one device only (it uses every core itself). With several CPU
  devices in one process, XLA's in-process all-reduce was seen to hang around it (one run in
  about ten here; XLA then aborts the process), so it is refused rather than risked."""
  if jax.device_count() > 1:
    raise ValueError(f"config.model.attention_impl='native' needs a single device, and this "
                     f"run has {jax.device_count()}; use num_cpu_devices=0 or 1 (the kernel "
                     f"uses every core itself), or attention_impl 'auto' or 'fused'.")


def _softmax_kernel(implementation: str) -> Callable[..., Array]:
  implementation = resolve_implementation(implementation)
  return {
      "xla": softmax_attention,
      "dot_product": dot_product_attention,
      "chunked": chunked_softmax_attention,
      "fused": fused_softmax_attention,
      "native": native_softmax_attention,
      "cudnn": cudnn_attention,
  }[implementation]


def _dense_init():
  # Keras' Dense default (glorot uniform), as in the seed notebooks.
  return nn.initializers.xavier_uniform()


class SelfAttention(nn.Module):
  """Multi-head softmax self-attention (optionally causal) with Q/K/V/output projections."""
  num_heads: int
  causal: bool = False
  implementation: str = "xla"  # one of SOFTMAX_IMPLEMENTATIONS ("auto" resolved when called)
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array) -> Array:
    embed = x.shape[-1]
    head_dim = embed // self.num_heads
    dense = functools.partial(nn.DenseGeneral, features=(self.num_heads, head_dim),
                              dtype=self.dtype, kernel_init=_dense_init())
    query = dense(name="query")(x)
    key = dense(name="key")(x)
    value = dense(name="value")(x)
    out = _softmax_kernel(self.implementation)(query, key, value, padding_mask, causal=self.causal)
    return nn.DenseGeneral(embed, axis=(-2, -1), dtype=self.dtype, kernel_init=_dense_init(),
                           name="out")(out)


class AdditiveAttention(nn.Module):
  """Fastformer additive attention: output = W_o u + q (as in the authors' implementation)."""
  num_heads: int
  scoring: str = "shared"
  implementation: str = "xla"  # "native" (or "auto" resolving to it): the C++ kernel; else XLA
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array) -> Array:
    embed = x.shape[-1]
    check_attention_config("additive", self.implementation, self.scoring, embed, self.num_heads)
    heads, head_dim = self.num_heads, embed // self.num_heads
    dense = functools.partial(nn.DenseGeneral, features=(heads, head_dim), dtype=self.dtype,
                              kernel_init=_dense_init())
    query = dense(name="query")(x)
    key = dense(name="key")(x)
    score_shape = (heads * head_dim, heads) if self.scoring == "shared" else (heads, head_dim)
    alpha_kernel = self.param("alpha_kernel", _dense_init(), score_shape, jnp.float32)
    beta_kernel = self.param("beta_kernel", _dense_init(), score_shape, jnp.float32)
    native = resolve_implementation(self.implementation, "additive", head_dim) == "native"
    kernel = native_additive_attention if native else additive_attention
    u = kernel(query, key, padding_mask, alpha_kernel.astype(self.dtype),
               beta_kernel.astype(self.dtype))
    out = nn.DenseGeneral(embed, axis=(-2, -1), dtype=self.dtype, kernel_init=_dense_init(),
                          name="out")(u)
    return out + query.reshape(x.shape[:-1] + (embed,))


def check_attention_config(name: str, implementation: str, scoring: str, embed_dim: int,
                           num_heads: int) -> None:
  """Raise ValueError naming the bad field, its value and what is allowed."""
  if name not in ATTENTIONS:
    raise ValueError(f"config.model.attention={name!r} is not a known attention; "
                     f"allowed: {', '.join(ATTENTIONS)}.")
  if implementation not in SOFTMAX_IMPLEMENTATIONS:
    raise ValueError(f"config.model.attention_impl={implementation!r} is not known; "
                     f"allowed: {', '.join(SOFTMAX_IMPLEMENTATIONS)}.")
  if scoring not in ADDITIVE_SCORINGS:
    raise ValueError(f"config.model.additive_scoring={scoring!r} is not known; "
                     f"allowed: {', '.join(ADDITIVE_SCORINGS)}.")
  if num_heads < 1 or embed_dim % num_heads:
    raise ValueError(f"config.model.num_heads={num_heads} must be a positive divisor of "
                     f"config.model.embed_dim={embed_dim}.")
  if name == "additive" and implementation == "native" and (embed_dim // num_heads) % 8:
    raise ValueError(f"config.model.attention_impl='native' with additive attention needs a "
                     f"head size (embed_dim / num_heads = {embed_dim // num_heads}) that is a "
                     f"multiple of 8; use 'auto' (falls back to XLA) or 'xla'.")


def make_attention(name: str, *, num_heads: int, implementation: str = "xla",
                   scoring: str = "shared", dtype: Any = jnp.float32, embed_dim: int | None = None,
                   module_name: str | None = None) -> nn.Module:
  """The attention module called `name` (one of ATTENTIONS); all share one call signature."""
  if embed_dim is not None:
    check_attention_config(name, implementation, scoring, embed_dim, num_heads)
  elif name not in ATTENTIONS:
    check_attention_config(name, implementation, scoring, num_heads, num_heads)
  if name == "additive":
    return AdditiveAttention(num_heads=num_heads, scoring=scoring, implementation=implementation,
                             dtype=dtype, name=module_name)
  return SelfAttention(num_heads=num_heads, causal=(name == "causal"),
                       implementation=implementation, dtype=dtype, name=module_name)
