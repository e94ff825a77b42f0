"""Would keeping punctuation as tokens help? A cheap proxy before changing the tokenizer.

Bag-of-words logistic regression (scikit-learn, not a project dependency: `pip install
scikit-learn`) on IMDB's training split with textattn's validation carve (10%, data_seed 0),
scored on that validation split only (never test), for three standardisations:
  strip  - textattn's (Keras "lower_and_strip_punctuation", `<br />` removed);
  keep!? - the same, but "!" and "?" kept as tokens of their own;
  keep   - every ASCII punctuation mark kept as a token of its own.
Features: the 20,000 most frequent training tokens (the configs' vocabulary size), unigrams
or unigrams + bigrams, binary; C chosen per row on the same validation split (best of 4).

    TFDS_DATA_DIR=../shared/tensorflow_datasets python experiments/punctuation_probe.py
"""

import os
import re
import string
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression

from configs import imdb_softmax
from textattn import input_pipeline, tokenizer

_BANG = re.compile(r"([!?])")
_ALL = re.compile("([" + re.escape(string.punctuation) + "])")


def keep(pattern):
  delete = "".join(c for c in string.punctuation if not pattern.fullmatch(c))
  table = str.maketrans("", "", delete)

  def standardize(text):
    text = re.sub(r"<br\s*/?>", " ", text.lower())
    return pattern.sub(r" \1 ", text).translate(table)
  return standardize


STANDARDISATIONS = {"strip": tokenizer.standardize, "keep!?": keep(_BANG), "keep": keep(_ALL)}


def main():
  config = imdb_softmax.get_config()
  raw = input_pipeline._source(config).read(config.val_fraction, config.data_seed)
  for name, standardize in STANDARDISATIONS.items():
    train = [standardize(t) for t in raw.texts["train"]]
    val = [standardize(t) for t in raw.texts["validation"]]
    for ngrams in ((1, 1), (1, 2)):
      vectorizer = CountVectorizer(tokenizer=str.split, token_pattern=None, lowercase=False,
                                   ngram_range=ngrams, max_features=20000, binary=True)
      x_train, x_val = vectorizer.fit_transform(train), vectorizer.transform(val)
      scores = {}
      for c in (0.03, 0.1, 0.3, 1.0):
        model = LogisticRegression(C=c, max_iter=2000).fit(x_train, raw.labels["train"])
        scores[c] = model.score(x_val, raw.labels["validation"])
      best = max(scores, key=scores.get)
      print(f"{name:7s} ngrams {ngrams}: validation {scores[best]:.4f} (C={best}; all: "
            f"{' '.join(f'{v:.4f}' for v in scores.values())})", flush=True)


if __name__ == "__main__":
  main()
