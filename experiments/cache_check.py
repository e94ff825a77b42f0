"""Loads the IMDB configs' encoded data (and word vectors where a config starts from them),
printing the time each took: a cache check (e.g. after copying the TFDS dir elsewhere).

    TFDS_DATA_DIR=../shared/tensorflow_datasets python experiments/cache_check.py
    cp -r ../shared/tensorflow_datasets /tmp/tfds_copy
    python experiments/cache_check.py --data_dir=/tmp/tfds_copy   # expected: all from cache
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import logging

from configs import imdb_fastformer, imdb_keras_example, imdb_softmax
from textattn import input_pipeline, word_vectors


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data_dir", default="", help="TFDS data dir (default: TFDS_DATA_DIR)")
  args = parser.parse_args()
  logging.set_verbosity(logging.INFO)
  for module in (imdb_softmax, imdb_fastformer, imdb_keras_example):
    config = module.get_config()
    if args.data_dir:
      config.data_dir = args.data_dir
    name = module.__name__.split(".")[-1]
    start = time.time()
    data = input_pipeline.load_dataset(config, None)
    print(f"{name}: tokens {time.time() - start:.1f} s, train {data.train.inputs.shape}",
          flush=True)
    if config.model.embedding_init == "word2vec":
      start = time.time()
      word_vectors.pretrained_token_table(config, data.tokenizer, data.vocab_size)
      print(f"{name}: word vectors {time.time() - start:.1f} s", flush=True)


if __name__ == "__main__":
  main()
