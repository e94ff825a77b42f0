"""IMDB with Fastformer additive attention (arXiv 2108.09084), validation carved from train.

The encoder of configs/imdb_softmax.py with additive attention in place of softmax attention,
over the last 800 tokens instead of 400 (its linear cost makes the longer context affordable;
at 400 tokens it reached validation 0.8928, at 800 0.8968, and the length was chosen by that):
2 layers, embed 64, 4 heads, masked mean pooling, token embeddings started from word2vec
vectors of the training text and IMDB's 50,000 unlabelled reviews (inherited), AdamW + cosine,
2 epochs without word dropout, best-validation checkpoint for the test report.

    TFDS_DATA_DIR=../shared/tensorflow_datasets \
      python -m textattn.main --config=configs/imdb_fastformer.py --workdir=runs/imdb_fastformer

Result on this 2-core CPU (2026-11-23): validation 0.8948, test accuracy 88.39% (weighted F1
0.884), seed 0 — short of the 88.5% target; 37.5 min wall on one core (`taskset -c 0`, the
other core training), 11 of them building the word vectors (cached for later runs).
Seeds 1 / 2: validation 0.8984 / 0.8976, test 88.26% / 88.01% (26.6 / 24.3 min, vectors
cached); 3 seeds: 88.22% ± 0.19.
The recipe was chosen on validation by a GPU sweep (experiments/sweeps/fastformer_w2v.jsonl,
12 seeds): mean best validation 0.8966 against 0.8947 for the previous recipe (random token
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
  # With the word2vec start, 2 epochs without word dropout validated best (GPU sweep, 12 seeds).
  config.num_epochs = 2
  config.model.token_dropout_rate = 0.0
  # XLA:CPU without its YNNPACK fusions: this step measured 10-20% faster (406 vs 452 ms in an
  # interleaved A/B; 387-405 vs 462-498 ms through the benchmark command), experiments/RESULTS.md,
  # "Fourth round". (imdb_softmax.py: no difference, so it keeps XLA's default.)
  config.xla_flags = "--xla_cpu_experimental_ynn_fusion_type="
  return config
