"""HuffPost News Category (Misra 2018; the Fastformer notebook's task) with Fastformer attention.

JSON lines with `category` (41 classes), `headline` and `short_description` (as in
News_Category_Dataset_v2.json, 200,853 lines); text = headline + " " + short_description,
the first 64 words. A 2-layer Fastformer encoder (embed 128, 4 heads) with attention pooling,
random token embeddings (the word2vec start lowered accuracy on the short-text sets it was
tried on), 3 epochs; validation and test carved from the file (10% each), evaluated 4 times per
epoch (every ~627 steps on the full file, as often relative to any other size). The test report
includes weighted F1 (test/f1_weighted).

    python -m textattn.main --config=configs/news_category_fastformer.py --workdir=runs/news \
        --config.dataset=/path/to/News_Category_Dataset_v2.json

Result: not measured (the file is not available here); the notebook's weighted F1 0.7085 is the
figure to beat. Tested end to end on tests/fixtures/news_category.jsonl (tests/test_own_data.py).
"""

from textattn import defaults


def get_config():
  config = defaults.classification("source", "layout", "embedding")
  config.dataset = "News_Category_Dataset_v2.json"  # JSON lines despite the .json
  config.source.text_fields = "headline,short_description"
  config.source.label_field = "category"
  config.vocab_size = 30000
  config.max_len = 64  # a headline and a one-sentence description: ~30 words, rarely 64
  config.layout.truncation = "post"  # keep the headline (the start) when a text is longer
  config.batch_size = 64
  config.num_epochs = 3
  config.model.attention = "additive"
  config.model.embed_dim = 128
  config.model.num_heads = 4
  config.model.num_layers = 2
  config.model.ffn_dim = 256
  config.model.mlp_dim = 0
  config.embedding.token_dropout_rate = 0.1  # word dropout
  config.model.pooling = "attention"
  config.optimizer.name = "adamw"
  config.optimizer.weight_decay = 0.01
  config.optimizer.schedule = "cosine"
  config.optimizer.warmup_steps = 500
  # Automatic intervals (0): evals_per_epoch times per epoch of whatever file is given, so a
  # subset or a newer, larger version of the file is evaluated as often per epoch.
  return config
