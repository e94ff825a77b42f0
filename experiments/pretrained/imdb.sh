#!/usr/bin/env bash
# IMDB test accuracy of all-MiniLM-L6-v2 fine-tuned (configs/imdb_minilm.py: 256 tokens, 1 epoch)
# with its own softmax attention and with additive attention swapped in
# (configs/imdb_minilm_additive.py), paired by seed, one run at a time; then, per seed, NBSVM
# (configs/imdb_nbsvm.py, ~1 min) and the NBSVM + MiniLM ensemble (textattn.ensemble: weights
# chosen on validation, ~4 min for MiniLM's validation pass). Each run resumes exactly where it
# stopped when the script is run again (a finished run only re-reports), so the seeds can be
# spread over several sittings (a checkpoint at each of 4 evaluations an epoch).
#   MINILM=DIR/all-MiniLM-L6-v2 TFDS_DATA_DIR=... bash experiments/pretrained/imdb.sh runs/imdb_pre
#   python experiments/summarize_runs.py runs/imdb_pre          (mean ± sd per config)
#   python -m textattn.compare runs/imdb_pre/softmax_s0 runs/imdb_pre/additive_s0   (paired)
# On a lent GPU the six MiniLM runs go at once: experiments/gpu/minilm_imdb.sh (staged by
# experiments/pretrained/stage_gpu.sh; the JSONL export it makes gives these runs' splits, token
# for token).
set -euo pipefail
out=${1:?give an output directory}
seeds=${SEEDS:-0 1 2}
mkdir -p "$out"
for seed in $seeds; do
  for variant in softmax additive; do
    config=imdb_minilm; [ "$variant" = additive ] && config=imdb_minilm_additive
    dir="$out/${variant}_s$seed"
    [ -f "$dir/test_predictions.npz" ] && continue
    python -m textattn.main --config=$config --workdir="$dir" \
      --config.model.pretrained="${MINILM:?set MINILM to the model directory}" \
      --config.evals_per_epoch=4 --config.seed=$seed >> "$out/${variant}_s$seed.log" 2>&1
  done
  nbsvm="$out/nbsvm_s$seed"
  [ -f "$nbsvm/test_predictions.npz" ] || python -m textattn.main --config=imdb_nbsvm \
    --workdir="$nbsvm" --config.seed=$seed >> "$nbsvm.log" 2>&1
  ensemble="$out/nbsvm_minilm_s$seed"
  [ -f "$ensemble/ensemble.json" ] || python -m textattn.ensemble --workdir="$nbsvm" \
    --workdir="$out/softmax_s$seed" --out="$ensemble" >> "$ensemble.log" 2>&1
done
