"""IMDB with NB-weighted uni-, bi- and trigrams (NBSVM-style): Wang & Manning (2012) 91.2%.

The 800,000 most frequent training n-grams of 1-3 words, each once per review, scaled by its
naive-Bayes log-count ratio and a learned per-feature weight (fast.ai's "NBSVM++", J. Howard
2018; textattn/models/baselines.py), trained as a logistic regression with Adam.

    python -m textattn.main --config=configs/imdb_nbsvm.py --workdir=runs/nbsvm

Result: test 91.42% ± 0.06 over seeds 0–4 (Wang & Manning: 91.22%); 23 s from launch with
features cached, 74 s from a cold cache, 2 CPU cores (CPU-4, 2026-11-25). Two epochs were chosen
on validation. With a Fastformer run of the same seed, `python -m textattn.ensemble` reaches
91.69% ± 0.07 (5 seeds). experiments/RESULTS.md, section 22.
"""

from textattn import defaults


def get_config():
  config = defaults.classification("ngrams")
  config.tokenizer = "ngram"
  config.ngrams.order = 3
  config.vocab_size = 800000
  config.max_len = 2048  # distinct features per review; the longest reviews drop their rarest
  config.model.architecture = "bag"
  config.ngrams.weighting = "nb"
  config.model.mlp_dim = 0
  config.model.dropout_rate = 0.0
  config.optimizer.learning_rate = 0.02
  config.optimizer.weight_decay = 1e-6
  config.optimizer.schedule = "cosine"
  config.batch_size = 64
  # (num_epochs 2, the default, was chosen on validation: experiments/RESULTS.md, "Baselines")
  config.evals_per_epoch = 2
  return config
