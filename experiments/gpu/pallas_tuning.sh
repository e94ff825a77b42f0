#!/usr/bin/env bash
# The GPU Pallas kernels under other Triton parameters and chunk sizes (experiments/gpu/
# pallas_tuning.py says what and why), after the lowering check:
#   device tool: carry [".whl"], command "bash experiments/gpu/pallas_tuning.sh", timeout_s 300
# Rehearsal on a CPU (tests/test_gpu_scripts.py runs it): REHEARSE=1 bash experiments/gpu/pallas_tuning.sh
source experiments/gpu/setup.sh
"$PYTHON" -m textattn.attention.lowering > "$OUT/lowering.log" 2>&1 \
  || { cat "$OUT/lowering.log"; echo "a kernel does not lower: stopping"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ARGS=(); [ "$REHEARSE" = 1 ] && ARGS=(--rehearse)
timeout -k 5 ${LIMIT:-270} "$PYTHON" experiments/gpu/pallas_tuning.py "${ARGS[@]}" 2>&1 \
  | grep -v "^W0000\|^I0000" | tee "$OUT/pallas_tuning.log"
