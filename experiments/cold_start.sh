#!/usr/bin/env bash
# Cold start of the main command (RESULTS section 14, issue 26): empty token, word2vec and
# native-kernel caches; prints the seconds until the train step is compiled (the compile row in
# metrics.jsonl), then stops the run with SIGINT. Extra arguments go to textattn.main, e.g.
#   bash experiments/cold_start.sh --config.embedding.init=random
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
export TFDS_DATA_DIR=${TFDS_DATA_DIR:-../shared/tensorflow_datasets} TEXTATTN_NATIVE_CACHE=$tmp/native \
  TEXTATTN_CACHE=$tmp/caches
start=$(date +%s.%N)
python -m textattn.main --config=configs/imdb_fastformer.py --workdir="$tmp/run" \
  --config.cache_dir="$tmp/cache" "$@" > "$tmp/stdout.log" 2>&1 &
pid=$!
while kill -0 $pid 2>/dev/null; do
  if grep -qs compile_s "$tmp/run/metrics.jsonl"; then
    echo "first step starts (compiled) after $(echo "$(date +%s.%N) - $start" | bc) s"
    kill -INT $pid; break
  fi
  sleep 0.5
done
wait $pid; echo "exit $?"; grep "word2vec: epoch" "$tmp/stdout.log" | tail -1
