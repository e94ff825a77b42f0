"""Causal Fastformer additive attention, two forms; registers "causal_additive" (direct) and
"causal_additive_recurrent" (recurrent).

Fastformer (textattn/attention/additive.py) pools the whole sequence twice: a global query
g_q = sum_i alpha_i q_i, then a global key g_k = sum_i beta_i p_i with p_i = g_q * k_i. Made
causal, position t may use positions <= t only, and there are two honest ways to do that:

- **direct** ("causal_additive"): exactly the bidirectional definition restricted to the prefix.
  g_q(t) = sum_{i<=t} softmax_{i<=t}(a_i) q_i, with a_i = score_alpha(q_i); every earlier key is
  re-scored with that prefix's global query, p_i(t) = g_q(t) * k_i and
  g_k(t) = sum_{i<=t} softmax_{i<=t}(score_beta(p_i(t))) p_i(t). Prefix semantics are exact,
  but the beta scores depend on t, so training costs O(length^2) and decoding O(t) per token
  (the keys are cached), like softmax attention.
- **recurrent** ("causal_additive_recurrent"): each key is scored once, with the global query
  of its own position: p_i = g_q(i) * k_i, g_k(t) = sum_{i<=t} softmax_{i<=t}(score_beta(p_i))
  p_i. Both global vectors are then running softmax-weighted sums, so training is O(length)
  (an associative scan) and decoding is O(1) per token from a fixed-size state (`init_state`,
  `recurrent_step`). It is not the same function as the direct form: an early key keeps the
  score it got from an early, less informed global query.

Both output u_t = g_k(t) * q_t, then (as the bidirectional module) W_o u + q. Segments (packed
documents, `segment_ids`): both running sums restart at each segment start (a segmented scan; in
the chunked form a masked chunk and a carry kept only within its segment), and the direct form
pools only its own segment's keys. Padding keys get no
weight; a position whose prefix has no real token outputs u = 0. Running sums are kept
stable as (max, sum of exp(score - max) * value, sum of exp(score - max)). Scores and sums are
float32 whatever the activations' dtype.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from textattn.attention import causal_additive_pallas, common, pallas_allowlist, registry, softmax
from textattn.attention.additive import fastformer_output, fastformer_projections
from textattn.attention.common import MASK_VALUE, Array
from textattn.errors import UsageError

FORMS = ("direct", "recurrent")


def _scores(x: Array, kernel: Array) -> Array:
  """score(x) of [batch, length, heads, dim] features -> float32 [batch, length, heads]."""
  batch, length, heads, head_dim = x.shape
  s = jnp.einsum("blf,fh->blh", x.reshape(batch, length, heads * head_dim).astype(jnp.float32),
                 kernel.astype(jnp.float32))
  return s * head_dim ** -0.5


def _combine(a, b):
  """Associative merge of two running softmax sums (max, weighted values, weights)."""
  m_a, v_a, w_a = a
  m_b, v_b, w_b = b
  m = jnp.maximum(m_a, m_b)
  scale_a, scale_b = jnp.exp(m_a - m), jnp.exp(m_b - m)
  return m, v_a * scale_a[..., None] + v_b * scale_b[..., None], w_a * scale_a + w_b * scale_b


def _combine_runs(a, b):
  """`_combine` within a segment: an interval's sums cover only its last run's positions, so
  an earlier interval whose last run is not the later one's is dropped (a segmented scan)."""
  run_a, *sums_a = a
  run_b, *sums_b = b
  m, v, w = _combine(sums_a, sums_b)
  same = run_a == run_b  # [b, l, 1]
  m_b, v_b, w_b = sums_b
  return (run_b, jnp.where(same, m, m_b), jnp.where(same[..., None], v, v_b),
          jnp.where(same, w, w_b))


