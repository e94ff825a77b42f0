"""IMDB with softmax multi-head self-attention, validation carved from train.

A small post-LN encoder over the last 400 tokens of each review (2 layers, embed 64, 4 heads),
masked mean pooling, word dropout 0.2 (model.token_dropout_rate), AdamW with warm-up and cosine
decay, 3 epochs; the test report uses the checkpoint with the best validation accuracy
(validation = 10% of the training split).

    TFDS_DATA_DIR=../shared/tensorflow_datasets \
      python -m textattn.main --config=configs/imdb_softmax.py --workdir=runs/imdb_softmax

Result on this 2-core CPU (2026-11-22, evening): validation 0.8960, test accuracy 87.86%
(weighted F1 0.879) — short of the 88.5% target; 57.7 min wall on one core (`taskset -c 1`,
the other core training). Word dropout 0.2 and the third epoch were chosen on validation by a
GPU sweep (experiments/sweeps/; +0.31 points of mean validation accuracy over 3 seeds), but on
test this run scored below the 2-epoch version without word dropout (validation 0.8904 /
0.8880, test 88.34% / 88.03% for seeds 0 / 1): the 2,500-review validation split does not
resolve differences this small. Starting the token embeddings from word2vec vectors trained on
the training text and IMDB's 50,000 unlabelled reviews (`--config.model.embedding_init=word2vec
--config.word2vec.unlabeled_split=unsupervised`): validation 0.8984, test 87.92% (36 min, native
kernel) — not adopted on that evidence. All runs: experiments/RESULTS.md.
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
  config.optimizer.name = "adamw"
  config.optimizer.learning_rate = 1e-3
  config.optimizer.weight_decay = 0.01
  config.optimizer.schedule = "cosine"
  config.optimizer.warmup_steps = 200
  config.eval_every_steps = 350
  config.checkpoint_every_steps = 350
  return config
