"""Checks that IMDB exported as JSONL (experiments/pretrained/stage_gpu.sh) gives exactly the
splits the TFDS path gives: train / validation / test token ids and labels through textattn's own
pipeline (configs/imdb_minilm.py's tokenizer, length and carve), array for array; exit 1 if not.
The GPU runs read the export, the CPU runs TFDS, so their seeds see the same data.

    TFDS_DATA_DIR=... python experiments/pretrained/same_splits.py MODEL_DIR EXPORT_DIR
"""

import sys

import numpy as np

from textattn import data
from textattn.configs import imdb_minilm
from textattn.pretrained import finetune


def config(model: str, **fields):
  c = imdb_minilm.get_config()
  c.model.pretrained = model
  c.update(fields)
  return c


def main(model: str, export: str) -> int:
  from_tfds = config(model)
  tokenizer = finetune.load(from_tfds).tokenizer
  a = data.load_dataset(from_tfds, None, write=False, tokenizer=tokenizer)
  b = data.load_dataset(config(model, dataset=f"{export}/train.jsonl",
                               test_file=f"{export}/test.jsonl"),
                        None, write=False, tokenizer=tokenizer)
  differ = [split for split in ("train", "validation", "test")
            if not (np.array_equal(getattr(a, split).inputs, getattr(b, split).inputs)
                    and np.array_equal(getattr(a, split).labels, getattr(b, split).labels))]
  if differ or a.class_names != b.class_names:
    print(f"the export differs from TFDS in {differ or 'its class names'}", file=sys.stderr)
    return 1
  print(f"the export gives the TFDS splits exactly: {len(a.train.labels):,} / "
        f"{len(a.validation.labels):,} / {len(a.test.labels):,}, classes {a.class_names}")
  return 0


if __name__ == "__main__":
  sys.exit(main(*sys.argv[1:]))
