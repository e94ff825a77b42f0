"""A byte-level language model of IMDB reviews with causal softmax attention.

Training on the 50,000 unlabelled reviews of TFDS imdb_reviews ("unsupervised"); validation (250)
and test (1,000) reviews drawn from its test split. A 2-layer post-LN decoder (embed 128, 4
heads, feed-forward 512) over packed rows of 256 bytes, documents kept apart by segment ids;
2,000 steps of 32 rows (~16 M bytes, an eighth of an epoch). The test report adds xz -9e and a
byte 5-gram Kneser-Ney model on the same test bytes (lm_report.json). Then sample from it:

    python -m textattn.main --config=configs/imdb_lm_bytes.py --workdir=runs/imdb_lm_bytes
    python -m textattn.generate --workdir=runs/imdb_lm_bytes --text="This movie was"

Result: not measured yet at this budget (one seed's 600-step check: validation bits per byte
below 3 by step 400; docs/language_model.md).
"""

from textattn import defaults


def get_config():
  config = defaults.for_task("language_model")  # the task's defaults are this recipe
  return config
