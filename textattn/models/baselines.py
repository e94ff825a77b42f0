"""The baselines every attention result is read against (config.model.architecture):

- `BagOfNgrams` ("bag"): a bag of the n-gram features of `textattn/data/ngrams.py` (or of
  words). Each feature id in a row counts once per occurrence (the tokenizer decides: multi-hot
  rows hold each n-gram once, count rows repeat it), times a fixed per-feature weight:
  - bag_weighting="none": 1 (multi-hot or counts);
  - "tfidf": the inverse document frequency of Keras `TextVectorization(output_mode="tf_idf")`,
    log(1 + N / (1 + df)), N and df counted on the training split (the out-of-vocabulary
    feature gets the mean idf, as Keras);
  - "nb": the NBSVM-style log-count ratios of Wang & Manning (2012), per class c (one class
    against the rest), r_c = log((p_c / |p_c|_1) / (q_c / |q_c|_1)), p_c = 1 + the multi-hot
    feature sums of the training examples of class c, q_c = 1 + those of the others.
  With model.mlp_dim > 0 the features go through a hidden ReLU layer of that width and dropout
  (Deep Learning with Python's Dense(16) + Dropout(0.5) on a multi-hot vector, as an embedding
  bag: the same function, without building the dense [batch, vocabulary] input), else straight
  to the logits (a linear model). For "nb" the model is the NBSVM++ form of fast.ai (J. Howard,
  2018): logit_c = b_c + NB_SCALE * sum_i x_i r_ic (w_i + NB_PRIOR) with one learned weight
  w_i per feature, initialised near 0, so training starts from naive Bayes and weight decay
  pulls back towards it (Wang & Manning's interpolation between NB and a discriminative model).
- `BiLSTM` ("bilstm"): embedding (id 0 = padding, masked), Flax's `nn.RNN` LSTM in both
  directions with `seq_lengths`, so neither direction reads a padding position; the two final
  states, concatenated, -> dropout -> (optional hidden layer) -> logits. Deep Learning with
  Python's IMDB BiLSTM: embedding 256, LSTM 32, dropout 0.5, 600 tokens.

The fixed weights (idf, NB ratios) are parameters whose names start with "frozen_": they are
computed from the training split before the first step (`frozen_parameters`), saved in every
checkpoint with the rest (so predict needs nothing else), and never changed by the optimizer
(`optim.make_optimizer(..., trainable=trainable(config))` masks them; the model also stops their gradient).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from textattn.checks import check_choice, check_integer
from textattn.data import tokenizer as tokenizer_lib
from textattn.errors import UsageError
from textattn.flax_layers import Dense
from textattn.models import registry
from textattn.models.layers import DTYPES


def bilstm_config() -> ml_collections.ConfigDict:
  """config.bilstm, an opt-in part (config.complete): the BiLSTM baseline's own size."""
  part = ml_collections.ConfigDict()
  part.rnn_dim = 32  # LSTM units per direction
  return part

Array = jax.Array

BAG_WEIGHTINGS = ("none", "tfidf", "nb")
FROZEN_PREFIX = "frozen_"
NB_PRIOR = 0.4  # fast.ai's w_adj
NB_SCALE = 0.1  # fast.ai's 1 / r_adj
NB_SMOOTHING = 1.0  # Wang & Manning's alpha


def _keras_uniform(key, shape, dtype=jnp.float32):
  return jax.random.uniform(key, shape, dtype, -0.05, 0.05)


def _frozen(module: nn.Module, name: str, shape: tuple[int, ...]) -> Array:
  return jax.lax.stop_gradient(module.param(FROZEN_PREFIX + name, nn.initializers.zeros, shape))


