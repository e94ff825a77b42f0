"""The seed Keras transformer (keras.io "Text classification with Transformer") and a step-by-step
comparison of textattn's transcription (configs/imdb_keras_example.py) with it.

Used by tests/test_train.py (the Keras-Adam fidelity test) and by experiments/keras_seed.py and
experiments/keras_step_check.py. Needs Keras 3 (installed with TensorFlow; the test extra).
"""

import os

import jax
import jax.numpy as jnp
import keras
import numpy as np
from keras import layers, ops

from textattn import defaults, models, optim, train_state
from textattn.tasks.classification import step as step_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB, MAXLEN, EMBED, HEADS, FFN, DENSE, RATE, BATCH = 20000, 200, 32, 2, 32, 20, 0.1, 32
SEED_PARAMS = 653_566


class TransformerBlock(layers.Layer):
  def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
    super().__init__()
    self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim // num_heads)
    self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)])
    self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
    self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
    self.dropout1 = layers.Dropout(rate)
    self.dropout2 = layers.Dropout(rate)

  def call(self, inputs, training=False):
    attn_output = self.dropout1(self.att(inputs, inputs), training=training)
    out1 = self.layernorm1(inputs + attn_output)
    ffn_output = self.dropout2(self.ffn(out1), training=training)
    return self.layernorm2(out1 + ffn_output)


class TokenAndPositionEmbedding(layers.Layer):
  def __init__(self, maxlen, vocab_size, embed_dim):
    super().__init__()
    self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
    self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

  def call(self, x):
    positions = self.pos_emb(ops.arange(start=0, stop=ops.shape(x)[-1], step=1))
    return self.token_emb(x) + positions


def seed_model(jit: str, rate: float = RATE) -> keras.Model:
  inputs = layers.Input(shape=(MAXLEN,))
  x = TokenAndPositionEmbedding(MAXLEN, VOCAB, EMBED)(inputs)
  x = TransformerBlock(EMBED, HEADS, FFN, rate)(x)
  x = layers.GlobalAveragePooling1D()(x)
  x = layers.Dropout(rate)(x)
  x = layers.Dense(DENSE, activation="relu")(x)
  x = layers.Dropout(rate)(x)
  outputs = layers.Dense(2, activation="softmax")(x)
  model = keras.Model(inputs=inputs, outputs=outputs)
  model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                jit_compile={"auto": "auto", "off": False}[jit])
  if model.count_params() != SEED_PARAMS:
    raise RuntimeError(f"The Keras model has {model.count_params():,} parameters, not the seed's "
                     f"{SEED_PARAMS:,}: it is not the seed model.")
  return model


# Flax parameter path -> Keras weight path (the seed model's names).
NAMES = {
    ("embedding", "token", "embedding"): "token_and_position_embedding/embedding/embeddings",
    ("embedding", "position"): "token_and_position_embedding/embedding_1/embeddings",
    **{("block_0", "attention", part, leaf): f"transformer_block/multi_head_attention/{kpart}/{leaf}"
       for part, kpart in [("query", "query"), ("key", "key"), ("value", "value"),
                           ("out", "attention_output")] for leaf in ("kernel", "bias")},
    **{("block_0", part, leaf): f"transformer_block/sequential/{kpart}/{leaf}"
       for part, kpart in [("ffn_in", "dense"), ("ffn_out", "dense_1")]
       for leaf in ("kernel", "bias")},
    **{("block_0", part, leaf): f"transformer_block/{kpart}/{kleaf}"
       for part, kpart in [("norm_attention", "layer_normalization"),
                           ("norm_ffn", "layer_normalization_1")]
       for leaf, kleaf in [("scale", "gamma"), ("bias", "beta")]},
    **{(part, leaf): f"{kpart}/{leaf}" for part, kpart in [("mlp", "dense_2"), ("logits", "dense_3")]
       for leaf in ("kernel", "bias")},
}


def keras_params(model) -> dict:
  weights = {w.path: np.asarray(w.numpy()) for w in model.weights}
  tree: dict = {}
  for path, kpath in NAMES.items():
    if kpath not in weights:
      raise RuntimeError(f"Keras weight {kpath} not found; the model has: {sorted(weights)}")
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = jnp.asarray(weights[kpath])
  return tree


def compare_steps(inputs: np.ndarray, labels: np.ndarray, steps: int, optimizer: str,
                  vocab_size: int, report=None,
                  attention_impl: str = "auto") -> list[tuple[float, float]]:
  """Trains the Keras seed model and the transcription (configs/imdb_keras_example.py; dropout
  off, the Keras model's initial weights copied over) on the same `steps` batches of 32 rows of
  `inputs` (int32 [N, 200], padding 0 before the tokens) and returns, after each step, (max |loss difference|, max |parameter difference|).
  `optimizer` is textattn's config.optimizer.name, `attention_impl` its attention kernel
  (config.model.attention_impl; "auto" = the native kernel on a CPU). `report(step, loss, kloss, worst, diff)` is
  called after each step when given."""
  config = defaults.complete(defaults.load(os.path.join(ROOT, "configs", "imdb_keras_example.py")))
  config.optimizer.name = optimizer
  config.model.dropout_rate = 0.0
  config.model.attention_impl = attention_impl
  keras.backend.clear_session()  # layer names restart (dense, dense_1, ...)
  keras.utils.set_random_seed(0)
  kmodel = seed_model("off", rate=0.0)
  params = keras_params(kmodel)
  model = models.build_model(config, 2, vocab_size=vocab_size)
  tx = optim.make_optimizer(config.optimizer, 1000)
  state = train_state.init_train_state(model, tx, jax.random.key(0), config.max_len, config.optimizer)
  if jax.tree.structure(state.params) != jax.tree.structure(params):
    raise RuntimeError("parameter trees differ")
  state = state.replace(params=params, opt_state=tx.init(params))
  step = jax.jit(step_lib.train_step)
  out = []
  for i in range(steps):
    batch = {"inputs": inputs[i * 32:(i + 1) * 32], "labels": labels[i * 32:(i + 1) * 32]}
    state, metrics = step(state, batch)
    kloss = kmodel.train_on_batch(batch["inputs"], batch["labels"])
    kloss = float(kloss[0] if isinstance(kloss, (list, tuple)) else kloss)
    loss = float(metrics["loss_sum"]) / 32
    diffs = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), state.params,
                         keras_params(kmodel))
    flat = {"/".join(str(getattr(k, "key", k)) for k in path): v
            for path, v in jax.tree_util.tree_flatten_with_path(diffs)[0]}
    worst = max(flat, key=flat.get)
    out.append((abs(loss - kloss), flat[worst]))
    if report:
      report(i + 1, loss, kloss, worst, flat[worst])
  return out
