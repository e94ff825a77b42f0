#!/usr/bin/env bash
# Issue 55's study on the disaster tweets: all-MiniLM-L6-v2 with its softmax attention swapped
# for another variant, fine-tuned (a) naively, (b) naively for as many extra steps as the
# transfer stage takes (the compute-matched control) and (c) after the attention transfer stage
# (textattn/recipes/attention_transfer.py), each paired by seed with the softmax original.
# Tweets as in experiments/own_data/tweets.sh: 64 tokens, one epoch (190 steps), warm-up 19.
#   MINILM=DIR/all-MiniLM-L6-v2 ROWS="additive linear_hedgehog" SEEDS="0 1 2" \
#     bash experiments/pretrained/transfer_tweets.sh runs/transfer_tweets
#   python experiments/summarize_runs.py runs/transfer_tweets
# Rows (ROWS, default all): softmax, and per variant its naive, control and transfer runs.
set -euo pipefail
out=${1:?give an output directory}
here="$(cd "$(dirname "$0")/../.." && pwd)"
data="${TWEETS:-$here/../shared/data/disaster-tweets/train.csv}"
steps=${TRANSFER_STEPS:-200}
common=(--config=imdb_minilm --config.dataset="$data" --config.source.text_fields=text
        --config.source.label_field=target
        --config.model.pretrained="${MINILM:?set MINILM to the model directory}"
        --config.max_len=64 --config.optimizer.warmup_steps=19)
declare -A variant=(
  [additive]="--config.model.attention=additive"
  [linear_elu1]="--config.model.attention=linear"
  [linear_hedgehog]="--config.model.attention=linear --config.model.linear.feature_map=hedgehog"
  [linear_t2r]="--config.model.attention=linear --config.model.linear.feature_map=t2r"
  [hybrid]="--config.model.attention=window_linear --config.model.hybrid.window=16"
)
run() {  # run NAME SEED ARGS...
  local name=$1 seed=$2; shift 2
  [ -f "$out/${name}_s$seed/metrics.jsonl" ] && grep -q test/accuracy "$out/${name}_s$seed/metrics.jsonl" && return
  python -m textattn.main "${common[@]}" --workdir="$out/${name}_s$seed" --config.seed="$seed" \
    "$@" > "$out/${name}_s$seed.log" 2>&1
}
mkdir -p "$out"
for seed in ${SEEDS:-0 1 2}; do
  run softmax "$seed"
  for row in ${ROWS:-additive linear_elu1 linear_hedgehog linear_t2r hybrid}; do
    # shellcheck disable=SC2086
    run "${row}_naive" "$seed" ${variant[$row]}
    # The control: the stage's steps added to the fine-tuning (190 + steps), same schedule shape.
    # shellcheck disable=SC2086
    run "${row}_control" "$seed" ${variant[$row]} --config.num_train_steps=$((190 + steps))
    # shellcheck disable=SC2086
    run "${row}_transfer" "$seed" ${variant[$row]} --config.attention_transfer.num_steps="$steps"
  done
done
