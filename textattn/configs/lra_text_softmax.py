"""Long Range Arena "Text" (Tay et al. 2021): byte-level IMDB, 4,000 bytes, softmax attention.

The LRA text task's setting: IMDB reviews as bytes (no vocabulary), the first 4,000 of each
(truncation "post"), an LRA-sized encoder (4 layers, embed 256, 4 heads, FFN 1,024) trained for
20,000 steps of 32, in bfloat16 with cuDNN flash attention on a GPU (that path has not run
yet: unverified). Validation carved from train (LRA reported test accuracy only). GPU-sized:
on a CPU, smoke runs only.

    python -m textattn.main --config=configs/lra_text_softmax.py --workdir=runs/lra_text_softmax

Result: not measured yet (no GPU was lent since it was written). LRA's published Transformer:
64.27% test; its best efficient attention about 65.9%.
"""

from textattn import defaults


def get_config():
  config = defaults.classification("layout", "platform")
  config.tokenizer = "byte"
  config.max_len = 4000
  config.layout.truncation = "post"  # the first 4,000 bytes, as LRA
  config.platform.eval_batch_size = 64
  config.num_train_steps = 20000
  config.eval_every_steps = 1000
  config.checkpoint_every_steps = 1000
  config.model.embed_dim = 256
  config.model.num_heads = 4
  config.model.num_layers = 4
  config.model.ffn_dim = 1024
  config.model.mlp_dim = 256
  config.model.norm = "pre"
  config.model.dtype = "bfloat16"
  config.optimizer.name = "adamw"
  config.optimizer.learning_rate = 5e-4
  config.optimizer.weight_decay = 0.1
  config.optimizer.schedule = "cosine"
  config.optimizer.warmup_steps = 1000
  config.optimizer.grad_clip_norm = 1.0
  return config
