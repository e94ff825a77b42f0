#!/usr/bin/env bash
# Six-seed validation-only sweep of the word2vec start of the token table (and of the 2-epoch
# recipe) on a lent GPU (experiments/RESULTS.md, section 7). Never sees test.
#
# Here, first (gitignored; .gpu/ is listed in .git/info/exclude); the configs now ask for the
# word2vec start, so the export carries the table:
#   TFDS_DATA_DIR=../shared/tensorflow_datasets python -m textattn.sweep export \
#     --config=configs/imdb_fastformer.py --out=.gpu/imdb_800_w2v.npz
# Device tool: carry [".whl", ".gpu"], command "bash experiments/gpu/w2v_sweep.sh".
# With 36 processes on the card some runs ran out of GPU memory (their jsonl lines say so); they
# were re-run with the same sweep command, fewer --seeds and --jobs.
source experiments/gpu/setup.sh
S="-m textattn.sweep"   # python3 $S ... (was experiments/val_sweep.py)
D=.gpu/imdb_800_w2v.npz
# Every variant names the fields it is about, so this means what it meant when it ran (then the
# configs had the random start, 3 epochs and word dropout 0.2: "base" here).
R="model.embedding_init=random,word2vec.unlabeled_split="
W="model.embedding_init=word2vec,word2vec.unlabeled_split=unsupervised"
E2="num_epochs=2,model.token_dropout_rate=0.0"
E3="num_epochs=3,model.token_dropout_rate=0.2"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
wired $S sweep --data=$D --config=configs/imdb_fastformer.py --seeds=0,1,2,3,4,5 --jobs=24 \
  --variant="base:$R,$E3" --variant="w2v:$W,$E3" --variant="ep2:$R,$E2" \
  --variant="w2v_ep2:$W,$E2" \
  --out="$OUT/ff_w2v.jsonl" > "$OUT/ff_w2v.log" 2>&1 &
wired $S sweep --data=$D --config=configs/imdb_softmax.py --seeds=0,1,2,3,4,5 --jobs=12 \
  --variant="base:$R" --variant="w2v:$W" --out="$OUT/sm_w2v.jsonl" > "$OUT/sm_w2v.log" 2>&1 &
wait
grep -h -A6 "^variant" "$OUT"/*_w2v.log; grep -h '"error"' "$OUT"/*.jsonl | cut -c1-600 | head -3
