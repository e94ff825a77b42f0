"""Gated and delta-rule linear recurrences (RetNet, GLA, Mamba-2, DeltaNet, Gated DeltaNet): one
module per family over pieces written once.

The cores are public functions, apart from the layers (as flash-linear-attention's `fla.ops`),
all with one set of conventions, so a user can call one directly and compare it with another
implementation:

    out, final_state = core(q, k, v, log_gates, ..., *, scale=None, initial_state=None,
                            segment_ids=None, mask=None)

  q, k         [batch, length, key_heads, key_dim]; key_heads divides heads (grouped queries and
               keys: Mamba-2's B and C are shared by the heads of a group; head h reads key head
               h // (heads // key_heads)).
  v            [batch, length, heads, value_dim].
  log_gates    log of the decay, <= 0: [batch, length, heads] (a scalar per head and position:
               RetNet, Mamba-2, Gated DeltaNet) or [batch, length, heads, key_dim] (GLA's per
               key dimension). Position t's gate multiplies the state before t is written.
  beta         (delta rule only) [batch, length, heads], the write strength in [0, 1].
  scale        multiplies q (key_dim ** -0.5 by default; Mamba-2's layer passes 1).
  initial_state [batch, heads, key_dim, value_dim] (None: zeros); the state S is key x value,
               o_t = scale * S_t^T q_t (the papers write its transpose).
  segment_ids  int [batch, length] (None: each row one document): a position whose id differs
               from the previous position's starts a new document, and the state is emptied
               before it, a boundary inside a chunk included; the initial state belongs to the
               first document, the final state is the last document's.
  mask         bool [batch, length] (None: all real): False marks padding, which neither decays
               nor writes the state (its output is computed but means nothing).
  Returns      out [batch, length, heads, value_dim] in v's dtype and the final state in at
               least float32 (float64 inputs stay float64).

The recurrences, token by token (the `recurrent` forms, each variant's reference):
  gated:       S_t = exp(g_t) S_{t-1} + k_t v_t^T                     (g broadcast over values)
  delta rule:  S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T   (g = 0: DeltaNet)
  output:      o_t = scale * S_t^T q_t

The `chunked` forms compute the same in chunks of `chunk_size` tokens (64 by default): within a
chunk, matrix products masked to j <= i; across chunks, the state, carried by lax.scan whose
body is rematerialised (the backward pass keeps one state per chunk). Numerics: log-gates are
summed from each chunk's start (never over the whole sequence), in at least float32; every
`exp` is of a difference b_i - b_j with j <= i, masked before the `exp`, so it is <= 0 and
neither value nor gradient overflows.
"""
