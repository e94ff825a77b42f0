"""The seed Keras example (keras.io "Text classification with Transformer"), transcribed.

653,566 parameters, length 200, 2 epochs, tested after each epoch as the seed was (no model
selection). It computes what the Keras model computes (padding before the tokens, unmasked;
Keras 3's Adam), checked step for step by experiments/keras_step_check.py (<= 3.3e-7 over 10 steps).

    python -m textattn.main --config=configs/imdb_keras_example.py --workdir=runs/keras_example

Result: test accuracy 86.59% +- 0.62 after epoch 2 over 6 seeds (87.66% +- 0.52 after epoch 1);
the Keras model itself 86.81% +- 1.32 (6 seeds). Seed 0 on 2 cores: 87.41%, one seed
(`git show 50fcafb:experiments/RESULTS.md`). 2-core CPU,
2026-11-23. History: experiments/RESULTS.md, section 1.
"""

from textattn import defaults


def get_config():
  config = defaults.classification("layout", "platform")
  config.val_fraction = 0.0
  config.eval_split = "test"
  config.final_params = "last"
  # The seed's own computation, checked step for step against the Keras model
  # (experiments/keras_step_check.py): padding before the tokens, embedded, attended to and
  # averaged like a token (the Keras model has no mask), and Keras 3's Adam, whose token-table
  # second moment takes per-occurrence squared gradients (optim.scale_by_keras_adam).
  config.layout.padding = "before_as_token"
  config.optimizer.name = "keras_adam"
  # Tested once per epoch, as the seed was (its per-epoch results above): not the automatic
  # 4 evaluations per epoch (0 = evals_per_epoch times per epoch).
  config.evals_per_epoch = 1
  # With the native softmax kernel (the default on a one-device CPU run), XLA:CPU's own ops ran
  # faster here without its YNNPACK fusions: ~8% (step A/B) and ~12% (real training loop); within
  # noise through the benchmark command (`git show 50fcafb:experiments/RESULTS.md`, "Third round").
  config.platform.xla_flags = "--xla_cpu_experimental_ynn_fusion_type="
  return config
