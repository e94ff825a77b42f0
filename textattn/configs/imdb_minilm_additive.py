"""IMDB by fine-tuning all-MiniLM-L6-v2 with Fastformer's additive attention swapped in.

configs/imdb_minilm.py with model.attention="additive": the pretrained embeddings, feed-forward
layers, norms and the query, key and output projections the additive variant has start from the
checkpoint (21.8 M of 22.7 M values); its own alpha/beta weights start afresh and the value
projections it has no place for are dropped (the run prints the three lists). The question it answers: what the switch to linear-time attention costs a
pretrained encoder, against imdb_minilm.py paired by seed.

    python -m textattn.main --config=configs/imdb_minilm_additive.py \
        --workdir=runs/imdb_minilm_additive

Result: 81.58 +- 0.98% test (seeds 0-2: 82.26, 80.46, 82.02), 9.24, 11.32 and 9.70 points
below imdb_minilm.py's same seeds (95% CIs 8.76-9.71, 10.82-11.82 and 9.22-10.18;
experiments/RESULTS.md section 26; budget as imdb_minilm.py).
"""

from textattn import defaults


def get_config():
  config = defaults.sibling(__file__, "imdb_minilm.py")
  config.model.attention = "additive"
  return config
