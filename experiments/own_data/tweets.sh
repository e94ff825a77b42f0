#!/usr/bin/env bash
# "Which config for my data" on a small real CSV: the disaster tweets (7,613 rows; validation and
# test carved from the file, data_seed 0, 10% each), three seeds a config, one run at a time:
# NBSVM n-grams (imdb_nbsvm.py) and all-MiniLM-L6-v2 fine-tuned (imdb_minilm.py: 64 tokens, one
# epoch, warm-up 10%), then the from-scratch Fastformer for own data (news_category_fastformer.py),
# then the NBSVM + MiniLM ensemble of each seed (textattn.ensemble: weights chosen on validation).
#   MINILM=DIR/all-MiniLM-L6-v2 bash experiments/own_data/tweets.sh runs/tweets
#   python experiments/summarize_runs.py runs/tweets/*   (test accuracy per config, mean ± sd)
set -euo pipefail
out=${1:?give an output directory}
here="$(cd "$(dirname "$0")/../.." && pwd)"
data="${TWEETS:-$here/../shared/data/disaster-tweets/train.csv}"
common=(--config.dataset="$data" --config.source.text_fields=text --config.source.label_field=target)
for seed in 0 1 2; do
  python -m textattn.main --config=imdb_nbsvm --workdir="$out/nbsvm_s$seed" "${common[@]}" \
    --config.seed=$seed > "$out.nbsvm_s$seed.log" 2>&1
done
for seed in 0 1 2; do
  python -m textattn.main --config=imdb_minilm --workdir="$out/minilm_s$seed" "${common[@]}" \
    --config.model.pretrained="${MINILM:?set MINILM to the model directory}" --config.max_len=64 \
    --config.optimizer.warmup_steps=19 --config.seed=$seed > "$out.minilm_s$seed.log" 2>&1
done
for seed in 0 1 2; do
  python -m textattn.main --config=news_category_fastformer --workdir="$out/fastformer_s$seed" \
    "${common[@]}" --config.seed=$seed > "$out.fastformer_s$seed.log" 2>&1
done
for seed in 0 1 2; do
  python -m textattn.ensemble --workdir="$out/nbsvm_s$seed" --workdir="$out/minilm_s$seed" \
    --out="$out/nbsvm_minilm_s$seed" > "$out.nbsvm_minilm_s$seed.log" 2>&1
done
