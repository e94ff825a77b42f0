"""Multi-query associative recall (Zoology's MQAR) with causal softmax attention at width 128.

Zoology's model (Arora et al. 2023): two attention-only layers (no feed-forward, one head) of
embed 128 with rotary positions, trained on fresh examples of 256 tokens holding 32 key-value
pairs (vocabulary 8,192), tested on 1,000 fixed examples per setting, from 64 tokens x 4 pairs
to 1,024 tokens x 64 pairs (longer than trained on, and more pairs). docs/mqar.md explains it.

    python -m textattn.main --config=configs/mqar.py --workdir=runs/mqar

Result: not measured yet.
"""

from textattn import defaults


def get_config():
  config = defaults.for_task("mqar")  # the task's defaults are this recipe
  return config
