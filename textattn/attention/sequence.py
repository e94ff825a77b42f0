"""Sequence (context) parallelism: attention with the length split over a mesh's "sequence" axis.

Each built-in variant that can be split declares it here, in one place, as `Variant.shard`: a
build function like `Variant.build` plus `mesh=`, returning a module with the same parameters
whose attention core runs under `jax.shard_map` along the "sequence" axis (and "data", if the
mesh has one). Inputs and outputs are [batch, length, embed] in the model's order, length split
into contiguous equal shards; the per-token projections run outside the shard_map, where XLA
keeps them sharded. `build(variant, mesh, ...)` picks the module; a variant that declares no
sharding is refused when the sequence axis has more than one device.

The cores, each exact against one device (tests/test_sequence.py; n = length / S per shard):
- additive (Fastformer): each shard's partial softmax sums (max, weighted sum, weight sum) are
  merged across the axis, pmax then psum, for the global query; then likewise for the global
  key. Two dependent rounds of O(batch x heads x head_dim) bytes per layer, whatever the length.
- softmax, causal: ring attention (`textattn/attention/ring.py`): key/value blocks travel round
  the ring with ppermute, partial results merged online (flash attention's running max and sum),
  a custom VJP that sends the blocks round again, memory O(n^2 + n) per device; causal in the
  zig-zag layout (shard i holds chunks i and 2S-1-i of 2S), into which the module reorders its
  queries/keys/values and back with two ppermutes each.
- causal additive, recurrent form: each shard's local prefix sums (an associative scan), then the
  exclusive prefix of the shards' totals (all_gather of their totals, combined below the shard's
  index) merged in; once for the global query, then, depending on it, for the global key.
The direct causal additive form (O(length^2), each key re-scored per position) declares nothing.
Segment ids (packed documents; the causal ring and the recurrent form): the runs of the whole row
(`common.segment_runs`) are computed before the split; the ring sends each key block's ids with
it and a query sees only keys of its own run; the prefix merges the shards' totals as a
segmented scan (a shard's total only continues the run it ends with).

On every platform the per-block computation is XLA's einsum (a flash kernel per block on GPUs is
not wired in), and only the xla semantics are offered: `implementation` is accepted and ignored.
Decoding (decode=True) stays on one device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from textattn import sharding
from textattn.attention import registry
from textattn.attention.additive import fastformer_output, fastformer_projections
from textattn.attention.causal_additive import _combine_runs, _scores
from textattn.attention.common import MASK_VALUE, Array, dense_init, merged_mean, segment_runs
from textattn.attention.linear import LinearAttention
from textattn.attention.recurrent.deltanet import DeltaNet
from textattn.attention.recurrent.gla import GLA
from textattn.attention.recurrent.mamba2 import Mamba2
from textattn.attention.recurrent.retnet import RetNet
from textattn.attention.ring import from_zigzag, ring_attention_shard, to_zigzag
from textattn.attention.rotary import apply_rotary
from textattn.errors import UsageError
from textattn.flax_layers import DenseGeneral

SEQUENCE = sharding.SEQUENCE


# ---------------------------------------------------------------------------------------------
# Additive (Fastformer): two rounds of (pmax, psum).

def _pooled_over_shards(scores: Array, values: Array, padding_mask: Array) -> Array:
  """sum_i softmax_i(scores) values_i over the real tokens of every shard -> [batch, heads, dim].

  scores float32 [batch, n, heads], values [batch, n, heads, dim]. The global max is only for
  stability (the quotient does not depend on it), so it carries no gradient; a row with no real
  token anywhere pools to 0, as `masked_softmax_over_tokens` makes it on one device."""
  real = padding_mask[:, :, None]
  local_max = jnp.max(jnp.where(real, scores, MASK_VALUE), axis=1)
  top = jax.lax.pmax(jax.lax.stop_gradient(local_max), SEQUENCE)
  weights = jnp.where(real, jnp.exp(scores - top[:, None]), 0.0)
  weighted = jnp.einsum("blh,blhd->bhd", weights, values.astype(jnp.float32))
  weighted, total = jax.lax.psum((weighted, jnp.sum(weights, axis=1)), SEQUENCE)
  return merged_mean(weighted, total)


def additive_shard(query: Array, key: Array, padding_mask: Array, alpha_kernel: Array,
                   beta_kernel: Array) -> Array:
  """One shard's `additive.additive_attention` (call inside shard_map over "sequence")."""
  global_query = _pooled_over_shards(_scores(query, alpha_kernel), query, padding_mask)
  mixed = key.astype(jnp.float32) * global_query[:, None]
  global_key = _pooled_over_shards(_scores(mixed, beta_kernel), mixed, padding_mask)
  return (query.astype(jnp.float32) * global_key[:, None]).astype(query.dtype)


# ---------------------------------------------------------------------------------------------
# Causal additive, recurrent form: local scan + exclusive prefix of the shards' totals.

