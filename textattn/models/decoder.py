"""The decoder-only model (the language model's and MQAR's): the translation decoder's blocks
without cross-attention.

    tokens int [batch, length] (0 = padding) -> token embedding, plus by `position`:
      learned  a learned position table (models/seq2seq.Embed; positions restart at each
               packed document; it cannot extrapolate beyond max_len), the default;
      rotary   none added: each attention turns its queries and keys by position (RoPE,
               registry.Variant.rotary: relative for the dot-product families, counted from
               each packed document's start for the feature-map ones);
      none     no position information but the causal mask's
    -> num_layers of seq2seq.DecoderBlock with memory=None (causal self-attention from the
    registry, post-LN, ReLU feed-forward, none with ffn_dim=0; segment ids keep packed documents
    apart) -> logits float32 [.., vocab] (`logits_at`: of some positions only).

Decoding (`decode=True`) is the translation decoder's: a first call on [batch, max_len]
allocates the "cache" collection (the softmax keys/values and the position), each later call
feeds one token per row (textattn/tasks/language_model/sampling.py).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from textattn import attention as attention_lib
from textattn import sharding
from textattn.attention import sequence
from textattn.attention.common import dense_init
from textattn.checks import check_choice, check_integer
from textattn.errors import UsageError
from textattn.flax_layers import Dense
from textattn.models.layers import DTYPES, accepts_head_dim, pad_for_mesh
from textattn.models.seq2seq import DecoderBlock, Embed, token_table

POSITIONS = ("learned", "rotary", "none")  # config.model.position (the module's docstring)


class LanguageModel(nn.Module):
  vocab_size: int
  max_len: int
  embed_dim: int = 128
  num_heads: int = 4
  ffn_dim: int = 512
  num_layers: int = 2
  attention: str = "causal"
  attention_impl: str = "auto"  # the variant's kernel ("auto": its choice for packed rows)
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32
  head_dim: int | None = None  # None: embed // num_heads
  tie_output: bool = False  # logits = x @ token table^T + bias
  attention_options: tuple = ()  # EncoderBlock.attention_options
  position: str = "learned"  # one of POSITIONS
  # A mesh whose "sequence" axis (S > 1 devices) splits each row's attention (training and
  # evaluation; decoding stays on one device): the row is padded to 2S-divisible length.
  mesh: Any = None

  def setup(self):
    # (Initialised without the mesh: the same parameters, from a dummy batch of one row.)
    self._mesh = None if self.is_initializing() else self.mesh
    table = token_table(self.vocab_size, self.embed_dim, self.dtype) if self.tie_output else None
    self.token_table = table
    if self.position not in POSITIONS:
      raise ValueError(f"position={self.position!r} is not one of {', '.join(POSITIONS)}.")
    self.embed = Embed(self.vocab_size, self.max_len, self.embed_dim, self.dtype, table,
                       learned_positions=self.position == "learned")
    options = self.attention_options + ((("rotary", True),) if self.position == "rotary" else ())
    self.blocks = [DecoderBlock(self.attention, self.num_heads, self.ffn_dim, self.dropout_rate,
                                self.dtype, self.head_dim, implementation=self.attention_impl,
                                attention_options=options, mesh=self._mesh)
                   for _ in range(self.num_layers)]
    if self.tie_output:
      self.logits_bias = self.param("logits_bias", nn.initializers.zeros, (self.vocab_size,))
    else:
      self.logits = Dense(self.vocab_size, dtype=jnp.float32, kernel_init=dense_init())

  def __call__(self, tokens: jax.Array, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None, *, train: bool = False,
               decode: bool = False, logits_at: jax.Array | None = None) -> jax.Array:
    """Logits float32 [batch, length, vocab]. segment_ids and positions (int [batch, length],
    data.row_fields): packed documents; None: each row one document from position 0.
    logits_at int [batch, K]: only those positions' logits, [batch, K, vocab] (a task scored at
    a few positions, such as MQAR's answers, skips the output layer everywhere else)."""
    mask = jnp.ones(tokens.shape, bool) if decode else tokens != 0
    x = self.embed(tokens, decode=decode, positions=None if decode else positions)
    length = x.shape[1]
    if not decode:
      x, mask = pad_for_mesh(x, mask, self._mesh, causal=True)
      if segment_ids is not None and x.shape[1] > length:  # (the padding: id 0, no segment)
        segment_ids = jnp.pad(segment_ids, ((0, 0), (0, x.shape[1] - length)))
    for block in self.blocks:
      x = block(x, mask, None, None, deterministic=not train, decode=decode, length=length,
                segment_ids=None if decode else segment_ids)
    x = x[:, :length]  # (the mesh's padding dropped)
    if logits_at is not None:
      x = jnp.take_along_axis(x, logits_at[..., None], axis=1)
    if self.tie_output:
      table = self.token_table.embedding.astype(jnp.float32)
      return jnp.einsum("...d,vd->...v", x.astype(jnp.float32), table) + self.logits_bias
    return self.logits(x)


