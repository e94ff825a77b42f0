"""Delta-rule cores: DeltaNet (Schlag et al. 2021; Yang et al. 2024, arXiv 2406.06484) and Gated
DeltaNet (Yang et al. 2024, arXiv 2412.06464), in the conventions of
`textattn.attention.recurrent` (shapes, log_gates, beta, scale, initial_state, segment_ids, mask,
return values; read its docstring first).

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = scale * S_t^T q_t

log_gates None is g = 0 (DeltaNet). Three forms of the same function:
  delta_rule_recurrent  lax.scan of `delta_rule_step` over the tokens: the reference, and the
                        step decoding calls.
  delta_rule_chunked    the chunkwise UT form. With u'_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t)
                        the recurrence is S_t = exp(g_t) S_{t-1} + k_t u'_t^T, so within a chunk
                        of C tokens entered with state S (b the chunk-local cumulative log-gate,
                        Gamma_ij = exp(b_i - b_j) for j <= i, rows are tokens):
                          (I + A) U' = diag(beta) (V - (exp(b) * K) S),
                          A = strictly-lower(diag(beta) (Gamma * K K^T)),
                        i.e. U' = U - W S with [W | U] = T [exp(b) * K | V],
                        T = (I + A)^-1 diag(beta) (a blocked triangular inverse), and
                          O = scale [(exp(b) * Q) S + (Gamma * tril(Q K^T)) U'],
                          S <- exp(b_C) S + (exp(b_C - b) * K)^T U'.
                        W, U and the masked Gamma * Q K^T do not depend on S: they are computed
                        for all chunks at once, and lax.scan (body rematerialised) carries S
                        through four [C, d] products per chunk.
  delta_rule_shard      sequence parallelism inside jax.shard_map: each shard's (transition,
                        state) pair from a zero state, an exclusive scan of the pairs over the
                        shards, and the chunked form rerun from the incoming state.

Segments: the state is emptied before each run's first token (`chunking.document_runs`: a run
starts at a real token whose segment id differs from the previous real token's; padding, mask
False or id 0, joins the run before it, so the final state is the last document's). In the
chunked form every within-chunk coupling (K K^T in A, Q K^T in O) is masked to pairs of the same
run; the incoming state is seen (in W S and in (exp(b) * Q) S) only by the positions still in the
run it belongs to; the outgoing state keeps exp(b_C) S only if the chunk's last run is that run,
and adds only the last run's keys. Padding (mask False) has beta = 0 and log-gate 0 before
anything else, so it neither decays nor writes. Numerics: the state and the log-gate sums in at
least float32 (float64 stays float64); every exp is of b_i - b_j with j <= i masked before the
exp, or of b_i <= 0.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from textattn.attention.common import Array
from textattn.attention.recurrent.chunking import compute_dtype as _compute_dtype
from textattn.attention.recurrent.chunking import document_runs, expand_heads
from textattn.attention.recurrent.layer import Core
from textattn.attention.recurrent.parallel import SEQUENCE, incoming_state, shard_over_sequence


class Inputs(NamedTuple):
  """A core's inputs, checked and brought to one form: heads repeated for grouped keys, all in the
  compute dtype, padding's beta and log-gate set to 0."""
  q: Array  # [batch, length, heads, key_dim]
  k: Array  # [batch, length, heads, key_dim]
  v: Array  # [batch, length, heads, value_dim]
  beta: Array  # [batch, length, heads]
  log_gates: Array  # [batch, length, heads] (zeros for DeltaNet)
  runs: Array  # int32 [batch, length], run numbers (`chunking.document_runs`)
  state: Array  # [batch, heads, key_dim, value_dim], the state the first run enters with
  scale: float


def compute_dtype(*arrays: Array | None) -> jnp.dtype:
  """At least float32; float64 if any input is float64 (None entries ignored)."""
  return _compute_dtype(*(a for a in arrays if a is not None))


