"""Does gensim's word2vec give the same vectors twice? With 1 thread vs 2 threads.

  for w in 1 1 2 2; do python experiments/w2v_probe/threads_check.py $w; done

Each run trains on the same synthetic 60,000-word corpus (several of gensim's 10,000-word jobs
per epoch) and prints a checksum and the first vector; textattn/recipes/word2vec.py uses 1 thread.
"""
import sys

import numpy as np
from gensim.models import Word2Vec

rng = np.random.default_rng(0)
texts = [[f"w{k}" for k in rng.zipf(1.3, 40) % 500] for _ in range(1500)]
workers = int(sys.argv[1])
model = Word2Vec(texts, vector_size=8, window=3, min_count=1, sg=1, negative=3, epochs=2, seed=0,
                 workers=workers)
vectors = np.stack([model.wv[w] for w in sorted(model.wv.key_to_index)])
print(f"workers={workers} sum={vectors.astype(np.float64).sum():.9f} "
      f"first={np.round(vectors[0], 6).tolist()}")
