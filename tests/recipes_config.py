"""The classification defaults plus both recipes' fields (word2vec start, MLM pretraining), so
tests can set any of them, in-process or as --config.* flags of textattn.main
(`--config=tests/recipes_config.py`)."""

from textattn import defaults
from textattn.recipes import pretrain, word2vec


def get_config():
  config = defaults.complete(defaults.classification())
  config.word2vec = word2vec.default_config()
  config.pretrain = pretrain.default_config()
  return config
