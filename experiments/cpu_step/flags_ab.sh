#!/bin/bash
# Issue 56: XLA:CPU options on the seed model's train step, interleaved (every option once per
# round, rounds alternate), both cores, nothing else running. Prints one line per call:
#   ROUND ATTENTION OPTION examples/s
#     bash experiments/cpu_step/flags_ab.sh [rounds] > experiments/cpu_step/flags_ab_<cpu>.txt
set -euo pipefail
cd "$(dirname "$0")/../.."
base="--xla_cpu_experimental_ynn_fusion_type="   # imdb_keras_example.py's own
options=(
  "base|$base"
  "vector512|$base --xla_cpu_prefer_vector_width=512"
  "onednn_call|$base --xla_cpu_experimental_onednn_custom_call=true"
  "concurrency_sched|$base --xla_cpu_enable_concurrency_optimized_scheduler=true"
  "ynn_default|"
)
for round in $(seq "${1:-3}"); do
  for attention in softmax additive; do
    for entry in "${options[@]}"; do
      name=${entry%%|*}; flags=${entry#*|}
      speed=$(python -m textattn.benchmark --mode=train_step --config=configs/imdb_keras_example.py \
        --config.model.attention=$attention "--config.platform.xla_flags=$flags" --repeats=60 \
        --warmup=10 --out_dir=/tmp/flags_ab --overwrite 2>&1 | grep "^train_step" \
        | sed -E 's/.*: ([0-9,.]+) examples.*/\1/' || echo failed)
      echo "$round $attention $name $speed"
    done
  done
done
