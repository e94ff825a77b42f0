"""A byte-level language model of IMDB reviews with DeltaNet (Schlag et al. 2021; Yang et al. 2024, arXiv 2406.06484: the delta rule, which overwrites what a key stored; O(1) decoding state).

configs/imdb_lm_bytes.py (causal softmax) with only the attention changed: the same data, model
size and budget, so test bits per byte compare directly; no position table, as the paper.

    python -m textattn.main --config=configs/imdb_lm_deltanet.py --workdir=runs/imdb_lm_deltanet
    python -m textattn.generate --workdir=runs/imdb_lm_deltanet --text="This movie was"

Result at 300 steps: experiments/language_model/compare.py (RESULTS section 29).
"""

from textattn import attention, defaults


def get_config():
  config = defaults.sibling(__file__, "imdb_lm_bytes.py")
  config.model.attention = "deltanet"
  # As the paper: DeltaNet uses no position embedding (its short convolutions order the tokens).
  config.model.position = "none"
  # Its options, at the authors' defaults (e.g. --config.model.deltanet.chunk_size=128):
  config.model.deltanet = attention.default_options("deltanet")
  return config
