"""What the recurrent families' layers share: the short causal convolution, the gated RMS norms,
the forms behind `config.model.attention_impl`, and decoding against the "cache" collection.

A family's layer (retnet.py, gla.py, mamba2.py, ...) is projections, gates, convolution and
output norm around one `apply_core` call, as flash-linear-attention's fla/layers are.

Decoding (decode=True), the protocol every textattn variant follows (softmax.SelfAttention): a
first call (the whole [batch, max_len] dummy) allocates the cache, then each call feeds tokens
[batch, n, embed]: one token through the family's step, O(state) whatever the length decoded; n > 1
(a prompt: prefill) through the chunked form from the cached state, whose final state decoding
continues from. The cache: "state" [batch, heads, key, value] (at least float32), "segment" (the
last real token's segment id: a new id empties the state and the convolution's buffer), "index"
(positions decoded, for rotary), the convolutions' buffers. Prefill takes no segment ids (one
document a row, as the samplers decode).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from textattn.attention.common import dense_init
from textattn.attention.recurrent.chunking import document_runs
from textattn.flax_layers import DenseGeneral

Array = jax.Array
NORM_EPSILON = 1e-5  # flash-linear-attention's norm_eps and Mamba-2's


class Core(NamedTuple):
  """A family's core in its forms (recurrent/__init__.py's conventions): recurrent and chunked
  take (q, k, v, *gates, scale=, initial_state=, segment_ids=, mask=[, chunk_size=]); step takes
  (state, q_t, k_t, v_t, *gates_t, scale=, reset=, real=)."""
  recurrent: Callable[..., tuple[Array, Array]]
  chunked: Callable[..., tuple[Array, Array]]
  step: Callable[..., tuple[Array, Array]]
  # sharded(q, k, v, *gates, scale=, mesh=, mask=, segment_ids=, chunk_size=) -> out: the
  # chunked form with the length split over the mesh's "sequence" axis (recurrent/parallel.py).
  sharded: Callable[..., Array] | None = None


FORMS = ("auto", "chunked", "recurrent")
KERNEL_LABELS = (("chunked", "chunked (scan over chunks)"), ("recurrent", "recurrent (scan)"))


def resolve(implementation: str, head_dim: int | None = None, dtype: str = "float32", **_) -> str:
  """'auto' -> 'chunked' (exact, matrix products per chunk; the recurrent form is the reference,
  sequential over tokens); other names as they are."""
  del head_dim, dtype
  return "chunked" if implementation == "auto" else implementation


def _cache_segment(module: nn.Module, segment_ids: Array | None, padding_mask: Array):
  """(real [b], reset [b]) of a one-token call, updating the cache's last segment id."""
  real = padding_mask[:, 0].astype(bool)
  if segment_ids is None:
    return real, None
  segment = module.variable("cache", "segment")
  ids = segment_ids[:, 0].astype(jnp.int32)
  real = real & (ids != 0)
  reset = real & (ids != segment.value) & (segment.value != 0)
  segment.value = jnp.where(real, ids, segment.value)
  return real, reset


def decode_mode(module: nn.Module, decode: bool) -> str:
  """'off' (training), 'allocate' (decode's first call) or 'step' (a later decode call)."""
  if not decode:
    return "off"
  return "step" if module.has_variable("cache", "state") else "allocate"


def decode_signals(module: nn.Module, mode: str, padding_mask: Array,
                   segment_ids: Array | None) -> tuple[Array | None, Array | None]:
  """(real, reset) bool [batch] for a one-token step (None, None otherwise); allocates the
  segment cache on the first decode call."""
  if mode == "allocate":
    module.variable("cache", "segment", jnp.zeros, (padding_mask.shape[0],), jnp.int32)
  if mode != "step" or padding_mask.shape[1] != 1:
    return None, None
  return _cache_segment(module, segment_ids, padding_mask)