def prefix_softmax_sum(scores: Array, values: Array, mask: Array,
                       runs: Array | None = None) -> Array:
  """out[:, t] = sum_{i<=t, mask_i} softmax_{i<=t, mask_i}(scores)_i values_i, per head.

  scores float32 [batch, length, heads]; values [batch, length, heads, dim]; mask bool
  [batch, length]. A prefix without a real position gives 0. O(length) (associative scan).
  runs int32 [batch, length] (`common.segment_runs`): only positions i of t's own run count.
  """
  real = mask[:, :, None]
  m = jnp.where(real, scores, MASK_VALUE)
  w = jnp.broadcast_to(real, scores.shape).astype(jnp.float32)
  v = values.astype(jnp.float32) * w[..., None]
  if runs is None:
    _, total_v, total_w = jax.lax.associative_scan(_combine, (m, v, w), axis=1)
  else:
    _, _, total_v, total_w = jax.lax.associative_scan(_combine_runs, (runs[:, :, None], m, v, w),
                                                      axis=1)
  return jnp.where(total_w[..., None] > 0, total_v / jnp.maximum(total_w, 1e-30)[..., None], 0.0)


def recurrent_causal_additive(query: Array, key: Array, padding_mask: Array, alpha_kernel: Array,
                              beta_kernel: Array, runs: Array | None = None) -> Array:
  """The recurrent form's u [batch, length, heads, dim] (module docstring), O(length); runs:
  `prefix_softmax_sum`'s (segments)."""
  global_query = prefix_softmax_sum(_scores(query, alpha_kernel), query, padding_mask, runs)
  mixed = key.astype(jnp.float32) * global_query  # p_i = g_q(i) * k_i
  global_key = prefix_softmax_sum(_scores(mixed, beta_kernel), mixed, padding_mask, runs)
  return (query.astype(jnp.float32) * global_key).astype(query.dtype)


def _chunk_prefix_softmax_sum(carry, scores, values, real, runs=None):
  """One chunk of `prefix_softmax_sum`, as matrix products: carry (max [b, h], weighted values
  [b, h, d], weights [b, h]) of the positions before the chunk; scores float32 [b, c, h], values
  float32 [b, c, h, d], real bool [b, c]. Returns (the carry after the chunk, out [b, c, h, d]).

  A position's weight does not depend on t, so out[t] is a weighted cumulative sum: a masked
  [c, c] matrix W[t, i] = exp(s_i - m_t) [i <= t, real_i] times the values (and times 1 for the
  normaliser). m_t is the row's own running max (the cumulative max inside the chunk merged
  with the carried one), not one max per chunk: with one max, a row whose prefix scores lie far
  below a later score of the chunk would underflow to 0 / 0. The carried sums are rescaled by
  exp(M - m_t). The maxima only stabilise (the result does not depend on them), so no gradient
  flows through them.
  """
  if runs is not None:
    return _chunk_prefix_softmax_sum_in_runs(carry, scores, values, real, runs)
  carried_max, carried_values, carried_weights = carry
  chunk = scores.shape[1]
  scores = jnp.where(real[:, :, None], scores, MASK_VALUE)
  row_max = jax.lax.stop_gradient(
      jnp.maximum(jax.lax.cummax(scores, axis=1), carried_max[:, None]))  # m_t [b, c, h]
  visible = (jnp.tril(jnp.ones((chunk, chunk), bool))[None, :, :, None]
             & real[:, None, :, None])  # [b, t, i, 1]
  # Exponent only where visible: exp(s_i - m_t) of a later i can overflow (and inf * 0 = NaN).
  exponent = jnp.where(visible, scores[:, None, :, :] - row_max[:, :, None, :], MASK_VALUE)
  weights = jnp.exp(exponent)  # W [b, t, i, h]
  carried_scale = jnp.exp(carried_max[:, None] - row_max)  # exp(M - m_t) [b, t, h]
  out_values = (jnp.einsum("btih,bihd->bthd", weights, values)
                + carried_scale[..., None] * carried_values[:, None])
  out_weights = jnp.sum(weights, axis=2) + carried_scale * carried_weights[:, None]
  mean = jnp.where(out_weights[..., None] > 0,
                   out_values / jnp.maximum(out_weights, 1e-30)[..., None], 0.0)
  return (row_max[:, -1], out_values[:, -1], out_weights[:, -1]), mean


