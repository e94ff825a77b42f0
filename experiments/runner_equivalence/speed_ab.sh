#!/usr/bin/env bash
# Issue 41's speed check: the whole training loop before and after the runner restructuring,
# interleaved (old, new, old, new, ...), ROUNDS rounds: imdb_keras_example.py for 300 steps,
# train/examples_per_sec of its log windows after the first (which holds the compilation).
#   git worktree add /tmp/old 4f22bde
#   OLD=/tmp/old bash experiments/runner_equivalence/speed_ab.sh > experiments/runner_equivalence/speed_ab.txt
set -euo pipefail
OLD=${OLD:?set OLD to a checkout of the commit before the restructuring}
NEW=$(cd "$(dirname "$0")/../.." && pwd)
ROUNDS=${ROUNDS:-3}
export TFDS_DATA_DIR="${TFDS_DATA_DIR:-$NEW/../shared/tensorflow_datasets}"
for round in $(seq "$ROUNDS"); do
  for side in old new; do
    dir=$OLD; [ "$side" = new ] && dir=$NEW
    out=$(mktemp -d)
    (cd "$dir" && python -m textattn.main --config="$dir/configs/imdb_keras_example.py" \
       --workdir="$out/w" --config.num_train_steps=300 --config.log_every_steps=50 > /dev/null 2>&1)
    python - "$out/w/metrics.jsonl" "$round" "$side" <<'PY'
import json, statistics, sys
rates = [r["train/examples_per_sec"] for r in map(json.loads, open(sys.argv[1]))
         if "train/examples_per_sec" in r][1:]
print(f"round {sys.argv[2]} {sys.argv[3]:3s} median {statistics.median(rates):8.1f} examples/s "
      f"over {len(rates)} windows")
PY
    rm -rf "$out"
  done
done
