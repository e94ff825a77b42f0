"""A byte-level language model of IMDB reviews with causal softmax attention.

Training on the 50,000 unlabelled reviews of TFDS imdb_reviews ("unsupervised"); validation (250)
and test (1,000) reviews drawn from its test split. A 2-layer post-LN decoder (embed 128, 4
heads, feed-forward 512) over packed rows of 256 bytes, documents kept apart by segment ids;
2,000 steps of 32 rows (~16 M bytes, a quarter of an epoch). The test report adds xz -9e and a
byte 5-gram Kneser-Ney model on the same test bytes (lm_report.json). Then sample from it:

    python -m textattn.main --config=configs/imdb_lm_bytes.py --workdir=runs/imdb_lm_bytes
    python -m textattn.generate --workdir=runs/imdb_lm_bytes --text="This movie was"

Result at 300 steps (experiments/language_model/compare.py, seeds 0-2, a 2-core CPU): test bits
per byte 3.337 +- 0.052 (xz -9e: 2.590; byte 5-gram Kneser-Ney: 1.981); RESULTS section 29. Not
measured at this config's 2,000 steps.
"""

from textattn import defaults


def get_config():
  config = defaults.for_task("language_model")  # the task's defaults are this recipe
  return config
