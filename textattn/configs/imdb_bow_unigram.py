"""IMDB with a multi-hot bag of words: Deep Learning with Python (ch. 11), 89.2% test.

The chapter's model: the 20,000 most frequent training words as a multi-hot vector (with the
out-of-vocabulary bit), Dense(16, relu), Dropout(0.5), the class layer; RMSprop 1e-3, batch 32,
10 epochs, the best-validation checkpoint tested once. An embedding bag computes the same
function without the dense [batch, 20,000] input (textattn/models/baselines.py).

    python -m textattn.main --config=configs/imdb_bow_unigram.py --workdir=runs/bow_unigram

Result: test 88.67% ± 0.30 over seeds 0–2 (the chapter: 89.2%); 15 s from launch with features
cached, 2 CPU cores (CPU-4, 2026-11-25). experiments/RESULTS.md, section 22.
"""

from textattn import defaults


def get_config():
  config = defaults.classification("ngrams")
  config.tokenizer = "ngram"
  config.ngrams.order = 1
  config.max_len = 1024  # distinct words per review (IMDB's most: ~900)
  config.model.architecture = "bag"
  config.model.mlp_dim = 16
  config.model.dropout_rate = 0.5
  config.optimizer.name = "rmsprop"
  config.num_epochs = 10
  config.evals_per_epoch = 1
  return config
