"""Long Range Arena "Text" with causal (look-ahead masked) softmax attention, last-token pooling.

configs/lra_text_softmax.py with a causal mask: each byte sees only earlier bytes, so the
classifier reads the last real position. GPU-sized: on a CPU, smoke runs only.

    python -m textattn.main --config=configs/lra_text_causal.py --workdir=runs/lra_text_causal

Result: not measured yet (no GPU was lent since it was written). LRA's published Transformer:
64.27% test.
"""

from textattn import defaults


def get_config():
  config = defaults.sibling(__file__, "lra_text_softmax.py")
  config.model.attention = "causal"
  config.model.pooling = "last"
  return config
