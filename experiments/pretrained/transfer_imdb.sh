#!/usr/bin/env bash
# Issue 55 on IMDB at a CPU budget: all-MiniLM-L6-v2 at 128 tokens (the end of each review), a
# fixed STEPS of fine-tuning (default 400, warm-up 10%) for every row, paired by seed with its
# softmax run: softmax; additive after the attention transfer stage (queries and keys train
# too, as on the tweets); a linear row after transfer (ROW_LINEAR, default Hedgehog's map); and
# additive naively swapped (today's 10-point loss, at this budget). The stage's steps come on
# top (TRANSFER_STEPS, default 200). Resumable; copies may share the directory (runs.sh).
#   MINILM=DIR/all-MiniLM-L6-v2 TFDS_DATA_DIR=... SEEDS="0 1 2" [BASE_LR=1.5e-4] \
#     bash experiments/pretrained/transfer_imdb.sh runs/transfer_imdb
#   python experiments/summarize_runs.py runs/transfer_imdb --paired=softmax
set -euo pipefail
out=${1:?give an output directory}
steps=${STEPS:-400}
stage=${TRANSFER_STEPS:-200}
common=(--config=imdb_minilm --config.model.pretrained="${MINILM:?set MINILM to the model directory}"
        --config.max_len=128 --config.num_train_steps="$steps"
        --config.optimizer.warmup_steps=$((steps / 10)) --config.evals_per_epoch=4)
