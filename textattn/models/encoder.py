"""The attention-encoder classifier: embeddings -> encoder blocks -> pooling -> head (the layers
are layers.py), registered as architecture "transformer"; the model config's checks and the
kernel "auto" resolves to, which every architecture shares. Padding: see models/__init__.py.
"""

from __future__ import annotations

import collections
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from textattn import attention as attention_lib
from textattn import sharding
from textattn.attention import sequence
from textattn.checks import check_choice, check_integer
from textattn.data import tokenizer as tokenizer_lib
from textattn.errors import UsageError
from textattn.flax_layers import Dense
from textattn.models import baselines, registry
from textattn.models.layers import (
  DTYPES,
  LAYER_NORM_EPSILON,
  AttentionPooling,
  Dropout,
  Embedding,
  EncoderBlock,
  dropout_bits,
  last_token,
  masked_max,
  masked_mean,
  pad_for_mesh,
)

Array = jax.Array

POOLINGS = ("mean", "max", "attention", "cls", "last")
POSITIONS = ("learned", "sinusoidal")
NORMS = ("post", "pre")

class Classifier(nn.Module):
  """tokens int[batch, length] (0 = padding) -> logits float32[batch, num_classes]."""
  num_classes: int
  vocab_size: int
  max_len: int
  embed_dim: int = 32
  num_heads: int = 2
  num_layers: int = 1
  ffn_dim: int = 32
  mlp_dim: int = 20
  dropout_rate: float = 0.1
  token_dropout_rate: float = 0.0
  attention: str = "softmax"
  attention_impl: str = "auto"
  position: str = "learned"
  norm: str = "post"
  pooling: str = "mean"
  dtype: Any = jnp.float32
  mask_padding: bool = True
  bigram_buckets: int = 0
  mesh: Any = None  # sequence parallelism (EncoderBlock.mesh); the length is padded to split
  attention_options: tuple = ()  # EncoderBlock.attention_options

  @nn.compact
  def __call__(self, tokens: Array, *, train: bool = False, padding_mask: Array | None = None,
               token_embeddings: Array | None = None, mlm_positions: Array | None = None,
               mask_input: Array | None = None) -> Array:
    # By default id 0 is padding; a caller may pass its own mask (True = real token).
    # token_embeddings: the token-embedding rows of `tokens` [batch, length, embed], when the
    # caller looked them up itself (step.train_step with keras_adam, for the per-occurrence squares).
    # mlm_positions: int [batch, K] -> masked-language-model logits float32 [batch, K, vocab]
    # at those token positions instead of class logits (textattn/recipes/pretrain.py): the same
    # embedding and encoder blocks, then a head of its own (mlm_dense, mlm_norm, mlm_bias) whose
    # output layer is the token-embedding table (tied, as BERT's). mask_input: bool
    # [batch, length], True where the input embedding is the learned [MASK] vector. No word
    # dropout in this mode (the masking replaces it).
    if padding_mask is None:
      padding_mask = tokens != 0 if self.mask_padding else jnp.ones(tokens.shape, bool)
    padding_mask = padding_mask.astype(bool)
    token_drop = None
    if train and self.token_dropout_rate > 0.0 and mlm_positions is None:
      # Word dropout (Iyyer et al. 2015): each token's embedding is zeroed with this
      # probability, without rescaling; the token still counts in the padding mask.
      threshold = round(self.token_dropout_rate * 65536)
      token_drop = dropout_bits(self.make_rng("dropout"), tokens.shape) < threshold
    embedding = Embedding(self.vocab_size, self.max_len, self.embed_dim, self.position,
                          self.dtype, self.bigram_buckets, name="embedding")
    x = embedding(tokens, token_embeddings, token_drop, mask_input)
    if self.pooling == "cls":
      cls = self.param("cls", nn.initializers.normal(0.02), (self.embed_dim,))
      x = jnp.concatenate([jnp.broadcast_to(cls.astype(x.dtype), x[:, :1].shape), x], axis=1)
      padding_mask = jnp.concatenate([jnp.ones_like(padding_mask[:, :1]), padding_mask], axis=1)
    length = x.shape[1]
    # (Initialised without the mesh: the same parameters, from a dummy batch of one row.)
    mesh = None if self.is_initializing() else self.mesh
    x, padding_mask = pad_for_mesh(x, padding_mask, mesh,
                                   attention_lib.get(self.attention).causal)
    for i in range(self.num_layers):
      x = EncoderBlock(self.attention, self.num_heads, self.ffn_dim, self.dropout_rate, self.norm,
                       self.attention_impl, self.dtype, mesh=mesh,
                       attention_options=self.attention_options, name=f"block_{i}")(
                           x, padding_mask, deterministic=not train, length=length)
    if self.norm == "pre":
      x = nn.LayerNorm(LAYER_NORM_EPSILON, dtype=self.dtype, name="final_norm")(x)
    if mlm_positions is not None:
      if token_embeddings is not None:
        raise ValueError("masked-language-model logits need the model's own token table "
                         "(token_embeddings must be None).")
      offset = 1 if self.pooling == "cls" else 0  # the CLS token shifts every position
      h = jnp.take_along_axis(x, (mlm_positions + offset)[..., None], axis=1)
      h = nn.gelu(Dense(self.embed_dim, dtype=self.dtype, name="mlm_dense")(h))
      h = nn.LayerNorm(LAYER_NORM_EPSILON, dtype=self.dtype, name="mlm_norm")(h)
      table = embedding.variables["params"]["token"]["embedding"]
      bias = self.param("mlm_bias", nn.initializers.zeros, (self.vocab_size,))
      logits = jnp.einsum("bkd,vd->bkv", h, table.astype(self.dtype))
      return logits.astype(jnp.float32) + bias

    if self.pooling == "mean":
      x = masked_mean(x, padding_mask)
    elif self.pooling == "max":
      x = masked_max(x, padding_mask)
    elif self.pooling == "attention":
      x = AttentionPooling(self.dtype, name="attention_pooling")(x, padding_mask)
    elif self.pooling == "cls":
      x = x[:, 0]
    else:
      x = last_token(x, padding_mask)

    dropout = functools.partial(Dropout(self.dropout_rate), deterministic=not train)
    x = dropout(x)
    if self.mlp_dim:
      x = nn.relu(Dense(self.mlp_dim, dtype=self.dtype,
                        kernel_init=nn.initializers.xavier_uniform(), name="mlp")(x))
      x = dropout(x)
    return Dense(self.num_classes, dtype=jnp.float32,
                 kernel_init=nn.initializers.xavier_uniform(), name="logits")(x)


