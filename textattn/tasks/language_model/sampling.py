"""Sampling from a trained language model with its decoding cache.

`sample(model, params, prompts, ...)`: each prompt (token ids, no specials) starts a document,
[start] prompt; the model is fed one token per step through its cache (the softmax keys and
values, as translation decodes: models/seq2seq.py), the prompt's tokens forced, then up to
`max_tokens` new ones drawn, until [end]. One `jax.lax.while_loop`, jitted whole. A draw is
keyed by (seed, position) and depends on nothing but its own row's logits: a prompt gets the
same continuation alone or in any batch, in any row (so one prompt given twice gets one
continuation twice: several samples of a prompt take several seeds). temperature 0 is greedy
(argmax); top_k > 0 keeps the k most probable tokens. Padding and [start] are never drawn.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from textattn.errors import UsageError
from textattn.tasks.language_model.tokenizers import END_ID, PAD_ID, START_ID


def next_token(logits: jax.Array, key: jax.Array, temperature: float, top_k: int) -> jax.Array:
  """Tokens int32 [batch] drawn from logits [batch, vocab] (see the module's docstring). The
  banned tokens' logits are -inf after the temperature's scaling (a finite floor divided by a
  large temperature would come within reach); a top_k of the whole vocabulary keeps it all."""
  logits = logits.astype(jnp.float32)
  if temperature:
    logits = logits / temperature
  logits = logits.at[:, PAD_ID].set(-jnp.inf).at[:, START_ID].set(-jnp.inf)
  if temperature == 0:
    return jnp.argmax(logits, -1).astype(jnp.int32)
  if 0 < top_k < logits.shape[-1]:
    threshold = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits >= threshold, logits, -jnp.inf)
  # (one key for every row: categorical over [batch, vocab] gives row i the i-th slice of its
  # noise, so a prompt's draw would depend on its row)
  return jax.vmap(lambda row: jax.random.categorical(key, row))(logits).astype(jnp.int32)


def _sample(model, max_tokens, temperature, top_k, params, tokens, forced, seed_key):
  batch, total = tokens.shape
  _, variables = model.apply({"params": params}, jnp.ones((batch, model.max_len), jnp.int32),
                             decode=True, mutable=["cache"])

  def running(carry):
    t, _, done, _ = carry
    return (t < total - 1) & ~jnp.all(done)

  def body(carry):
    t, tokens, done, cache = carry
    logits, updated = model.apply({"params": params, "cache": cache}, tokens[:, t, None],
                                  decode=True, mutable=["cache"])
    drawn = next_token(logits[:, 0], jax.random.fold_in(seed_key, t), temperature, top_k)
    generating = t + 1 >= forced
    token = jnp.where(generating, drawn, tokens[:, t + 1])
    token = jnp.where(done, PAD_ID, token)
    ended = generating & ((token == END_ID) | (t + 2 - forced >= max_tokens))
    return t + 1, tokens.at[:, t + 1].set(token), done | ended, updated["cache"]

  carry = (jnp.asarray(0), tokens, jnp.zeros((batch,), bool), variables["cache"])
  return jax.lax.while_loop(running, body, carry)[1]


@functools.lru_cache(maxsize=8)
def _compiled(model, max_tokens: int, temperature: float, top_k: int):
  """The jitted sampler of one (model, settings): a later call of the same compiles nothing."""
  return jax.jit(functools.partial(_sample, model, max_tokens, temperature, top_k))


def sample(model, params, prompts: list[np.ndarray], max_tokens: int, temperature: float = 1.0,
           top_k: int = 0, seed: int = 0) -> list[np.ndarray]:
  """Per prompt, the drawn token ids (up to and excluding [end])."""
  if max_tokens < 1:
    raise UsageError(f"--max_tokens={max_tokens} must be >= 1.")
  if not (math.isfinite(temperature) and temperature >= 0):
    raise UsageError(f"--temperature={temperature} must be a finite number >= 0 (0: greedy).")
  if top_k < 0:
    raise UsageError(f"--top_k={top_k} must be >= 0 (0: all tokens).")
  if not prompts:
    return []
  longest = max(len(p) for p in prompts)
  total = longest + 1 + max_tokens  # (positions fed to the model: all but the last drawn)
  if total - 1 > model.max_len:
    raise UsageError(f"a prompt of {longest} tokens plus --max_tokens={max_tokens} does not fit "
                     f"the model's context of max_len={model.max_len} tokens (the start token "
                     f"included); shorten either.")
  tokens = np.zeros((len(prompts), total), np.int32)
  tokens[:, 0] = START_ID
  for row, prompt in enumerate(prompts):
    tokens[row, 1:1 + len(prompt)] = prompt
  forced = np.asarray([len(p) + 1 for p in prompts], np.int32)
  run = _compiled(model, max_tokens, float(temperature), int(top_k))
  out = np.asarray(run(params, jnp.asarray(tokens), jnp.asarray(forced), jax.random.key(seed)))
  results = []
  for row, start in enumerate(forced):
    drawn = out[row, start:start + max_tokens]
    stop = np.flatnonzero((drawn == END_ID) | (drawn == PAD_ID))
    results.append(drawn[:stop[0]] if len(stop) else drawn)
  return results
