"""A byte-level language model of IMDB reviews with causal Performer FAVOR+ attention (positive random features drawn per layer from the seed).

configs/imdb_lm_bytes.py (causal softmax) with only the attention changed: the same data, model
size and budget, so test bits per byte compare directly.

    python -m textattn.main --config=configs/imdb_lm_causal_performer.py --workdir=runs/imdb_lm_causal_performer
    python -m textattn.generate --workdir=runs/imdb_lm_causal_performer --text="This movie was"

Result at 300 steps (experiments/language_model/compare.py, seeds 0-2, a 2-core CPU): test bits
per byte 3.423 +- 0.031 (+0.086 against causal softmax, paired);
RESULTS section 29. Not measured at this config's 2,000 steps.
"""

from textattn import attention, defaults


def get_config():
  config = defaults.sibling(__file__, "imdb_lm_bytes.py")
  config.model.attention = "causal_performer"
  # Its options, at their defaults (e.g. --config.model.performer.FIELD=VALUE):
  config.model.performer = attention.default_options("causal_performer")
  return config