def validate_model_config(config: ml_collections.ConfigDict) -> None:
  """Raise ValueError naming the first bad model field, its value and what is allowed."""
  m = config.model
  architecture = m.architecture
  check_choice("model.architecture", architecture,
               [name for name in registry.names() if name != "pretrained"])
  shards = config.mesh.sequence
  if shards > 1 and (m.pretrained or architecture != "transformer"):
    what = f"model.pretrained={m.pretrained!r}" if m.pretrained else f"model.architecture={architecture!r}"
    raise UsageError(f"config.mesh.sequence={shards} splits the attention of the transformer "
                     f"classifier, and config.{what} has none that is split; use "
                     f"mesh.sequence=1.")
  if m.pretrained:  # a BERT encoder: its sizes come from its config.json (finetune.py)
    variant = attention_lib.get(m.attention)
    check_choice("model.dtype", m.dtype, tuple(DTYPES))
    if variant.causal and m.pooling == "cls":
      raise UsageError(f"config.model.pooling='cls' cannot be used with config.model.attention="
                       f"{m.attention!r}: [CLS] comes first, so the look-ahead mask lets it see "
                       f"no token; use pooling 'mean'.")
    return
  if architecture != "transformer":
    registry.get(architecture).validate(config)
    return
  variant = attention_lib.get(m.attention)
  choices = {"pooling": POOLINGS, "position": POSITIONS, "norm": NORMS, "dtype": tuple(DTYPES)}
  for field, allowed in choices.items():
    check_choice(f"model.{field}", m[field], allowed)
  positive = {"model.embed_dim": m.embed_dim, "model.num_layers": m.num_layers,
              "model.ffn_dim": m.ffn_dim, "max_len": config.max_len,
              "vocab_size": config.vocab_size}
  for field, value in positive.items():
    check_integer(field, value, 1)
  variant.validate(m.attention_impl, m.embed_dim, m.num_heads, m.dtype)
  attention_lib.build_options(variant, m)
  sequence.check_declared(variant, shards)
  if variant.causal and m.pooling == "cls":
    raise UsageError(f"config.model.pooling='cls' cannot be used with config.model.attention="
                     f"{m.attention!r}: the CLS token comes first, so the look-ahead mask lets it "
                     f"see no token; use pooling 'last' (or mean, max, attention).")
  check_integer("embedding.bigram_buckets", config.embedding.bigram_buckets, 0)
  check_integer("model.mlp_dim", m.mlp_dim, 0)
  for field, value in (("model.dropout_rate", m.dropout_rate),
                       ("embedding.token_dropout_rate", config.embedding.token_dropout_rate)):
    if not 0.0 <= value < 1.0:
      raise UsageError(f"config.{field}={value} must be in [0, 1).")


