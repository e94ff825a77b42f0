"""A BERT-family encoder (Devlin et al. 2019; RoBERTa, Liu et al. 2019) in Flax, with any
registered attention variant.

    embeddings  word + token type + position (absolute, learned), LayerNorm, dropout
    block_i     h = LN(x + drop(attention(x)));  out = LN(h + drop(W_out act(W_in h)))
    pooler      tanh(W h[CLS])

A post-norm block like layers.EncoderBlock, except in what a checkpoint's config.json decides:
the activation (BERT's exact erf GELU, not Flax's default tanh approximation), the
LayerNorm epsilon (1e-12; RoBERTa's 1e-5), token-type embeddings, the pooler, and RoBERTa's
position numbering (real tokens from pad_token_id + 1, padding at pad_token_id); `BertConfig`
carries them (textattn/pretrained/hf.py reads it). LayerNorm computes its variance in two passes, as
PyTorch does (Flax's default one-pass E[x^2] - E[x]^2 loses digits when a feature's mean is
large against its spread, and an epsilon of 1e-12 hides nothing).

The self-attention is the registry's: `attention.get(name).build(...)`, called as
module(x, padding_mask). The "softmax" variant owns query/key/value/out DenseGeneral
projections of exactly BERT's shapes and biases, so BERT's weights fit it as they are (hf.py)
and the encoder computes BERT's function (tests/test_pretrained.py holds it to transformers' to
1e-5). Another variant keeps whichever of those projections it has and initialises the rest.

One difference, in training only: BERT also drops attention probabilities
(attention_probs_dropout_prob); the registry's kernels have no dropout inside, so fine-tuning
here regularises with the hidden dropout only. Evaluation is unaffected.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from textattn import attention as attention_lib
from textattn.errors import UsageError
from textattn.flax_layers import Dense
from textattn.models.layers import Dropout, masked_mean

Array = jax.Array

# config.json "hidden_act" -> the function. "gelu" is the exact (erf) GELU; "gelu_new" and
# "gelu_pytorch_tanh" are the tanh approximation (GPT-2, some distillations).
ACTIVATIONS = {
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
}
POOLINGS = ("cls", "mean")
# Where BertClassifier keeps the word-embedding table (step.TOKEN_TABLE_PATH's counterpart).
TOKEN_TABLE_PATH = ("encoder", "embeddings", "word", "embedding")


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """What the encoder takes from a checkpoint's config.json (hf.read_config)."""
  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  intermediate_size: int
  max_positions: int  # rows of the position table (max_position_embeddings)
  type_vocab_size: int = 2
  hidden_act: str = "gelu"
  layer_norm_eps: float = 1e-12
  hidden_dropout: float = 0.1
  pad_token_id: int = 0
  model_type: str = "bert"

  @property
  def padding_positions(self) -> bool:
    """RoBERTa numbers positions as fairseq did: real tokens pad_token_id + 1, + 2, ... (counted
    over real tokens only), padding pad_token_id; BERT numbers every slot 0, 1, 2, ..."""
    return self.model_type == "roberta"

  @property
  def usable_positions(self) -> int:
    """The longest input: the position table's rows, less the pad_token_id + 1 rows RoBERTa's
    numbering skips (514 - 2 = 512 for roberta-base)."""
    return self.max_positions - (self.pad_token_id + 1 if self.padding_positions else 0)


def bert_init():
  # BERT's initialiser (initializer_range 0.02), for what a checkpoint does not provide.
  return nn.initializers.normal(0.02)


def _layer_norm(config: BertConfig, dtype: Any, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(config.layer_norm_eps, dtype=dtype, use_fast_variance=False, name=name)


class BertEmbeddings(nn.Module):
  config: BertConfig
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, tokens: Array, token_types: Array, token_embeddings: Array | None = None, *,
               deterministic: bool) -> Array:
    c = self.config
    length = tokens.shape[1]
    if length > c.usable_positions:
      raise ValueError(f"An input of {length} tokens is longer than the pretrained model's "
                       f"{c.usable_positions} positions; use config.max_len <= "
                       f"{c.usable_positions}.")
    if c.padding_positions:  # RoBERTa's (transformers' create_position_ids_from_input_ids)
      real = (tokens != 0).astype(jnp.int32)  # (padding is id 0 here: data/pretrained_tokenizer.py)
      positions = jnp.cumsum(real, axis=1) * real + c.pad_token_id
    else:  # absolute positions 0..length-1 in every slot, padding included, as BERT's
      positions = jnp.arange(length)[None, :]
    embed = functools.partial(nn.Embed, features=c.hidden_size, embedding_init=bert_init(),
                              dtype=self.dtype)
    # Summed in transformers' order (word + type, then position): float addition is not
    # associative, and the reference test compares to 1e-5.
    word = embed(c.vocab_size, name="word")
    # token_embeddings: the rows of `tokens` looked up by the caller, which differentiates with
    # respect to them (step.train_step's keras_adam path, explain's gradient x input).
    x = word(tokens) if token_embeddings is None else token_embeddings.astype(self.dtype)
    x = x + embed(c.type_vocab_size, name="token_type")(token_types)
    x = x + embed(c.max_positions, name="position")(positions)
    x = _layer_norm(c, self.dtype, "norm")(x)
    return Dropout(c.hidden_dropout)(x, deterministic=deterministic)


