#!/usr/bin/env bash
# Issue 85 (after issue 42's set, RESULTS section 28): the GPU kernels on one lent GPU, within 8
# minutes on one H200, most important first. Each part runs under its own time limit and the
# whole under BUDGET_S (470 s), so a slow part costs only itself and the last parts are the ones
# cut (the log says which):
#   here first:  bash experiments/gpu/prepare_peer.sh   (the peer row's wheel into .peer/)
#   device tool: carry [".whl", ".peer"], command "bash experiments/gpu/accelerators.sh",
#                timeout_s 540
# (.whl/ as experiments/gpu/check.sh describes). Results land in $OUT: copy them into
# experiments/gpu/ and write the RESULTS section with this command and the card's name (H100
# and H200 differ in bandwidth: 3.35 vs 4.8 TB/s).
# Rehearsal on a CPU (tests/test_gpu_scripts.py runs it, in CI): REHEARSE=1 bash
# experiments/gpu/accelerators.sh: every part at toy sizes (Pallas in interpret mode), the test
# step only collected, the layer benchmark planned (--dry_run), the lowering at full size.
#
#   0. lowering: every autotune configuration of every GPU kernel exported for CUDA at
#      [4, 16384, 4, 64] (a kernel that cannot lower stops the script in seconds);
#   1. numerics: each Pallas kernel compiled (not interpreted) against float64 on the device,
#      values and gradients, and cuDNN flash attention; float32 products at highest precision
#      (JAX_DEFAULT_MATMUL_PRECISION: not TF32), the kernels' own dots are HIGHEST anyway;
#   2. bandwidth: the additive core alone, XLA vs Pallas, bfloat16, batch 16 and 4, 16K and 4K,
#      bytes by formula against the device's bandwidth, Pallas rows with command buffers on and
#      off (experiments/gpu/kernels.py says how);
#   3. tune: each kernel's autotune configurations (at most four) at 16K, 30 s compile cap each,
#      shared-memory estimate beside the outcome, error against XLA;
#   4. peer: jax-linear-attention's Mosaic GPU GLA and Gated DeltaNet at the same shape;
#   5. layers: one attention layer forward and backward in bfloat16 at 4K and 16K (projections
#      included): cuDNN flash, additive XLA, additive Pallas.
source experiments/gpu/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
[ "$REHEARSE" = 1 ] || "$PYTHON" -c "import jax; print('jax', jax.__version__, jax.devices())"
if [ "$REHEARSE" = 1 ]; then  # (limits x4: a shared CPU is slow, and a rehearsal must not cut)
  RH=(--rehearse); LENS=16,32; SIZES=(--batch_size=2 --embed_dim=16 --num_heads=2); DRY=(--dry_run)
  SCALE=4; BUDGET_S=${BUDGET_S:-1880}
else
  RH=(); LENS=4096,16384; SIZES=(--batch_size=4 --embed_dim=256 --num_heads=4); DRY=()
  SCALE=1; BUDGET_S=${BUDGET_S:-470}
fi

# part NAME LIMIT_S COMMAND...: COMMAND under the smaller of LIMIT_S and what is left of the
# budget (skipped under 20 s), its output in $OUT/NAME.log and its last lines here. A `wired`
# command (setup.sh) takes the limit as its --timeout.
part() {
  local name=$1 limit=$(($2 * SCALE)) rc; shift 2
  local left=$((BUDGET_S - SECONDS))
  if [ $left -lt 20 ]; then echo "== $name: skipped, ${left} s of the budget left"; return 0; fi
  [ "$limit" -gt $left ] && limit=$left
  echo "== $name (limit ${limit} s, at ${SECONDS} s)"
  if [ "$1" = wired ]; then shift; wired --timeout=$limit "$@" > "$OUT/$name.log" 2>&1
  else timeout -k 5 $limit "$@" > "$OUT/$name.log" 2>&1; fi
  rc=$?
  grep -v "^W0000\|^I0000" "$OUT/$name.log" | tail -${TAIL:-30} | cut -c1-240
  [ $rc = 124 ] && echo "   ($name cut at its ${limit} s limit)"
  return $rc
}

part lowering 60 "$PYTHON" -m textattn.attention.lowering --configs --shape=4,16384,4,64 \
  --dtypes=bfloat16 || { echo "a kernel does not lower: stopping before the GPU runs"; exit 1; }

JAX_DEFAULT_MATMUL_PRECISION=highest part numerics 110 wired -m pytest -q -p no:cacheprovider \
  -rs tests/test_additive_pallas.py tests/test_causal_additive.py tests/test_attention.py \
  -k "cudnn or pallas"

part bandwidth 150 "$PYTHON" experiments/gpu/kernels.py bandwidth "$OUT/kernels" "${RH[@]}"

part tune 160 "$PYTHON" experiments/gpu/kernels.py tune "$OUT/kernels" "${RH[@]}"

# The peer in a site folder of its own (never textattn's dependency), from .peer/'s wheel.
if ls .peer/*.whl > /dev/null 2>&1; then
  "$PYTHON" -m pip install -q --no-index --no-deps --ignore-requires-python --upgrade \
    --target "$OUT/peer_site" .peer/*.whl 2>&1 | grep -v "^WARNING" | tail -2
  PYTHONPATH="$OUT/peer_site" part peer 70 "$PYTHON" experiments/gpu/peer.py "$OUT/peer" "${RH[@]}"
else
  echo "== peer: skipped, no wheel in .peer/ (bash experiments/gpu/prepare_peer.sh, carry .peer)"
fi

part layers 90 "$PYTHON" -m textattn.benchmark --overwrite --mode=attention+backward \
  --lengths=full --warmup=2 --repeats=10 --point_timeout_s=60 "${SIZES[@]}" "${DRY[@]}" \
  --variants=softmax_auto,additive,additive_pallas --dtype=bfloat16 --seq_lens=$LENS \
  --out_dir="$OUT/layers"
echo "done in ${SECONDS} s (budget ${BUDGET_S} s)"
