"""IMDB with a multi-hot bag of words and word pairs: Deep Learning with Python (ch. 11), 90.4%.

imdb_bow_unigram.py's model over the 20,000 most frequent training unigrams and bigrams.

    python -m textattn.main --config=configs/imdb_bow_bigram.py --workdir=runs/bow_bigram

Result: test 90.11% ± 0.34 over seeds 0–2 (the chapter: 90.4%); 15 s from launch with features
cached, 2 CPU cores (CPU-4, 2026-11-25). experiments/RESULTS.md, section 22.
"""

from textattn import defaults


def get_config():
  config = defaults.sibling(__file__, "imdb_bow_unigram.py")
  config.ngrams.order = 2
  config.max_len = 1536  # distinct features per review (IMDB's most: ~1,400)
  return config
