#!/usr/bin/env bash
# Train-step speed before and after the layout restructuring (issue 25), interleaved A/B:
# the same benchmark command (`textattn.benchmark --mode=train_step`, one subprocess per point,
# median of 20 timed steps after 3 warm-up steps) on the old checkout (OLD, a worktree at the
# commit before the restructuring) and on this one, alternating, ROUNDS times per config.
#   git worktree add /tmp/layout_old 50fcafb
#   OLD=/tmp/layout_old bash experiments/layout_ab.sh > experiments/layout_ab.txt
set -euo pipefail
OLD=${OLD:?set OLD to a checkout of the commit before the restructuring}
NEW=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-3}
for config in imdb_keras_example imdb_fastformer; do
  for round in $(seq "$ROUNDS"); do
    for side in old new; do
      dir=$OLD; [ "$side" = new ] && dir=$NEW
      out=$(mktemp -d)
      (cd "$dir" && python -m textattn.benchmark --mode=train_step --config="configs/$config.py" \
         --warmup=3 --repeats=20 --out_dir="$out/r" --overwrite > /dev/null 2>&1)
      python - "$out/r/results.csv" "$config" "$round" "$side" <<'PY'
import csv, sys
row = next(csv.DictReader(open(sys.argv[1])))
print(f"{sys.argv[2]:20s} round {sys.argv[3]} {sys.argv[4]:3s} {row['variant']:16s} "
      f"median {float(row['median_ms']):8.2f} ms  {row['status']}")
PY
      rm -rf "$out"
    done
  done
done