class BertBlock(nn.Module):
  config: BertConfig
  attention: str = "softmax"
  attention_impl: str = "auto"
  dtype: Any = jnp.float32
  attention_options: tuple = ()  # EncoderBlock.attention_options

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array, *, deterministic: bool) -> Array:
    c = self.config
    attend = attention_lib.get(self.attention).build(
        num_heads=c.num_heads, implementation=self.attention_impl, dtype=self.dtype,
        name="attention", **dict(self.attention_options))
    dropout = functools.partial(Dropout(c.hidden_dropout), deterministic=deterministic)
    dense = functools.partial(Dense, dtype=self.dtype, kernel_init=bert_init())
    x = _layer_norm(c, self.dtype, "norm_attention")(x + dropout(attend(x, padding_mask)))
    h = ACTIVATIONS[c.hidden_act](dense(c.intermediate_size, name="ffn_in")(x))
    return _layer_norm(c, self.dtype, "norm_ffn")(x + dropout(dense(c.hidden_size,
                                                                     name="ffn_out")(h)))


class BertEncoder(nn.Module):
  """tokens int [batch, length] -> (hidden [batch, length, hidden], pooled [batch, hidden]).

  tokens: textattn's ids, padding 0 (data/pretrained_tokenizer.py exchanges the model's padding id
  with 0, and hf.read_weights the embedding rows). padding_mask: True for real tokens (default:
  tokens != 0); token_types:
  segment ids (default: all 0, a single sentence); token_embeddings: the word-embedding rows of
  `tokens` [batch, length, hidden] when the caller looked them up (see BertEmbeddings)."""
  config: BertConfig
  attention: str = "softmax"
  attention_impl: str = "auto"
  dtype: Any = jnp.float32
  attention_options: tuple = ()

  @nn.compact
  def __call__(self, tokens: Array, *, train: bool = False, padding_mask: Array | None = None,
               token_types: Array | None = None,
               token_embeddings: Array | None = None) -> tuple[Array, Array]:
    c = self.config
    if padding_mask is None:
      padding_mask = tokens != 0
    padding_mask = padding_mask.astype(bool)
    if token_types is None:
      token_types = jnp.zeros_like(tokens)
    x = BertEmbeddings(c, self.dtype, name="embeddings")(tokens, token_types, token_embeddings,
                                                         deterministic=not train)
    for i in range(c.num_layers):
      x = BertBlock(c, self.attention, self.attention_impl, self.dtype, self.attention_options,
                    name=f"block_{i}")(
          x, padding_mask, deterministic=not train)
    pooled = jnp.tanh(Dense(c.hidden_size, dtype=self.dtype, kernel_init=bert_init(),
                            name="pooler")(x[:, 0]))
    return x, pooled


class BertClassifier(nn.Module):
  """tokens int [batch, length] -> logits float32 [batch, num_classes]: the encoder, then
  dropout and a linear layer on the pooled output ("cls": BERT's pooler on [CLS], as
  transformers' BertForSequenceClassification; "mean": the mean of the last hidden states over
  real tokens, as sentence-transformers' models such as all-MiniLM-L6-v2 were trained)."""
  config: BertConfig
  num_classes: int
  pooling: str = "cls"
  dropout_rate: float | None = None  # None: config.hidden_dropout
  attention: str = "softmax"
  attention_impl: str = "auto"
  dtype: Any = jnp.float32
  attention_options: tuple = ()

  @nn.compact
  def __call__(self, tokens: Array, *, train: bool = False, padding_mask: Array | None = None,
               token_embeddings: Array | None = None) -> Array:
    if self.pooling not in POOLINGS:
      raise UsageError(f"config.model.pooling={self.pooling!r} is not allowed for a pretrained "
                       f"encoder; allowed: {', '.join(POOLINGS)}.")
    if padding_mask is None:
      padding_mask = tokens != 0
    hidden, pooled = BertEncoder(self.config, self.attention, self.attention_impl, self.dtype,
                                 self.attention_options, name="encoder")(tokens, train=train, padding_mask=padding_mask,
                                                token_embeddings=token_embeddings)
    x = pooled if self.pooling == "cls" else masked_mean(hidden, padding_mask)
    rate = self.config.hidden_dropout if self.dropout_rate is None else self.dropout_rate
    x = Dropout(rate)(x, deterministic=not train)
    return Dense(self.num_classes, dtype=jnp.float32, kernel_init=bert_init(),
                 name="logits")(x)
