"""Kernelised linear attention (Katharopoulos et al. 2020, arXiv 2006.16236); registers "linear"
(bidirectional) and "causal_linear".

Softmax's exp(q.k) is replaced by a feature-map inner product phi(q).phi(k), so the sum over keys
factorises: out_t = phi(q_t) S / phi(q_t) z with S = sum_i phi(k_i) v_i^T [features, head_dim]
and z = sum_i phi(k_i) [features], over the keys position t sees (real, and for causal_linear
i <= t). Cost O(length * features * head_dim) instead of O(length^2 * head_dim). A position that
sees no key (or whose features meet none) outputs exactly 0 (`common.merged_mean`); sums are
float32 whatever the activations' dtype.

Feature maps: a small registry, FEATURE_MAPS, of builders `build(num_heads=, head_dim=, name=,
**options) -> phi`, where phi(x [batch, length, heads, head_dim], *, is_query) returns float32
[batch, length, heads, features]. "elu1" (elu(x) + 1, the paper's; the default) and "relu" are
plain functions; a learned map (Hedgehog's per-head MLP, say) registers a builder returning a
Flax module: it is built inside the attention module's compact call under the name
"feature_map", so its parameters live there and train with the rest. One map serves queries and
keys (`is_query` lets a map treat them differently: textattn/attention/performer.py's FAVOR+).
Register one with `register_feature_map(name, build)`; the module's `feature_map` names it and
`feature_options` ((key, value) pairs) are passed to its builder.

Causal kernels (pure functions of the feature-mapped queries and keys, all the same function):
  xla        `causal_linear_attention`: the masked [length, length] matrix phi(Q) phi(K)^T, the
             reference; O(length^2) work and memory.
  chunked    `chunked_causal_linear_attention`: chunks of `chunk_size` positions, each a masked
             [chunk, chunk] product plus the state (S, z) of the chunks before, carried by
             lax.scan; O(length * chunk) work, memory O(length * features * head_dim / chunk).
  recurrent  `recurrent_causal_linear_attention`: lax.scan of the decoding step `step` over the
             positions, a constant-size state [heads, features, head_dim] + [heads, features].
"auto" resolves to chunked from CHUNKED_FROM positions on (measured on a CPU, see `resolve`),
else xla. The bidirectional "linear" has one kernel, "xla" (`linear_attention`, the factorised
sums).

Segments (causal_linear): `segment_ids` int32 [batch, length] (0 = padding) split a packed row
into segments; a position sees only the earlier real positions of its own segment, which must
be one contiguous run of equal ids (as packing makes them). Every kernel works on "runs"
(`segment_runs`: a new run wherever the id changes), so the recurrent and chunked states reset
at each segment start, a boundary inside a chunk included. Decoding (`step`) resets on `reset`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from textattn.attention import registry
from textattn.attention.common import Array, dense_init, merged_mean, segment_runs
from textattn.attention.recurrent.chunking import document_runs, wide
from textattn.attention.recurrent.parallel import incoming_state, shard_edges, shard_over_sequence
from textattn.attention.rotary import apply_rotary
from textattn.errors import UsageError
from textattn.flax_layers import DenseGeneral

F32 = jnp.float32

# ---------------------------------------------------------------------------------------------
# Feature maps.

FeatureMap = Callable[..., Array]  # phi(x [b, l, h, d], *, is_query) -> float32 [b, l, h, f]
FEATURE_MAPS: dict[str, Callable[..., FeatureMap]] = {}


def register_feature_map(name: str, build: Callable[..., FeatureMap]) -> None:
  """Adds a feature map: build(num_heads=, head_dim=, name=, **options) -> phi (a function, or a
  Flax module, which then owns its parameters under the attention module's "feature_map")."""
  if name in FEATURE_MAPS and FEATURE_MAPS[name] is not build:
    raise ValueError(f"feature map {name!r} is already registered; choose another name.")
  FEATURE_MAPS[name] = build


def elu1(x: Array, *, is_query: bool = True) -> Array:
  """elu(x) + 1: positive, and the identity's slope for x > 0 (Katharopoulos et al.)."""
  del is_query
  return jax.nn.elu(wide(x)) + 1.0


def relu(x: Array, *, is_query: bool = True) -> Array:
  del is_query
  return jax.nn.relu(wide(x))


register_feature_map("elu1", lambda **_: elu1)
register_feature_map("relu", lambda **_: relu)


def build_feature_map(name: str, *, num_heads: int, head_dim: int,
                      options: tuple[tuple[str, Any], ...] = ()) -> FeatureMap:
  if name not in FEATURE_MAPS:
    raise ValueError(f"feature_map={name!r} is not a registered feature map; allowed: "
                     f"{', '.join(FEATURE_MAPS)}.")
  return FEATURE_MAPS[name](num_heads=num_heads, head_dim=head_dim, name="feature_map",
                            **dict(options))


# ---------------------------------------------------------------------------------------------
# Kernels over feature-mapped queries/keys fq, fk float32 [b, l, h, f] and values v [b, l, h, d].

def linear_attention(fq: Array, fk: Array, value: Array, real: Array) -> Array:
  """Bidirectional: out_t = phi(q_t) S / phi(q_t) z over the real keys. O(l f d)."""
  fk = fk * real[:, :, None, None]
  kv = jnp.einsum("blhf,blhd->bhfd", fk, value.astype(fk.dtype))
  numerator = jnp.einsum("blhf,bhfd->blhd", fq, kv)
  return merged_mean(numerator, jnp.einsum("blhf,bhf->blh", fq, jnp.sum(fk, axis=1)))


def causal_linear_attention(fq: Array, fk: Array, value: Array, real: Array, runs: Array,
                            **_) -> Array:
  """Causal, the reference: the masked matrix A[t, i] = phi(q_t).phi(k_i) [i <= t, real_i, same
  run], out = A V / A 1. O(l^2 (f + d))."""
  length = fq.shape[1]
  visible = (jnp.tril(jnp.ones((length, length), bool))[None]
             & real[:, None, :] & (runs[:, :, None] == runs[:, None, :]))  # [b, t, i]
  scores = jnp.einsum("bthf,bihf->bhti", fq, fk) * visible[:, None]
  numerator = jnp.einsum("bhti,bihd->bthd", scores, value.astype(scores.dtype))
  return merged_mean(numerator, jnp.sum(scores, axis=-1).transpose(0, 2, 1))


def chunked_causal_linear_attention(fq: Array, fk: Array, value: Array, real: Array, runs: Array,
                                    *, chunk_size: int = 64, initial_state: State | None = None,
                                    initial_run: Array | None = None) -> Array:
  """Causal, chunk by chunk: within a chunk the masked [chunk, chunk] products (same run only),
  plus phi(q_t) times the state (S, z) of the earlier chunks for the positions t still in the run
  that state belongs to. The state is replaced at each chunk's end by the sums over the chunk's
  last run, added to the carried state only if that run began before the chunk: so a segment
  boundary inside a chunk resets it exactly. lax.scan over the chunks, body rematerialised
  (jax.checkpoint); the length is padded to a multiple of the chunk with padding positions.
  `initial_state` (sequence parallelism: what earlier shards leave) is seen by the positions of
  run `initial_run` int [batch] (None: no state)."""
  batch, length, heads, features = fq.shape
  chunk = max(1, min(chunk_size, length))
  num_chunks = -(-length // chunk)
  extra = num_chunks * chunk - length

  def split(x, mode="constant"):  # [b, l, ...] -> [chunks, b, chunk, ...]
    x = jnp.pad(x, [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2), mode=mode)
    return x.reshape((batch, num_chunks, chunk) + x.shape[2:]).swapaxes(0, 1)

  tril = jnp.tril(jnp.ones((chunk, chunk), bool))

  @jax.checkpoint
  def one_chunk(carry, inputs):
    kv, normaliser, carried_run = carry
    q, k, v, is_real, run = inputs
    visible = tril[None] & is_real[:, None, :] & (run[:, :, None] == run[:, None, :])
    scores = jnp.einsum("bthf,bihf->bhti", q, k) * visible[:, None]
    sees_state = (run == carried_run[:, None])[:, :, None, None]  # [b, t, 1, 1]
    numerator = (jnp.einsum("bhti,bihd->bthd", scores, v)
                 + sees_state * jnp.einsum("bthf,bhfd->bthd", q, kv))
    denominator = (jnp.sum(scores, axis=-1).transpose(0, 2, 1)
                   + sees_state[..., 0] * jnp.einsum("bthf,bhf->bth", q, normaliser))
    last_run = run[:, -1]
    keep = (last_run == carried_run)[:, None, None]
    in_last = (is_real & (run == last_run[:, None]))[:, :, None, None]
    kv = jnp.where(keep[..., None], kv, 0.0) + jnp.einsum("bihf,bihd->bhfd", k * in_last, v)
    normaliser = jnp.where(keep, normaliser, 0.0) + jnp.sum(k * in_last, axis=1)
    return (kv, normaliser, last_run), merged_mean(numerator, denominator)

  head_dim = value.shape[-1]
  state = (init_state(batch, heads, features, head_dim, fq.dtype) if initial_state is None
           else initial_state)
  if initial_run is None:
    initial_run = jnp.full((batch,), -1, jnp.int32)
  carry = (state.kv, state.normaliser, initial_run.astype(jnp.int32))
  _, out = jax.lax.scan(one_chunk, carry, (split(fq), split(fk), split(value.astype(fq.dtype)),
                                           split(real), split(runs, "edge")))
  return out.swapaxes(0, 1).reshape(batch, num_chunks * chunk, heads, head_dim)[:, :length]


def last_run_state(fk: Array, value: Array, real: Array, runs: Array) -> State:
  """The state (S, z) a row leaves from a zero state: the sums over its last run's real keys."""
  in_last = (real & (runs == runs[:, -1:]))[:, :, None, None]
  fk = fk * in_last
  return State(jnp.einsum("blhf,blhd->bhfd", fk, value.astype(fk.dtype)), jnp.sum(fk, axis=1))


def sharded_causal_linear_attention(fq: Array, fk: Array, value: Array,
                                    padding_mask: Array, segment_ids: Array | None, *, mesh,
                                    chunk_size: int = 64) -> Array:
  """The chunked kernel with the length split over mesh's "sequence" axis
  (recurrent/parallel.py's scheme: each shard's last-run sums from a zero state, an exclusive
  scan over the shards, the chunked kernel from the incoming state; the transition is the
  identity, or 0 for a shard holding a document start)."""
  real, runs = document_runs(padding_mask, segment_ids, padding_mask.shape)

  def shard(fq, fk, value, real, runs):
    local = last_run_state(fk, value, real, runs)
    first_run, last_run, single = shard_edges(real, runs + 1)  # (ids: run numbers, not 0)
    keep = single.astype(local.kv.dtype)
    kv = incoming_state(local.kv, first_run, last_run, keep[:, None, None, None])
    normaliser = incoming_state(local.normaliser, first_run, last_run, keep[:, None, None])
    return chunked_causal_linear_attention(fq, fk, value, real, runs, chunk_size=chunk_size,
                                           initial_state=State(kv, normaliser),
                                           initial_run=runs[:, 0])
  return shard_over_sequence(shard, mesh, (fq, fk, value, real, runs), value.ndim)


class State(NamedTuple):
  """Causal linear attention's decoding state: constant size whatever the tokens seen."""
  kv: Array  # sum phi(k_i) v_i^T, float32 [batch, heads, features, head_dim]
  normaliser: Array  # sum phi(k_i), float32 [batch, heads, features]


def init_state(batch: int, heads: int, features: int, head_dim: int, dtype=F32) -> State:
  return State(jnp.zeros((batch, heads, features, head_dim), dtype),
               jnp.zeros((batch, heads, features), dtype))


def step(state: State, q_t: Array, k_t: Array, v_t: Array, *, real: Array | None = None,
         reset: Array | None = None) -> tuple[State, Array]:
  """One position in O(features * head_dim): q_t, k_t feature-mapped [batch, heads, features]
  (the caller applies the feature map), v_t [batch, heads, head_dim] -> (state, out_t float32
  [batch, heads, head_dim]). Caller's contract: `reset` bool [batch] True where this token starts
  a new segment (the state is emptied before it is added: pass it at every segment start when
  decoding packed rows); `real` bool [batch] False for a padding token (not added; its output is
  still computed, as the whole-sequence kernels compute it)."""
  kv, normaliser = state
  if reset is not None:
    kv = jnp.where(reset[:, None, None, None], 0.0, kv)
    normaliser = jnp.where(reset[:, None, None], 0.0, normaliser)
  k_t = k_t.astype(kv.dtype)
  if real is not None:
    k_t = k_t * real[:, None, None]
  kv = kv + jnp.einsum("bhf,bhd->bhfd", k_t, v_t.astype(kv.dtype))
  normaliser = normaliser + k_t
  q_t = q_t.astype(kv.dtype)
  out = merged_mean(jnp.einsum("bhf,bhfd->bhd", q_t, kv), jnp.einsum("bhf,bhf->bh", q_t,
                                                                     normaliser))
  return State(kv, normaliser), out


def recurrent_causal_linear_attention(fq: Array, fk: Array, value: Array, real: Array,
                                      runs: Array, **_) -> Array:
  """Causal, position by position: lax.scan of `step`, resetting where a run starts."""
  batch, _, heads, features = fq.shape
  starts = jnp.concatenate([jnp.zeros_like(runs[:, :1], bool), runs[:, 1:] != runs[:, :-1]], 1)

  def one(state, inputs):
    q, k, v, is_real, reset = inputs
    return step(state, q, k, v, real=is_real, reset=reset)

  time_major = lambda x: jnp.swapaxes(x, 0, 1)
  _, out = jax.lax.scan(one, init_state(batch, heads, features, value.shape[-1], fq.dtype),
                        tuple(map(time_major, (fq, fk, value, real, starts))))
  return time_major(out)


CAUSAL_KERNELS = {"xla": causal_linear_attention, "chunked": chunked_causal_linear_attention,
                  "recurrent": recurrent_causal_linear_attention}
IMPLEMENTATIONS = {False: ("auto", "xla"), True: ("auto",) + tuple(CAUSAL_KERNELS)}
KERNEL_LABELS = {False: (("xla", "linear"),),
                 True: (("xla", "naive"), ("chunked", "chunked"), ("recurrent", "scan"))}
# "auto" picks chunked from this length on. Forward + backward, median ms at L = 128, 256, 512,
# 1024, 2048 (python -m textattn.benchmark --mode=attention+backward --variants=causal_linear_xla,
# causal_linear_chunked,causal_linear_recurrent --seq_lens=128,256,512,1024,2048 --batch_size=2
# --embed_dim=64 --num_heads=2; a 2-core CPU): xla 1.64, 3.44, 19.7, 65.8, 386; chunked (64)
# 1.36, 2.96, 5.65, 11.4, 54.2; recurrent 4.02, 4.54, 18.7, 40.0, 98.5. At 128 the two are
# within noise; from 256 chunked is ahead, and its memory is linear.
CHUNKED_FROM = 256


def resolve(implementation: str, head_dim: int | None = None, dtype: str = "float32", *,
            length: int | None = None, num_heads: int | None = None,
            causal: bool = True) -> str:
  """'auto' -> 'chunked' for a causal row of at least CHUNKED_FROM positions (both exact; the
  quadratic form's O(length^2) work and memory lose from there, measured on a CPU, and the
  chunked form's matrix products suit accelerators too), else 'xla'; 'recurrent' (sequential
  over positions) is never chosen. The bidirectional variant has only 'xla'. Other names are
  returned as they are."""
  del head_dim, dtype, num_heads
  if implementation != "auto":
    return implementation
  if causal and length is not None and length >= CHUNKED_FROM:
    return "chunked"
  return "xla"


def positions_in_runs(runs: Array) -> Array:
  """int32 [batch, length]: each position's offset from the start of its run (segment_runs)."""
  index = jnp.arange(runs.shape[1])[None, :]
  starts = jnp.concatenate([jnp.ones_like(runs[:, :1], bool), runs[:, 1:] != runs[:, :-1]],
                           axis=1)
  return (index - jax.lax.cummax(jnp.where(starts, index, 0), axis=1)).astype(jnp.int32)


class LinearAttention(nn.Module):
  """Multi-head linear attention with Q/K/V/output projections (as softmax's SelfAttention)."""
  num_heads: int
  causal: bool = False
  implementation: str = "xla"
  dtype: Any = jnp.float32
  head_dim: int | None = None  # None: embed // num_heads
  feature_map: str = "elu1"  # a name in FEATURE_MAPS
  feature_options: tuple[tuple[str, Any], ...] = ()  # keywords for the feature map's builder
  chunk_size: int = 64  # the chunked kernel's
  mesh: Any = None  # causal only: the chunked kernel split over the mesh's "sequence" axis
  # Queries and keys turned by position before the feature map (registry.Variant.rotary),
  # counted from the start of their segment (`_turn`); decoding keeps each row's next position
  # in the cache ("index").
  rotary: bool = False

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array, decode: bool = False, *,
               segment_ids: Array | None = None) -> Array:
    """decode=True (causal only), as softmax's SelfAttention: a first whole-length call allocates
    the "cache" (the state, O(1) in length, and the last segment id), then one position
    [batch, 1, embed] per call; a change of segment id between calls resets the state."""
    embed = x.shape[-1]
    head_dim = self.head_dim or embed // self.num_heads
    dense = functools.partial(DenseGeneral, features=(self.num_heads, head_dim),
                              dtype=self.dtype, kernel_init=dense_init())
    query, key, value = (dense(name=name)(x) for name in ("query", "key", "value"))
    if self.rotary:
      query, key = self._turn(query, key, segment_ids,
                              decode and self.has_variable("cache", "state"))
    phi = build_feature_map(self.feature_map, num_heads=self.num_heads, head_dim=head_dim,
                            options=self.feature_options)
    fq, fk = phi(query, is_query=True), phi(key, is_query=False)
    # (kept only where the caller asks: attention transfer's weight matching, mutable=...)
    self.sow("intermediates", "features", (fq, fk))
    if not self.causal and (decode or segment_ids is not None):
      raise ValueError("decode=True and segment_ids need a causal linear attention variant.")
    if decode and self.has_variable("cache", "state"):
      out = self._decode_step(fq, fk, value, padding_mask, segment_ids)
    else:
      if decode:
        self.variable("cache", "state", init_state, x.shape[0], self.num_heads, fq.shape[-1],
                      head_dim)
        self.variable("cache", "segment", jnp.zeros, (x.shape[0],), jnp.int32)
        if self.rotary:
          self.variable("cache", "index", jnp.zeros, (x.shape[0],), jnp.int32)
      real, runs = segment_runs(padding_mask, segment_ids)
      if self.causal and self.mesh is not None:
        out = sharded_causal_linear_attention(fq, fk, value, padding_mask, segment_ids,
                                              mesh=self.mesh, chunk_size=self.chunk_size)
      elif self.causal:
        name = resolve(self.implementation, length=x.shape[1])
        out = CAUSAL_KERNELS[name](fq, fk, value, real, runs, chunk_size=self.chunk_size)
      else:
        out = linear_attention(fq, fk, value, real)
    return DenseGeneral(embed, axis=(-2, -1), dtype=self.dtype, kernel_init=dense_init(),
                        name="out")(out.astype(self.dtype))

  def _decode_step(self, fq, fk, value, padding_mask, segment_ids):
    state, segment = self.variable("cache", "state"), self.variable("cache", "segment")
    real = padding_mask[:, 0].astype(bool)
    reset = None
    if segment_ids is not None:
      ids = segment_ids[:, 0].astype(jnp.int32)
      real, reset = real & (ids != 0), ids != segment.value
      segment.value = ids
    state.value, out = step(state.value, fq[:, 0], fk[:, 0], value[:, 0], real=real,
                            reset=reset)
    return out[:, None]

  def _turn(self, query, key, segment_ids, decoding: bool):
    """query and key [batch, length, heads, head_dim] turned by their position within their
    segment (0 at its start; the row when there are no segment ids). Not the row's position, as
    the dot-product families may take it: the feature map makes phi(R_i q).phi(R_j k) depend on
    i and j, not on i - j alone, so a packed document must count from its own start, as it does
    alone and when decoding after a reset. Decoding: the cache's index of each row (back to 0
    where the segment id changes), then advanced."""
    if decoding:
      index = self.variable("cache", "index")
      positions = index.value
      if segment_ids is not None:  # (the cache's "segment" is still the previous step's)
        new = segment_ids[:, 0].astype(jnp.int32) != self.get_variable("cache", "segment")
        positions = jnp.where(new, 0, positions)
      index.value = positions + 1
      positions = positions[:, None]
    else:
      positions = positions_in_runs(segment_runs(jnp.ones(query.shape[:2], bool),
                                                 segment_ids)[1])
    return apply_rotary(query, positions), apply_rotary(key, positions)


def forward_flops(batch: int, length: int, heads: int, head_dim: int,
                  features: int | None = None) -> float:
  """S = sum phi(k) v^T and phi(q) S: 2 * (2 * B * H * L * f * d), f = head_dim for elu1
  (the normaliser's L * f terms left out)."""
  return 4.0 * batch * heads * length * (features or head_dim) * head_dim


def check_chunk_size(chunk_size: int, sub_config: str) -> None:
  if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
    raise UsageError(f"config.model.{sub_config}.chunk_size={chunk_size!r} must be a positive "
                     f"number of positions.")


def linear_keywords(feature_map: str, chunk_size: int, features: int,
                    sub_config: str = "linear") -> dict:
  """config.model.linear.{feature_map, chunk_size, features} -> the build keywords feature_map,
  chunk_size and feature_options (features, for a map whose builder takes it; 0: its default)."""
  where = f"config.model.{sub_config}"
  if feature_map not in FEATURE_MAPS:
    raise UsageError(f"{where}.feature_map={feature_map!r} is not a feature map; allowed: "
                     f"{', '.join(FEATURE_MAPS)}.")
  check_chunk_size(chunk_size, sub_config)
  if not isinstance(features, int) or isinstance(features, bool) or features < 0:
    raise UsageError(f"{where}.features={features!r} must be a number of features >= 1 (0: the "
                     f"map's default).")
  options = ()
  if features:
    if "features" not in inspect.signature(FEATURE_MAPS[feature_map]).parameters:
      raise UsageError(f"{where}.features={features}: feature map {feature_map!r} has no "
                       f"feature count (use 0).")
    options = (("features", features),)
  return {"feature_map": feature_map, "chunk_size": chunk_size, "feature_options": options}


def variant(name: str, causal: bool, description: str) -> registry.Variant:
  return registry.Variant(
      name=name,
      build=functools.partial(LinearAttention, causal=causal),
      implementations=IMPLEMENTATIONS[causal],
      resolve=functools.partial(resolve, causal=causal),
      causal=causal,
      segment_ids=causal,
      rotary=True,
      options="linear",
      option_defaults=(("feature_map", "elu1"), ("chunk_size", 64), ("features", 0)),
      option_keywords=linear_keywords,
      forward_flops=forward_flops,
      kernels=KERNEL_LABELS[causal],
      description=description)


registry.register(variant(
    "linear", False, "linear attention, elu(x)+1 features (Katharopoulos et al. 2020), O(length)"))
registry.register(variant(
    "causal_linear", True, "causal linear attention, elu(x)+1 features: xla (masked quadratic), "
    "chunked, recurrent (scan); O(1)-state decoding"))