def apply_core(module: nn.Module, core: Core, mode: str, q: Array, k: Array, v: Array,
               gates: tuple[Array, ...], *, scale: float, padding_mask: Array,
               segment_ids: Array | None, real: Array | None = None,
               reset: Array | None = None) -> Array:
  """The core in the module's form (its `implementation`, `chunk_size` and `mesh` fields), or
  decoding against the cache (module docstring). q, k [b, l, key_heads, key]; v [b, l, heads,
  value]; gates per-token arrays [b, l, ...]; (real, reset) from `decode_signals`."""
  implementation, chunk_size, mesh = module.implementation, module.chunk_size, module.mesh
  batch, length, heads, value_dim = v.shape
  if mode == "step":
    state = module.variable("cache", "state")
    if length == 1:
      state.value, out = core.step(state.value, q[:, 0], k[:, 0], v[:, 0],
                                   *(g[:, 0] for g in gates), scale=scale, reset=reset,
                                   real=real)
      return out[:, None].astype(v.dtype)
    if segment_ids is not None:
      raise ValueError("prefill (several tokens in one decode call) takes no segment ids: "
                       "decode one document a row.")
    out, state.value = core.chunked(q, k, v, *gates, scale=scale, initial_state=state.value,
                                    mask=padding_mask, chunk_size=chunk_size)
    return out
  if mode == "allocate":
    dtype = jnp.promote_types(v.dtype, jnp.float32)
    module.variable("cache", "state", jnp.zeros, (batch, heads, k.shape[-1], value_dim), dtype)
  if mesh is not None and mode == "off":  # (sequence parallelism: training and evaluation)
    return core.sharded(q, k, v, *gates, scale=scale, mesh=mesh, mask=padding_mask,
                        segment_ids=segment_ids, chunk_size=chunk_size)
  form = resolve(implementation)
  keywords = {"chunk_size": chunk_size} if form == "chunked" else {}
  out, _ = getattr(core, form)(q, k, v, *gates, scale=scale, segment_ids=segment_ids,
                               mask=padding_mask, **keywords)
  return out


class ShortConvolution(nn.Module):
  """A causal depthwise convolution over time (Mamba-2's conv1d, flash-linear-attention's
  ShortConvolution): y_t = sum_w weight[w] x_{t - width + 1 + w} (+ bias), then SiLU, over the
  real positions of t's document: padding is skipped (a padded position changes nothing, as in
  decoding, where it never enters the buffer) and an input before the document's start counts
  as 0, so it never reads across a document start. Decoding keeps the last width - 1 real
  inputs in the cache ("conv_<name>"), emptied
  where a document starts."""
  width: int = 4
  use_bias: bool = True
  activation: bool = True  # SiLU after the convolution
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array, real: Array, runs: Array, mode: str = "off",
               reset: Array | None = None) -> Array:
    channels = x.shape[-1]
    bound = self.width ** -0.5  # PyTorch's Conv1d default (fan-in = width, depthwise)
    init = lambda key, shape: jax.random.uniform(key, shape, jnp.float32, -bound, bound)
    weight = self.param("kernel", init, (self.width, channels)).astype(self.dtype)
    x = x * real[..., None].astype(x.dtype)
    if mode == "step":
      buffer = self.variable("cache", "buffer")
      past = buffer.value if reset is None else jnp.where(reset[:, None, None], 0.0,
                                                          buffer.value)
      window = jnp.concatenate([past.astype(x.dtype), x], axis=1)  # [b, width - 1 + n, c]
      if x.shape[1] == 1:
        new = jnp.where(real[:, :, None], window[:, 1:], past)
      else:  # prefill: one document, every token real
        new = window[:, -(self.width - 1):]
      buffer.value = new.astype(buffer.value.dtype)
      y = sum(weight[w] * window[:, w:w + x.shape[1]] for w in range(self.width))
    else:
      if mode == "allocate":
        self.variable("cache", "buffer", jnp.zeros, (x.shape[0], self.width - 1, channels),
                      jnp.promote_types(x.dtype, jnp.float32))
      y = weight[-1] * x
      # The `shift`-th real position before t in t's document (padding skipped, as decoding
      # skips it): positions numbered by rank among the real ones of the row.
      rank = jnp.cumsum(real.astype(jnp.int32), axis=1) - 1
      length = x.shape[1]
      slot = jnp.where(real, rank, length)  # (padding scattered out of range: dropped)
      position_of_rank = jnp.zeros_like(rank).at[
          jnp.arange(x.shape[0])[:, None], slot].set(
              jnp.broadcast_to(jnp.arange(length, dtype=rank.dtype), rank.shape), mode="drop")
      for shift in range(1, self.width):
        source = jnp.take_along_axis(position_of_rank, jnp.maximum(rank - shift, 0), axis=1)
        same = (rank - shift >= 0) & (jnp.take_along_axis(runs, source, axis=1) == runs)
        earlier = jnp.take_along_axis(x, source[..., None], axis=1)
        y = y + weight[-1 - shift] * earlier * same[..., None].astype(x.dtype)
    if self.use_bias:
      y = y + self.param("bias", nn.initializers.zeros, (channels,)).astype(self.dtype)
    return nn.silu(y) if self.activation else y


