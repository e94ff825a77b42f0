#!/usr/bin/env bash
# RESULTS §30: A/B of the decode_step benchmark's cache donation on this CPU: old (582ad83, cache copied each
# call) vs new (cache donated), same command, one core, nothing else running.
# OLD=DIR (a checkout of 582ad83) bash experiments/seq_len/decode_donation.sh OUT, from the repository root.
set -euo pipefail
out=$(realpath -m "${1:?give an output directory}")
cmd=(python -m textattn.benchmark --mode=decode_step
     --variants=causal_auto,causal_additive_recurrent_auto,causal_linear_auto,sliding_window_auto,causal_performer_auto
     --seq_lens=256,4096,16384 --batch_size=4 --embed_dim=256 --num_heads=4 --num_layers=1 --dtype=float32
     --point_memory_limit_gb=8 --warmup=1 --repeats=5 --point_time_budget_s=15 --point_timeout_s=150 --overwrite)
for side in old new; do
  dir=$([ $side = old ] && echo "${OLD:?a checkout of 582ad83}" || echo .)
  (cd $dir && taskset -c 1 "${cmd[@]}" --out_dir="$out/$side" > "$out/$side.log" 2>&1)
done
