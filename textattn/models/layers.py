"""The classifier's layers: embeddings (learned or sinusoidal positions, hashed bigrams, word
dropout), deterministic dropout, the encoder block around any registered attention variant, the
padding that splits a length over a mesh's sequence axis, and the poolings.

Token id 0 is padding everywhere; no layer lets a padding position contribute (models/__init__.py
assembles them).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from textattn import attention as attention_lib
from textattn import sharding
from textattn.attention import sequence
from textattn.errors import UsageError
from textattn.flax_layers import Dense, column_sum

Array = jax.Array

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}  # config.model.dtype -> the dtype
LAYER_NORM_EPSILON = 1e-6


def embedding_config() -> ml_collections.ConfigDict:
  """config.embedding, an opt-in part (config.complete): a token table trained from scratch (the
  attention encoder's, the BiLSTM's): its initialisation and the encoder's input extras."""
  part = ml_collections.ConfigDict()
  # random (Keras' uniform) | word2vec (recipe) | vectors:PATH (a word2vec/GloVe file,
  # textattn/recipes/vectors.py)
  part.init = "random"
  part.vectors_scale = "raw"  # vectors:PATH: raw (the file's) | init (the random spread)
  part.token_dropout_rate = 0.0  # word dropout: a token's embedding zeroed in training
  part.bigram_buckets = 0  # > 0: hashed (previous, current) token embeddings, this many
  return part


def keras_embedding_init(key, shape, dtype=jnp.float32):
  # Keras Embedding's default: uniform in [-0.05, 0.05], as in the seed notebooks.
  return jax.random.uniform(key, shape, dtype, -0.05, 0.05)


