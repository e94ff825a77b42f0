"""IMDB with Fastformer additive attention (arXiv 2108.09084), validation carved from train.

The same encoder as configs/imdb_softmax.py with additive attention in place of softmax
attention, so the two compare one change: linear-cost attention over the last 400 tokens,
2 layers, embed 64, 4 heads, masked mean pooling, AdamW + cosine, 2 epochs, best-validation
checkpoint for the test report.

    TFDS_DATA_DIR=../shared/tensorflow_datasets \
      python -m textattn.main --config=configs/imdb_fastformer.py --workdir=runs/imdb_fastformer

Result on this 2-core CPU: see experiments/RESULTS.md (target >= 88.5% test accuracy).
"""

from configs import imdb_softmax


def get_config():
  config = imdb_softmax.get_config()
  config.model.attention = "additive"
  config.model.additive_scoring = "shared"
  return config
