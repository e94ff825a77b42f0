#!/bin/bash
# Interleaved A/B of two checkouts of textattn on the seed model's train step (issue 56): each
# round runs `python -m textattn.benchmark --mode=train_step --config=configs/imdb_keras_example.py`
# for softmax and additive in checkout A then B (python -m imports the package of the current
# directory). Prints "ROUND ATTENTION A|B examples/s". Quiet machine only.
#   bash experiments/cpu_step/tree_ab.sh DIR_A DIR_B [rounds] > experiments/cpu_step/<name>_ab.txt
set -euo pipefail
a=${1:?checkout A}; b=${2:?checkout B}
for round in $(seq "${3:-4}"); do
  for attention in softmax additive; do
    for side in A B; do
      dir=$a; [ "$side" = B ] && dir=$b
      speed=$(cd "$dir" && python -m textattn.benchmark --mode=train_step \
        --config=configs/imdb_keras_example.py --config.model.attention=$attention --repeats=60 \
        --warmup=10 --out_dir=/tmp/tree_ab --overwrite 2>&1 | grep "^train_step" \
        | sed -E 's/.*: ([0-9,.]+) examples.*/\1/' || echo failed)
      echo "$round $attention $side $speed"
    done
  done
done
