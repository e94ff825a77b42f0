"""Multi-query associative recall (Zoology's MQAR) with causal softmax attention at width 128.

Zoology's model (Arora et al. 2023): two attention-only layers (no feed-forward, one head) of
embed 128 with rotary positions and a tied output layer, trained on fresh examples of 256 tokens
holding 32 key-value pairs (vocabulary 8,192; batches of 64x4, 128x8 and 256x16 in turn before
each, Zoology's mixture), 1,200 steps of 64 sequences (300 of them at 256x32), AdamW 3e-3,
cosine; tested on 1,000 fixed examples per setting, from 64 tokens x 4 pairs to 1,024 tokens x
64 pairs (longer than trained on, and more pairs). docs/mqar.md explains it.

    python -m textattn.main --config=configs/mqar.py --workdir=runs/mqar

Result (seed 0, one run, 20 min wall under `nice -n 10` on a shared 2-core AMD EPYC, 1,078 s
of CPU): test accuracy 0.9994 at 256x32, the training setting (32,000 answers; validation
0.9791 at step 300, 0.9995 at 1,200); 0.9998 / 1.0000 / 0.9998 at 64x4 / 128x8 / 256x16,
0.9818 at 256x64 (twice the pairs), 0.9552 at 512x32, 0.9243 at 512x64 and 0.7656 at 1024x64
(longer than trained on); test/accuracy (their mean) 0.9532.
"""

from textattn import defaults


def get_config():
  config = defaults.for_task("mqar")  # the task's defaults are this recipe
  return config