def _chunk_prefix_softmax_sum_in_runs(carry, scores, values, real, runs):
  """`_chunk_prefix_softmax_sum` where a position sees only its own run (segment): carry also
  holds the run of the chunk's last position [b]; the carried sums count for a row only if it is
  in that run, W[t, i] also needs i in t's run, and m_t is the max over what row t sees (a
  cumulative max across a boundary could sit far above a later segment's scores)."""
  carried_max, carried_values, carried_weights, carried_run = carry
  chunk = scores.shape[1]
  visible = (jnp.tril(jnp.ones((chunk, chunk), bool))[None]
             & real[:, None, :] & (runs[:, :, None] == runs[:, None, :]))[..., None]
  exponent = jnp.where(visible, scores[:, None, :, :], MASK_VALUE)  # s_i seen by t [b, t, i, h]
  continues = (runs == carried_run[:, None])[:, :, None]  # row t is in the carried run [b, t, 1]
  row_max = jax.lax.stop_gradient(jnp.maximum(
      jnp.max(exponent, axis=2), jnp.where(continues, carried_max[:, None], MASK_VALUE)))
  weights = jnp.exp(jnp.where(visible, exponent - row_max[:, :, None, :], MASK_VALUE))
  # (exp of a masked exponent, not a masked exp: exp(M - m_t) of another run can overflow.)
  carried_scale = jnp.exp(jnp.where(continues, carried_max[:, None] - row_max, MASK_VALUE))
  out_values = (jnp.einsum("btih,bihd->bthd", weights, values)
                + carried_scale[..., None] * carried_values[:, None])
  out_weights = jnp.sum(weights, axis=2) + carried_scale * carried_weights[:, None]
  return ((row_max[:, -1], out_values[:, -1], out_weights[:, -1], runs[:, -1]),
          common.merged_mean(out_values, out_weights))