def _inputs(q, k, v, beta, log_gates, scale, initial_state, real, runs) -> Inputs:
  batch, length, heads, value_dim = v.shape
  key_dim = k.shape[-1]
  if q.shape != k.shape or q.shape[:2] != (batch, length):
    raise ValueError(f"q {q.shape} and k {k.shape} must both be [batch, length, key_heads, "
                     f"key_dim] with v's batch and length ({v.shape}).")
  if beta.shape != (batch, length, heads):
    raise ValueError(f"beta {beta.shape} must be [batch, length, heads] = "
                     f"{(batch, length, heads)}.")
  if log_gates is not None and log_gates.shape != (batch, length, heads):
    raise ValueError(f"log_gates {log_gates.shape} must be [batch, length, heads] = "
                     f"{(batch, length, heads)} (one gate per head and position).")
  state_shape = (batch, heads, key_dim, value_dim)
  if initial_state is not None and initial_state.shape != state_shape:
    raise ValueError(f"initial_state {initial_state.shape} must be [batch, heads, key_dim, "
                     f"value_dim] = {state_shape}.")
  dtype = compute_dtype(q, k, v, beta, log_gates, initial_state)
  q, k = (expand_heads(x, heads, name).astype(dtype) for x, name in ((q, "q"), (k, "k")))
  beta = jnp.where(real[:, :, None], beta.astype(dtype), 0)
  gates = (jnp.zeros(beta.shape, dtype) if log_gates is None
           else jnp.where(real[:, :, None], log_gates.astype(dtype), 0))
  state = (jnp.zeros(state_shape, dtype) if initial_state is None
           else initial_state.astype(dtype))
  return Inputs(q, k, v.astype(dtype), beta, gates, runs.astype(jnp.int32), state,
                key_dim ** -0.5 if scale is None else scale)


def _runs(mask, segment_ids, batch, length) -> tuple[Array, Array]:
  return document_runs(mask, segment_ids, (batch, length))


# ---------------------------------------------------------------------------------------------
# Token by token.

def delta_rule_step(state: Array, q_t: Array, k_t: Array, v_t: Array, beta_t: Array,
                    log_gate_t: Array | None = None, *, scale: float,
                    reset: Array | None = None, real: Array | None = None) -> tuple[Array, Array]:
  """One token: state [batch, heads, key_dim, value_dim], q_t, k_t [batch, key_heads, key_dim],
  v_t [batch, heads, value_dim], beta_t and log_gate_t [batch, heads] (None: 0) -> (state in at
  least float32, o_t [batch, heads, value_dim] in v_t's dtype). `reset` bool [batch]: True where
  this token starts a new document (the state is emptied before it); `real` bool [batch]: False
  for padding (beta and log-gate taken as 0: the state is unchanged; o_t is still computed).

  exp(g) (I - beta k k^T) S + beta k v^T = D + beta k (v - D^T k)^T with D = exp(g) S."""
  heads = v_t.shape[1]
  dtype = compute_dtype(state, q_t, k_t, v_t, beta_t, log_gate_t)
  q_t, k_t = (expand_heads(x[:, None], heads, name)[:, 0].astype(dtype)
              for x, name in ((q_t, "q"), (k_t, "k")))
  beta_t = beta_t.astype(dtype)
  gate = jnp.zeros_like(beta_t) if log_gate_t is None else log_gate_t.astype(dtype)
  if real is not None:
    beta_t, gate = (jnp.where(real[:, None], x, 0) for x in (beta_t, gate))
  state = state.astype(dtype)
  if reset is not None:
    state = jnp.where(reset[:, None, None, None], 0, state)
  decayed = jnp.exp(gate)[..., None, None] * state
  error = v_t.astype(dtype) - jnp.einsum("bhk,bhkv->bhv", k_t, decayed)
  state = decayed + jnp.einsum("bhk,bhv->bhkv", k_t, beta_t[..., None] * error)
  out = scale * jnp.einsum("bhk,bhkv->bhv", q_t, state)
  return state, out.astype(v_t.dtype)


