"""A pretrained encoder's tokenizer (textattn/data/pretrained_tokenizer.py: data reads it back
from a workdir, so it lives beside the other tokenizers)."""

from textattn.data.pretrained_tokenizer import *
from textattn.data.pretrained_tokenizer import PretrainedTokenizer  # noqa: F401
