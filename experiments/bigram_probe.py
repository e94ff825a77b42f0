"""Is there accuracy in word bigrams that a unigram model lacks? A cheap proxy before building
hashed bigram embeddings into the encoder.

Bag-of-words logistic regression (scikit-learn, not a project dependency: `pip install
scikit-learn`) on IMDB's training split with textattn's validation carve (10%, data_seed 0),
scored on that validation split only (never test); textattn's standardisation ("strip").
Features, binary: unigrams over textattn's vocabulary (the 20,000 most frequent training
tokens), then unigrams + every bigram seen in at least 2 training reviews, then the same
bigrams hashed into B buckets (what an embedding table of B rows would see); C chosen per row
on the same validation split (best of 4).

    TFDS_DATA_DIR=../shared/tensorflow_datasets python experiments/bigram_probe.py
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import scipy.sparse
from sklearn.feature_extraction.text import CountVectorizer, HashingVectorizer
from sklearn.linear_model import LogisticRegression

from textattn import defaults
from textattn.data import sources, tokenizer


def score(name, x_train, x_val, y_train, y_val):
  scores = {}
  for c in (0.03, 0.1, 0.3, 1.0):
    model = LogisticRegression(C=c, max_iter=3000).fit(x_train, y_train)
    scores[c] = model.score(x_val, y_val)
  best = max(scores, key=scores.get)
  print(f"{name:40s} {x_train.shape[1]:>9,} features: validation {scores[best]:.4f} (C={best}; "
        f"all: {' '.join(f'{v:.4f}' for v in scores.values())})", flush=True)


def main():
  config = defaults.load(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "imdb_softmax.py"))
  raw = sources.source(config).read(config.val_fraction, config.data_seed)
  train = [tokenizer.standardize(t) for t in raw.texts["train"]]
  val = [tokenizer.standardize(t) for t in raw.texts["validation"]]
  y_train, y_val = raw.labels["train"], raw.labels["validation"]
  kw = {"tokenizer": str.split, "token_pattern": None, "lowercase": False, "binary": True}
  uni = CountVectorizer(ngram_range=(1, 1), max_features=20000, **kw)
  u_train, u_val = uni.fit_transform(train), uni.transform(val)
  score("unigrams (20,000)", u_train, u_val, y_train, y_val)
  bi = CountVectorizer(ngram_range=(2, 2), min_df=2, **kw)
  b_train, b_val = bi.fit_transform(train), bi.transform(val)
  score("unigrams + bigrams (min_df 2)", scipy.sparse.hstack([u_train, b_train]).tocsr(),
        scipy.sparse.hstack([u_val, b_val]).tocsr(), y_train, y_val)
  for buckets in (2 ** 16, 2 ** 18):
    hashing = HashingVectorizer(ngram_range=(2, 2), n_features=buckets, alternate_sign=False,
                                norm=None, **kw)
    h_train, h_val = hashing.transform(train), hashing.transform(val)
    score(f"unigrams + bigrams hashed into {buckets:,}",
          scipy.sparse.hstack([u_train, h_train]).tocsr(),
          scipy.sparse.hstack([u_val, h_val]).tocsr(), y_train, y_val)


if __name__ == "__main__":
  main()
