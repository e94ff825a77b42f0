#!/usr/bin/env bash
# CPU smoke run of the three LRA text configs (issue 28): the configs as shipped (4,000 bytes,
# 4 layers, bfloat16) for 2 steps of 2 on the committed 36-row tweets fixture (the real task is
# GPU-sized), to show each config builds, trains, evaluates and reports end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
for variant in softmax causal additive; do
  start=$(date +%s)
  python -m textattn.main --config=configs/lra_text_$variant.py --workdir="$(mktemp -d)/run" \
    --config.dataset=tests/fixtures/disaster_tweets.csv --config.source.label_field=target \
    --config.num_train_steps=2 --config.batch_size=2 --config.platform.eval_batch_size=2 \
    --config.eval_every_steps=2 --config.checkpoint_every_steps=2 2>&1 | grep "Test report" \
    | sed "s/^/lra_text_$variant: /"
  echo "lra_text_$variant: $(( $(date +%s) - start )) s wall"
done
