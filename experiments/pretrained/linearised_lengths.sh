#!/usr/bin/env bash
# Issue 55: one linearised attention layer against softmax at MiniLM's layer sizes (384 wide,
# 12 heads of 32, batch 1), forward + backward, at 512 tokens and at 4K-16K: linear attention
# with Hedgehog's map (what transfer_imdb.sh's linear row swaps in), LoLCATs' sliding-window +
# linear hybrid (window 64, Hedgehog's map; "auto": its blocked kernel at these lengths),
# additive attention, and softmax's naive, native (the CPU's fused kernel), chunked and auto
# kernels; and (VARIANTS=window_additive_auto, a run of its own) the window + additive-slot hybrid
# (window 64 too). Run it on a quiet machine (RESULTS §31).
#   bash experiments/pretrained/linearised_lengths.sh runs/linearised_lengths
#   VARIANTS=window_additive_auto bash experiments/pretrained/linearised_lengths.sh runs/window_additive
set -euo pipefail
out=${1:?give an output directory}
python -m textattn.benchmark --config=configs/imdb_keras_example.py \
  --config.model.linear.feature_map=hedgehog --config.model.hybrid.window=64 \
  --config.model.window.size=64 --mode=attention+backward \
  --variants="${VARIANTS:-softmax,softmax_native,softmax_chunked,softmax_auto,linear,window_linear_auto,additive_auto}" \
  --seq_lens=512,4096,8192,16384 --batch_size=1 --embed_dim=384 --num_heads=12 --num_layers=1 \
  --warmup=1 --repeats=3 --point_time_budget_s=60 --out_dir="$out" "${@:2}"
