#!/usr/bin/env bash
# The IMDB model table (issue 30): every baseline config over seeds 0-2; NBSVM and the attention
# configs (Fastformer, the keras.io seed transformer's fast recipe, causal attention) over 0-4, the NBSVM + Fastformer ensemble of each seed pair (weights chosen on
# validation), then the table (params, train wall time, test accuracy mean +- sd) and McNemar
# tests between neighbours: experiments/summarize_runs.py.
#
#   TFDS_DATA_DIR=... RUNS=runs/imdb_table bash experiments/imdb_baselines.sh
#
# Each run's wall time (launch to test report, tokens cached) goes to $RUNS/times.tsv. A run
# whose workdir already has a test report is skipped, so the script resumes.
set -euo pipefail
RUNS=${RUNS:-runs/imdb_table}
mkdir -p "$RUNS"
train() {  # config seed
  local name; name="$(basename "$1" .py)_s$2"
  if [ -f "$RUNS/$name/test_predictions.npz" ]; then return; fi
  local start; start=$(date +%s.%N)
  python -m textattn.main --config="$1" --workdir="$RUNS/$name" --config.seed="$2" \
    > "$RUNS/$name.log" 2>&1
  printf '%s\t%.1f\n' "$name" "$(echo "$(date +%s.%N) - $start" | bc)" >> "$RUNS/times.tsv"
}
for config in bow_unigram bow_bigram tfidf_bigram bilstm; do
  for seed in 0 1 2; do train "configs/imdb_$config.py" "$seed"; done
done
for config in nbsvm fastformer keras_fast causal; do
  for seed in 0 1 2 3 4; do train "configs/imdb_$config.py" "$seed"; done
done
for seed in 0 1 2 3 4; do
  [ -f "$RUNS/nbsvm_fastformer_ensemble_s$seed/ensemble.json" ] || python -m textattn.ensemble \
    --workdir="$RUNS/imdb_nbsvm_s$seed" --workdir="$RUNS/imdb_fastformer_s$seed" \
    --out="$RUNS/nbsvm_fastformer_ensemble_s$seed"
done
python experiments/summarize_runs.py "$RUNS"
