"""Encoder-decoder Transformer for translation, built from the attention registry.

    sources int [batch, S] (0 = padding) -> encoder: embedding + positions, encoder blocks
      (any registered variant: softmax, additive, ...), padding masked
    targets_in int [batch, T] ([start] w1 ... , 0 = padding) -> decoder: embedding + positions,
      decoder blocks of causal self-attention (a causal variant: causal, causal_additive,
      causal_additive_recurrent) + softmax cross-attention to the encoder (its padding
      masked) + feed-forward, post-LN as Deep Learning with Python's TransformerDecoder
    -> dropout -> logits float32 [batch, T, target vocabulary]

Decoding (`decode=True`, Flax examples/wmt's pattern; textattn/decoding.py): a first call on a
[batch, target_len] dummy allocates the "cache" collection; each later call feeds one token per
row and returns that position's logits, reading and updating the cache (softmax: cached
keys/values; causal additive: its running sums, plus the keys for the direct form).

With a mesh whose sequence axis has S > 1 devices (training only; decoding stays on one
device), sources and teacher-forced targets are padded to split over it (layers.pad_for_mesh),
the encoder's and the decoder's self-attention are their variants' sequence-sharded modules,
and the cross-attention runs in JAX's global view (XLA gathers the memory's keys and values).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from textattn import attention as attention_lib
from textattn.attention import sequence
from textattn.attention.common import dense_init
from textattn.attention.softmax import softmax_attention
from textattn.errors import UsageError
from textattn.flax_layers import Dense, DenseGeneral
from textattn.models.layers import (
  LAYER_NORM_EPSILON,
  Dropout,
  EncoderBlock,
  head_dim_argument,
  keras_embedding_init,
  pad_for_mesh,
)

Array = jax.Array


def token_table(vocab_size: int, embed_dim: int, dtype: Any, name: str | None = None) -> nn.Embed:
  return nn.Embed(vocab_size, embed_dim, embedding_init=keras_embedding_init, dtype=dtype,
                  name=name)


class Embed(nn.Module):
  """Token plus learned position embedding (the chapter's PositionalEmbedding); in decode mode
  the position is the cache's running index. `tokens`: a token table owned by the parent (shared
  or tied embeddings); None: its own ("token"). learned_positions=False: the token embedding
  alone (no "position" table: a model without positions, or whose attention turns its queries
  and keys by position, registry.Variant.rotary)."""
  vocab_size: int
  max_len: int
  embed_dim: int
  dtype: Any = jnp.float32
  tokens: nn.Module | None = None
  learned_positions: bool = True

  @nn.compact
  def __call__(self, tokens: Array, decode: bool = False, positions: Array | None = None) -> Array:
    """positions: int [batch, length] (packed documents restart at 0; None: 0, 1, 2, ...)."""
    table = (self.tokens if self.tokens is not None
             else token_table(self.vocab_size, self.embed_dim, self.dtype, "token"))
    x = table(tokens)
    if not self.learned_positions:
      return x
    table = self.param("position", keras_embedding_init, (self.max_len, self.embed_dim))
    if positions is not None and not decode:
      return x + jnp.take(table, positions, axis=0).astype(self.dtype)
    if decode and self.has_variable("cache", "position"):
      position = self.variable("cache", "position")
      positions = jax.lax.dynamic_slice_in_dim(table, position.value, 1)
      position.value = position.value + 1
      return x + positions[None].astype(self.dtype)
    if decode:
      self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
    return x + table[None, :tokens.shape[1]].astype(self.dtype)


class CrossAttention(nn.Module):
  """Softmax attention from decoder positions to the encoder's outputs (padding masked)."""
  num_heads: int
  dtype: Any = jnp.float32
  head_dim: int | None = None  # None: embed // num_heads

  @nn.compact
  def __call__(self, x: Array, memory: Array, memory_mask: Array, decode: bool = False) -> Array:
    """decode=True: the memory's keys and values are projected once, when the cache is
    allocated, and read from it at every later step (the memory does not change while decoding)."""
    embed = x.shape[-1]
    head_dim = self.head_dim or embed // self.num_heads
    dense = functools.partial(DenseGeneral, features=(self.num_heads, head_dim),
                              dtype=self.dtype, kernel_init=dense_init())
    query = dense(name="query")(x)
    if decode and self.has_variable("cache", "memory_keys"):
      keys = self.get_variable("cache", "memory_keys")
      values = self.get_variable("cache", "memory_values")
    else:
      keys, values = dense(name="key")(memory), dense(name="value")(memory)
      if decode:
        self.put_variable("cache", "memory_keys", keys)
        self.put_variable("cache", "memory_values", values)
    out = softmax_attention(query, keys, values, memory_mask, causal=False)
    return DenseGeneral(embed, axis=(-2, -1), dtype=self.dtype, kernel_init=dense_init(),
                        name="out")(out)