# BASE_LR: every row's fine-tuning rate (default imdb_minilm's 5e-5); 1.5e-4 is softmax's better
# rate (softmax_lr, 2026-11-29), so a study at it pairs each row with the stronger reference.
if [[ -n "${BASE_LR:-}" ]]; then common+=(--config.optimizer.learning_rate="$BASE_LR"); fi
linear=${ROW_LINEAR:---config.model.attention=linear --config.model.linear.feature_map=hedgehog}
# shellcheck source=experiments/pretrained/runs.sh
source "$(dirname "$0")/runs.sh"  # run NAME SEED ARGS...
mkdir -p "$out"
seeds=${SEEDS:-0 1 2}
# Seed-major, so that copies sharing the directory finish whole pairs first. ROWS (default the
# first four) picks rows: softmax, linear_transfer, additive_transfer, additive_naive, and the
# transfer rows from the task-fine-tuned teacher (linear_transfer_ft, additive_transfer_ft: the
# teacher and the student's start are that seed's finished softmax run, as in Hedgehog's GLUE study),
# their compute control softmax_again (that finished run fine-tuned STEPS more: a softmax student
# of a 1-step stage that trains nothing, train=new, so it starts from exactly the run's weights),
# additive_transfer_ft_long (its stage 3 x TRANSFER_STEPS; diverged at a constant rate, RESULTS §31)
# and additive_transfer_ft_cosine (the same, the stage's rate cosine-decayed to 0);
# additive_transfer_ft_distill (additive_transfer_ft whose fine-tuning also distils the teacher's
# predictions: attention_transfer.distill=DISTILL, default 0.5, at TEMPERATURE, default 2); and
# window_additive_transfer_ft (the window (+-WINDOW, default 16) + additive-slot hybrid, from the
# fine-tuned teacher); slot_additive_transfer_ft (the same at window 0: the token and the slot).
rows=${ROWS:-softmax linear_transfer additive_transfer additive_naive}
additive=(--config.model.attention=additive --config.attention_transfer.train=new+out+qk)
has() { [[ " $rows " == *" $1 "* ]]; }
for seed in $seeds; do
  has softmax && run softmax "$seed"
  # softmax at the additive pilot's rate (is the reference itself better there?)
  has softmax_lr && run softmax_lr "$seed" --config.optimizer.learning_rate="${LR:-1.5e-4}"
  # shellcheck disable=SC2086
  has linear_transfer && run linear_transfer "$seed" $linear \
    --config.attention_transfer.num_steps="$stage"
  has additive_transfer && run additive_transfer "$seed" "${additive[@]}" \
    --config.attention_transfer.num_steps="$stage"
  teacher=(--config.attention_transfer.num_steps="$stage" \
           --config.attention_transfer.teacher="$out/softmax_s$seed")
  if [[ " $rows " =~ _ft|softmax_again ]]; then
    finished "$out/softmax_s$seed" || continue  # (the teacher: that seed's finished softmax run)
  fi
  # shellcheck disable=SC2086
  has linear_transfer_ft && run linear_transfer_ft "$seed" $linear "${teacher[@]}"
  has additive_transfer_ft && run additive_transfer_ft "$seed" "${additive[@]}" "${teacher[@]}"
  has softmax_again && run softmax_again "$seed" --config.attention_transfer.num_steps=1 \
    --config.attention_transfer.train=new --config.attention_transfer.teacher="$out/softmax_s$seed"
  has additive_transfer_ft_long && run additive_transfer_ft_long "$seed" "${additive[@]}" \
    "${teacher[@]}" --config.attention_transfer.num_steps=$((3 * stage))
  has additive_transfer_ft_cosine && run additive_transfer_ft_cosine "$seed" "${additive[@]}" \
    "${teacher[@]}" --config.attention_transfer.num_steps=$((3 * stage)) \
    --config.attention_transfer.schedule=cosine
  has additive_transfer_ft_distill && run additive_transfer_ft_distill "$seed" "${additive[@]}" \
    "${teacher[@]}" --config.attention_transfer.distill="${DISTILL:-0.5}" \
    --config.attention_transfer.distill_temperature="${TEMPERATURE:-2}"
  # Pilots of two levers for pure additive (one seed each, 2026-11-29): a higher fine-tuning rate
  # (LR, default 1.5e-4: 3x imdb_minilm's 5e-5) at the same steps, and twice the fine-tuning steps.
  has additive_transfer_ft_lr && run additive_transfer_ft_lr "$seed" "${additive[@]}" \
    "${teacher[@]}" --config.optimizer.learning_rate="${LR:-1.5e-4}"
  # 5x the rate (LR5, default 2.5e-4), 2026-11-29: does the 3x row's gain go on?
  has additive_transfer_ft_lr5 && run additive_transfer_ft_lr5 "$seed" "${additive[@]}" \
    "${teacher[@]}" --config.optimizer.learning_rate="${LR5:-2.5e-4}"
  # The stage training whole blocks to match their outputs (train=block, Adam BLOCK_LR, default
  # 3e-3: transfer_probe_block.txt), then the 5x row's fine-tuning, 2026-11-29.
  has additive_transfer_ft_block && run additive_transfer_ft_block "$seed" \
    --config.model.attention=additive "${teacher[@]}" --config.attention_transfer.train=block \
    --config.attention_transfer.learning_rate="${BLOCK_LR:-3e-3}" \
    --config.optimizer.learning_rate="${LR5:-2.5e-4}"
  # Fastformer as its paper writes it (additive_value: u = g_k * v, so the checkpoint's value
  # weights are kept), with and without its "+ q" residual, the 5x row's settings, 2026-11-29.
  has additive_value_transfer_ft_lr5 && run additive_value_transfer_ft_lr5 "$seed" \
    "${additive[@]}" --config.model.attention=additive_value "${teacher[@]}" \
    --config.optimizer.learning_rate="${LR5:-2.5e-4}"
  has additive_value_nores_transfer_ft_lr5 && run additive_value_nores_transfer_ft_lr5 "$seed" \
    "${additive[@]}" --config.model.attention=additive_value \
    --config.model.additive_value.query_residual=false "${teacher[@]}" \
    --config.optimizer.learning_rate="${LR5:-2.5e-4}"
  has additive_transfer_ft_steps2 && run additive_transfer_ft_steps2 "$seed" "${additive[@]}" \
    "${teacher[@]}" --config.num_train_steps=$((2 * steps)) \
    --config.optimizer.warmup_steps=$((2 * steps / 10))
  # The 5x row's stage, then fine-tuning through rank-8 LoRA factors on the attention projections
  # (textattn/lora.py; the new attention parameters and the head in full) at LORA_LR (default
  # 5e-4) instead of the whole model, LoLCATs' second stage, 2026-12-01.
  has additive_transfer_ft_lora && run additive_transfer_ft_lora${LORA_LR:+_$LORA_LR} "$seed" \
    "${additive[@]}" "${teacher[@]}" --config.optimizer.lora.rank=8 \
    --config.optimizer.learning_rate="${LORA_LR:-5e-4}"
  has window_additive_transfer_ft && run window_additive_transfer_ft "$seed" \
    --config.model.attention=window_additive --config.model.window.size="${WINDOW:-16}" \
    --config.attention_transfer.train=new+out+qk "${teacher[@]}"
  # The hybrid without its window (2026-12-02): each token attends to itself and the additive
  # slot only, O(length): is it the window or the slot that closes the gap?
  has slot_additive_transfer_ft && run slot_additive_transfer_ft "$seed" \
    --config.model.attention=window_additive --config.model.window.size=0 \
    --config.attention_transfer.train=new+out+qk "${teacher[@]}"
done
if has additive_naive; then
  for seed in $seeds; do run additive_naive "$seed" --config.model.attention=additive; done
fi
