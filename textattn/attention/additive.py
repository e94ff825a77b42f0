"""Fastformer additive attention (Wu et al. 2021, arXiv 2108.09084); registers "additive" (the
authors' code's form, the query doubling as the value) and "additive_value" (the paper's, with a
value projection: XLA only; `AdditiveValueAttention`).

Linear in the sequence length. Four kernels behind one signature: `additive_attention`, the XLA
function ("xla"); `native_additive_attention`, the same maths as two C++ XLA FFI kernels (CPU,
one device, head_dim a multiple of 8); `additive_pallas.pallas_additive_attention`, Pallas
kernels in the Triton style ("pallas"; GPU, or interpret mode on a CPU); and
`additive_tpu.tpu_additive_attention`, the same algorithm as Pallas TPU (Mosaic) kernels
("pallas_tpu"; TPU, or TPU interpret mode on a CPU; benchmark label "pallas" too). Two names, not
one "pallas" dispatching per backend: they are different kernels (layouts, lowering, tests), each
allow-listed separately, and on a CPU both run (in interpret mode) and are tested. "auto" picks
native where it runs and was measured faster than xla for the shape
(textattn/attention/calibration.py); on a GPU "pallas", on a TPU "pallas_tpu", where
textattn/attention/pallas_allowlist.py lists the platform; else xla.
The scoring vectors are shared across heads as in the authors' code: each head's score reads
all heads' features (kernel [heads*dim, heads]).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from textattn.attention import (
  additive_pallas,
  additive_tpu,
  calibration,
  common,
  native,
  pallas_allowlist,
  registry,
  softmax,
)
from textattn.attention.common import Array, dense_init, masked_softmax_over_tokens, usable_cores
from textattn.errors import UsageError
from textattn.flax_layers import DenseGeneral

IMPLEMENTATIONS = ("auto", "xla", "native", "pallas", "pallas_tpu")


def additive_attention(query: Array, key: Array, padding_mask: Array, alpha_kernel: Array,
                       beta_kernel: Array) -> Array:
  """Fastformer additive attention core; returns u = g_k * q, shape [batch, length, heads, dim].

  alpha_kernel / beta_kernel [heads*dim, heads] score tokens (the authors' code: every head's
  score reads all heads' features). The authors' scoring layers also have biases; a bias is
  constant over tokens, so softmax over tokens cancels it (its gradient is exactly zero) and it
  is omitted.

    alpha = softmax_tokens(score_alpha(q) / sqrt(d))      global query g_q = sum_i alpha_i q_i
    p_i = k_i * g_q                                       (element-wise, per head)
    beta = softmax_tokens(score_beta(p) / sqrt(d))        global key   g_k = sum_i beta_i p_i
    u_i = g_k * q_i                                       (the query doubles as the value)

  Every step is O(length): cost is linear in sequence length.
  """
  return additive_value_attention(query, key, query, padding_mask, alpha_kernel, beta_kernel)


def additive_value_attention(query: Array, key: Array, value: Array, padding_mask: Array,
                             alpha_kernel: Array, beta_kernel: Array) -> Array:
  """The Fastformer paper's core (its eq. for u_i): u_i = g_k * v_i [batch, length, heads, dim],
  g_k as in `additive_attention` (which is this with the query as the value, the authors'
  code's form)."""
  beta, mixed = key_weights(query, key, padding_mask, alpha_kernel, beta_kernel)
  global_key = jnp.einsum("blh,blhd->bhd", beta.astype(mixed.dtype), mixed)
  return value * global_key[:, None].astype(value.dtype)


def token_scores(x: Array, kernel: Array) -> Array:
  """Each token's score per head, float32 [batch, length, heads]: x [b, l, heads, dim] (all
  heads' features) against a scoring kernel [heads * dim, heads], over sqrt(dim)."""
  batch, length, heads, head_dim = x.shape
  s = jnp.einsum("blf,fh->blh", x.reshape(batch, length, heads * head_dim), kernel,
                 preferred_element_type=jnp.float32)
  return s * head_dim ** -0.5


def key_weights(query: Array, key: Array, padding_mask: Array, alpha_kernel: Array,
                beta_kernel: Array) -> tuple[Array, Array]:
  """(beta [b, l, heads], p = k * g_q [b, l, heads, dim]): additive_attention's weights over
  the tokens for its global key, and the vectors they weigh."""
  alpha = masked_softmax_over_tokens(token_scores(query, alpha_kernel), padding_mask)
  global_query = jnp.einsum("blh,blhd->bhd", alpha.astype(query.dtype), query)
  mixed = key * global_query[:, None]
  return masked_softmax_over_tokens(token_scores(mixed, beta_kernel), padding_mask), mixed


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _native_additive_core(q, k, mask, w_alpha, w_beta, heads):
  return _native_additive_forward(q, k, mask, w_alpha, w_beta, heads)[0]


def _native_additive_forward(q, k, mask, w_alpha, w_beta, heads):
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
                                threads=usable_cores(), xla_pool=True)
  return u, (q, k, mask, w_alpha, w_beta, alpha, beta, g_q, g_k)


def _native_additive_backward(heads, residuals, d_u):
  q, k, mask, w_alpha, w_beta, alpha, beta, g_q, g_k = residuals
  d_q, d_k, d_w_alpha, d_w_beta = jax.ffi.ffi_call(
      native.ADDITIVE_BACKWARD_TARGET,
      (jax.ShapeDtypeStruct(q.shape, jnp.float32),) * 2
      + (jax.ShapeDtypeStruct(w_alpha.shape, jnp.float32),) * 2,
      vmap_method="sequential")(q, k, mask, w_alpha, w_beta, alpha, beta, g_q, g_k,
                                d_u.astype(jnp.float32), heads=heads, threads=usable_cores(),
                                xla_pool=True)
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
      alpha_kernel.astype(f32),
      beta_kernel.astype(f32), heads)
  return u.reshape(query.shape).astype(query.dtype)


