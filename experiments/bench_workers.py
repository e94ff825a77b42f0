"""textattn.benchmark with the native kernels' workers chosen: own std::threads or XLA's pool.

    python experiments/bench_workers.py own|xla --mode=train_step --config=configs/imdb_keras_example.py

(attention.NATIVE_WORKERS is read when a step is traced, so it is set before the benchmark.)
"""

import sys

from absl import app

from textattn import attention, benchmark

if __name__ == "__main__":
  attention.NATIVE_WORKERS = sys.argv.pop(1)
  app.run(benchmark.main)
