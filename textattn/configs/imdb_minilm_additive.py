"""IMDB by fine-tuning all-MiniLM-L6-v2 with Fastformer's additive attention swapped in.

configs/imdb_minilm.py with model.attention="additive": the pretrained embeddings, feed-forward
layers, norms and the query, key and output projections the additive variant has start from the
checkpoint (21.8 M of 22.7 M values); its own alpha/beta weights start afresh and the value
projections it has no place for are dropped (the run prints the three lists). The question it answers: what the switch to linear-time attention costs a
pretrained encoder, against imdb_minilm.py paired by seed.

    python -m textattn.main --config=configs/imdb_minilm_additive.py \
        --workdir=runs/imdb_minilm_additive

Result: 81.36 +- 1.28% test (seeds 0-1: 82.26, 80.46; seed 2 stopped at step 163, to resume), 9.24 and 11.32 points
below imdb_minilm.py's same seeds (95% CIs 8.76-9.71 and 10.82-11.82; experiments/RESULTS.md
section 26; budget as imdb_minilm.py).
"""

from textattn import defaults


def get_config():
  config = defaults.sibling(__file__, "imdb_minilm.py")
  config.model.attention = "additive"
  return config
