"""Long Range Arena "Text" with Fastformer additive attention (linear in length).

configs/lra_text_softmax.py with additive attention in place of softmax attention; same model
size, data and training. GPU-sized: on a CPU, smoke runs only.

    python -m textattn.main --config=configs/lra_text_additive.py --workdir=runs/lra_text_additive

Result: not measured yet (no GPU was lent since it was written). LRA's published Transformer:
64.27% test; its best efficient attention about 65.9%.
"""

from textattn import defaults


def get_config():
  config = defaults.sibling(__file__, "lra_text_softmax.py")
  config.model.attention = "additive"
  return config