def delta_rule_recurrent(q: Array, k: Array, v: Array, beta: Array, log_gates: Array | None = None,
                         *, scale: float | None = None, initial_state: Array | None = None,
                         segment_ids: Array | None = None,
                         mask: Array | None = None) -> tuple[Array, Array]:
  """The delta rule token by token (lax.scan of `delta_rule_step`): the reference. O(length)
  sequential steps of O(key_dim * value_dim)."""
  real, runs = _runs(mask, segment_ids, *v.shape[:2])
  x = _inputs(q, k, v, beta, log_gates, scale, initial_state, real, runs)
  starts = jnp.concatenate([jnp.zeros_like(x.runs[:, :1], bool),
                            x.runs[:, 1:] != x.runs[:, :-1]], axis=1)

  def one(state, inputs):
    q_t, k_t, v_t, beta_t, gate_t, reset = inputs
    return delta_rule_step(state, q_t, k_t, v_t, beta_t, gate_t, scale=x.scale, reset=reset)

  time_major = lambda a: jnp.swapaxes(a, 0, 1)
  final, out = jax.lax.scan(one, x.state, tuple(map(time_major, (
      x.q, x.k, x.v, x.beta, x.log_gates, starts))))
  return time_major(out).astype(v.dtype), final


# ---------------------------------------------------------------------------------------------
# Chunkwise.

def unit_lower_triangular_inverse(a: Array) -> Array:
  """(I + a)^-1 for strictly lower triangular a [..., n, n] (its diagonal and upper part are
  ignored), by blocks: the inverses of the diagonal blocks of size s, paired into those of size
  2s by [[X1, 0], [A21, X2]]^-1 = [[X1, 0], [-X2 A21 X1, X2]], log2(n) levels of batched matrix
  products (n padded to a power of two with identity). Every intermediate is a block of the
  inverse itself, so nothing grows beyond it (as forward substitution, unlike a Neumann series),
  and it runs as matrix products: on a CPU about twice as fast as jax.scipy.linalg's
  solve_triangular for a chunk's 64 x 64 systems with 128 right-hand sides."""
  size = a.shape[-1]
  padded = 1 << (size - 1).bit_length()
  a = jnp.pad(a, [(0, 0)] * (a.ndim - 2) + [(0, padded - size)] * 2)
  batch = a.shape[:-2]
  inverse = jnp.ones(batch + (padded, 1, 1), a.dtype)  # [..., blocks, s, s]
  s = 1
  while s < padded:
    pairs = padded // (2 * s)
    diagonal = jnp.diagonal(a.reshape(batch + (pairs, 2 * s, pairs, 2 * s)), axis1=-4, axis2=-2)
    lower = jnp.moveaxis(diagonal, -1, -3)[..., s:, :s]  # A21 of each pair, [..., pairs, s, s]
    paired = inverse.reshape(batch + (pairs, 2, s, s))
    first, second = paired[..., 0, :, :], paired[..., 1, :, :]
    inverse = jnp.concatenate([
        jnp.concatenate([first, jnp.zeros_like(first)], axis=-1),
        jnp.concatenate([-second @ lower @ first, second], axis=-1)], axis=-2)
    s *= 2
  return inverse[..., 0, :size, :size]