class DecoderBlock(nn.Module):
  """Causal self-attention, softmax cross-attention to `memory`, feed-forward (post-LN); with
  memory=None no cross-attention (a decoder-only language model's block, the same parameters
  less "cross_attention"/"norm_cross"); ffn_dim=0: no feed-forward either (nor its "norm_ffn":
  Zoology's attention-only blocks). `segment_ids`: packed documents, passed to the
  self-attention (a variant that takes them)."""
  attention: str
  num_heads: int
  ffn_dim: int
  dropout_rate: float = 0.1
  dtype: Any = jnp.float32
  head_dim: int | None = None  # None: embed // num_heads
  mesh: Any = None  # sequence parallelism of the self-attention (EncoderBlock.mesh)
  implementation: str = "xla"  # the self-attention's kernel (config.model.attention_impl)
  attention_options: tuple = ()  # EncoderBlock.attention_options

  @nn.compact
  def __call__(self, x, padding_mask, memory, memory_mask, *, deterministic: bool,
               decode: bool = False, length: int | None = None, segment_ids=None):
    embed = x.shape[-1]
    dropout = functools.partial(Dropout(self.dropout_rate), deterministic=deterministic,
                                length=length)
    norm = lambda name: nn.LayerNorm(LAYER_NORM_EPSILON, dtype=self.dtype, name=name)
    attend = sequence.build(
        attention_lib.get(self.attention), None if decode else self.mesh,
        num_heads=self.num_heads, implementation=self.implementation, dtype=self.dtype,
        name="self_attention",
        **head_dim_argument(self.head_dim), **dict(self.attention_options))
    # (decode and segment ids are passed only when asked: a plugin's variant need not take them)
    extra = {"decode": True} if decode else {}
    if segment_ids is not None:
      extra["segment_ids"] = segment_ids
    x = norm("norm_self")(x + dropout(attend(x, padding_mask, **extra)))
    if memory is not None:
      cross = CrossAttention(self.num_heads, self.dtype, self.head_dim, name="cross_attention")
      x = norm("norm_cross")(x + dropout(cross(x, memory, memory_mask, decode=decode)))
    if not self.ffn_dim:
      return x
    h = nn.relu(Dense(self.ffn_dim, dtype=self.dtype, kernel_init=dense_init(),
                      name="ffn_in")(x))
    h = Dense(embed, dtype=self.dtype, kernel_init=dense_init(), name="ffn_out")(h)
    return norm("norm_ffn")(x + dropout(h))


