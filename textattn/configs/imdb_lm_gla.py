"""A byte-level language model of IMDB reviews with gated linear attention, GLA (Yang et al. 2024, arXiv 2312.06635: a data-dependent decay per key dimension; O(1) decoding state).

configs/imdb_lm_bytes.py (causal softmax) with only the attention changed: the same data, model
size and budget, so test bits per byte compare directly; no position table, as the paper.

    python -m textattn.main --config=configs/imdb_lm_gla.py --workdir=runs/imdb_lm_gla
    python -m textattn.generate --workdir=runs/imdb_lm_gla --text="This movie was"

Result at 300 steps: experiments/language_model/compare.py (RESULTS section 29).
"""

from textattn import attention, defaults


def get_config():
  config = defaults.sibling(__file__, "imdb_lm_bytes.py")
  config.model.attention = "gla"
  # As the paper: GLA uses no position embedding (its decays order the tokens).
  config.model.position = "none"
  # Its options, at the authors' defaults (e.g. --config.model.gla.chunk_size=128):
  config.model.gla = attention.default_options("gla")
  return config
