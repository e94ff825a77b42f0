#!/usr/bin/env bash
# Issue 42, item 8 (the "done" set), for one lent GPU call of about 8 minutes, most important
# first; each part has a time limit, so a slow part costs only itself:
#   device tool: carry [".whl"], command "bash experiments/gpu/accelerators.sh", timeout_s 600
# (.whl/ as experiments/gpu/check.sh describes). Results land in $OUT: copy them into
# experiments/gpu/ and write the RESULTS section with this command and the card's name (H100
# and H200 differ in bandwidth: 3.35 vs 4.8 TB/s).
# Rehearsal on a CPU (tests/test_gpu_scripts.py runs it): REHEARSE=1 bash experiments/gpu/accelerators.sh
# (toy sizes, Pallas in interpret mode, the test step only collected). Not run on a GPU yet.
#
# Shapes (issue 42, 8a): batch 4, 4 heads of 64 (embed 256), one attention layer, forward and
# backward (--mode=attention+backward: the layer alone, projections included), no padding.
# Rows give attention TFLOP/s by formula (3.5 x 4 B H L^2 d; softmax only), % of the card's peak,
# and TB/s from XLA's cost analysis. XLA does not see inside a Pallas call, so for the Pallas
# rows count bytes by formula: the fused additive kernels move 4 B L F s forward (read q twice and
# k once, write u) and 7 B L F s backward (read du and q twice and k once, write dq and dk; see
# textattn/attention/additive_pallas.py), F = heads x head_dim = 256, s = bytes per element:
# 11 x 4 x 16384 x 256 x 2 = 369 MB at 16K in bfloat16 (0.11 ms at an H100's 3.35 TB/s).
source experiments/gpu/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$PYTHON" -c "import jax; print('jax', jax.__version__, jax.devices()[0].device_kind)"

if [ "$REHEARSE" = 1 ]; then
  # float32 runs the same commands as bfloat16 with another --dtype: rehearsed once, not twice
  # (each benchmark point is a process of its own, several seconds on a CPU).
  # Only the Pallas-vs-reference group (4.) measures for real; the others are planned with
  # --dry_run (flags, variant names, kernels checked; no point run: the suite's time).
  LENS=16; LONG=32; SIZES=(--batch_size=2 --embed_dim=16 --num_heads=2); LIMIT=120; F32=""
  DRY=(--dry_run)
else
  LENS=1024,4096,8192,16384; LONG=16384; SIZES=(--batch_size=4 --embed_dim=256 --num_heads=4)
  LIMIT=90; F32=float32; DRY=()
fi
BENCH=("$PYTHON" -m textattn.benchmark --overwrite --mode=attention+backward --lengths=full
       --warmup=2 --repeats=10 --point_timeout_s=$LIMIT "${SIZES[@]}")
show() {  # (a dry run writes no table: its plan is in the log)
  if [ -f "$1/results.md" ]; then grep -A4 "^| variant | L | kernel" "$1/results.md" | cut -c1-200
  else tail -1 "$1.log"; fi
}

# 0. Lowering first (~15 s; issue 53): every GPU Pallas kernel exported for CUDA with this
#    machine's JAX, so a kernel that cannot lower stops the script in seconds, not minutes.
"$PYTHON" -m textattn.attention.lowering > "$OUT/lowering.log" 2>&1
lowered=$?; grep -E "^(ok|FAILED|jax)" "$OUT/lowering.log"
[ $lowered = 0 ] || { echo "a kernel does not lower: stopping before the GPU runs"; exit 1; }

# 1. Numerics (~1 min): cuDNN flash attention against float64 (the test skipped on CPUs), and
#    the Pallas kernels compiled through Triton (not interpreted, as on a CPU) against float64.
#    A timing of a kernel that fails here is not worth reporting.
wired --timeout=150 -m pytest -q -p no:cacheprovider -rs tests/test_attention.py \
  tests/test_additive_pallas.py tests/test_causal_additive.py -k "cudnn or auto or pallas" \
  > "$OUT/pytest_numerics.log" 2>&1
tail -4 "$OUT/pytest_numerics.log"

# 2. (8a) Flash vs additive in bfloat16 at 1K-16K (~2 min): softmax_auto is cuDNN flash here
#    (target >= 300 TFLOP/s at 8K), additive_auto the XLA function (the allow-list is empty).
timeout 180 "${BENCH[@]}" "${DRY[@]}" --variants=softmax_auto,additive_auto --dtype=bfloat16 \
  --seq_lens=$LENS --out_dir="$OUT/flash_bfloat16" > "$OUT/flash_bfloat16.log" 2>&1
show "$OUT/flash_bfloat16"

# 3. (8b) Each Pallas-era kernel against XLA at 16K, outputs and gradients compared (~2 min):
#    fused Pallas additive (target >= 50% of HBM bandwidth by the formula above), and the chunked
#    causal additive form, XLA and Pallas, against the scan (target >= 3x; the Pallas forward
#    and backward kernels run one program per example).
for dtype in bfloat16 $F32; do
  timeout 100 "${BENCH[@]}" "${DRY[@]}" --variants=additive,additive_pallas --dtype=$dtype \
    --seq_lens=$LONG \
    --check_against_reference --out_dir="$OUT/pallas_$dtype" > "$OUT/pallas_$dtype.log" 2>&1
  show "$OUT/pallas_$dtype"
done
timeout 120 "${BENCH[@]}" --dtype=float32 \
  --variants=causal_additive_recurrent,causal_additive_recurrent_chunked,causal_additive_recurrent_pallas \
  --seq_lens=$LONG --check_against_reference --out_dir="$OUT/chunked" > "$OUT/chunked.log" 2>&1
show "$OUT/chunked"

# 4. (8a) The same in float32 (~2 min): cuDNN's flash kernel takes no float32, so softmax_auto
#    is XLA's dot_product there (the row's kernel column says which ran).
for dtype in $F32; do
  timeout 150 "${BENCH[@]}" --variants=softmax_auto,additive_auto --dtype=$dtype \
    --seq_lens=$LENS --out_dir="$OUT/flash_$dtype" > "$OUT/flash_$dtype.log" 2>&1
  show "$OUT/flash_$dtype"
done

# 5. (issue 54) The new families at 16K in bfloat16, forward and backward (~2 min): linear
#    attention (chunked, recurrent), sliding window (banded XLA, chunked), Performer, against
#    the flash rows of 2.
timeout 180 "${BENCH[@]}" "${DRY[@]}" --dtype=bfloat16 --seq_lens=$LONG \
  --variants=causal_linear_chunked,causal_linear_recurrent,sliding_window,sliding_window_chunked,causal_performer_chunked,linear,performer,local \
  --out_dir="$OUT/families" > "$OUT/families.log" 2>&1
show "$OUT/families"
echo "done in ${SECONDS} s"
