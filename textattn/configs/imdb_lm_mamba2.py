"""A byte-level language model of IMDB reviews with Mamba-2's SSD layer (Dao & Gu 2024, arXiv 2405.21060: an input-dependent decay per head, a short convolution; O(1) decoding state).

configs/imdb_lm_bytes.py (causal softmax) with only the attention changed: the same data, model
size and budget, so test bits per byte compare directly; no position table, as the paper.

    python -m textattn.main --config=configs/imdb_lm_mamba2.py --workdir=runs/imdb_lm_mamba2
    python -m textattn.generate --workdir=runs/imdb_lm_mamba2 --text="This movie was"

Result at 300 steps: experiments/language_model/compare.py (RESULTS section 29).
"""

from textattn import attention, defaults


def get_config():
  config = defaults.sibling(__file__, "imdb_lm_bytes.py")
  config.model.attention = "mamba2"
  # As the paper: Mamba-2 uses no position embedding (its convolution and decays order the tokens).
  config.model.position = "none"
  # Its options, at the authors' defaults (e.g. --config.model.mamba2.chunk_size=128):
  config.model.mamba2 = attention.default_options("mamba2")
  return config
