#!/usr/bin/env bash
# Issue 54: the causal attention families as byte-level language models of IMDB reviews
# (configs/imdb_lm_bytes.py: 2 layers, embed 128, 256-byte packed rows, batch 32), compared on
# validation bits per byte through the task registry (python -m textattn.sweep, no export).
# Budget: STEPS steps each (default 300, ~5 min a run on a 2-core CPU), seeds SEEDS.
#   TFDS_DATA_DIR=../shared/tensorflow_datasets bash experiments/language_model/variants.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
STEPS=${STEPS:-300}
SEEDS=${SEEDS:-0,1}
OUT=${OUT:-experiments/language_model/variants_${STEPS}.jsonl}
common="num_train_steps=${STEPS},eval_every_steps=$((STEPS / 2)),checkpoint_every_steps=$((STEPS / 2)),optimizer.warmup_steps=$((STEPS / 10))"
"$PYTHON" -m textattn.sweep sweep --config=configs/imdb_lm_bytes.py --seeds="$SEEDS" --jobs=1 \
  --variant="softmax:model.attention=causal,${common}" \
  --variant="linear:model.attention=causal_linear,${common}" \
  --variant="window:model.attention=sliding_window,${common}" \
  --variant="performer:model.attention=causal_performer,${common}" \
  --out="$OUT"
"$PYTHON" -m textattn.sweep summarize "$OUT" --paired=softmax,linear
"$PYTHON" -m textattn.sweep summarize "$OUT" --paired=softmax,window
"$PYTHON" -m textattn.sweep summarize "$OUT" --paired=softmax,performer
