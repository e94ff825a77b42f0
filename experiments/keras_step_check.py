"""Does textattn's transcription compute the same training steps as the seed Keras model?

experiments/keras_seed.py (the Keras model) learned faster than configs/imdb_keras_example.py in
its first epoch on the same token arrays until the config took the seed's padding layout and
Keras 3's Adam (experiments/RESULTS.md, "The Keras model's Adam"). This copies the Keras model's
initial weights into the transcription (configs/imdb_keras_example.py), switches dropout off in
both, feeds both the same batches of IMDB training reviews (padded before the tokens, as the
config's pipeline and Keras' pad_sequences do) and compares, after each of K Adam steps, the
losses and every parameter.

    TFDS_DATA_DIR=../shared/tensorflow_datasets python experiments/keras_step_check.py \
        [K] [adam|keras_adam]

The second argument is textattn's config.optimizer.name (default: the seed config's,
"keras_adam"; "adam" is optax's Adam, which drifts from the Keras model from step 1).

Prints, per step, both losses and the largest absolute parameter difference (and where).
Float32 rounding grows through the steps; a wrong layer, initialiser or optimizer formula shows
as a large difference at step 1.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from tests.keras_reference import ROOT, compare_steps
from textattn import data as data_lib
from textattn import defaults


def main():
  steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
  config = defaults.complete(defaults.load(os.path.join(ROOT, "configs", "imdb_keras_example.py")))
  optimizer = sys.argv[2] if len(sys.argv) > 2 else config.optimizer.name
  data = data_lib.load_dataset(config, None)  # padding before the tokens, as Keras
  order = np.random.default_rng(0).permutation(len(data.train))[:steps * 32]
  compare_steps(data.train.inputs[order], data.train.labels[order], steps, optimizer,
                data.vocab_size,
                report=lambda i, loss, kloss, worst, diff: print(
                    f"step {i}: loss textattn {loss:.6f} keras {kloss:.6f}; "
                    f"max |param diff| {diff:.2e} ({worst})", flush=True))


if __name__ == "__main__":
  main()
