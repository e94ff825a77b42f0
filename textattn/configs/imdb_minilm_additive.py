"""IMDB by fine-tuning all-MiniLM-L6-v2 with Fastformer's additive attention swapped in.

configs/imdb_minilm.py with model.attention="additive": the pretrained embeddings, feed-forward
layers, norms and the query, key and output projections the additive variant has start from the
checkpoint (21.8 M of 22.7 M values); its own alpha/beta weights start afresh and the value
projections it has no place for are dropped (the run prints the three lists). The question it answers: what the switch to linear-time attention costs a
pretrained encoder, against imdb_minilm.py paired by seed.

    python -m textattn.main --config=configs/imdb_minilm_additive.py \
        --workdir=runs/imdb_minilm_additive

Result: 82.26% test at seed 0, 9.24 points below imdb_minilm.py's seed 0 (95% CI 8.76-9.71;
experiments/RESULTS.md section 26; seeds 1-2 to come; budget as imdb_minilm.py).
"""

from textattn import defaults


def get_config():
  config = defaults.sibling(__file__, "imdb_minilm.py")
  config.model.attention = "additive"
  return config
