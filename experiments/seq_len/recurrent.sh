#!/usr/bin/env bash
# Issues 81 and 83: the linear recurrences' chunked form against their recurrent reference on
# this CPU, one layer's forward+backward (the attention alone, projections included) at batch 4,
# 4 heads, embed 256 (RetNet: keys 64, values 128; GLA: keys 32, values 64; Mamba-2: state 128,
# heads of 128; DeltaNet / Gated DeltaNet: keys and values 64), float32; and peak memory at 16,384
# against causal linear attention's chunked form. Run from the repository root with nothing else
# running. Tables: experiments/seq_len/recurrent_cpu/{speed,memory}/results.md.
set -euo pipefail
out=${1:-experiments/seq_len/recurrent_cpu}
families=${FAMILIES:-retnet,gla,mamba2,deltanet,gated_deltanet}
common=(--batch_size=4 --embed_dim=256 --num_heads=4 --num_layers=1 --dtype=float32
        --point_memory_limit_gb=8 --warmup=1 --repeats=3 --point_time_budget_s=60
        --point_timeout_s=500 --overwrite --lengths=full)
variants=""
for f in ${families//,/ }; do variants+="${f}_chunked,${f}_recurrent,"; done
python -m textattn.benchmark --mode=attention+backward --variants="${variants%,}" \
  --seq_lens=4096 "${common[@]}" --out_dir="$out/speed"
chunked=""
for f in ${families//,/ }; do chunked+="${f}_chunked,"; done
python -m textattn.benchmark --mode=attention+backward \
  --variants="causal_linear_chunked,${chunked%,}" --seq_lens=16384 "${common[@]}" \
  --repeats=1 --out_dir="$out/memory"
