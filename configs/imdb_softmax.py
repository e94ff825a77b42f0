"""IMDB with softmax multi-head self-attention, validation carved from train.

A small post-LN encoder over the last 400 tokens of each review (2 layers, embed 64, 4 heads),
masked mean pooling, token embeddings started from word2vec vectors (skip-gram, trained on the
training split's text with validation carved out plus IMDB's 50,000 unlabelled reviews, the
TFDS split "unsupervised"; built once, ~11 min on one core, then cached), hashed bigram
embeddings (model.bigram_buckets=65536: each (previous token, token) pair adds a zero-started
row of a 65,536-row table), word dropout 0.2 (model.token_dropout_rate), AdamW with warm-up
and cosine decay, 3 epochs; the test report uses the checkpoint with the best validation
accuracy (validation = 10% of the training split).

    TFDS_DATA_DIR=../shared/tensorflow_datasets \
      python -m textattn.main --config=configs/imdb_softmax.py --workdir=runs/imdb_softmax

Result on this 2-core CPU (Zen 3 host, 2026-11-23): seed 0: best validation 0.9024 (steps 2100
and 2109; the test uses 2109's parameters), test accuracy 88.93% (weighted F1 0.889), 27 min
with the vectors cached, sharing the cores with two other training runs; seeds 1-4 (one core
each, `taskset`): test 88.23% / 88.98% / 89.00% / 88.85%; 5 seeds: 88.80% +- 0.32 (4 of 5 above
the project's 88.5%). Re-run with this file as shipped (2026-11-24, both cores, nothing else
running): the same metrics exactly, test 88.93%, 10.7 min.

The bigrams were adopted on validation by a rule written before its runs: 20 fresh seeds a
side (10-29), validation only, adopt if the mean best validation gains >= 0.002; it gained
0.00248 (0.8947 -> 0.8972, paired 95% interval +0.0002 to +0.0048;
experiments/sweeps/softmax_bigram_cpu.jsonl). Without them (`--config.model.bigram_buckets=0`,
this config until 2026-11-24): seed 0 validation 0.8984, test 87.92%; 5 seeds 88.06% +- 0.38.
The word2vec start was chosen on validation by a GPU sweep (experiments/sweeps/softmax_w2v.jsonl:
mean best validation 0.8958 over 9 seeds against 0.8932 with random token embeddings), as word
dropout and the third epoch were before it. Random token embeddings, no bigrams
(`--config.model.embedding_init=random --config.model.bigram_buckets=0`): seed 0 validation
0.8960, test 87.86%; with 2 epochs and no word dropout too (`... --config.num_epochs=2
--config.model.token_dropout_rate=0`): test 88.34% / 88.03% (seeds 0 / 1).
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
  # Hashed bigram embeddings: +0.25 points mean best validation over 20 paired seeds
  # (experiments/RESULTS.md, "softmax with and without bigrams").
  config.model.bigram_buckets = 65536
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
