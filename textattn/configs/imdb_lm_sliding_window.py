"""A byte-level language model of IMDB reviews with sliding-window causal softmax attention (each byte sees the previous model.window.size positions).

configs/imdb_lm_bytes.py (causal softmax) with only the attention changed: the same data, model
size and budget, so test bits per byte compare directly.

    python -m textattn.main --config=configs/imdb_lm_sliding_window.py --workdir=runs/imdb_lm_sliding_window
    python -m textattn.generate --workdir=runs/imdb_lm_sliding_window --text="This movie was"

Result at 300 steps (experiments/language_model/compare.py, seeds 0-2, a 2-core CPU): test bits
per byte 3.330 +- 0.035 (-0.007 against causal softmax, paired);
RESULTS section 29. Not measured at this config's 2,000 steps.
"""

from textattn import attention, defaults


def get_config():
  config = defaults.sibling(__file__, "imdb_lm_bytes.py")
  config.model.attention = "sliding_window"
  # Its options, at their defaults (e.g. --config.model.window.FIELD=VALUE):
  config.model.window = attention.default_options("sliding_window")
  return config
