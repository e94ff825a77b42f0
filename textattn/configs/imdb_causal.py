"""IMDB with causal (look-ahead masked) softmax attention and last-token pooling.

The softmax encoder as it was on 2026-11-22 (random token embeddings, 2 epochs, no word dropout,
no bigrams) with a causal mask; the classifier reads the last real token's hidden state.

    python -m textattn.main --config=configs/imdb_causal.py --workdir=runs/imdb_causal

Result: test accuracy 86.92% +- 0.32 over 5 seeds (87.00 / 86.71 / 87.26 / 86.48 / 87.15%),
11-12 min a run on one core of a 2-core Zen 4 CPU (2026-11-25). The bidirectional encoder with the
same recipe: 88.34% / 88.03% (seeds 0 / 1, 2026-11-22). History: experiments/RESULTS.md, section 6.
"""

from textattn import defaults


def get_config():
  config = defaults.sibling(__file__, "imdb_softmax.py")
  config.model.attention = "causal"
  config.model.pooling = "last"
  config.num_epochs = 2
  # As it was run for the result above (imdb_softmax.py has since moved to 3 epochs with word
  # dropout, the word2vec start of the token embeddings and hashed bigram embeddings; bigrams
  # were never tried here).
  config.embedding.token_dropout_rate = 0.0
  config.embedding.init = "random"
  config.word2vec.unlabeled_split = ""
  config.embedding.bigram_buckets = 0
  return config