def chunked_recurrent_causal_additive(query: Array, key: Array, padding_mask: Array,
                                      alpha_kernel: Array, beta_kernel: Array,
                                      runs: Array | None = None, *,
                                      chunk_size: int = 64) -> Array:
  """The recurrent form (`recurrent_causal_additive`) computed chunk by chunk, the layout
  causal linear attention uses on tensor cores (GLA / flash-linear-attention's "chunk" mode).

  A lax.scan over chunks of `chunk_size` positions carries both running softmax sums; inside a
  chunk each pooling is one masked [chunk, chunk] matrix product (`_chunk_prefix_softmax_sum`),
  the alpha pooling first, since the chunk's beta scores read its g_q. Work O(length * chunk),
  sequential depth length / chunk. The chunk body is rematerialised (jax.checkpoint), so the
  backward (autodiff through the scan) holds one chunk's [chunk, chunk] weights at a time.
  The length is padded to a multiple of the chunk with padding positions, which change nothing.
  """
  batch, length, heads, head_dim = query.shape
  chunk = max(1, min(chunk_size, length))
  num_chunks = -(-length // chunk)
  extra = num_chunks * chunk - length
  f32 = jnp.float32

  def split(x, fill=0):  # [b, L, ...] -> [chunks, b, chunk, ...]
    x = jnp.pad(x, [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2), constant_values=fill)
    return x.reshape((batch, num_chunks, chunk) + x.shape[2:]).swapaxes(0, 1)

  @jax.checkpoint
  def one_chunk(carry, inputs):
    alpha_carry, beta_carry = carry
    q, k, real, chunk_runs = inputs  # (chunk_runs: None without segments)
    alpha_carry, global_query = _chunk_prefix_softmax_sum(
        alpha_carry, _scores(q, alpha_kernel), q.astype(f32), real, chunk_runs)
    mixed = k.astype(f32) * global_query  # p_i = g_q(i) * k_i
    beta_carry, global_key = _chunk_prefix_softmax_sum(
        beta_carry, _scores(mixed, beta_kernel), mixed, real, chunk_runs)
    u = (q.astype(f32) * global_key).astype(query.dtype)
    return (alpha_carry, beta_carry), u

  state = init_state(batch, heads, head_dim)
  alpha = (state.alpha_max, state.alpha_values, state.alpha_weights)
  beta = (state.beta_max, state.beta_values, state.beta_weights)
  if runs is not None:  # (the first chunk's rows continue run -1: none)
    alpha, beta = (alpha + (jnp.full((batch,), -1, jnp.int32),),
                   beta + (jnp.full((batch,), -1, jnp.int32),))
  # (Padding positions past the end get run -2: a run of their own, after every real one.)
  chunk_runs = None if runs is None else split(runs, fill=-2)
  _, u = jax.lax.scan(one_chunk, (alpha, beta),
                      (split(query), split(key), split(padding_mask), chunk_runs))
  return u.swapaxes(0, 1).reshape(batch, num_chunks * chunk, heads, head_dim)[:, :length]


def direct_causal_additive(query: Array, key: Array, padding_mask: Array, alpha_kernel: Array,
                           beta_kernel: Array, runs: Array | None = None) -> Array:
  """The direct form's u [batch, length, heads, dim] (module docstring), O(length^2); runs:
  `prefix_softmax_sum`'s (segments)."""
  batch, length, heads, head_dim = query.shape
  global_query = prefix_softmax_sum(_scores(query, alpha_kernel), query, padding_mask, runs)
  k = key.astype(jnp.float32).reshape(batch, length, heads * head_dim)
  g = global_query.reshape(batch, length, heads * head_dim)
  # score_beta(g_q(t) * k_i) = sum_f k_i[f] g_q(t)[f] W[f, h], for every (t, i): [b, t, i, h].
  scores = jnp.einsum("bif,btf,fh->btih", k, g, beta_kernel.astype(jnp.float32))
  scores = scores * head_dim ** -0.5
  visible = (padding_mask[:, None, :] & jnp.tril(jnp.ones((length, length), bool))[None])
  if runs is not None:
    visible = visible & (runs[:, :, None] == runs[:, None, :])
  scores = jnp.where(visible[..., None], scores, MASK_VALUE)
  beta = jax.nn.softmax(scores, axis=2) * visible[..., None]
  # g_k(t) = sum_i beta_ti p_i(t) = g_q(t) * sum_i beta_ti k_i   (per head)
  pooled_keys = jnp.einsum("btih,bihd->bthd", beta, key.astype(jnp.float32))
  global_key = global_query * pooled_keys
  return (query.astype(jnp.float32) * global_key).astype(query.dtype)


class State(NamedTuple):
  """The recurrent form's decoding state after some tokens: two running softmax sums."""
  alpha_max: Array  # [batch, heads]
  alpha_values: Array  # [batch, heads, dim]
  alpha_weights: Array  # [batch, heads]
  beta_max: Array
  beta_values: Array
  beta_weights: Array


def init_state(batch: int, heads: int, head_dim: int) -> State:
  m = jnp.full((batch, heads), MASK_VALUE, jnp.float32)
  v = jnp.zeros((batch, heads, head_dim), jnp.float32)
  w = jnp.zeros((batch, heads), jnp.float32)
  return State(m, v, w, m, v, w)


def recurrent_step(state: State, query: Array, key: Array, real: Array, alpha_kernel: Array,
                   beta_kernel: Array) -> tuple[State, Array]:
  """One position of the recurrent form in O(1): query/key [batch, heads, dim], real bool
  [batch] (False: a padding position, which changes nothing and outputs 0) -> (state, u)."""
  q = query[:, None]
  mask = real[:, None, None]

  def push(m, v, w, scores, values):
    new = _combine((m, v, w), (jnp.where(mask[..., 0], scores, MASK_VALUE),
                               values * mask, mask[..., 0].astype(jnp.float32)))
    mean = jnp.where(new[2][..., None] > 0, new[1] / jnp.maximum(new[2], 1e-30)[..., None], 0.0)
    return new, mean

  (am, av, aw), global_query = push(state.alpha_max, state.alpha_values, state.alpha_weights,
                                    _scores(q, alpha_kernel)[:, 0], q[:, 0].astype(jnp.float32))
  mixed = key.astype(jnp.float32) * global_query
  (bm, bv, bw), global_key = push(state.beta_max, state.beta_values, state.beta_weights,
                                  _scores(mixed[:, None], beta_kernel)[:, 0], mixed)
  u = jnp.where(real[:, None, None], query.astype(jnp.float32) * global_key, 0.0)
  return State(am, av, aw, bm, bv, bw), u.astype(query.dtype)


CORES = {"direct": direct_causal_additive, "recurrent": recurrent_causal_additive}
# The recurrent form's kernels by implementation name (the direct form has "xla" only): "xla"
# is the associative scan, "chunked" the chunk-by-chunk matrix form, "pallas" the chunked form
# as a Pallas kernel (causal_additive_pallas.py; GPU, or interpret mode on a CPU); all the same
# function.
RECURRENT_KERNELS = {"xla": recurrent_causal_additive,
                     "chunked": chunked_recurrent_causal_additive,
                     "pallas": causal_additive_pallas.pallas_recurrent_causal_additive}
IMPLEMENTATIONS = {"direct": ("auto", "xla"), "recurrent": ("auto",) + tuple(RECURRENT_KERNELS)}


def resolve(implementation: str, head_dim: int | None = None, dtype: str = "float32",
            form: str = "recurrent") -> str:
  """'auto' -> 'xla' (the scan; the direct form has no other kernel). The chunked form has not
  been timed against the scan on an accelerator yet (issue 42 item 8), so it is chosen by name
  only; the Pallas kernel on a GPU the allow-list names (pallas_allowlist.py), elsewhere on a
  GPU the scan, with the reason warned once."""
  del head_dim, dtype
  if implementation != "auto":
    return implementation
  if form == "recurrent" and common.backend() == "gpu":
    reason = pallas_allowlist.refusal("causal_additive_recurrent")
    if reason is None:
      return "pallas"
    softmax.warn_fallback("causal_additive_recurrent", "xla", reason)
  return "xla"


class CausalAdditiveAttention(nn.Module):
  """Causal Fastformer attention, output = W_o u + q (as the bidirectional module)."""
  num_heads: int
  form: str = "recurrent"
  implementation: str = "xla"
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array, decode: bool = False,
               segment_ids: Array | None = None) -> Array:
    """decode=True as softmax's SelfAttention: a first whole-length call allocates the
    "cache" (recurrent: the running sums only, O(1) in length; direct: those plus every key so
    far), then one position [batch, 1, embed] per call. segment_ids (int32 [batch, length],
    0 = padding, each segment one contiguous run): a position pools only the earlier positions
    of its own segment; not taken while decoding (decode one document a row)."""
    if segment_ids is not None and decode and self.has_variable("cache", "state"):
      raise ValueError("causal additive decoding takes no segment ids: decode one document a "
                       "row.")
    query, key, alpha_kernel, beta_kernel = fastformer_projections(self, x, self.num_heads,
                                                                   self.dtype)
    heads, head_dim = query.shape[-2:]
    if decode and self.has_variable("cache", "state"):
      u = self._decode_step(query, key, padding_mask, alpha_kernel, beta_kernel)
    else:
      if decode:
        batch, length = padding_mask.shape
        self.variable("cache", "state", init_state, batch, heads, head_dim)
        if self.form == "direct":
          self.variable("cache", "keys", jnp.zeros, (batch, length, heads, head_dim),
                        jnp.float32)
          self.variable("cache", "mask", jnp.zeros, (batch, length), bool)
          self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
      if segment_ids is None:
        u = self._kernel()(query, key, padding_mask, alpha_kernel, beta_kernel)
      else:
        real, runs = common.segment_runs(padding_mask, segment_ids)
        u = self._kernel()(query, key, real, alpha_kernel, beta_kernel, runs)
    return fastformer_output(u, query, self.dtype)

  def _kernel(self):
    """The whole-sequence kernel (each takes segments: runs as a sixth argument); decoding steps
    are the same for every implementation."""
    if self.form == "direct":
      return direct_causal_additive
    return RECURRENT_KERNELS[resolve(self.implementation, form=self.form)]

  def _decode_step(self, query, key, padding_mask, alpha_kernel, beta_kernel):
    cache = self.variable("cache", "state")
    real = padding_mask[:, 0].astype(bool)
    if self.form == "recurrent":
      cache.value, u = recurrent_step(cache.value, query[:, 0], key[:, 0], real, alpha_kernel,
                                      beta_kernel)
      return u[:, None]
    # Direct: the running global query, then every cached key re-scored with it (O(t)).
    state, _ = recurrent_step(cache.value, query[:, 0], key[:, 0], real, alpha_kernel,
                              beta_kernel)  # (only its alpha sums are used)
    cache.value = state
    global_query = jnp.where(state.alpha_weights[..., None] > 0, state.alpha_values
                             / jnp.maximum(state.alpha_weights, 1e-30)[..., None], 0.0)
    keys, mask = self.variable("cache", "keys"), self.variable("cache", "mask")
    index = self.variable("cache", "index")
    i = index.value
    keys.value = jax.lax.dynamic_update_slice(keys.value, key.astype(jnp.float32), (0, i, 0, 0))
    mask.value = jax.lax.dynamic_update_slice(mask.value, real[:, None], (0, i))
    index.value = i + 1
    batch, length, heads, head_dim = keys.value.shape
    visible = mask.value & (jnp.arange(length) <= i)[None]
    scores = jnp.einsum("bif,bf,fh->bih", keys.value.reshape(batch, length, heads * head_dim),
                        global_query.reshape(batch, heads * head_dim),
                        beta_kernel.astype(jnp.float32)) * head_dim ** -0.5
    beta = jax.nn.softmax(jnp.where(visible[..., None], scores, MASK_VALUE), axis=1)
    pooled = jnp.einsum("bih,bihd->bhd", beta * visible[..., None], keys.value)
    u = query[:, 0].astype(jnp.float32) * global_query * pooled
    return jnp.where(real[:, None, None], u, 0.0).astype(query.dtype)[:, None]


