"""IMDB with softmax multi-head self-attention, validation carved from train.

A small post-LN encoder over the last 400 tokens of each review (2 layers, embed 64, 4 heads),
masked mean pooling, token embeddings started from word2vec vectors (skip-gram, trained on the
training split's text with validation carved out plus IMDB's 50,000 unlabelled reviews, the
TFDS split "unsupervised"; built once, ~11 min on one core, then cached), word dropout 0.2
(model.token_dropout_rate), AdamW with warm-up and cosine decay, 3 epochs; the test report
uses the checkpoint with the best validation accuracy (validation = 10% of the training split).

    TFDS_DATA_DIR=../shared/tensorflow_datasets \
      python -m textattn.main --config=configs/imdb_softmax.py --workdir=runs/imdb_softmax

Result on this 2-core CPU (2026-11-22/23; one core each, `taskset`, the other core training):
seed 0: validation 0.8984, test accuracy 87.92% (weighted F1 0.879), 36 min with the vectors
cached; seed 1: validation 0.8932, test 88.12% (F1 0.881), 50 min, 11 of them building the
vectors; seeds 2-4 (Zen 3, 21-23 min each): test 87.97% / 87.62% / 88.66%; 5 seeds: mean best
validation 0.8958, test 88.06% +- 0.38 — short of the 88.5% target. Hashed bigram embeddings
(`--config.model.bigram_buckets=65536`, adopted by imdb_fastformer.py) test 88.80% +- 0.32 over
the same 5 seeds but validate no better (mean best validation 0.8958 too), so by the
pre-registered rule they are not adopted here. The word2vec start was
chosen on validation by a GPU sweep (experiments/sweeps/softmax_w2v.jsonl: mean best
validation 0.8958 over 9 seeds against 0.8932 with random token embeddings), as word dropout
and the third epoch were before it. Random token embeddings (`--config.model.embedding_init=
random`): seed 0 validation 0.8960, test 87.86%; with random token embeddings, 2 epochs and no
word dropout (`... --config.num_epochs=2 --config.model.token_dropout_rate=0`): test 88.34% /
88.03% (seeds 0 / 1) — the 2,500-review validation split does not resolve differences this small.
All runs: experiments/RESULTS.md.
"""

from configs import default


def get_config():
  config = default.get_config()
  config.max_len = 400
  config.vocab_size = 20000
  config.truncation = "pre"
  config.batch_size = 32
  config.num_epochs = 3
  config.model.attention = "softmax"
  config.model.embed_dim = 64
  config.model.num_heads = 4
  config.model.num_layers = 2
  config.model.ffn_dim = 128
  config.model.mlp_dim = 0
  config.model.dropout_rate = 0.1
  config.model.token_dropout_rate = 0.2  # word dropout
  config.model.pooling = "mean"
  config.model.embedding_init = "word2vec"
  config.word2vec.unlabeled_split = "unsupervised"
  config.optimizer.name = "adamw"
  config.optimizer.learning_rate = 1e-3
  config.optimizer.weight_decay = 0.01
  config.optimizer.schedule = "cosine"
  config.optimizer.warmup_steps = 200
  config.eval_every_steps = 350
  config.checkpoint_every_steps = 350
  return config
