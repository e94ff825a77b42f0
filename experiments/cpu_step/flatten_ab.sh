#!/bin/bash
# Issue 56: config.optimizer.flatten (the update as one vector) on the seed model's train step,
# interleaved (both settings once per round and attention, in fresh processes), both cores,
# nothing else running. One line per call:   ROUND ATTENTION FLATTEN examples/s
#     bash experiments/cpu_step/flatten_ab.sh [rounds] > experiments/cpu_step/flatten_ab_<cpu>.txt
# Compare best-of per setting (the step is bimodal per process on CPU-4: README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
for round in $(seq "${1:-3}"); do
  for attention in softmax additive; do
    for flatten in false true; do
      speed=$(python -m textattn.benchmark --mode=train_step --config=configs/imdb_keras_example.py \
        --config.model.attention=$attention --config.optimizer.flatten=$flatten --repeats=60 \
        --warmup=10 --out_dir=/tmp/flatten_ab --overwrite 2>&1 | grep "^train_step" \
        | sed -E 's/.*: ([0-9,.]+) examples.*/\1/' || echo failed)
      echo "$round $attention $flatten $speed"
    done
  done
done
