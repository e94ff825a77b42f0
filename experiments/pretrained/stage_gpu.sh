#!/usr/bin/env bash
# Stages what experiments/gpu/minilm_imdb.sh needs on a lent GPU machine, here, once, into the
# gitignored .gpu/ and .whl/ (see that script's header for the two device calls):
#   TFDS_DATA_DIR=... bash experiments/pretrained/stage_gpu.sh DIR/all-MiniLM-L6-v2
# A device call carries at most 64 MiB, and the weights (87 MiB) and IMDB (18 MiB as xz JSONL)
# do not fit one, so they are split over two folders of ~55 MiB each, one per call:
#   .gpu/minilm_a/  the first 48 MiB of model.safetensors (+ the wheels in .whl/, ~3 MiB)
#   .gpu/minilm_b/  the rest of it, its sha256, the model's small files, IMDB train and test
# IMDB comes from TFDS (imdb_reviews, its own order) as JSONL {"text", "label": "neg"|"pos"}, the
# class names TFDS gives; the GPU run reads it as local files (the machine has no TensorFlow).
set -euo pipefail
model=${1:?give the model directory (all-MiniLM-L6-v2, Hugging Face format)}
[ -f "$model/model.safetensors" ] || { echo "$model has no model.safetensors" >&2; exit 1; }
cd "$(dirname "$0")/../.."
a=.gpu/minilm_a; b=.gpu/minilm_b
rm -rf "$a" "$b"; mkdir -p "$a" "$b/model"
head -c 48M "$model/model.safetensors" > "$a/model.safetensors.part"
tail -c +$((48 * 1024 * 1024 + 1)) "$model/model.safetensors" > "$b/model.safetensors.part"
(cd "$model" && sha256sum model.safetensors) > "$b/model.safetensors.sha256"
for f in "$model"/*; do
  [ -f "$f" ] && [ "$(basename "$f")" != model.safetensors ] && cp "$f" "$b/model/"
done
python - "$b" <<'EOF'
import json, sys
import tensorflow_datasets as tfds
for split in ("train", "test"):
  with open(f"{sys.argv[1]}/{split}.jsonl", "w") as f:
    for example in tfds.as_numpy(tfds.load("imdb_reviews", split=split)):
      f.write(json.dumps({"text": example["text"].decode("utf-8"),
                          "label": ("neg", "pos")[example["label"]]}) + "\n")
EOF
python experiments/pretrained/same_splits.py "$model" "$b"  # (exit 1 if the export differs)
xz -9 -T2 -f "$b/train.jsonl" "$b/test.jsonl"
if ! ls .whl/pinned/flax-*.whl > /dev/null 2>&1; then  # (the wheels experiments/gpu/check.sh names)
  download() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 "$@"; }
  download -d .whl ml-collections==1.1.0 tensorboardX==2.6.5
  download -d .whl/pinned flax==0.12.8 optax==0.2.8 orbax-checkpoint==0.12.8
fi
du -sh "$a" "$b" .whl
