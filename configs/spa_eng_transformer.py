"""English to Spanish, Deep Learning with Python's sequence-to-sequence Transformer (ch. 11.5).

The chapter's data handling (spa.txt, seeded 70/15/15 split of the pairs, word vocabularies of
15,000, 20 tokens, punctuation and "¿" stripped) and model sizes (embed 256, feed-forward 2048,
8 heads, one encoder and one decoder block, dropout 0.5 before the output layer, RMSprop, batch
64), with standard head sizes (256 / 8 = 32 per head; the chapter's Keras MultiHeadAttention
uses 256 per head). A softmax encoder, a causal softmax decoder.

    python -m textattn.main --config=configs/spa_eng_transformer.py --workdir=runs/spa_eng \\
      --config.dataset=spa.txt

spa.txt: http://www.manythings.org/anki/spa-eng.zip (the chapter's file, English<TAB>Spanish).

Result: not measured yet (issue 29).
"""

from textattn import defaults


def get_config():
  config = defaults.translation()
  config.num_epochs = 7
  config.evals_per_epoch = 2
  return config