def _prefix_over_shards(scores: Array, values: Array, padding_mask: Array,
                        runs: Array) -> Array:
  """`causal_additive.prefix_softmax_sum` of the whole sequence, for this shard's positions,
  each position pooling only its own run (`runs` int32 [batch, n], global run numbers)."""
  real = padding_mask[:, :, None]
  m = jnp.where(real, scores, MASK_VALUE)
  w = jnp.broadcast_to(real, scores.shape).astype(jnp.float32)
  v = values.astype(jnp.float32) * w[..., None]
  local = jax.lax.associative_scan(_combine_runs, (runs[:, :, None], m, v, w), axis=1)
  # Every shard's total (its last run's running sums); those of the shards before this one are
  # merged in order, each dropping what came before its last run (a segmented scan of S).
  totals = jax.lax.all_gather(tuple(x[:, -1] for x in local), SEQUENCE)
  me = jax.lax.axis_index(SEQUENCE)
  prefix = (jnp.full_like(totals[0][0], -1), jnp.full_like(totals[1][0], MASK_VALUE),
            jnp.zeros_like(totals[2][0]), jnp.zeros_like(totals[3][0]))
  for j in range(totals[0].shape[0]):
    merged = _combine_runs(prefix, tuple(t[j] for t in totals))
    prefix = tuple(jnp.where(j < me, new, old) for new, old in zip(merged, prefix, strict=True))
  _, _, total_v, total_w = _combine_runs(tuple(x[:, None] for x in prefix), local)
  return merged_mean(total_v, total_w)


def recurrent_causal_additive_shard(query: Array, key: Array, padding_mask: Array, runs: Array,
                                    alpha_kernel: Array, beta_kernel: Array) -> Array:
  """One shard's `causal_additive.recurrent_causal_additive` (inside shard_map)."""
  global_query = _prefix_over_shards(_scores(query, alpha_kernel), query, padding_mask, runs)
  mixed = key.astype(jnp.float32) * global_query  # p_i = g_q(i) * k_i needs the corrected g_q
  global_key = _prefix_over_shards(_scores(mixed, beta_kernel), mixed, padding_mask, runs)
  return (query.astype(jnp.float32) * global_key).astype(query.dtype)


# ---------------------------------------------------------------------------------------------
# Ring attention (softmax, causal).
#
# ---------------------------------------------------------------------------------------------
# The global (shard_map) forms and the modules.

def _sharded(core: Callable, mesh: jax.sharding.Mesh, token_args: int, replicated_args: int):
  """core under shard_map: the first `token_args` arguments [batch, length, ...] split along
  (data, sequence), the next `replicated_args` whole on every device; output split like x."""
  data = sharding.data_axis(mesh)

  def spec(ndim):
    return jax.P(data, SEQUENCE, *([None] * (ndim - 2)))

  def run(*args):
    in_specs = tuple(spec(a.ndim) for a in args[:token_args]) + (jax.P(),) * replicated_args
    return jax.shard_map(core, mesh=mesh, in_specs=in_specs,
                         out_specs=spec(args[0].ndim))(*args)
  return run


def _check_shards(mesh, length: int, multiple: int = 1) -> None:
  why = " (the causal ring's zig-zag layout halves each shard)" if multiple == 2 else ""
  sharding.check_length(length, sharding.sequence_size(mesh), multiple, why)


def sharded_additive(query, key, padding_mask, alpha_kernel, beta_kernel, *, mesh) -> Array:
  """`additive.additive_attention` with the length split over mesh's "sequence" axis."""
  _check_shards(mesh, query.shape[1])
  return _sharded(additive_shard, mesh, 3, 2)(query, key, padding_mask, alpha_kernel,
                                              beta_kernel)


def sharded_recurrent_causal_additive(query, key, padding_mask, alpha_kernel, beta_kernel, *,
                                      mesh, segment_ids: Array | None = None) -> Array:
  """`causal_additive.recurrent_causal_additive`, length split over "sequence"; segment_ids
  (0 = padding) as there: each position pools only its own segment."""
  _check_shards(mesh, query.shape[1])
  real, runs = segment_runs(padding_mask, segment_ids)
  return _sharded(recurrent_causal_additive_shard, mesh, 4, 2)(
      query, key, real, runs, alpha_kernel, beta_kernel)


def sharded_softmax(query, key, value, padding_mask, *, mesh, causal: bool = False,
                    layout: str = "zigzag", zigzag_input: bool = False,
                    segment_ids: Array | None = None) -> Array:
  """Exact softmax attention (causal: look-ahead masked) by ring over "sequence".

  Arguments in the model's (contiguous) order unless zigzag_input (then already in zig-zag order
  along each shard pair, as `to_zigzag` leaves them). Causal layouts: "zigzag" (balanced) or
  "contiguous" (for comparison). segment_ids int32 [batch, length] (0 = padding): a position
  attends only to its own segment (`common.segment_runs`, computed over the whole row)."""
  multiple = 2 if causal and layout == "zigzag" else 1
  _check_shards(mesh, query.shape[1], multiple)
  ring_layout = layout if causal else None
  reorder = ring_layout == "zigzag" and not zigzag_input

  def core(q, k, v, mask, *ids):
    if reorder:
      q, k, v, mask, *ids = (to_zigzag(a) for a in (q, k, v, mask, *ids))
    out = ring_attention_shard(q, k, v, mask, ids[0] if ids else None, ring_layout)
    return from_zigzag(out) if reorder else out
  if segment_ids is None:
    return _sharded(core, mesh, 4, 0)(query, key, value, padding_mask)
  real, runs = segment_runs(padding_mask, segment_ids)
  return _sharded(core, mesh, 5, 0)(query, key, value, real, runs + 1)


