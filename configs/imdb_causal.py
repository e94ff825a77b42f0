"""IMDB with causal (look-ahead masked) softmax attention and last-token pooling.

The configs/imdb_softmax.py encoder with a causal mask: each position sees only earlier tokens,
so the classifier reads the hidden state of the last real token (pooling "last"), as a
decoder-only model would. Truncation "pre" keeps each review's end.

    TFDS_DATA_DIR=../shared/tensorflow_datasets \
      python -m textattn.main --config=configs/imdb_causal.py --workdir=runs/imdb_causal

Result: not yet measured on IMDB (no acceptance target; CPU time went to the softmax and
Fastformer acceptance runs). Its mechanics are covered by the tests (causality Jacobians, padding
invariance with last-token pooling).
"""

from configs import imdb_softmax


def get_config():
  config = imdb_softmax.get_config()
  config.model.attention = "causal"
  config.model.pooling = "last"
  return config
