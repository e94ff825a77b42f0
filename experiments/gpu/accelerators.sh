#!/usr/bin/env bash
# Issue 28's GPU measurements, most important first, for one lent GPU call (~10 min budget):
#   device tool: carry [".whl"], command "bash experiments/gpu/accelerators.sh"
# (.whl/ as experiments/gpu/check.sh describes). Results land in $OUT (copy them into
# experiments/gpu/ with this command in RESULTS). Written 2026-11-25 without a GPU: not run yet.
source experiments/gpu/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
B=(python3 -m textattn.benchmark --overwrite --point_timeout_s=240)

# 0. cuDNN flash attention against the float64 reference (skipped on CPUs).
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_attention.py -k "cudnn or auto" \
  > "$OUT/pytest_flash.log" 2>&1; tail -3 "$OUT/pytest_flash.log"

# 1. Flash softmax vs additive: a one-layer classifier forward+backward (time includes the
#    embedding, FFN and head, so the attention TFLOP/s by formula is a lower bound), head dim 64,
#    bfloat16 then float32:
#    attention TFLOP/s and % of peak (target >= 300 TFLOP/s at 8K), additive's TB/s.
for dtype in bfloat16 float32; do
  "${B[@]}" --variants=softmax_auto,softmax_chunked,additive_auto --dtype=$dtype \
    --seq_lens=1024,4096,8192,16384 --batch_size=4 --embed_dim=256 --num_heads=4 \
    --num_layers=1 --mode=forward+backward --lengths=full --out_dir="$OUT/flash_$dtype" > "$OUT/flash_$dtype.log" 2>&1
  tail -8 "$OUT/flash_$dtype/results.md"
done

# 2. Long sequences on one GPU: batch 1, head dim 64, forward+backward, 32K..128K.
"${B[@]}" --variants=softmax_auto,additive_auto --dtype=bfloat16 --seq_lens=32768,65536,131072 \
  --batch_size=1 --embed_dim=256 --num_heads=4 --num_layers=1 --mode=forward+backward --lengths=full \
  --out_dir="$OUT/long" > "$OUT/long.log" 2>&1; tail -6 "$OUT/long/results.md"

# 3. Train-step MFU of the LRA-sized model (4 layers, embed 256, 4 heads, FFN 1024, 4K, batch 32).
for variant in softmax additive; do
  "${B[@]}" --mode=train_step --config=configs/lra_text_$variant.py --warmup=3 --repeats=10 \
    --out_dir="$OUT/mfu_$variant" > "$OUT/mfu_$variant.log" 2>&1
  tail -2 "$OUT/mfu_$variant/results.md"
done
