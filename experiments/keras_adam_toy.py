"""The smallest demonstration of Keras 3's Adam on an Embedding (TensorFlow backend).

One embedding row looked up 16 times in a batch, one looked up once, one 15 times: Adam's
first step moves every parameter by about the learning rate (1e-3); Keras moves a row seen n
times up to sqrt(n) times further, because it squares the per-occurrence gradient slices
(tf.IndexedSlices) before summing duplicates into the second moment. Printed for Keras 3's
default (XLA-compiled step) and without XLA. See experiments/RESULTS.md, section 1.

    python experiments/keras_adam_toy.py
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
from keras import layers


def main():
  for jit in ("auto", False):
    keras.utils.set_random_seed(0)
    inputs = layers.Input(shape=(16,))
    x = layers.Embedding(10, 2)(inputs)
    x = layers.GlobalAveragePooling1D()(x)
    model = keras.Model(inputs, layers.Dense(2, activation="softmax")(x))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", jit_compile=jit)
    table = model.layers[1].embeddings
    before = np.array(table)
    model.train_on_batch(np.array([[1] * 16, [2] + [3] * 15]), np.array([0, 0]))
    step = np.abs(np.array(table) - before).max(axis=1)
    print(f"jit_compile={jit}: first-step move of row 1 (16 occurrences) {step[1]:.2e}, "
          f"row 2 (1 occurrence) {step[2]:.2e}, row 3 (15) {step[3]:.2e}; Adam's step: 1e-3")


if __name__ == "__main__":
  main()
