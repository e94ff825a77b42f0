"""Time the IMDB data path: tokenising + vectorising the 25,000 training reviews, and a full
`load_dataset` cold (empty cache) and warm (cached).

    TFDS_DATA_DIR=../shared/tensorflow_datasets python experiments/data_timing.py
"""

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import default
from textattn import input_pipeline, tokenizer


def main():
  import tensorflow_datasets as tfds
  texts = [t.decode() for batch in tfds.as_numpy(
      tfds.builder("imdb_reviews").as_dataset(split="train", batch_size=4096))
           for t in batch["text"]]
  wall, cpu = time.perf_counter(), time.process_time()
  standardized = [tokenizer.standardize(text) for text in texts]
  word = tokenizer.WordTokenizer.train(standardized, 20000, standardized=True)
  ids = word.encode(standardized, 200, "pre", standardized=True)
  print(f"tokenize+vectorize {len(texts)} train reviews: {time.perf_counter() - wall:.2f} s wall, "
        f"{time.process_time() - cpu:.2f} s CPU, ids {ids.shape}")
  config = default.get_config()
  config.cache_dir = tempfile.mkdtemp()
  for label in ("cold (empty cache)", "warm (cached)"):
    start = time.perf_counter()
    data = input_pipeline.load_dataset(config, None)
    print(f"load_dataset {label}: {time.perf_counter() - start:.2f} s "
          f"(train/val/test {len(data.train)}/{len(data.validation)}/{len(data.test)})")


if __name__ == "__main__":
  main()
