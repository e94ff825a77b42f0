"""IMDB with Fastformer additive attention (arXiv 2108.09084), validation carved from train.

The encoder of configs/imdb_softmax.py with additive attention in place of softmax attention,
over the last 800 tokens instead of 400 (its linear cost makes the longer context affordable;
at 400 tokens it reached validation 0.8928, at 800 0.8968, and the length was chosen by that):
2 layers, embed 64, 4 heads, masked mean pooling, token embeddings started from word2vec
vectors of the training text and IMDB's 50,000 unlabelled reviews (inherited), AdamW + cosine,
2 epochs without word dropout, best-validation checkpoint for the test report.

    TFDS_DATA_DIR=../shared/tensorflow_datasets \
      python -m textattn.main --config=configs/imdb_fastformer.py --workdir=runs/imdb_fastformer

Plus hashed bigram embeddings (model.bigram_buckets=65536: each (previous token, token) pair's
own learned vector, zero at the start, added to the token embedding), adopted on validation:
mean best validation 0.9000 over seeds 0-3 against 0.8969 without (seeds 0-2). A weak test:
the rule was written after seeds 0-1 (their test figures included) had been seen, and the
comparison is unpaired, against earlier runs on another machine, with a bar of about one
standard error. The softmax config adopted the same change on a stricter test (20 fresh seeds
a side, paired, rule written first: +0.25 points); this config's adoption is being re-checked
the same way (experiments/RESULTS.md, 2026-11-24).

Result on this 2-core CPU (2026-11-23, Zen 3): seed 0 validation 0.8964, test accuracy
89.43% (weighted F1 0.894), 15 min wall on one core (`taskset -c 0`, the other core training)
including a rebuild of the word vectors. Seeds 1 / 2 / 3: test 89.78% / 89.59% / 89.10%;
4 seeds: 89.48% +- 0.29 (the project's 88.5% goal met by every seed). Without bigrams
(`--config.model.bigram_buckets=0`, the previous recipe): 88.39% / 88.26% / 88.01%, 88.22% +- 0.19.
The rest of the recipe (word2vec start, 2 epochs, no word dropout) was chosen on validation
by a GPU sweep (experiments/sweeps/fastformer_w2v.jsonl, 12 seeds): mean best validation 0.8966 against 0.8947 for the previous recipe (random token
embeddings, 3 epochs, word dropout 0.2: `--config.model.embedding_init=random
--config.num_epochs=3 --config.model.token_dropout_rate=0.2`; its test figures on this CPU,
seeds 0/1/2: 88.26% / 86.92% / 87.92%, and 88.24% for seed 0 with the native kernel). The
2-epoch recipe without word2vec tested 88.34% / 88.13% / 87.65%. All runs:
experiments/RESULTS.md.
"""

from configs import imdb_softmax


def get_config():
  config = imdb_softmax.get_config()
  config.model.attention = "additive"
  config.model.additive_scoring = "shared"
  config.max_len = 800
  # Hashed bigram embeddings (fastText's bigram features): +0.31 mean best validation over
  # 4 seeds (experiments/RESULTS.md, "hashed bigram embeddings"); 65,536 rows chosen by a
  # linear probe on validation (experiments/bigram_probe.py).
  config.model.bigram_buckets = 65536
  # With the word2vec start, 2 epochs without word dropout validated best (GPU sweep, 12 seeds).
  config.num_epochs = 2
  config.model.token_dropout_rate = 0.0
  # XLA:CPU without its YNNPACK fusions: this step measured 10-20% faster (406 vs 452 ms in an
  # interleaved A/B; 387-405 vs 462-498 ms through the benchmark command), experiments/RESULTS.md,
  # "Fourth round". (imdb_softmax.py: no difference, so it keeps XLA's default.)
  config.xla_flags = "--xla_cpu_experimental_ynn_fusion_type="
  return config
