"""Pretrained encoders from Hugging Face files, with any registered attention variant (the
encoder itself, in Flax, is textattn/models/bert.py).

hf.py: a model directory (config.json,
model.safetensors, tokenizer.json) or hf:ORG/NAME -> its config, converted weights, tokenizer,
and which of a model's parameters they fill; tokenizer.py: the model's own tokenizer behind
textattn's tokenizer interface; finetune.py: layer-wise learning-rate decay.
"""
