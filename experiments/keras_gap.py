"""Why did textattn's transcription of the seed trail the Keras model on the same data?

The seed Keras model (experiments/keras_seed.py) reaches 87.27-87.54% IMDB test accuracy after
its 2 epochs over seeds 0-2; configs/imdb_keras_example.py reached 84.86-86.95% until it took
the seed's padding and Keras' Adam (the answer this script and keras_step_check.py found:
experiments/RESULTS.md, "the Keras model's Adam"). The two differed in how
they treat padding: textattn pads after the tokens and masks padding out of the attention and
the mean; Keras pads before the tokens (pad_sequences) and the model ignores the mask, so
padding positions are attended to and averaged like tokens. This trains the seed config's model
(same code as textattn.main: make_optimizer, train_step, eval_step, TrainIterator) on three
layouts of the same token arrays, seeds 0-2, and prints test accuracy after each epoch:

  right_mask   - textattn's layout (padding after the tokens, masked);
  left_mask    - padding before the tokens, still masked (only the positions move);
  left_nomask  - padding before the tokens as a token of its own (id = vocab size, one extra
                 embedding row), so nothing is masked: the Keras model's computation.

All with attention_impl="fused" (XLA; the native kernel's padding fast path is for padding
after the tokens).

    TFDS_DATA_DIR=../shared/tensorflow_datasets python experiments/keras_gap.py [layouts] [seeds] \
        [adam|keras_adam]

(the third argument: config.optimizer.name; "keras_adam" is the Keras model's own Adam, whose
token-table second moment takes per-occurrence squared gradients: experiments/keras_step_check.py).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import numpy as np

from configs import imdb_keras_example
from textattn import input_pipeline, models, train

LAYOUTS = ("right_mask", "left_mask", "left_nomask")


def layout(inputs: np.ndarray, name: str, vocab_size: int) -> np.ndarray:
  if name == "right_mask":
    return inputs
  left = input_pipeline.pad_before(inputs)
  return left if name == "left_mask" else np.where(left == 0, vocab_size, left).astype(np.int32)


def base_config():
  """The seed config with textattn's layout (padding after, masked): `layout` makes the others."""
  config = imdb_keras_example.get_config()
  config.padding = "after_masked"
  return config


def run(data, name: str, seed: int, optimizer: str = "adam") -> list[float]:
  config = base_config()
  config.model.attention_impl = "fused"
  config.optimizer.name = optimizer
  config.seed = seed
  vocab = data.vocab_size + (1 if name == "left_nomask" else 0)
  model = models.build_model(config, 2, vocab_size=vocab)
  steps_per_epoch = len(data.train) // config.batch_size
  tx = train.make_optimizer(config.optimizer, steps_per_epoch * config.num_epochs)
  state = train.init_train_state(model, tx, jax.random.key(seed), config.max_len,
                                 config.optimizer)
  step = jax.jit(train.train_step, donate_argnums=0)
  evaluate = jax.jit(lambda s, b: train.eval_step(s, b, 2))
  split = input_pipeline.Split(layout(data.train.inputs, name, data.vocab_size),
                               data.train.labels)
  test_inputs = layout(data.test.inputs, name, data.vocab_size)
  batches = input_pipeline.TrainIterator(split, config.batch_size, seed)
  accuracies = []
  for _ in range(config.num_epochs):
    for _ in range(steps_per_epoch):
      state, _ = step(state, next(batches))
    correct = 0.0
    for start in range(0, len(test_inputs), 250):
      batch = {"inputs": test_inputs[start:start + 250],
               "labels": data.test.labels[start:start + 250],
               "weights": np.ones(len(test_inputs[start:start + 250]), np.float32)}
      correct += float(evaluate(state, batch)["correct"])
    accuracies.append(correct / len(test_inputs))
  return accuracies


def main():
  layouts = sys.argv[1].split(",") if len(sys.argv) > 1 else LAYOUTS
  seeds = [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else [0, 1, 2]
  optimizer = sys.argv[3] if len(sys.argv) > 3 else "adam"
  data = input_pipeline.load_dataset(base_config(), None)
  for name in layouts:
    for seed in seeds:
      accuracies = run(data, name, seed, optimizer)
      print(f"{name:12s} {optimizer} seed {seed}: test accuracy after each epoch "
            f"{' '.join(f'{a:.4f}' for a in accuracies)}", flush=True)


if __name__ == "__main__":
  main()
