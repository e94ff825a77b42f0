"""A byte-level language model of IMDB reviews with Gated DeltaNet (Yang et al. 2025, arXiv 2412.06464: the delta rule with Mamba-2's decay; O(1) decoding state).

configs/imdb_lm_bytes.py (causal softmax) with only the attention changed: the same data, model
size and budget, so test bits per byte compare directly; no position table, as the paper.

    python -m textattn.main --config=configs/imdb_lm_gated_deltanet.py --workdir=runs/imdb_lm_gated_deltanet
    python -m textattn.generate --workdir=runs/imdb_lm_gated_deltanet --text="This movie was"

Result at 300 steps: experiments/language_model/compare.py (RESULTS section 29).
"""

from textattn import attention, defaults


def get_config():
  config = defaults.sibling(__file__, "imdb_lm_bytes.py")
  config.model.attention = "gated_deltanet"
  # As the paper: no position embedding (its convolutions and decays order the tokens).
  config.model.position = "none"
  # Its options, at the authors' defaults (e.g. --config.model.gated_deltanet.chunk_size=128):
  config.model.gated_deltanet = attention.default_options("gated_deltanet")
  return config
