"""A byte-level language model of IMDB reviews with causal linear attention (Katharopoulos et al. 2020, elu+1 features; O(1) decoding state).

configs/imdb_lm_bytes.py (causal softmax) with only the attention changed: the same data, model
size and budget, so test bits per byte compare directly.

    python -m textattn.main --config=configs/imdb_lm_causal_linear.py --workdir=runs/imdb_lm_causal_linear
    python -m textattn.generate --workdir=runs/imdb_lm_causal_linear --text="This movie was"

Result at 300 steps (experiments/language_model/compare.py, seeds 0-2, a 2-core CPU): test bits
per byte 3.499 +- 0.004 (+0.162 against causal softmax, paired);
RESULTS section 29. Not measured at this config's 2,000 steps.
"""

from textattn import attention, defaults


def get_config():
  config = defaults.sibling(__file__, "imdb_lm_bytes.py")
  config.model.attention = "causal_linear"
  # Its options, at their defaults (e.g. --config.model.linear.FIELD=VALUE):
  config.model.linear = attention.default_options("causal_linear")
  return config
