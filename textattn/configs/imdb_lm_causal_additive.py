"""A byte-level language model of IMDB reviews with causal Fastformer additive attention, direct form (exact prefix semantics, O(length^2)).

configs/imdb_lm_bytes.py (causal softmax) with only the attention changed: the same data, model
size and budget, so test bits per byte compare directly.

    python -m textattn.main --config=configs/imdb_lm_causal_additive.py --workdir=runs/imdb_lm_causal_additive
    python -m textattn.generate --workdir=runs/imdb_lm_causal_additive --text="This movie was"

Result at 300 steps (experiments/language_model/compare.py, seeds 0-2, a 2-core CPU): test bits
per byte 3.529 +- 0.004 (+0.192 against causal softmax, paired);
RESULTS section 29. Not measured at this config's 2,000 steps.
"""

from textattn import defaults


def get_config():
  config = defaults.sibling(__file__, "imdb_lm_bytes.py")
  config.model.attention = "causal_additive"
  return config
