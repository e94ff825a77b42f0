"""The chapter's English-to-Spanish Transformer (Deep Learning with Python, ch. 11.5) in Keras, timed
on this CPU: the like-for-like speed comparison for configs/spa_eng_chapter.py (issue 29 quotes
18 examples/s for it on a 2-core CPU; this measures it here, so the ratio is taken on one machine).

The model is the chapter's, layer for layer (Keras 3, TensorFlow backend): PositionalEmbedding
(token + position tables, mask_zero), TransformerEncoder and TransformerDecoder (post-LN,
MultiHeadAttention(num_heads=8, key_dim=256), FFN 2048, causal and padding masks), Dropout(0.5),
Dense(15,000, softmax); RMSprop (Keras defaults), sparse categorical cross-entropy, batch 64. It
must have exactly 19,960,216 parameters (checked). Random tokens of full length (20 source, 20
target inputs), so every position costs what it costs in the chapter's dense computation.

    python experiments/translation/keras_chapter.py [--jit=auto|off] [--steps=40] [--epochs=3]

Prints one line per epoch (wall seconds, examples/s) and the median of epochs 2.. (the first
compiles).
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras
import numpy as np
from keras import layers, ops
from keras_seed import EpochTimer

VOCAB, LENGTH, EMBED, FFN, HEADS, BATCH = 15000, 20, 256, 2048, 8, 64
CHAPTER_PARAMETERS = 19_960_216


class PositionalEmbedding(layers.Layer):
  def __init__(self, sequence_length, input_dim, output_dim, **kwargs):
    super().__init__(**kwargs)
    self.token_embeddings = layers.Embedding(input_dim, output_dim)
    self.position_embeddings = layers.Embedding(sequence_length, output_dim)

  def call(self, inputs):
    positions = ops.arange(0, ops.shape(inputs)[-1])
    return self.token_embeddings(inputs) + self.position_embeddings(positions)

  def compute_mask(self, inputs, mask=None):
    return ops.not_equal(inputs, 0)


class TransformerEncoder(layers.Layer):
  def __init__(self, embed_dim, dense_dim, num_heads, **kwargs):
    super().__init__(**kwargs)
    self.attention = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
    self.dense_proj = keras.Sequential([layers.Dense(dense_dim, activation="relu"),
                                        layers.Dense(embed_dim)])
    self.layernorm_1 = layers.LayerNormalization()
    self.layernorm_2 = layers.LayerNormalization()
    self.supports_masking = True

  def call(self, inputs, mask=None):
    if mask is not None:
      mask = mask[:, None, :]
    attention_output = self.attention(inputs, inputs, attention_mask=mask)
    proj_input = self.layernorm_1(inputs + attention_output)
    return self.layernorm_2(proj_input + self.dense_proj(proj_input))


class TransformerDecoder(layers.Layer):
  def __init__(self, embed_dim, dense_dim, num_heads, **kwargs):
    super().__init__(**kwargs)
    self.attention_1 = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
    self.attention_2 = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
    self.dense_proj = keras.Sequential([layers.Dense(dense_dim, activation="relu"),
                                        layers.Dense(embed_dim)])
    self.layernorm_1 = layers.LayerNormalization()
    self.layernorm_2 = layers.LayerNormalization()
    self.layernorm_3 = layers.LayerNormalization()
    self.supports_masking = True

  def call(self, inputs, encoder_outputs, mask=None):
    length = ops.shape(inputs)[1]
    causal_mask = ops.cast(ops.tril(ops.ones((length, length))), "int32")[None]
    padding_mask = None
    if mask is not None:
      padding_mask = ops.minimum(ops.cast(mask[:, None, :], "int32"), causal_mask)
    attention_output_1 = self.attention_1(query=inputs, value=inputs, key=inputs,
                                          attention_mask=causal_mask)
    attention_output_1 = self.layernorm_1(inputs + attention_output_1)
    attention_output_2 = self.attention_2(query=attention_output_1, value=encoder_outputs,
                                          key=encoder_outputs, attention_mask=padding_mask)
    attention_output_2 = self.layernorm_2(attention_output_1 + attention_output_2)
    return self.layernorm_3(attention_output_2 + self.dense_proj(attention_output_2))


def chapter_model(jit: str) -> keras.Model:
  encoder_inputs = keras.Input(shape=(None,), dtype="int64", name="english")
  x = PositionalEmbedding(LENGTH, VOCAB, EMBED)(encoder_inputs)
  encoder_outputs = TransformerEncoder(EMBED, FFN, HEADS)(x)
  decoder_inputs = keras.Input(shape=(None,), dtype="int64", name="spanish")
  x = PositionalEmbedding(LENGTH, VOCAB, EMBED)(decoder_inputs)
  x = TransformerDecoder(EMBED, FFN, HEADS)(x, encoder_outputs)
  x = layers.Dropout(0.5)(x)
  outputs = layers.Dense(VOCAB, activation="softmax")(x)
  model = keras.Model([encoder_inputs, decoder_inputs], outputs)
  model.compile(optimizer="rmsprop", loss="sparse_categorical_crossentropy",
                metrics=["accuracy"], jit_compile=(jit == "auto") and "auto")
  return model


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--jit", choices=["auto", "off"], default="auto")
  parser.add_argument("--steps", type=int, default=40, help="batches per epoch")
  parser.add_argument("--epochs", type=int, default=3, help="epochs (the first warms up)")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  keras.utils.set_random_seed(args.seed)
  model = chapter_model(args.jit)
  count = model.count_params()
  print(f"Keras {keras.__version__} ({keras.backend.backend()}), jit_compile={args.jit}, "
        f"{count:,} parameters", flush=True)
  if count != CHAPTER_PARAMETERS:
    sys.exit(f"the chapter's model has {CHAPTER_PARAMETERS:,} parameters, this one {count:,}.")
  rng = np.random.default_rng(args.seed)
  n = args.steps * BATCH
  source, target = (rng.integers(2, VOCAB, (n, LENGTH + 1)) for _ in range(2))
  timer = EpochTimer(n)
  model.fit((source[:, :LENGTH], target[:, :-1]), target[:, 1:], batch_size=BATCH,
            epochs=args.epochs, shuffle=False, verbose=0, callbacks=[timer])
  steady = float(np.median(timer.seconds[1:])) if args.epochs > 1 else timer.seconds[0]
  print(f"steady state (median of epochs 2..{args.epochs}): {n / steady:,.1f} examples/s "
        f"({steady / args.steps * 1e3:.0f} ms/step)")


if __name__ == "__main__":
  main()
