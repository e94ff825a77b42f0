#!/bin/bash
cd "$(dirname "$0")/../.."
for i in $(seq ${1:-5}); do
  for mode in default hugetlb; do
    env=""; [ $mode = hugetlb ] && env="GLIBC_TUNABLES=glibc.malloc.hugetlb=1"
    speed=$(env $env python -m textattn.benchmark --mode=train_step --config=configs/imdb_keras_example.py --config.model.attention=${ATT:-softmax} --repeats=60 --warmup=10 --out_dir=/tmp/thp --overwrite 2>&1 | grep "^train_step" | sed -E 's/.*: ([0-9,.]+) examples.*/\1/')
    echo "$i $mode $speed $(grep AnonHugePages /proc/meminfo | awk '{print $2}')kB"
  done
done