KERNELS = {"xla": additive_attention, "native": native_additive_attention,
           "pallas": additive_pallas.pallas_additive_attention,
           "pallas_tpu": additive_tpu.tpu_additive_attention}
# The Pallas kernel of each accelerator backend ("auto" may pick it where allow-listed).
PALLAS_BY_BACKEND = {"gpu": "pallas", "tpu": "pallas_tpu"}


def calibration_problem(shape):
  """The problem textattn.attention.calibration times for an additive shape class: forward and
  backward of the core (sum of u times a fixed cotangent; gradients of the query, the key and
  both scoring kernels) with the class's heads, at the bucket's length, on `rows` examples
  (a multiple of the thread count, rows * length about 8K tokens, at most 32), padded as
  calibration.padding_lengths says."""
  import numpy as np

  length, threads, heads = shape.length, shape.threads, shape.heads
  rows = threads * max(1, min(32, (1 << 13) // length) // threads)
  dtype = jnp.dtype(shape.dtype)
  rng = np.random.default_rng(0)
  q, k, cotangent = (jnp.asarray(rng.standard_normal((rows, length, heads, shape.head_dim)),
                                 dtype) for _ in range(3))
  w_alpha, w_beta = (jnp.asarray(0.05 * rng.standard_normal((heads * shape.head_dim, heads)),
                                 dtype) for _ in range(2))
  real = np.asarray(calibration.padding_lengths(rows, length))
  mask = jnp.asarray(np.arange(length)[None, :] < real[:, None])

  def problem(name):
    def loss(q, k, w_alpha, w_beta):
      u = KERNELS[name](q, k, mask, w_alpha, w_beta)
      return jnp.sum((u * cotangent).astype(jnp.float32))
    return jax.value_and_grad(loss, argnums=(0, 1, 2, 3)), (q, k, w_alpha, w_beta)
  return problem


def resolve(implementation: str, head_dim: int | None = None, dtype: str = "float32", *,
            length: int | None = None, num_heads: int | None = None) -> str:
  """'auto' -> on a one-device CPU where the native kernels serve this run and head_dim is a
  multiple of 8 (its kernel needs that), 'native' where textattn.attention.calibration measured
  it faster than 'xla' for this shape class (`length`, `head_dim`, `num_heads`; without them,
  'native'), else 'xla'; on a GPU 'pallas', on a TPU 'pallas_tpu', where the allow-list names
  this device kind and JAX version (pallas_allowlist.py: a run there vouched for it), else 'xla'
  with the reason warned once; 'xla' elsewhere (memory-bound, linear in length, and XLA fuses
  it)."""
  if implementation != "auto":
    return implementation
  if common.backend() in PALLAS_BY_BACKEND:
    reason = pallas_allowlist.refusal("additive")
    if reason is None:
      return PALLAS_BY_BACKEND[common.backend()]
    softmax.warn_fallback("additive", "xla", reason)
    return "xla"
  if head_dim is not None and head_dim % 8:
    return "xla"
  if softmax.native_runs_here():
    if length is None or head_dim is None or num_heads is None:
      return "native"
    shape = calibration.shape("additive", length, head_dim, str(dtype), heads=num_heads)
    return calibration.choose(shape, "xla", lambda: calibration_problem(shape))
  if common.backend() == "cpu":  # (elsewhere 'xla' is the platform's best: no warning)
    softmax.warn_fallback("additive", "xla")
  return "xla"


def check(implementation: str, embed_dim: int, num_heads: int, dtype: str = "float32") -> None:
  del dtype
  registry.check_choice("model.attention_impl", implementation, IMPLEMENTATIONS)
  registry.check_heads(embed_dim, num_heads)
  if implementation == "native":
    if (embed_dim // num_heads) % 8:
      raise UsageError(f"config.model.attention_impl='native' with additive attention needs a "
                       f"head size (embed_dim / num_heads = {embed_dim // num_heads}) that is a "
                       f"multiple of 8; use 'auto' (falls back to XLA) or 'xla'.")
    softmax.check_native_here()
  if implementation == "pallas" and common.backend() not in ("gpu", "cpu"):
    raise UsageError(f"config.model.attention_impl='pallas' with additive attention runs on a GPU "
                     f"(or in interpret mode on a CPU), not on the {common.backend()} "
                     f"backend; use 'auto', 'xla' or (on a TPU) 'pallas_tpu'.")
  if implementation == "pallas_tpu" and common.backend() not in ("tpu", "cpu"):
    raise UsageError(f"config.model.attention_impl='pallas_tpu' with additive attention runs on a "
                     f"TPU (or in TPU interpret mode on a CPU), not on the "
                     f"{common.backend()} backend; use 'auto', 'xla' or (on a GPU) 'pallas'.")


def fastformer_projections(module: nn.Module, x: Array, num_heads: int, dtype: Any):
  """Fastformer's per-head query and key projections [.., heads, head_dim] and its two scoring
  kernels [heads * head_dim, heads] (alpha for the queries, beta for the keys): parameters of
  `module`, called from its compact __call__ (shared by the bidirectional and causal forms)."""
  heads, head_dim = num_heads, x.shape[-1] // num_heads
  dense = functools.partial(DenseGeneral, features=(heads, head_dim), dtype=dtype,
                            kernel_init=dense_init())
  query, key = dense(name="query")(x), dense(name="key")(x)
  alpha_kernel = module.param("alpha_kernel", dense_init(), (heads * head_dim, heads), jnp.float32)
  beta_kernel = module.param("beta_kernel", dense_init(), (heads * head_dim, heads), jnp.float32)
  return query, key, alpha_kernel, beta_kernel


def fastformer_output(u: Array, query: Array, dtype: Any, residual: bool = True) -> Array:
  """W_o u + q (the authors' residual to the query; W_o u without it), [.., heads, head_dim] ->
  [.., embed]."""
  embed = query.shape[-2] * query.shape[-1]
  out = DenseGeneral(embed, axis=(-2, -1), dtype=dtype, kernel_init=dense_init(),
                     name="out")(u)
  return out + query.reshape(query.shape[:-2] + (embed,)) if residual else out


class AdditiveAttention(nn.Module):
  """Fastformer additive attention: output = W_o u + q (as in the authors' implementation)."""
  num_heads: int
  implementation: str = "xla"  # a key of KERNELS, or "auto" (resolved when called)
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array) -> Array:
    query, key, alpha_kernel, beta_kernel = fastformer_projections(self, x, self.num_heads,
                                                                   self.dtype)
    kernel = KERNELS[resolve(self.implementation, query.shape[-1], jnp.dtype(self.dtype).name,
                             length=x.shape[1], num_heads=self.num_heads)]
    u = kernel(query, key, padding_mask, alpha_kernel.astype(self.dtype),
               beta_kernel.astype(self.dtype))
    return fastformer_output(u, query, self.dtype)


registry.register(registry.Variant(
    name="additive",
    build=AdditiveAttention,
    implementations=IMPLEMENTATIONS,
    resolve=resolve,
    check=check,
    kernels=(("xla", "linear (XLA)"), ("native", "native"), ("pallas", "pallas"),
             ("pallas_tpu", "pallas")),
    core_bytes=lambda batch, length, heads, head_dim, itemsize, backward: (
        additive_pallas.core_bytes(batch, length, heads * head_dim, itemsize, backward)),
    description="Fastformer additive attention, linear in length (arXiv 2108.09084)"))


class AdditiveValueAttention(nn.Module):
  """Fastformer's output as its paper writes it: W_o (g_k * v) + q, v a value projection named
  "value" (softmax's name, so a pretrained encoder's value weights start it: issue 55), one
  kernel (XLA); "additive" is the authors' code's form (u = g_k * q). The scoring is
  "additive"'s (the authors' code's kernels [heads * dim, heads], shared across heads).
  query_residual=False (config.model.additive_value.query_residual) drops the "+ q":
  W_o (g_k * v), a softmax layer's shape and parameters plus the two scoring kernels."""
  num_heads: int
  implementation: str = "xla"
  dtype: Any = jnp.float32
  query_residual: bool = True

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array) -> Array:
    query, key, alpha_kernel, beta_kernel = fastformer_projections(self, x, self.num_heads,
                                                                   self.dtype)
    value = DenseGeneral(features=query.shape[-2:], dtype=self.dtype, kernel_init=dense_init(),
                         name="value")(x)
    u = additive_value_attention(query, key, value, padding_mask,
                                 alpha_kernel.astype(self.dtype), beta_kernel.astype(self.dtype))
    return fastformer_output(u, query, self.dtype, residual=self.query_residual)


def _value_keywords(query_residual) -> dict:
  if not isinstance(query_residual, bool):
    raise UsageError(f"config.model.additive_value.query_residual={query_residual!r} must be "
                     f"True (the paper's W_o u + q) or False (W_o u).")
  return {"query_residual": query_residual}


registry.register(registry.Variant(
    name="additive_value",
    build=AdditiveValueAttention,
    options="additive_value",
    option_defaults=(("query_residual", True),),
    option_keywords=_value_keywords,
    kernels=(("xla", "linear (XLA)"),),
    description="Fastformer additive attention with a value projection, as the paper writes it "
                "(u_i = g_k * v_i; 'additive' reuses the query)"))
