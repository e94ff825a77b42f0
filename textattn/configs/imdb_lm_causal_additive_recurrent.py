"""A byte-level language model of IMDB reviews with causal Fastformer additive attention, recurrent form (keys scored once, O(length), O(1) decoding state).

configs/imdb_lm_bytes.py (causal softmax) with only the attention changed: the same data, model
size and budget, so test bits per byte compare directly.

    python -m textattn.main --config=configs/imdb_lm_causal_additive_recurrent.py --workdir=runs/imdb_lm_causal_additive_recurrent
    python -m textattn.generate --workdir=runs/imdb_lm_causal_additive_recurrent --text="This movie was"

Result at 300 steps (experiments/language_model/compare.py, seeds 0-2, a 2-core CPU): test bits
per byte 3.532 +- 0.006 (+0.195 against causal softmax, paired);
RESULTS section 29. Not measured at this config's 2,000 steps.
"""

from textattn import defaults


def get_config():
  config = defaults.sibling(__file__, "imdb_lm_bytes.py")
  config.model.attention = "causal_additive_recurrent"
  return config