def gated_output(module: nn.Module, x: Array, o: Array, output_gate: bool) -> Array:
  """The layers' common end: RMSNorm(o) per head, times silu(x W_g) where `output_gate`, then
  the output projection to x's width (parameters "gate", "output_norm", "out")."""
  heads, value_dim = o.shape[-2:]
  gate = (DenseGeneral(features=(heads, value_dim), use_bias=False, dtype=module.dtype,
                       kernel_init=dense_init(), name="gate")(x) if output_gate else None)
  o = GatedRMSNorm(dtype=module.dtype, name="output_norm")(o, gate)
  return DenseGeneral(x.shape[-1], axis=(-2, -1), use_bias=False, dtype=module.dtype,
                      kernel_init=dense_init(), name="out")(o)


def runs_of(padding_mask: Array, segment_ids: Array | None) -> tuple[Array, Array]:
  """(real, runs) of a training or allocation call (chunking.document_runs)."""
  return document_runs(padding_mask, segment_ids, padding_mask.shape)


def conv_inputs(mode: str, padding_mask: Array, segment_ids: Array | None,
                real: Array | None) -> tuple[Array, Array]:
  """(real [b, l], runs [b, l]) for ShortConvolution: a step's real flags (runs unused)."""
  if mode == "step":
    step_real = padding_mask.astype(bool) if real is None else real[:, None]
    return step_real, jnp.zeros(padding_mask.shape, jnp.int32)
  return runs_of(padding_mask, segment_ids)


class GatedRMSNorm(nn.Module):
  """RMSNorm(x) * silu(gate) over the last axis (flash-linear-attention's FusedRMSNormGated,
  per head: one weight vector shared by the heads), or with norm_before_gate=False
  RMSNorm(x * silu(gate)) (Mamba-2's RMSNormGated; groups: normalised per group of heads)."""
  norm_before_gate: bool = True
  groups: int = 0  # 0: per head (x [..., heads, dim]); g > 0: x [..., heads, dim] in g groups
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array, gate: Array | None) -> Array:
    """gate None: RMSNorm(x) alone."""
    compute = jnp.promote_types(x.dtype, jnp.float32)
    x = x.astype(compute)
    gate = None if gate is None else gate.astype(compute)
    if gate is not None and not self.norm_before_gate:
      x = x * nn.silu(gate)
    shape = x.shape
    if self.groups:
      x = x.reshape(shape[:-2] + (self.groups, -1))
    normed = nn.RMSNorm(NORM_EPSILON, dtype=compute, param_dtype=jnp.float32, name="norm",
                        feature_axes=-1 if not self.groups else (-2, -1),
                        reduction_axes=-1)(x).reshape(shape)
    if gate is not None and self.norm_before_gate:
      normed = normed * nn.silu(gate)
    return normed.astype(self.dtype)