class BagOfNgrams(nn.Module):
  """tokens int[batch, K] (feature ids, 0 = padding) -> logits float32[batch, num_classes]."""
  num_classes: int
  vocab_size: int
  weighting: str = "none"
  mlp_dim: int = 16
  dropout_rate: float = 0.5

  @nn.compact
  def __call__(self, tokens: Array, *, train: bool = False, padding_mask: Array | None = None,
               token_embeddings: Array | None = None) -> Array:
    if token_embeddings is not None:
      raise ValueError("the bag-of-n-grams model looks up its own features.")
    present = (tokens != 0) if padding_mask is None else padding_mask.astype(bool)
    x = present.astype(jnp.float32)
    if self.weighting == "tfidf":
      x = x * jnp.take(_frozen(self, "idf", (self.vocab_size,)), tokens)
    if self.weighting == "nb":
      ratios = jnp.take(_frozen(self, "nb_ratio", (self.vocab_size, self.num_classes)), tokens,
                        axis=0)
      init = lambda key, shape: jax.random.uniform(key, shape, jnp.float32, -0.1, 0.1)
      weight = jnp.take(self.param("nb_weight", init, (self.vocab_size,)), tokens)
      bias = self.param("bias", nn.initializers.zeros, (self.num_classes,))
      return NB_SCALE * jnp.einsum("bk,bkc->bc", x * (weight + NB_PRIOR), ratios) + bias
    width = self.mlp_dim or self.num_classes
    # Keras Dense's glorot-uniform kernel of a [vocabulary, width] layer, looked up by id.
    table = self.param("features", nn.initializers.xavier_uniform(), (self.vocab_size, width))
    h = jnp.einsum("bk,bkd->bd", x, jnp.take(table, tokens, axis=0))
    h = h + self.param("bias", nn.initializers.zeros, (width,))
    if not self.mlp_dim:
      return h
    h = nn.Dropout(self.dropout_rate, deterministic=not train)(nn.relu(h))
    return Dense(self.num_classes, kernel_init=nn.initializers.xavier_uniform(),
                 name="logits")(h)


class BiLSTM(nn.Module):
  """tokens int[batch, length] (0 = padding, after the tokens) -> logits [batch, classes]."""
  num_classes: int
  vocab_size: int
  embed_dim: int = 256
  rnn_dim: int = 32
  mlp_dim: int = 0
  dropout_rate: float = 0.5
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, tokens: Array, *, train: bool = False, padding_mask: Array | None = None,
               token_embeddings: Array | None = None) -> Array:
    mask = (tokens != 0) if padding_mask is None else padding_mask.astype(bool)
    if token_embeddings is None:
      x = nn.Embed(self.vocab_size, self.embed_dim, embedding_init=_keras_uniform,
                   dtype=self.dtype, name="embedding")(tokens)
    else:
      x = token_embeddings.astype(self.dtype)
    lengths = jnp.sum(mask, axis=1).astype(jnp.int32)
    cell = functools.partial(nn.OptimizedLSTMCell, self.rnn_dim, dtype=self.dtype)
    forward = nn.RNN(cell(name="forward_cell"), return_carry=True, name="forward")
    backward = nn.RNN(cell(name="backward_cell"), return_carry=True, reverse=True,
                      keep_order=True, name="backward")
    (_, h_forward), _ = forward(x, seq_lengths=lengths)
    (_, h_backward), _ = backward(x, seq_lengths=lengths)
    h = jnp.concatenate([h_forward, h_backward], axis=-1)
    dropout = nn.Dropout(self.dropout_rate, deterministic=not train)
    h = dropout(h)
    if self.mlp_dim:
      h = dropout(nn.relu(Dense(self.mlp_dim, dtype=self.dtype, name="mlp")(h)))
    return Dense(self.num_classes, dtype=jnp.float32, name="logits")(h)


def is_frozen(path) -> bool:
  """Whether a parameter (its tree path) is one of the fixed weights above."""
  name = getattr(path[-1], "key", str(path[-1])) if path else ""
  return str(name).startswith(FROZEN_PREFIX)


def has_frozen(config) -> bool:
  m = config.model
  return m.architecture == "bag" and config.ngrams.weighting != "none"


def trainable(config):
  """optim.make_optimizer's `trainable(path)` for the config's model: None (all train) unless
  it has fixed weights, which then never train."""
  return (lambda path: not is_frozen(path)) if has_frozen(config) else None


