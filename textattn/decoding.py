"""Decoding a trained `seq2seq.Seq2Seq`: the cache, greedy search and beam search, all pure
functions of (model, params, sources) that jit whole (`jax.lax.while_loop` over positions, which
stops once every row has ended: a batch of short sentences costs a few steps, not max_len).

- `greedy_decode`: the most probable next token each step; cached (one decoder position per
  step, O(1) or O(t) attention work) or uncached (the whole decoder on the prefix every step,
  as Deep Learning with Python's `decode_sequence`).
- `beam_search`: `beam_size` hypotheses per row; finished ones are scored with GNMT's length
  penalty, log p / ((5 + length) / 6) ** alpha (Wu et al. 2016); alive ones carry their caches,
  re-ordered each step. beam_size=1 with alpha=0 is greedy search.

Rows end independently at their first [end]; outputs are int32 [batch, max_len], tokens after
[start] up to and including [end], then 0s. Id 0 (padding) is never decoded.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from textattn.models.seq2seq import Array, Seq2Seq

NEG_INF = -1.0e9


def init_cache(model: Seq2Seq, params, memory: Array, memory_mask: Array):
  """The empty decoding cache for a batch of encoder outputs (allocated for target_len)."""
  dummy = jnp.ones((memory.shape[0], model.target_len), jnp.int32)
  _, variables = model.apply({"params": params}, dummy, memory, memory_mask, decode=True,
                             method=Seq2Seq.decode, mutable=["cache"])
  return variables["cache"]


def decode_step(model: Seq2Seq, params, cache, tokens: Array, memory: Array,
                memory_mask: Array) -> tuple[Array, Any]:
  """Logits [batch, vocab] of the next position after feeding `tokens` [batch] (the previous
  output of each row), and the updated cache."""
  logits, updated = model.apply({"params": params, "cache": cache}, tokens[:, None], memory,
                                memory_mask, decode=True, method=Seq2Seq.decode,
                                mutable=["cache"])
  return logits[:, 0], updated["cache"]


def greedy_decode(model: Seq2Seq, params, sources: Array, start_id: int, end_id: int,
                  max_len: int | None = None, cached: bool = True) -> Array:
  """Greedy translations int [batch, max_len]: each row's tokens after [start], up to and
  including its first [end], then 0s. cached=False re-runs the whole decoder on the prefix for
  every token (the chapter's way; for comparison and tests)."""
  max_len = max_len or model.target_len
  memory, memory_mask = model.apply({"params": params}, sources, method=Seq2Seq.encode)
  batch = sources.shape[0]
  out = jnp.zeros((batch, max_len), jnp.int32)
  done = jnp.zeros((batch,), bool)
  if cached:
    cache = init_cache(model, params, memory, memory_mask)

    def body(carry):
      t, out, done, cache, previous = carry
      logits, cache = decode_step(model, params, cache, previous, memory, memory_mask)
      token = jnp.where(done, 0, jnp.argmax(_no_padding(logits), -1).astype(jnp.int32))
      out = out.at[:, t].set(token)
      return t + 1, out, done | (token == end_id), cache, token

    start = jnp.full((batch,), start_id, jnp.int32)
    carry = (jnp.asarray(0), out, done, cache, start)
    return jax.lax.while_loop(lambda c: _running(c[0], c[2], max_len), body, carry)[1]

  def body_uncached(carry):
    t, out, done = carry
    prefix = jnp.concatenate([jnp.full((batch, 1), start_id, jnp.int32), out], axis=1)
    prefix = jnp.where(jnp.arange(max_len + 1)[None] <= t, prefix, 0)[:, :model.target_len]
    logits = model.apply({"params": params}, prefix, memory, memory_mask,
                         method=Seq2Seq.decode)
    token = jnp.where(done, 0, jnp.argmax(_no_padding(logits[:, t]), -1).astype(jnp.int32))
    return t + 1, out.at[:, t].set(token), done | (token == end_id)

  return jax.lax.while_loop(lambda c: _running(c[0], c[2], max_len), body_uncached,
                            (jnp.asarray(0), out, done))[1]


def _running(t, done, max_len: int):
  return (t < max_len) & ~jnp.all(done)


def _no_padding(logits: jax.Array) -> jax.Array:
  """Id 0 is padding, never an output token (it would end the text for the decoder's mask)."""
  return logits.at[..., 0].set(NEG_INF)


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
  return ((5.0 + length) / 6.0) ** alpha


def _reorder(cache, batch: int, beam: int, rows: jax.Array):
  """Each cache leaf with a leading batch*beam axis, its beams re-ordered by `rows`
  [batch, beam] (the beam each new hypothesis continues); shared scalars stay."""
  def take(leaf):
    if leaf.ndim == 0:
      return leaf
    grouped = leaf.reshape((batch, beam) + leaf.shape[1:])
    picked = jnp.take_along_axis(grouped, rows.reshape((batch, beam) + (1,) * (leaf.ndim - 1)),
                                 axis=1)
    return picked.reshape(leaf.shape)
  return jax.tree.map(take, cache)


def beam_search(model: Seq2Seq, params, sources: jax.Array, start_id: int, end_id: int,
                beam_size: int = 4, alpha: float = 0.6, max_len: int | None = None,
                stop_early: bool = True) -> tuple[jax.Array, jax.Array]:
  """(tokens int32 [batch, max_len], scores float32 [batch]): each row's best finished
  hypothesis by log p / length_penalty (an unfinished one only if none finished).
  stop_early: stop once no row's result can change (False: always max_len steps; tests)."""
  max_len = max_len or model.target_len
  batch, beam = sources.shape[0], beam_size
  memory, memory_mask = model.apply({"params": params}, sources, method=Seq2Seq.encode)
  memory = jnp.repeat(memory, beam, axis=0)
  memory_mask = jnp.repeat(memory_mask, beam, axis=0)
  cache = init_cache(model, params, memory, memory_mask)
  alive = jnp.zeros((batch, beam, max_len), jnp.int32)
  # Only the first beam is live at the start (the others would duplicate it).
  alive_scores = jnp.tile(jnp.array([0.0] + [NEG_INF] * (beam - 1)), (batch, 1))
  finished = jnp.zeros((batch, beam, max_len), jnp.int32)
  finished_scores = jnp.full((batch, beam), NEG_INF)
  previous = jnp.full((batch * beam,), start_id, jnp.int32)

  def settled(t, alive_scores, finished_scores):
    """Every row's best finished hypothesis beats anything its alive ones can still become
    (log p < 0 only falls; the penalty is monotone in length, so at most its larger end
    value): the result is final."""
    largest = jnp.maximum(length_penalty(t + 1.0, alpha), length_penalty(float(max_len), alpha))
    return jnp.all(finished_scores[:, 0] >= alive_scores[:, 0] / largest)

  def running(carry):
    t, _, alive_scores, _, finished_scores, _, _ = carry
    return (t < max_len) & ~(stop_early & settled(t, alive_scores, finished_scores))

  def body(carry):
    t, alive, alive_scores, finished, finished_scores, cache, previous = carry
    logits, cache = decode_step(model, params, cache, previous, memory, memory_mask)
    vocab = logits.shape[-1]
    log_probs = jax.nn.log_softmax(_no_padding(logits.astype(jnp.float32)))
    log_probs = log_probs.reshape(batch, beam, vocab)
    candidates = (alive_scores[..., None] + log_probs).reshape(batch, beam * vocab)
    scores, flat = jax.lax.top_k(candidates, 2 * beam)
    origin, token = flat // vocab, (flat % vocab).astype(jnp.int32)
    sequences = jnp.take_along_axis(alive, origin[..., None], axis=1).at[:, :, t].set(token)
    ended = token == end_id
    # Finished: the best `beam` of the old finished and the ones ending now.
    ending = jnp.where(ended, scores / length_penalty(t + 1.0, alpha), NEG_INF)
    pool_scores = jnp.concatenate([finished_scores, ending], axis=1)
    pool = jnp.concatenate([finished, sequences], axis=1)
    finished_scores, keep = jax.lax.top_k(pool_scores, beam)
    finished = jnp.take_along_axis(pool, keep[..., None], axis=1)
    # Alive: the best `beam` that did not end.
    alive_scores, keep = jax.lax.top_k(jnp.where(ended, NEG_INF, scores), beam)
    alive = jnp.take_along_axis(sequences, keep[..., None], axis=1)
    cache = _reorder(cache, batch, beam, jnp.take_along_axis(origin, keep, axis=1))
    previous = jnp.take_along_axis(token, keep, axis=1).reshape(-1)
    return t + 1, alive, alive_scores, finished, finished_scores, cache, previous

  _, alive, alive_scores, finished, finished_scores, _, _ = jax.lax.while_loop(
      running, body,
      (jnp.asarray(0), alive, alive_scores, finished, finished_scores, cache, previous))
  any_finished = finished_scores[:, 0] > NEG_INF / 2
  tokens = jnp.where(any_finished[:, None], finished[:, 0], alive[:, 0])
  scores = jnp.where(any_finished, finished_scores[:, 0],
                     alive_scores[:, 0] / length_penalty(float(max_len), alpha))
  return tokens, scores