def resolved_kernel(config: ml_collections.ConfigDict, pretrained_config=None) -> str:
  """The attention kernel config.model.attention_impl means on this platform ("auto" resolved
  for config.max_len and the model's head size and heads: on a CPU by measured speed,
  textattn/attention/calibration.py); "none" for the baselines, which have no attention. With
  config.model.pretrained the sizes are the encoder's (`pretrained_config`, its BertConfig; None:
  read from the model's config.json), not config.model.embed_dim / num_heads, which it ignores."""
  m = config.model
  if m.architecture != "transformer":
    return "none"
  embed_dim, num_heads = m.embed_dim, m.num_heads
  if m.pretrained:
    if pretrained_config is None:  # (read from the model's own config.json)
      pretrained_config = registry.get("pretrained").encoder_config(config)
    embed_dim, num_heads = pretrained_config.hidden_size, pretrained_config.num_heads
  variant = attention_lib.get(m.attention)
  return variant.kernel(m.attention_impl, embed_dim // num_heads, m.dtype, length=config.max_len,
                        num_heads=num_heads, options=attention_lib.build_options(variant, m))


def _build(config: ml_collections.ConfigDict, num_classes: int, vocab_size: int | None,
           pretrained_config, mesh) -> nn.Module:
  """The attention-encoder classifier (registry.build says what the arguments are)."""
  del pretrained_config
  m = config.model
  vocab_size = vocab_size or tokenizer_lib.vocab_size_for(config)
  impl = resolved_kernel(config)
  if impl != m.attention_impl:
    logging.info("config.model.attention_impl=%r: using the %r %s kernel here.",
                 m.attention_impl, impl, m.attention)
  return Classifier(
      num_classes=num_classes, vocab_size=vocab_size,
      max_len=config.max_len, embed_dim=m.embed_dim, num_heads=m.num_heads,
      num_layers=m.num_layers, ffn_dim=m.ffn_dim, mlp_dim=m.mlp_dim,
      dropout_rate=m.dropout_rate, token_dropout_rate=config.embedding.token_dropout_rate,
      attention=m.attention, attention_impl=impl, position=m.position, norm=m.norm,
      pooling=m.pooling, dtype=DTYPES[m.dtype],
      mask_padding=config.layout.padding != "before_as_token",
      bigram_buckets=config.embedding.bigram_buckets,
      mesh=mesh if sharding.sequence_size(mesh) > 1 else None,
      attention_options=attention_lib.build_options(attention_lib.get(m.attention), m))


def _describe(config: ml_collections.ConfigDict) -> str:
  m = config.model
  return f"{m.attention} attention, {m.pooling} pooling"


def count_parameters(params) -> int:
  return int(sum(np.prod(p.shape) for p in jax.tree_util.tree_leaves(params)))


def parameter_table(params) -> str:
  """Rows of module path, parameter shapes and count; the total trained on the last line, then
  the fixed weights no optimizer step changes (a bag model's NB ratios or idf,
  baselines.is_frozen), where there are any."""
  rows, fixed = collections.OrderedDict(), 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    keys = [getattr(k, "key", str(k)) for k in path]
    module, name = "/".join(keys[:-1]) or "(top)", keys[-1]
    shapes, count = rows.get(module, ([], 0))
    size = int(np.prod(leaf.shape))
    if baselines.is_frozen(path):
      fixed += size
      name, size = f"{name}(fixed)", 0
    rows[module] = (shapes + [f"{name}{list(leaf.shape)}"], count + size)
  width = max([len(m) for m in rows] + [6])
  lines = [f"{'module':<{width}}  {'params':>10}  shapes", "-" * (width + 40)]
  for module, (shapes, count) in rows.items():
    lines.append(f"{module:<{width}}  {count:>10,}  {' '.join(shapes)}")
  total = sum(count for _, count in rows.values())
  lines += ["-" * (width + 40), f"{'total':<{width}}  {total:>10,}"]
  if fixed:
    lines.append(f"{'fixed':<{width}}  {fixed:>10,}  (not trained: computed from the data)")
  return "\n".join(lines)


def abstract_params(model: Classifier, max_len: int):
  tokens = jnp.ones((1, max_len), jnp.int32)
  return jax.eval_shape(lambda: model.init(jax.random.key(0), tokens))["params"]


registry.register(registry.Architecture("transformer", _build, _describe))