def from_model_config(m, vocab_size: int, max_len: int, mesh=None) -> LanguageModel:
  """The LanguageModel of a config.model section (its fields: `validate_config`'s) for
  `vocab_size` ids and rows of at most `max_len` tokens. `mesh`: the run's
  (platform.config_mesh); its sequence axis, if it has more than one device, splits the
  attention (None: one device's model, as for generation)."""
  return LanguageModel(vocab_size=vocab_size, max_len=max_len, embed_dim=m.embed_dim,
                       num_heads=m.num_heads, ffn_dim=m.ffn_dim, num_layers=m.num_layers,
                       attention=m.attention, attention_impl=m.attention_impl,
                       dropout_rate=m.dropout_rate, dtype=DTYPES[m.dtype],
                       head_dim=m.head_dim or None, tie_output=m.tie_output,
                       position=m.position,
                       attention_options=attention_lib.build_options(
                           attention_lib.get(m.attention), m),
                       mesh=mesh if sharding.sequence_size(mesh) > 1 else None)


def validate_config(m, mesh_sequence: int) -> None:
  """UsageError naming the first bad field of a config.model section of this model (the
  language model's and MQAR's: attention, attention_impl, embed_dim, num_heads, head_dim,
  ffn_dim, num_layers, position, dropout_rate, tie_output, dtype and the variant's options),
  its variant already known to be one the task can train; `mesh_sequence`:
  config.mesh.sequence."""
  variant = attention_lib.get(m.attention)
  sequence.check_declared(variant, mesh_sequence)
  for field in ("embed_dim", "num_heads", "num_layers"):
    check_integer(f"model.{field}", m[field], 1)
  check_integer("model.ffn_dim", m.ffn_dim, 0)
  check_integer("model.head_dim", m.head_dim, 0)
  check_choice("model.position", m.position, POSITIONS)
  if m.position == "rotary" and not variant.rotary:
    turning = [n for n in attention_lib.rotary_names() if attention_lib.get(n).causal]
    raise UsageError(f"config.model.position='rotary' needs an attention that turns its queries "
                     f"and keys by position (registry.Variant.rotary), which "
                     f"config.model.attention={m.attention!r} does not; allowed: "
                     f"{', '.join(turning)}.")
  if m.head_dim:  # (the variant's own check assumes embed_dim / num_heads)
    check_choice("model.attention_impl", m.attention_impl, variant.implementations)
  else:
    variant.validate(m.attention_impl, m.embed_dim, m.num_heads, m.dtype)
  attention_lib.build_options(variant, m)
  if m.head_dim and not accepts_head_dim(m.attention):
    raise UsageError(f"config.model.head_dim={m.head_dim}: config.model.attention="
                     f"{m.attention!r} has no head size option (use head_dim=0).")
  if not m.head_dim and m.embed_dim % m.num_heads:
    raise UsageError(f"config.model.num_heads={m.num_heads} must divide "
                     f"config.model.embed_dim={m.embed_dim}.")
  head_dim = m.head_dim or m.embed_dim // m.num_heads
  if m.position == "rotary" and head_dim % 2:
    raise UsageError(f"config.model.position='rotary' turns pairs of features, so the head size "
                     f"must be even; it is {head_dim} (config.model.embed_dim={m.embed_dim}, "
                     f"num_heads={m.num_heads}, head_dim={m.head_dim}).")
  check_choice("model.dtype", m.dtype, tuple(DTYPES))
  if not 0 <= m.dropout_rate < 1:
    raise UsageError(f"config.model.dropout_rate={m.dropout_rate} must be in [0, 1).")
