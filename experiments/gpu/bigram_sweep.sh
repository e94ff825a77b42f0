#!/usr/bin/env bash
# The decisive validation-only comparison of hashed bigram embeddings for the softmax config,
# 20 fresh seeds (10-29) a side, on a lent GPU. Never sees test. Rule, written (2026-11-23,
# 20:10) before any of these runs: adopt model.bigram_buckets=65536 in configs/imdb_softmax.py
# if the mean best validation of "bigram" beats "base" by >= 0.002 over seeds 10-29 (about two
# standard errors of a 20-seed paired difference; the two CPU looks, seeds 0-4, were null:
# experiments/RESULTS.md, sections 3-4).
#
# Here, first (gitignored): the softmax config's train + validation split, word2vec table included:
#   TFDS_DATA_DIR=../shared/tensorflow_datasets python -m textattn.sweep export \
#     --config=configs/imdb_softmax.py --out=.gpu/imdb_400_w2v.npz
# Device tool: carry [".whl", ".gpu"], command "bash experiments/gpu/bigram_sweep.sh"
# (.whl/ as experiments/gpu/check.sh describes). Smoke-tested on CPU with 30 steps.
# Runs already done on the CPU are in experiments/sweeps/softmax_bigram_cpu.jsonl: pass only
# the missing seeds (--seeds), and decide on all 20 a side, pooled.
# Amended 2026-11-23 22:15, before any GPU line and touching only arithmetic: val_sweep.py now
# runs GPU lines with full float32 products (jax_default_matmul_precision="highest"; JAX's GPU
# default is TF32) and compiles the steps as the trainer does (deterministic ops on a GPU), so
# pooled CPU and GPU lines differ only by rounding order; each line records its backend, jax
# version, precision and compiler options. (No-ops on the CPU: its lines are unchanged.)
# Decided 2026-11-24 on 20 seeds a side, all run on the CPU (no GPU was lent): +0.00248, so
# adopted (experiments/RESULTS.md). Both variants pin bigram_buckets, so this still compares them.
# The same comparison for the Fastformer config (pre-registered 2026-11-24, RESULTS):
#   CONFIG=configs/imdb_fastformer.py DATA=.gpu/imdb_800_w2v.npz SEEDS=... bash this script
# after `python -m textattn.sweep export --config=configs/imdb_fastformer.py --out=.gpu/imdb_800_w2v.npz`.
source experiments/gpu/setup.sh
CONFIG=${CONFIG:-configs/imdb_softmax.py}
NAME=$(basename "$CONFIG" .py)_bigram   # imdb_softmax_bigram.jsonl / imdb_fastformer_bigram.jsonl
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
wired -m textattn.sweep sweep --data=${DATA:-.gpu/imdb_400_w2v.npz} \
  --config=$CONFIG --seeds=${SEEDS:-$(seq -s, 10 29)} --jobs=${JOBS:-20} \
  --variant="base:model.bigram_buckets=0" --variant="bigram:model.bigram_buckets=65536" \
  --out="$OUT/$NAME.jsonl" > "$OUT/$NAME.log" 2>&1
grep -h -A4 "^variant" "$OUT/$NAME.log"; grep -h '"error"' "$OUT"/*.jsonl | cut -c1-600 | head -3
