#!/usr/bin/env bash
# The word2vec start's pre-registered paired test (experiments/RESULTS.md, section 14; rule
# written 2026-11-25 01:55 before any run): the shipped configs/imdb_fastformer.py ("base",
# bigrams kept by section 5) against the same with a random token table ("random"), seeds 30-49
# a side, validation only, paired by seed. Keep word2vec if base beats random by >= 0.002 mean
# best validation; otherwise drop it from the config and re-state its result over 5 test seeds.
# No summary before all 40 lines are in (CPU lines, if any, go to
# experiments/sweeps/fastformer_w2v_decision_cpu.jsonl; pass only the missing --seeds here).
#
# Here, first (gitignored): the config's train + validation arrays with its word2vec table:
#   TFDS_DATA_DIR=../shared/tensorflow_datasets python -m textattn.sweep export \
#     --config=configs/imdb_fastformer.py --out=.gpu/imdb_800_w2v.npz
# Device tool: carry [".whl", ".gpu"], command "bash experiments/gpu/w2v_decision.sh".
# Then: python -m textattn.sweep summarize FILES --paired=random,base --seeds=30-49
# Decided 2026-11-26 on CPU (all 40 lines in the _cpu.jsonl): +0.00948, word2vec stays.
source experiments/gpu/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
wired -m textattn.sweep sweep --data=${DATA:-.gpu/imdb_800_w2v.npz} \
  --config=configs/imdb_fastformer.py --seeds=${SEEDS:-$(seq -s, 30 49)} --jobs=${JOBS:-20} \
  --variant="base" --variant="random:model.embedding_init=random" \
  --out="$OUT/fastformer_w2v_decision.jsonl" > "$OUT/fastformer_w2v_decision.log" 2>&1
grep -h -A4 "^variant" "$OUT/fastformer_w2v_decision.log"
grep -h '"error"' "$OUT"/*.jsonl | cut -c1-600 | head -3