def _chunk_products(q, k, v, beta, gates, run, carried_run, scale):
  """What each chunk's step needs that does not depend on the state, for all chunks at once:
  q, k, v [n, b, h, C, d], beta, gates [n, b, h, C], run [n, b, C], carried_run [n, b] ->
  (W, U, scale * Gamma * Q K^T masked, scale * exp(b) * Q for the carried run, exp(b_C - b) * K
  for the last run, exp(b_C) where the last run is the carried one). (Rematerialising it too
  changed neither the time nor XLA's temporary memory of forward + backward on a CPU.)"""
  chunk, key_dim = k.shape[-2:]
  tril = jnp.tril(jnp.ones((chunk, chunk), bool))
  same = tril & (run[..., :, None] == run[..., None, :])  # [n, b, C, C]: j <= i, same run
  same = same[:, :, None]  # (over heads)
  b = jnp.cumsum(gates, axis=-1)  # chunk-local, in the compute dtype
  gamma = jnp.where(same, jnp.exp(jnp.where(same, b[..., :, None] - b[..., None, :], 0)), 0)
  in_carried = (run == carried_run[..., None])[:, :, None]  # [n, b, 1, C]
  decay_in = jnp.where(in_carried, jnp.exp(b), 0)
  strictly = same & ~jnp.eye(chunk, dtype=bool)
  a = jnp.where(strictly, beta[..., :, None] * gamma * jnp.einsum("...id,...jd->...ij", k, k), 0)
  rhs = beta[..., None] * jnp.concatenate([decay_in[..., None] * k, v], axis=-1)
  wu = unit_lower_triangular_inverse(a) @ rhs
  w, u = wu[..., :key_dim], wu[..., key_dim:]
  scores = scale * gamma * jnp.einsum("...id,...jd->...ij", q, k)  # zero off (j <= i, same)
  q_state = scale * decay_in[..., None] * q
  last_run = run[..., -1:]  # [n, b, 1]
  in_last = (run == last_run)[:, :, None]  # [n, b, 1, C]
  b_last = b[..., -1:]
  k_out = jnp.where(in_last, jnp.exp(jnp.where(in_last, b_last - b, 0)), 0)[..., None] * k
  keep = jnp.where((last_run == carried_run[..., None])[:, :, None], jnp.exp(b_last), 0)
  return w, u, scores, q_state, k_out, keep