class ShardedAdditiveAttention(nn.Module):
  """`additive.AdditiveAttention` (same parameters) with its core split over "sequence"."""
  num_heads: int
  mesh: Any = None
  implementation: str = "xla"  # accepted for the registry's signature; the core is XLA
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array) -> Array:
    query, key, alpha_kernel, beta_kernel = fastformer_projections(self, x, self.num_heads,
                                                                   self.dtype)
    u = sharded_additive(query, key, padding_mask, alpha_kernel.astype(self.dtype),
                         beta_kernel.astype(self.dtype), mesh=self.mesh)
    return fastformer_output(u, query, self.dtype)


class ShardedCausalAdditiveAttention(nn.Module):
  """`causal_additive.CausalAdditiveAttention(form="recurrent")` split over "sequence"."""
  num_heads: int
  mesh: Any = None
  implementation: str = "xla"
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array, *,
               segment_ids: Array | None = None) -> Array:
    query, key, alpha_kernel, beta_kernel = fastformer_projections(self, x, self.num_heads,
                                                                   self.dtype)
    u = sharded_recurrent_causal_additive(query, key, padding_mask, alpha_kernel, beta_kernel,
                                          mesh=self.mesh, segment_ids=segment_ids)
    return fastformer_output(u, query, self.dtype)


class ShardedSelfAttention(nn.Module):
  """`softmax.SelfAttention` (same parameters) with a ring over "sequence" as its kernel."""
  num_heads: int
  causal: bool = False
  mesh: Any = None
  implementation: str = "xla"
  dtype: Any = jnp.float32
  head_dim: int | None = None
  layout: str = "zigzag"  # causal only: "zigzag" (balanced) or "contiguous"
  rotary: bool = False  # as SelfAttention's: turned by their global positions, before the split

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array, *,
               segment_ids: Array | None = None) -> Array:
    embed = x.shape[-1]
    head_dim = self.head_dim or embed // self.num_heads
    dense = functools.partial(DenseGeneral, features=(self.num_heads, head_dim),
                              dtype=self.dtype, kernel_init=dense_init())
    query, key, value = (dense(name=name)(x) for name in ("query", "key", "value"))
    if self.rotary:
      positions = jnp.arange(x.shape[1])
      query, key = apply_rotary(query, positions), apply_rotary(key, positions)
    out = sharded_softmax(query, key, value, padding_mask, mesh=self.mesh, causal=self.causal,
                          layout=self.layout, segment_ids=segment_ids)
    return DenseGeneral(embed, axis=(-2, -1), dtype=self.dtype, kernel_init=dense_init(),
                        name="out")(out)


def check_declared(variant: registry.Variant, shards: int) -> None:
  """UsageError (one sentence) if `variant` declares no sequence sharding and shards > 1."""
  if shards > 1 and variant.shard is None:
    raise UsageError(f"config.model.attention={variant.name!r} declares no sequence sharding, so "
                     f"it cannot run with mesh.sequence={shards}; use mesh.sequence=1 or a "
                     f"variant that does ({', '.join(sharded_names())}).")


def build(variant: registry.Variant, mesh: jax.sharding.Mesh | None, **build_kwargs) -> nn.Module:
  """variant.build(**build_kwargs) without a mesh or with one sequence shard, else the variant's
  sequence-sharded module; a variant that declares none is refused in one sentence."""
  shards = sharding.sequence_size(mesh)
  if shards == 1:
    return variant.build(**build_kwargs)
  check_declared(variant, shards)
  return variant.shard(mesh=mesh, **build_kwargs)


def sharded_names() -> tuple[str, ...]:
  return tuple(name for name in registry.names() if registry.get(name).shard is not None)


# The built-in variants' declarations, in one place.
SHARDED_BUILDS = {
    "softmax": functools.partial(ShardedSelfAttention, causal=False),
    "causal": functools.partial(ShardedSelfAttention, causal=True),
    "additive": ShardedAdditiveAttention,
    "causal_additive_recurrent": ShardedCausalAdditiveAttention,
    # The linear recurrences: their own modules with a mesh (textattn/attention/recurrent/
    # parallel.py: each shard's state pair, an exclusive scan, the chunked form from it).
    "causal_linear": functools.partial(LinearAttention, causal=True),
    "retnet": RetNet,
    "gla": GLA,
    "mamba2": Mamba2,
    "deltanet": DeltaNet,
    "gated_deltanet": functools.partial(DeltaNet, gated=True),
}
for _name, _build in SHARDED_BUILDS.items():
  registry.declare_shard(_name, _build)
del _name, _build
