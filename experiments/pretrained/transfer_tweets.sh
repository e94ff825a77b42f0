#!/usr/bin/env bash
# Issue 55's study on the disaster tweets: all-MiniLM-L6-v2 with its softmax attention swapped
# for another variant, fine-tuned (a) naively, (b) naively for as many extra steps as the
# transfer stage takes (the compute-matched control) and (c) after the attention transfer stage
# (textattn/recipes/attention_transfer.py), each paired by seed with the softmax original.
# Tweets as in experiments/own_data/tweets.sh: 64 tokens, one epoch (190 steps), warm-up 19.
#   MINILM=DIR/all-MiniLM-L6-v2 ROWS="additive linear_hedgehog" SEEDS="0 1 2" \
#     bash experiments/pretrained/transfer_tweets.sh runs/transfer_tweets
#   python experiments/summarize_runs.py runs/transfer_tweets
# Rows (ROWS, default all, in this order; ROWS="" none): softmax, then per variant its transfer, naive and
# control runs (KINDS, default "transfer naive control": which of the three; "lora" adds the transfer
# fine-tuned through rank-8 LoRA factors instead, at LORA_LR, default 5e-4); each row for every
# seed before the next row. Then (EXTRA, default all; "" none) the
# transfer from the task-fine-tuned teacher (the softmax run of the same seed:
# attention_transfer.teacher) and, for the Hedgehog map (when EXTRA has it), with its weights loss too. Resumable (finished runs are
# skipped), and several copies may share one output directory (e.g. one per core, under
# `taskset -c N`): a run in progress is locked (flock) and the other copies pass it by.
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
# The stage's settings per variant, chosen on the relative error a held-out batch of tweets
# reached after 150 stage steps (RESULTS §31): additive attention needs its queries and keys to
# move too.
declare -A stage=(
  [additive]="--config.attention_transfer.train=new+out+qk"
)
# shellcheck source=experiments/pretrained/runs.sh
source "$(dirname "$0")/runs.sh"  # run NAME SEED ARGS...
mkdir -p "$out"
seeds=${SEEDS:-0 1 2}
for seed in $seeds; do run softmax "$seed"; done
kinds=" ${KINDS:-transfer naive control} "
for row in ${ROWS-additive linear_hedgehog hybrid linear_elu1 linear_t2r}; do
  # shellcheck disable=SC2086
  for seed in $seeds; do
    [[ $kinds == *" transfer "* ]] || break
    run "${row}_transfer" "$seed" ${variant[$row]} --config.attention_transfer.num_steps="$steps" \
      ${stage[$row]:-}
  done
  # shellcheck disable=SC2086
  for seed in $seeds; do
    [[ $kinds == *" naive "* ]] || break
    run "${row}_naive" "$seed" ${variant[$row]}
  done
  # LoRA (textattn/lora.py): the same stage, then rank-8 factors on the attention projections,
  # the new attention parameters and the head in full, the rest frozen.
  # shellcheck disable=SC2086
  for seed in $seeds; do
    [[ $kinds == *" lora "* ]] || break
    run "${row}_transfer_lora${LORA_LR:+_$LORA_LR}" "$seed" ${variant[$row]} --config.attention_transfer.num_steps="$steps" \
      ${stage[$row]:-} --config.optimizer.lora.rank=8 --config.optimizer.learning_rate="${LORA_LR:-5e-4}"
  done
  # The control: the stage's steps added to the fine-tuning (190 + steps), same schedule shape.
  # shellcheck disable=SC2086
  for seed in $seeds; do
    [[ $kinds == *" control "* ]] || break
    run "${row}_control" "$seed" ${variant[$row]} --config.num_train_steps=$((190 + steps))
  done
done
for row in ${EXTRA-additive linear_hedgehog}; do
  # shellcheck disable=SC2086
  for seed in $seeds; do
    finished "$out/softmax_s$seed" || continue  # (the teacher: that seed's finished softmax run)
    run "${row}_transfer_ft" "$seed" ${variant[$row]} --config.attention_transfer.num_steps="$steps" \
      ${stage[$row]:-} --config.attention_transfer.teacher="$out/softmax_s$seed"
  done
done
# The Hedgehog map with its weights loss too: one of EXTRA's rows (it runs when EXTRA has linear_hedgehog).
extra=" ${EXTRA-additive linear_hedgehog} "
# shellcheck disable=SC2086
for seed in $seeds; do
  [[ $extra == *" linear_hedgehog "* ]] || break
  run linear_hedgehog_transfer_ce "$seed" ${variant[linear_hedgehog]} \
    --config.attention_transfer.num_steps="$steps" --config.attention_transfer.weights_loss=1.0
done
