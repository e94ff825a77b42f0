#!/bin/bash
# Unpinned against the two tf_XLAEigen threads pinned to CPUs 0 and 1 (taskset -p on their TIDs,
# ~4 s into the child's life, after compilation), alternated; benchmark medians.
cd "$(dirname "$0")/../.."
for i in $(seq ${1:-3}); do
  for mode in free pinned; do
    python -m textattn.benchmark --mode=train_step --config=configs/imdb_keras_example.py --config.model.attention=${ATT:-softmax} --repeats=2000 --warmup=10 --out_dir=/tmp/pin --overwrite > /tmp/pin.log 2>&1 &
    bpid=$!
    pid=""; for _ in $(seq 60); do pid=$(pgrep -f "point_spec" | head -1); [ -n "$pid" ] && break; sleep 0.25; done
    sleep 3.5
    if [ $mode = pinned ]; then
      n=0; for t in /proc/$pid/task/*; do
        if [ "$(cat $t/comm 2>/dev/null)" = tf_XLAEigen ]; then taskset -p -c $n $(basename $t) > /dev/null; n=$((n+1)); fi
      done
    fi
    wait $bpid
    echo "$i $mode $(grep '^train_step' /tmp/pin.log | sed -E 's/.*: ([0-9,.]+) examples\/s \(median ([0-9.]+) ms.*/\1 ex\/s median \2 ms/')"
  done
done
