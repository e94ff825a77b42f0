r"""English to Spanish exactly as Deep Learning with Python (ch. 11.5) builds it: the like-for-like
speed and accuracy comparison for configs/spa_eng_transformer.py.

Keras' MultiHeadAttention(num_heads=8, key_dim=256) makes every head 256 wide (head_dim=256):
19,960,216 parameters, as the chapter's model. No dropout inside the blocks, Dropout(0.5) before
the output layer, RMSprop (Keras', 1e-3, constant), batch 64, plain random batches, 30 epochs;
word vocabularies of 15,000, 20 tokens, the seeded 70/15/15 split of the pairs.

    python -m textattn.main --config=configs/spa_eng_chapter.py --workdir=runs/spa_eng_chapter \
      --config.dataset=spa.txt

The chapter: 67% validation next-token accuracy after 30 epochs. Speed on a 2-core Zen 4 CPU: 76
examples/s, 0.96x the chapter's Keras code on the same machine (79/s; 30 epochs ~8.8 h; on spa.txt
19,193,240 parameters: 12,004 English words where Keras' table keeps 15,000 rows). Not trained
here; configs/spa_eng_transformer.py reaches 67% in 26 minutes (experiments/RESULTS.md, section 23).
"""

from textattn import defaults


def get_config():
  config = defaults.translation()
  config.model.update(head_dim=256, dropout_rate=0.0, output_dropout_rate=0.5)
  config.optimizer.update(name="rmsprop", learning_rate=1e-3, schedule="constant", warmup_steps=0)
  config.length_pool = 0
  config.num_epochs = 30
  return config