def _checker(form: str):
  def check(implementation: str, embed_dim: int, num_heads: int, dtype: str = "float32") -> None:
    del dtype
    registry.check_choice("model.attention_impl", implementation, IMPLEMENTATIONS[form])
    registry.check_heads(embed_dim, num_heads)
    if implementation == "pallas" and common.backend() not in ("gpu", "cpu"):
      raise UsageError(f"config.model.attention_impl='pallas' with causal additive attention "
                       f"runs on a GPU (or in interpret mode on a CPU), not on the "
                       f"{common.backend()} backend; use 'auto', 'xla' or 'chunked'.")
  return check


registry.register(registry.Variant(
    name="causal_additive",
    build=functools.partial(CausalAdditiveAttention, form="direct"),
    implementations=IMPLEMENTATIONS["direct"],
    resolve=functools.partial(resolve, form="direct"),
    check=_checker("direct"),
    causal=True,
    segment_ids=True,
    kernels=(("xla", "direct causal (XLA)"),),
    description="causal Fastformer, direct form: exact prefix semantics, O(length^2)"))

registry.register(registry.Variant(
    name="causal_additive_recurrent",
    build=functools.partial(CausalAdditiveAttention, form="recurrent"),
    implementations=IMPLEMENTATIONS["recurrent"],
    resolve=resolve,
    check=_checker("recurrent"),
    causal=True,
    segment_ids=True,
    kernels=(("xla", "scan"), ("chunked", "chunked"), ("pallas", "pallas")),
    description="causal Fastformer, recurrent form: keys scored once, O(length), O(1) decoding"))