def sinusoidal_positions(max_len: int, embed_dim: int) -> np.ndarray:
  """The fixed sin/cos table of Vaswani et al. (2017), [max_len, embed_dim]."""
  positions = np.arange(max_len)[:, None]
  rates = 1.0 / np.power(10000.0, (2 * (np.arange(embed_dim) // 2)) / embed_dim)
  angles = positions * rates[None, :]
  table = np.zeros((max_len, embed_dim), np.float32)
  table[:, 0::2] = np.sin(angles[:, 0::2])
  table[:, 1::2] = np.cos(angles[:, 1::2])
  return table


def _lowbias32(x: Array) -> Array:
  """Chris Wellons' lowbias32 integer hash: a full-avalanche uint32 -> uint32 mix."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def dropout_bits(key: Array, shape: tuple[int, ...]) -> Array:
  """16 random bits (as uint32 in [0, 65536)) for every element of `shape`.

  Two 32-bit words from the threefry key, then a counter-based hash of each element's index,
  hash(hash(index ^ k0) + k1): one fused elementwise loop, where jax.random.bits' rolled
  20-round threefry loop was ~20% of the seed model's step on a CPU (experiments/RESULTS.md).
  A bit depends only on the key and the element's index, so it is the same however the batch
  is sharded.
  """
  k0, k1 = jax.random.bits(key, (2,))
  index = jax.lax.iota(jnp.uint32, int(np.prod(shape))).reshape(shape)
  return _lowbias32(_lowbias32(index ^ k0) + k1) >> 16


class Dropout(nn.Module):
  """Inverted dropout from 16 random bits per element (see `dropout_bits`).

  The drop probability is `rate` rounded to a multiple of 1/65536 (0.1 -> 0.100006); kept
  values are scaled by the exact keep probability, so the expectation is unchanged.
  `length`: the sequence length x [batch, length', ...] had before a sequence-parallel model
  padded it to split over the mesh (`pad_for_mesh`): the bits are drawn for that length, so
  every real position drops as it does unpadded (the padding's bits are never used).
  """
  rate: float

  @nn.compact
  def __call__(self, x: Array, *, deterministic: bool, length: int | None = None) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    threshold = round(self.rate * 65536)
    keep_prob = 1.0 - threshold / 65536
    if length is None or length == x.shape[1]:
      bits = dropout_bits(self.make_rng("dropout"), x.shape)
    else:
      bits = dropout_bits(self.make_rng("dropout"), (x.shape[0], length, *x.shape[2:]))
      bits = jnp.pad(bits, [(0, 0), (0, x.shape[1] - length)] + [(0, 0)] * (x.ndim - 2))
    keep = bits >= threshold
    return jnp.where(keep, x / jnp.asarray(keep_prob, x.dtype), jnp.zeros_like(x))


def bigram_ids(tokens: Array, buckets: int) -> Array:
  """Each position's (previous token, token) pair hashed into [0, buckets): int32, same shape.
  The first position's previous token is 0, so a review's opening word has a bigram of its own;
  the id of a padding position is irrelevant (the caller zeroes its embedding)."""
  tokens = tokens.astype(jnp.uint32)
  previous = jnp.pad(tokens, ((0, 0), (1, 0)))[:, :-1]
  mixed = _lowbias32(_lowbias32(previous + jnp.uint32(0x9E3779B9)) ^ tokens)
  return (mixed % jnp.uint32(buckets)).astype(jnp.int32)


class Embedding(nn.Module):
  """Token embedding plus a learned (the seeds) or sinusoidal position embedding, plus, with
  bigram_buckets > 0, a hashed embedding of each position's (previous token, token) pair."""
  vocab_size: int
  max_len: int
  embed_dim: int
  position: str = "learned"
  dtype: Any = jnp.float32
  bigram_buckets: int = 0

  @nn.compact
  def __call__(self, tokens: Array, token_embeddings: Array | None = None,
               token_drop: Array | None = None, mask_input: Array | None = None) -> Array:
    """token_drop: bool [batch, length], True where the token embedding is zeroed (word
    dropout); the position embedding is kept. mask_input: bool [batch, length], True where the
    token embedding is replaced by a learned [MASK] vector (masked-language-model pretraining,
    textattn/recipes/pretrain.py; the parameter "mask" exists only in the pretraining model)."""
    length = tokens.shape[1]
    if length > self.max_len:
      raise UsageError(f"config.max_len={self.max_len} is smaller than the input length "
                       f"{length}; inputs must have at most max_len tokens.")
    if token_embeddings is None:
      x = nn.Embed(self.vocab_size, self.embed_dim, embedding_init=keras_embedding_init,
                   dtype=self.dtype, name="token")(tokens)
    else:  # rows looked up by the caller (the lazy embedding update differentiates w.r.t. them)
      x = token_embeddings.astype(self.dtype)
    if self.bigram_buckets:
      # fastText's n-gram features inside the encoder: a table of bigram_buckets rows, zero at
      # the start (so training starts from the unigram model), added to the token embedding of
      # the pair's second token; never at padding (id 0). Word dropout below hides both.
      bigrams = nn.Embed(self.bigram_buckets, self.embed_dim, embedding_init=nn.initializers.zeros,
                         dtype=self.dtype, name="bigram")(bigram_ids(tokens, self.bigram_buckets))
      x = x + jnp.where((tokens != 0)[..., None], bigrams, jnp.zeros_like(bigrams))
    if token_drop is not None:
      x = jnp.where(token_drop[..., None], jnp.zeros_like(x), x)
    if mask_input is not None:
      mask = self.param("mask", keras_embedding_init, (self.embed_dim,))
      x = jnp.where(mask_input[..., None], mask.astype(self.dtype), x)
    if self.position == "learned":
      table = self.param("position", keras_embedding_init, (self.max_len, self.embed_dim))
    else:
      table = jnp.asarray(sinusoidal_positions(self.max_len, self.embed_dim))
    return add_positions(x, table[:length].astype(self.dtype))


@jax.custom_vjp
def add_positions(x: Array, positions: Array) -> Array:
  """x [batch, length, dim] + positions [length, dim]. Its backward sums the batch's gradient
  for the positions as one matrix-vector product: XLA:CPU ran the reduction over the batch axis
  (fused with the four gradients that meet there) ~2.5x slower, 0.5 ms of the seed model's
  softmax step (experiments/cpu_step/README.md)."""
  return x + positions[None]


def _add_positions_forward(x, positions):
  return x + positions[None], None


def _add_positions_backward(_, g):
  summed = column_sum(g.reshape(g.shape[0], -1))
  return g, summed.reshape(g.shape[1:]).astype(g.dtype)


add_positions.defvjp(_add_positions_forward, _add_positions_backward)


def head_dim_argument(head_dim: int | None) -> dict:
  """The build() keyword for a head size other than embed // num_heads: given only when set, so
  variants without the option (additive, plugins) keep the registry's one signature."""
  return {} if not head_dim else {"head_dim": int(head_dim)}


def accepts_head_dim(variant: str) -> bool:
  import inspect
  return "head_dim" in inspect.signature(attention_lib.get(variant).build).parameters


class EncoderBlock(nn.Module):
  """Self-attention + ReLU feed-forward, each with dropout and a residual connection.

  norm="post" is the seeds' block: LN(x + drop(attn(x))), LN(x + drop(ffn(x))).
  norm="pre" is LN-first: x + drop(attn(LN(x))), x + drop(ffn(LN(x))).
  """
  attention: str
  num_heads: int
  ffn_dim: int
  dropout_rate: float = 0.1
  norm: str = "post"
  attention_impl: str = "auto"
  dtype: Any = jnp.float32
  head_dim: int | None = None  # None: embed // num_heads
  # A mesh with a "sequence" axis of S > 1 devices: attention is the variant's sequence-sharded
  # module (textattn/attention/sequence.py), x's length split over S; None: one device's.
  mesh: Any = None
  # The variant's options (registry.build_options of config.model: config.model.window.size...)
  attention_options: tuple = ()

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array, *, deterministic: bool,
               length: int | None = None) -> Array:
    """length: x's length before `pad_for_mesh` padded it (for dropout's bits; None: x's)."""
    embed = x.shape[-1]
    attend = sequence.build(
        attention_lib.get(self.attention), self.mesh, num_heads=self.num_heads,
        implementation=self.attention_impl, dtype=self.dtype, name="attention",
        **head_dim_argument(self.head_dim), **dict(self.attention_options))
    layer_norm = lambda name: nn.LayerNorm(LAYER_NORM_EPSILON, dtype=self.dtype, name=name)
    dropout = functools.partial(Dropout(self.dropout_rate), deterministic=deterministic,
                                length=length)

    def feed_forward(h):
      h = Dense(self.ffn_dim, dtype=self.dtype, kernel_init=nn.initializers.xavier_uniform(),
                name="ffn_in")(h)
      h = nn.relu(h)
      return Dense(embed, dtype=self.dtype, kernel_init=nn.initializers.xavier_uniform(),
                   name="ffn_out")(h)

    if self.norm == "post":
      x = layer_norm("norm_attention")(x + dropout(attend(x, padding_mask)))
      return layer_norm("norm_ffn")(x + dropout(feed_forward(x)))
    x = x + dropout(attend(layer_norm("norm_attention")(x), padding_mask))
    return x + dropout(feed_forward(layer_norm("norm_ffn")(x)))


def pad_for_mesh(x: Array, padding_mask: Array, mesh, causal: bool) -> tuple[Array, Array]:
  """x [batch, length, embed] and its mask padded at the end to a length the mesh's sequence
  axis splits (S shards; 2S for a causal variant, whose zig-zag ring halves each shard), and
  placed split along it. The padding is masked, so attention and every pooling are exact; it
  is never a real token's key, and a causal query never sees it (it comes last). Unchanged
  without a sequence axis of more than one device."""
  shards = sharding.sequence_size(mesh)
  if shards == 1:
    return x, padding_mask
  unit = shards * (2 if causal else 1)
  extra = -x.shape[1] % unit
  x = jnp.pad(x, ((0, 0), (0, extra), (0, 0)))
  padding_mask = jnp.pad(padding_mask, ((0, 0), (0, extra)))
  return (jax.lax.with_sharding_constraint(x, sharding.length_sharding(mesh, 3)),
          jax.lax.with_sharding_constraint(padding_mask, sharding.length_sharding(mesh, 2)))


def masked_mean(x: Array, padding_mask: Array) -> Array:
  weights = padding_mask[..., None].astype(x.dtype)
  count = jnp.maximum(jnp.sum(weights, axis=1), 1)
  return jnp.sum(x * weights, axis=1) / count


def masked_max(x: Array, padding_mask: Array) -> Array:
  lowest = jnp.finfo(x.dtype).min
  pooled = jnp.max(jnp.where(padding_mask[..., None], x, lowest), axis=1)
  return jnp.where(jnp.any(padding_mask, axis=1)[:, None], pooled, 0)  # fully padded row -> 0


def last_token(x: Array, padding_mask: Array) -> Array:
  """Hidden state at the last real token (tokens are left-aligned, padding on the right)."""
  last = jnp.maximum(jnp.sum(padding_mask, axis=1) - 1, 0)
  return jnp.take_along_axis(x, last[:, None, None], axis=1)[:, 0]


class AttentionPooling(nn.Module):
  """The Fastformer notebook's pooling: alpha = softmax(w2 . tanh(W1 x)) over real tokens."""
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array) -> Array:
    hidden = nn.tanh(Dense(x.shape[-1], dtype=self.dtype, name="hidden")(x))
    scores = Dense(1, dtype=jnp.float32, name="score")(hidden)[..., 0]
    scores = jnp.where(padding_mask, scores, -1e30)
    weights = jax.nn.softmax(scores, axis=1) * padding_mask  # a fully padded row pools to 0
    return jnp.einsum("bl,bld->bd", weights.astype(x.dtype), x)
