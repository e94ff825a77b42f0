#!/usr/bin/env bash
# The two causal Fastformer decoder forms on accuracy (issue 29): configs/spa_eng_fastformer.py
# with its recurrent decoder (each key scored once with its own position's global query) against
# the direct form (`causal_additive`: every earlier key re-scored with the current global query),
# same data, split, seeds and budget; then their mean +- sd (experiments/translation/summarize.py).
#
#   SPA=spa.txt EPOCHS=1 SEEDS="0 1" RUNS=runs/forms bash experiments/translation/forms.sh
#
# BEAM=0 skips the beam-search test decoding (greedy BLEU/chrF and token accuracy remain).
# EPOCHS shortens the whole schedule (warm-up, cosine decay to zero): a budget comparison, not the
# config's own figure. A run whose workdir has a test report is skipped, so the script resumes.
set -euo pipefail
RUNS=${RUNS:-runs/forms}; EPOCHS=${EPOCHS:-1}; SEEDS=${SEEDS:-"0 1"}; BEAM=${BEAM:-4}
mkdir -p "$RUNS"
for seed in $SEEDS; do
  for form in causal_additive_recurrent causal_additive; do
    name="${form}_s$seed"
    if [ -f "$RUNS/$name/test_translations.jsonl" ]; then continue; fi
    python experiments/translation/run_timed.py --threshold=0.67 --log="$RUNS/$name.log" -- \
      python -m textattn.main --config=configs/spa_eng_fastformer.py --workdir="$RUNS/$name" \
      --config.dataset="$SPA" --config.seed="$seed" --config.num_epochs="$EPOCHS" \
      --config.beam_size="$BEAM" --config.model.decoder_attention="$form" > /dev/null
  done
done
python experiments/translation/summarize.py "$RUNS"
