"""A byte-level language model of IMDB reviews with RetNet retention (Sun et al. 2023, arXiv 2307.08621: fixed multi-scale decays, rotary queries and keys; O(1) decoding state).

configs/imdb_lm_bytes.py (causal softmax) with only the attention changed: the same data, model
size and budget, so test bits per byte compare directly; no position table, as the paper.

    python -m textattn.main --config=configs/imdb_lm_retnet.py --workdir=runs/imdb_lm_retnet
    python -m textattn.generate --workdir=runs/imdb_lm_retnet --text="This movie was"

Result at 300 steps: experiments/language_model/compare.py (RESULTS section 29).
"""

from textattn import attention, defaults


def get_config():
  config = defaults.sibling(__file__, "imdb_lm_bytes.py")
  config.model.attention = "retnet"
  # As the paper: RetNet turns its queries and keys itself (rotary) and adds no position embedding.
  config.model.position = "none"
  # Its options, at the authors' defaults (e.g. --config.model.retnet.chunk_size=128):
  config.model.retnet = attention.default_options("retnet")
  return config
