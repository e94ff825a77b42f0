#!/bin/bash
# Issue 56: XLA:CPU options on the seed model's train step, interleaved (every option once per
# round, rounds alternate), both cores, nothing else running. Prints one line per call:
#   ROUND ATTENTION OPTION examples/s
#     bash experiments/cpu_step/flags_ab.sh [rounds] > experiments/cpu_step/flags_ab_<cpu>.txt
#     OPTIONS="base fast_runtime xnn_graph_greedy" bash experiments/cpu_step/flags_ab.sh 3
set -euo pipefail
cd "$(dirname "$0")/../.."
base="--xla_cpu_experimental_ynn_fusion_type="   # imdb_keras_example.py's own
# OPTIONS: a space-separated subset of the names below (default: the first set, run 08:24).
declare -A flags_of=(
  [base]="$base"
  [vector512]="$base --xla_cpu_prefer_vector_width=512"
  [onednn_call]="$base --xla_cpu_experimental_onednn_custom_call=true"
  [concurrency_sched]="$base --xla_cpu_enable_concurrency_optimized_scheduler=true"
  [ynn_default]=""
  [fast_runtime]="$base --xla_cpu_opt_preset=CPU_OPT_PRESET_FAST_RUNTIME"
  [xnn_graph_greedy]="$base --xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY"
)
options=()
for name in ${OPTIONS:-base vector512 onednn_call concurrency_sched ynn_default}; do
  options+=("$name|${flags_of[$name]}")
done
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
