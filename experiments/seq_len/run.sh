#!/usr/bin/env bash
# The commands behind experiments/seq_len/README.md, run from the repository root in this order.
# About 35 minutes on the 2-core CPU (under the shared load noted in the README).
set -euo pipefail
# --overwrite: re-running replaces the committed tables in place (git diff shows the change).
common=(--batch_size=4 --embed_dim=256 --num_heads=4 --num_layers=1 --dtype=float32
        --mode=forward+backward --point_memory_limit_gb=8 --overwrite)

# 1. The sweep (about 15 minutes): 1 warm-up + 5 timed calls, at most 30 s of calls per point,
#    180 s per point in all (the chunked kernel at 16,384 does not fit in that; see 3).
python -m textattn.benchmark \
  --variants=softmax,softmax_dot_product,softmax_chunked,causal,additive \
  --seq_lens=256,512,1024,2048,4096,8192,16384 "${common[@]}" \
  --warmup=1 --repeats=5 --point_time_budget_s=30 --point_timeout_s=180 \
  --out_dir=experiments/seq_len/cpu

# 2. Re-run of the one point that failed at run time in the sweep.
python -m textattn.benchmark --variants=softmax_dot_product --seq_lens=4096 "${common[@]}" \
  --warmup=1 --repeats=5 --point_time_budget_s=30 --point_timeout_s=180 \
  --out_dir=experiments/seq_len/cpu_rerun_dot_product_4096

# 3. The memory-efficient softmax at 16,384: one call, no time limit to speak of.
python -m textattn.benchmark --variants=softmax_chunked --seq_lens=16384 "${common[@]}" \
  --warmup=0 --repeats=1 --point_timeout_s=1200 --out_dir=experiments/seq_len/cpu_chunked_16k

# 4. Reference softmax vs additive at 4,096, back to back three times (the load is shared).
for round in 1 2 3; do
  python -m textattn.benchmark --variants=softmax,additive --seq_lens=4096 "${common[@]}" \
    --warmup=1 --repeats=5 --point_time_budget_s=30 --point_timeout_s=180 \
    --out_dir=experiments/seq_len/cpu_4096_rounds/round$round
done

# 5. Numerical match with the reference softmax (loss and every gradient), where both fit.
python -m textattn.benchmark --variants=softmax_chunked,causal_chunked --seq_lens=256,1024,4096 \
  "${common[@]}" --check_against_reference --warmup=0 --repeats=1 --point_timeout_s=600 \
  --out_dir=experiments/seq_len/cpu_check
python -m textattn.benchmark --variants=softmax_dot_product,softmax_fused --seq_lens=256,1024 \
  "${common[@]}" --check_against_reference --warmup=0 --repeats=1 --point_timeout_s=600 \
  --out_dir=experiments/seq_len/cpu_check_other_kernels