def _chunked(x: Inputs, chunk_size: int) -> tuple[Array, Array]:
  """The chunkwise form of prepared inputs -> (out in the compute dtype, final state)."""
  batch, length, heads, key_dim = x.k.shape
  value_dim = x.v.shape[-1]
  chunk = max(1, min(chunk_size, length))
  num_chunks = -(-length // chunk)
  extra = num_chunks * chunk - length

  def split(a, mode="constant"):  # [b, l, h, ...] -> [chunks, b, h, chunk, ...]
    a = jnp.pad(a, [(0, 0), (0, extra)] + [(0, 0)] * (a.ndim - 2), mode=mode)
    a = a.reshape((batch, num_chunks, chunk) + a.shape[2:])
    return jnp.moveaxis(a, (1, 2), (0, 3)) if a.ndim > 3 else jnp.moveaxis(a, 1, 0)

  # Padding to a multiple of the chunk: beta = 0 and gate 0 (zeros), in the last run ("edge").
  q, k, v = split(x.q), split(x.k), split(x.v)  # [n, b, h, C, d]
  beta, gates = split(x.beta), split(x.log_gates)  # [n, b, h, C]
  run = split(x.runs, "edge")  # [n, b, C]
  # The run the entering state belongs to: the previous token's (the first run's for chunk 0).
  before = jnp.concatenate([x.runs[:, :1], x.runs[:, :-1]], axis=1)
  carried_run = jnp.moveaxis(jnp.pad(before, [(0, 0), (0, extra)], mode="edge")[:, ::chunk], 1, 0)

  inputs = _chunk_products(q, k, v, beta, gates, run, carried_run, x.scale)

  @jax.checkpoint
  def one_chunk(state, inputs):
    w, u, scores, q_state, k_out, keep = inputs
    corrected = u - w @ state  # U' = U - W S
    out = q_state @ state + scores @ corrected
    state = keep[..., None] * state + jnp.swapaxes(k_out, -1, -2) @ corrected
    return state, out

  # (+ zeros_like of the inputs: inside shard_map the carry then varies as the body's output
  # does, where a replicated initial state meets sharded tokens)
  state = x.state + jnp.zeros_like(inputs[1][0][..., :1, :])
  final, out = jax.lax.scan(one_chunk, state, inputs)
  out = jnp.moveaxis(out, (0, 3), (1, 2)).reshape(batch, num_chunks * chunk, heads, value_dim)
  return out[:, :length], final


def delta_rule_chunked(q: Array, k: Array, v: Array, beta: Array, log_gates: Array | None = None,
                       *, scale: float | None = None, initial_state: Array | None = None,
                       segment_ids: Array | None = None, mask: Array | None = None,
                       chunk_size: int = 64) -> tuple[Array, Array]:
  """The delta rule chunk by chunk (the UT form, see the module docstring): the same function as
  `delta_rule_recurrent`, in O(length * chunk * (key_dim + value_dim)) work, length / chunk
  sequential steps; the backward pass keeps one state per chunk."""
  real, runs = _runs(mask, segment_ids, *v.shape[:2])
  out, final = _chunked(_inputs(q, k, v, beta, log_gates, scale, initial_state, real, runs),
                        chunk_size)
  return out.astype(v.dtype), final


# ---------------------------------------------------------------------------------------------
# Sequence parallelism.

def delta_rule_shard(q: Array, k: Array, v: Array, beta: Array, log_gates: Array | None = None,
                     *, axis_name: str, scale: float | None = None,
                     initial_state: Array | None = None, runs: Array | None = None,
                     mask: Array | None = None, chunk_size: int = 64) -> tuple[Array, Array]:
  """One shard of `delta_rule_chunked` with the length split into contiguous shards along
  `axis_name` (call inside jax.shard_map; arguments are this shard's [batch, n, ...] slices).

  `runs` and `mask` are `chunking.document_runs(mask, segment_ids)` of the WHOLE row, split like the
  tokens (None: one document, all real), so run numbers compare across shards. initial_state
  (replicated) enters shard 0. Returns (out, the state after this shard's last token): the last
  shard's is the sequence's final state.

  The state after a shard is M S_in + S_local, linear in the state it enters with: one chunked
  pass from [0 | I] with v widened by key_dim zero columns gives [S_local | M] (M key x key). The
  pairs are gathered and composed in order over the shards before this one, each entering with
  zero where its first run is not the previous shard's last; this shard enters likewise, and
  reruns the chunked form from that state."""
  batch, length, heads, value_dim = v.shape
  key_dim = k.shape[-1]
  real = jnp.ones((batch, length), bool) if mask is None else mask.astype(bool)
  runs = jnp.zeros((batch, length), jnp.int32) if runs is None else runs
  x = _inputs(q, k, v, beta, log_gates, scale, initial_state, real, runs)
  widened = x._replace(
      v=jnp.concatenate([x.v, jnp.zeros(x.v.shape[:3] + (key_dim,), x.v.dtype)], axis=-1),
      state=jnp.broadcast_to(jnp.concatenate([jnp.zeros((key_dim, value_dim), x.v.dtype),
                                              jnp.eye(key_dim, dtype=x.v.dtype)], axis=-1),
                             (batch, heads, key_dim, value_dim + key_dim)))
  _, pair = _chunked(widened, chunk_size)
  local, transition = pair[..., :value_dim], pair[..., value_dim:]
  incoming = incoming_state(local, x.runs[:, 0], x.runs[:, -1], transition, jnp.matmul,
                            initial=x.state)
  out, final = _chunked(x._replace(state=incoming), chunk_size)
  return out.astype(v.dtype), final


def sharded_delta_rule(q: Array, k: Array, v: Array, beta: Array, log_gates: Array | None = None,
                       *, scale: float | None = None, mesh, mask: Array | None = None,
                       segment_ids: Array | None = None, chunk_size: int = 64) -> Array:
  """`delta_rule_chunked`'s outputs with the length split over mesh's "sequence" axis (and its
  rows over "data"): `delta_rule_shard` on each shard, runs counted over the whole row."""
  real, runs = _runs(mask, segment_ids, *v.shape[:2])
  gates = () if log_gates is None else (log_gates,)

  def shard(q, k, v, beta, real, runs, *gates):
    return delta_rule_shard(q, k, v, beta, *gates, axis_name=SEQUENCE, scale=scale, runs=runs,
                            mask=real, chunk_size=chunk_size)[0]
  return shard_over_sequence(shard, mesh, (q, k, v, beta, real, runs) + gates, v.ndim)


DELTA_RULE = Core(recurrent=delta_rule_recurrent, chunked=delta_rule_chunked,
                  step=delta_rule_step, sharded=sharded_delta_rule)
