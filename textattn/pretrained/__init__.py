"""Pretrained encoders from Hugging Face files, with any registered attention variant (the
encoder itself, in Flax, is textattn/models/bert.py).

hf.py: a model directory (config.json,
model.safetensors, tokenizer.json) or hf:ORG/NAME -> its config, converted weights, tokenizer,
and which of a model's parameters they fill; finetune.py: a fine-tuning run's model, its start
from the checkpoint and its limits. The model's own tokenizer behind textattn's tokenizer
interface is textattn/data/pretrained_tokenizer.py; layer-wise learning-rate decay, optim.py.
"""
