"""IMDB with a bidirectional LSTM: Deep Learning with Python (ch. 11), 87-88% test.

The chapter's model: the first 600 words (20,000-word vocabulary), a 256-wide embedding with
padding masked, one LSTM of 32 units per direction (Flax's nn.RNN, sequence lengths), dropout
0.5, the class layer; RMSprop 1e-3, batch 32, 10 epochs, the best-validation checkpoint.

    python -m textattn.main --config=configs/imdb_bilstm.py --workdir=runs/bilstm

Result: test 88.15% ± 0.63 over seeds 0-2 (87.53, 88.12, 88.79; the chapter: 87-88%), about an
hour a seed on 2 shared CPU cores (CPU-4, 2026-11-25). experiments/RESULTS.md, section 22.
"""

from textattn import defaults


def get_config():
  config = defaults.classification("layout")
  config.max_len = 600
  config.layout.truncation = "post"  # TextVectorization(output_sequence_length=600) keeps the start
  config.model.architecture = "bilstm"
  config.model.embed_dim = 256
  config.model.mlp_dim = 0
  config.model.dropout_rate = 0.5
  config.optimizer.name = "rmsprop"
  config.num_epochs = 10
  config.evals_per_epoch = 1
  return config
