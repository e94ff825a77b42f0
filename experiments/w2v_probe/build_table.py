"""One-off probe (2026-11-22 23:25), kept as it ran: word2vec (gensim skip-gram, 2 threads) on the
training split minus validation + IMDB unsupervised, saved as a [vocab, 64] table for train_probe.py.
Usage: TFDS_DATA_DIR=../shared/tensorflow_datasets python experiments/w2v_probe/build_table.py \
  configs/imdb_fastformer.py /tmp/w2v/ff64 64 1
The project's own path is textattn/word2vec.py (one thread, cached)."""
import os
import sys
import time
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "experiments"))

def crc(s):
  return zlib.crc32(s.encode())

def build(config_path, out, dim, epochs=5, sg=1, use_unsup=True, workers=2):
  import val_sweep

  from textattn import data as data_lib
  from textattn.data import tokenizer as tok
  config = val_sweep.load_config(config_path)
  src = data_lib._TfdsSource(config)
  t = time.time()
  raw = src.read(config.val_fraction, config.data_seed)
  import tempfile
  with tempfile.TemporaryDirectory() as wd:
    data = data_lib.load_dataset(config, wd)
    tkz = data_lib.load_tokenizer(wd)[0]
  texts = list(raw.texts["train"])
  if use_unsup:
    import tensorflow_datasets as tfds
    ds = tfds.load("imdb_reviews", split="unsupervised", batch_size=1024)
    for b in tfds.as_numpy(ds):
      texts.extend(x.decode() for x in b["text"])
  print("read", len(texts), time.time() - t, flush=True)
  sents = [tok.standardize(x).split() for x in texts]
  print("tokenised", sum(map(len, sents)), time.time() - t, flush=True)
  from gensim.models import Word2Vec
  m = Word2Vec(sents, vector_size=dim, window=5, min_count=2, sg=sg, negative=5, workers=workers,
               epochs=epochs, seed=0, hashfxn=crc)
  print("w2v", time.time() - t, flush=True)




  ids = tkz._ids
  table = np.zeros((data.vocab_size, dim), np.float32)
  found = 0
  for w, i in ids.items():
    if w in m.wv:
      table[i] = m.wv[w]; found += 1
  print("found", found, "of", len(ids))
  np.savez(out, table=table, found=np.array([i for w, i in ids.items() if w in m.wv]))

if __name__ == "__main__":
  build(sys.argv[1], sys.argv[2], int(sys.argv[3]), sg=int(sys.argv[4]) if len(sys.argv) > 4 else 1)