class Seq2Seq(nn.Module):
  source_vocab: int
  target_vocab: int
  source_len: int
  target_len: int
  embed_dim: int = 256
  num_heads: int = 8
  ffn_dim: int = 2048
  encoder_layers: int = 1
  decoder_layers: int = 1
  encoder_attention: str = "softmax"
  decoder_attention: str = "causal"
  dropout_rate: float = 0.1  # inside the blocks
  output_dropout_rate: float = 0.5  # before the output layer (the chapter's Dropout(0.5))
  dtype: Any = jnp.float32
  head_dim: int | None = None  # None: embed // num_heads; the chapter's Keras: 256 (= embed)
  share_embeddings: bool = False  # one token table for both sides (a shared vocabulary)
  tie_output: bool = False  # logits = x @ target token table^T + bias (no output kernel)
  mesh: Any = None  # training with sequence parallelism (see the module's docstring)

  def setup(self):
    variant = attention_lib.get(self.decoder_attention)
    if not variant.causal:
      raise UsageError(f"config.model.decoder_attention={self.decoder_attention!r} is not a "
                       f"causal variant; allowed: "
                       f"{', '.join(n for n in attention_lib.names() if attention_lib.get(n).causal)}.")
    if self.share_embeddings and self.source_vocab != self.target_vocab:
      raise ValueError(f"shared embeddings need one vocabulary; the source has "
                       f"{self.source_vocab} entries, the target {self.target_vocab}.")
    # Tables the parent owns (a new parameter layout) only when shared or tied.
    table = (token_table(self.target_vocab, self.embed_dim, self.dtype)
             if self.share_embeddings or self.tie_output else None)
    self.token_table = table
    self.source_embed = Embed(self.source_vocab, self.source_len, self.embed_dim, self.dtype,
                              table if self.share_embeddings else None)
    self.target_embed = Embed(self.target_vocab, self.target_len, self.embed_dim, self.dtype,
                              table)
    # (Initialised without the mesh: the same parameters, from a dummy batch of one row.)
    self._mesh = None if self.is_initializing() else self.mesh
    self.encoder = [EncoderBlock(self.encoder_attention, self.num_heads, self.ffn_dim,
                                 self.dropout_rate, "post", "auto", self.dtype, self.head_dim,
                                 mesh=self._mesh)
                    for _ in range(self.encoder_layers)]
    self.decoder = [DecoderBlock(self.decoder_attention, self.num_heads, self.ffn_dim,
                                 self.dropout_rate, self.dtype, self.head_dim, mesh=self._mesh)
                    for _ in range(self.decoder_layers)]
    self.output_dropout = Dropout(self.output_dropout_rate)
    if self.tie_output:
      self.logits_bias = self.param("logits_bias", nn.initializers.zeros, (self.target_vocab,))
    else:
      self.logits = Dense(self.target_vocab, dtype=jnp.float32, kernel_init=dense_init())

  def encode(self, sources: Array, *, train: bool = False) -> tuple[Array, Array]:
    mask = sources != 0
    x = self.source_embed(sources)
    length = x.shape[1]
    x, mask = pad_for_mesh(x, mask, self._mesh, attention_lib.get(self.encoder_attention).causal)
    for block in self.encoder:
      x = block(x, mask, deterministic=not train, length=length)
    return x, mask  # (with a mesh: padded to split over it, the padding masked)

  def decode(self, targets_in: Array, memory: Array, memory_mask: Array, *,
             train: bool = False, decode: bool = False) -> Array:
    mask = targets_in != 0
    if decode:  # in a decoding step every fed token is real (rows that ended are ignored)
      mask = jnp.ones_like(mask)
    x = self.target_embed(targets_in, decode=decode)
    length = x.shape[1]
    if not decode:
      x, mask = pad_for_mesh(x, mask, self._mesh, causal=True)
    for block in self.decoder:
      x = block(x, mask, memory, memory_mask, deterministic=not train, decode=decode,
                length=length)
    x = self.output_dropout(x, deterministic=not train, length=length)
    if self.tie_output:
      table = self.token_table.embedding.astype(jnp.float32)
      logits = jnp.einsum("...d,vd->...v", x.astype(jnp.float32), table) + self.logits_bias
    else:
      logits = self.logits(x)
    return logits[:, :length]  # (the mesh's padding dropped)

  def __call__(self, sources: Array, targets_in: Array, *, train: bool = False) -> Array:
    memory, memory_mask = self.encode(sources, train=train)
    return self.decode(targets_in, memory, memory_mask, train=train)