def frozen_parameters(config, train_inputs: np.ndarray, train_labels: np.ndarray,
                      num_classes: int, vocab_size: int) -> dict | None:
  """The fixed weights of the config's bag model, from the training split's feature ids
  [N, K] and labels [N]; None for a model without any."""
  if not has_frozen(config):
    return None
  n = len(train_inputs)
  rows = np.repeat(np.arange(n, dtype=np.int64), train_inputs.shape[1])
  ids = train_inputs.reshape(-1).astype(np.int64)
  real = ids != 0
  # Each (example, feature) once: document frequencies and multi-hot sums.
  pairs = np.unique(rows[real] * vocab_size + ids[real])
  example, feature = np.divmod(pairs, vocab_size)
  if config.ngrams.weighting == "tfidf":
    df = np.bincount(feature, minlength=vocab_size)
    idf = np.log1p(n / (1.0 + df))
    idf[1] = idf[2:].mean() if vocab_size > 2 else idf[1]  # OOV: the mean, as Keras
    idf[0] = 0.0
    return {FROZEN_PREFIX + "idf": idf.astype(np.float32)}
  labels = np.asarray(train_labels)[example]
  sums = np.bincount(feature * num_classes + labels,
                     minlength=vocab_size * num_classes).reshape(vocab_size, num_classes)
  total = sums.sum(axis=1, keepdims=True)
  p = sums + NB_SMOOTHING
  q = (total - sums) + NB_SMOOTHING
  ratios = np.log(p / p.sum(axis=0)) - np.log(q / q.sum(axis=0))
  ratios[0] = 0.0
  return {FROZEN_PREFIX + "nb_ratio": ratios.astype(np.float32)}


def validate_config(config: ml_collections.ConfigDict) -> None:
  """The bag's and the BiLSTM's fields (UsageError naming the first bad one)."""
  m = config.model
  check_choice("ngrams.weighting", config.ngrams.weighting, BAG_WEIGHTINGS)
  check_integer("model.mlp_dim", m.mlp_dim, 0)
  check_integer("vocab_size", config.vocab_size, 1)
  if not 0.0 <= m.dropout_rate < 1.0:
    raise UsageError(f"config.model.dropout_rate={m.dropout_rate} must be in [0, 1).")
  if m.architecture == "bilstm":
    check_integer("model.embed_dim", m.embed_dim, 1)
    check_integer("bilstm.rnn_dim", config.bilstm.rnn_dim, 1)
  elif config.ngrams.weighting != "none" and config.tokenizer == "byte":
    raise UsageError("config.ngrams.weighting needs word or n-gram features, not bytes "
                     "(config.tokenizer='byte').")
  for field, value, allowed in (
      ("optimizer.name", config.optimizer.name, "adam, adamw or rmsprop"),
      ("embedding.init", config.embedding.init, "'random'")):
    if value in ("keras_adam", "word2vec") or str(value).startswith("vectors:"):
      raise UsageError(f"config.{field}={value!r} is for the transformer; the "
                       f"{m.architecture} model takes {allowed}.")


def _build_bag(config, num_classes: int, vocab_size: int | None, pretrained_config, mesh):
  del pretrained_config, mesh
  m = config.model
  return BagOfNgrams(num_classes=num_classes,
                     vocab_size=vocab_size or tokenizer_lib.vocab_size_for(config),
                     weighting=config.ngrams.weighting, mlp_dim=m.mlp_dim, dropout_rate=m.dropout_rate)


def _build_bilstm(config, num_classes: int, vocab_size: int | None, pretrained_config, mesh):
  del pretrained_config, mesh
  m = config.model
  return BiLSTM(num_classes=num_classes,
                vocab_size=vocab_size or tokenizer_lib.vocab_size_for(config),
                embed_dim=m.embed_dim, rnn_dim=config.bilstm.rnn_dim, mlp_dim=m.mlp_dim,
                dropout_rate=m.dropout_rate,
                dtype=DTYPES[m.dtype])


def _describe_bag(config) -> str:
  m = config.model
  features = f"{config.ngrams.order}-gram" if config.tokenizer == "ngram" else config.tokenizer
  return (f"bag of {features} features, weighting {config.ngrams.weighting}, "
          f"{'hidden layer ' + str(m.mlp_dim) if m.mlp_dim else 'linear'}")


registry.register(registry.Architecture("bag", _build_bag, _describe_bag, validate_config))
registry.register(registry.Architecture(
    "bilstm", _build_bilstm, lambda config: f"bidirectional LSTM, {config.bilstm.rnn_dim} units "
                                            f"per direction", validate_config))
