#!/usr/bin/env bash
# Does attention_impl="auto" pick the faster CPU kernel? For the benchmark's default shapes
# (textattn/benchmark/plan.py SYNTHETIC_DEFAULTS: batch 4, embed 256, 4 heads, 1 layer, float32,
# forward+backward of the classifier, lengths 256-4,096), times softmax and additive attention
# with attention_impl auto, native and the XLA kernel auto falls back to (softmax: fused;
# additive: xla), then prints auto / min(native, XLA) per (variant, length) (summarize.py).
#
#   bash experiments/cpu_auto/auto_vs_best.sh [OUT_DIR]     # ~15 min on a quiet 2-core Zen 3
#   REHEARSE=1 bash experiments/cpu_auto/auto_vs_best.sh    # toy sizes, ~1-2 min: the plumbing
#
# ROUNDS (default 2): every length is run that many times, the variants' order reversed every
# other round (a change in the machine's load then hits every variant); the summary takes each
# point's median over rounds. LENGTHS (default "256 512 1024 2048 4096") and REPEATS (timed calls
# a point, default 5) narrow or steady a rerun. RECALIBRATE=1: remove this machine's calibration verdicts first,
# so the auto points calibrate again (in their set-up, which is not timed). Run from the
# repository root; the machine should be otherwise idle.
set -euo pipefail
out_dir=${1:-runs/cpu_auto/$(date -u +%Y%m%d-%H%M%S)}
rounds=${ROUNDS:-2}
if [[ -n "${REHEARSE:-}" ]]; then
  lengths=(16 32)
  sizes=(--batch_size=2 --embed_dim=16 --num_heads=2 --warmup=0 --repeats=1)
  rounds=1
else
  read -r -a lengths <<< "${LENGTHS:-256 512 1024 2048 4096}"
  sizes=(--batch_size=4 --embed_dim=256 --num_heads=4 --warmup=1 --repeats="${REPEATS:-5}"
         --point_time_budget_s=60)
fi
variants=(softmax_auto softmax_native softmax_fused additive_auto additive_native additive)
if [[ -n "${RECALIBRATE:-}" ]]; then
  python - <<'PY'
from textattn.attention import calibration
path = calibration.cache_path()
path.unlink(missing_ok=True)
print(f"removed {path}")
PY
fi
mkdir -p "$out_dir"
for round in $(seq 1 "$rounds"); do
  order=("${variants[@]}")
  if (( round % 2 == 0 )); then  # reversed
    order=(); for ((i=${#variants[@]}-1; i>=0; i--)); do order+=("${variants[i]}"); done
  fi
  for length in "${lengths[@]}"; do
    python -m textattn.benchmark --variants="$(IFS=,; echo "${order[*]}")" \
      --seq_lens="$length" --num_layers=1 --dtype=float32 --mode=forward+backward \
      "${sizes[@]}" --point_timeout_s=900 --overwrite \
      --out_dir="$out_dir/round$round/L$length"
  done
done
python experiments/cpu_auto/summarize.py "$out_dir" | tee "$out_dir/summary.md"
