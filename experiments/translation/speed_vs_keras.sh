#!/bin/bash
# Like-for-like training speed of the chapter's English-to-Spanish model (19,960,216 parameters,
# batch 64, 20 tokens) on this CPU, both cores, one job after another: Keras (the chapter's code,
# experiments/translation/keras_chapter.py, with and without XLA; random full-length tokens) and
# textattn's configs/spa_eng_chapter.py through the main command on spa.txt (plain random
# batches, full width), stopped after STEPS steps; its examples/s are the log windows after the
# first (which holds the compilation). Run it a few rounds; compare within a round.
#
#     SPA=path/to/spa.txt bash experiments/translation/speed_vs_keras.sh [rounds]
set -euo pipefail
cd "$(dirname "$0")/../.."
SPA=${SPA:?set SPA to the spa.txt pairs file}
STEPS=${STEPS:-200}
quiet() { grep -v -i "warn\|cpu_feature\|oneDNN\|^I0\|^W0" || true; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for round in $(seq "${1:-1}"); do
  echo "round $round, $(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1 /proc/loadavg)"
  for jit in auto off; do
    echo "keras jit $jit: $(python experiments/translation/keras_chapter.py --jit=$jit --steps=25 \
      --epochs=3 2>&1 | quiet | tail -1)"
  done
  rm -rf "$work/run"
  python -m textattn.main --config=configs/spa_eng_chapter.py --workdir="$work/run" \
    --config.dataset="$SPA" --config.num_train_steps=100000 --config.log_every_steps=50 > "$work/log" 2>&1 &
  pid=$!
  until grep -q "^step $STEPS/" "$work/log" 2>/dev/null; do
    kill -0 $pid 2>/dev/null || { cat "$work/log"; exit 1; }
    sleep 1
  done
  kill -INT $pid; wait $pid || true
  echo "textattn spa_eng_chapter.py (examples/s per 50-step window):" \
    $(grep -o "step [0-9]*/[0-9]*:.*examples/s" "$work/log" | sed "s/.* \([0-9,]*\) examples\/s/\1/")
done
