"""The translation task's config: its fields with their defaults, and their checks."""

from __future__ import annotations

import os

import ml_collections

from textattn import attention, optim
from textattn.attention.sequence import sharded_names
from textattn.checks import check_choice, check_integer
from textattn.data import pairs as pairs_lib
from textattn.data.tfds_source import check_name
from textattn.errors import DataConfigError, UsageError
from textattn.models.layers import accepts_head_dim


def defaults() -> ml_collections.ConfigDict:
  """The translation task's own defaults (the runner adds its fields: run.fields): Deep Learning with Python's
  English-to-Spanish Transformer (ch. 11.5) with standard head sizes and a faster recipe (Adam
  with warm-up and cosine decay, light dropout, length-grouped batches);
  configs/spa_eng_chapter.py restores the chapter's every setting."""
  config = ml_collections.ConfigDict()
  config.task = "translation"  # a registered task (textattn/tasks/)
  # ---- Data (textattn/data/pairs.py) --------------------------------------------------------
  config.dataset = ""  # a pairs file: .txt/.tsv (source<TAB>target), .csv, .jsonl; or "tfds:NAME"
  config.data_dir = ""  # TFDS: its data dir (else $TFDS_DATA_DIR)
  config.source_field = "source"  # .csv/.jsonl/TFDS: the field (feature) names
  config.target_field = "target"
  config.split_by = "pair"  # pair (the chapter's) | source (a source's translations together)
  config.data_seed = 0
  config.tokenizer = "word"  # word (the chapter's) | bpe (HF tokenizers' subwords)
  config.source_vocab = 15000  # vocabularies of the training pairs, ids 0/1 reserved
  config.target_vocab = 15000
  config.shared_vocab = False  # one vocabulary of both sides' text (source_vocab = target_vocab)
  config.source_len = 20  # tokens; targets get target_len + 1 with [start] ... [end]
  config.target_len = 20
  config.length_pool = 20  # batches of similar length from pools of this many (0: plain random)
  # ---- Model (textattn/models/seq2seq.py) --------------------------------------------------------
  config.model = ml_collections.ConfigDict()
  config.model.encoder_attention = "softmax"  # any registered variant
  config.model.decoder_attention = "causal"  # a causal one: causal | causal_additive[_recurrent]
  config.model.embed_dim = 256
  config.model.num_heads = 8
  config.model.head_dim = 0  # 0: embed_dim / num_heads; the chapter's Keras model: 256
  config.model.ffn_dim = 2048
  config.model.encoder_layers = 1
  config.model.decoder_layers = 1
  config.model.dropout_rate = 0.1  # inside the blocks (the chapter: none)
  config.model.output_dropout_rate = 0.1  # before the output layer (the chapter: 0.5)
  config.model.share_embeddings = False  # one token table for both sides (needs shared_vocab)
  config.model.tie_output = False  # output layer = the target token table, transposed, + bias
  config.model.dtype = "float32"
  config.optimizer = optim.defaults()
  config.optimizer.update(name="adam", learning_rate=1e-3, schedule="cosine",
                          warmup_steps=1000)  # (the chapter: RMSprop 1e-3, constant)
  config.optimizer.adam = optim.adam_config()
  config.optimizer.adam.b2 = 0.98
  config.batch_size = 64  # (the runner's default: 32)
  config.evals_per_epoch = 1  # (the runner's default: 4)
  # ---- Test report --------------------------------------------------------------------------
  config.beam_size = 4  # 0: greedy only
  config.length_penalty = 0.6  # GNMT's alpha
  return config


def validate(config, device_count: int | None) -> None:
  """UsageError naming the first bad field of the task's own (the runner checks its own and the
  optimizer's: run.validate); nothing depends on the device count."""
  if device_count is not None:
    return
  check_choice("split_by", config.split_by, ("pair", "source"))
  check_choice("tokenizer", config.tokenizer, pairs_lib.TOKENIZERS)
  for field in ("source_vocab", "target_vocab", "source_len", "target_len"):
    check_integer(field, config[field], 3)
  check_integer("beam_size", config.beam_size, 0)
  check_integer("length_pool", config.length_pool, 0)
  attention.get(config.model.encoder_attention)
  if config.mesh.sequence > 1:
    for field in ("encoder_attention", "decoder_attention"):
      if attention.get(config.model[field]).shard is None:
        raise UsageError(f"config.model.{field}={config.model[field]!r} declares no sequence "
                         f"sharding, so it cannot run with mesh.sequence={config.mesh.sequence}; "
                         f"use mesh.sequence=1 or a variant that does "
                         f"({', '.join(sharded_names())}).")
  if not attention.get(config.model.decoder_attention).causal:
    raise UsageError(f"config.model.decoder_attention={config.model.decoder_attention!r} is not "
                     f"a causal variant; allowed: "
                     f"{', '.join(n for n in attention.names() if attention.get(n).causal)}.")
  check_integer("model.num_heads", config.model.num_heads, 1)
  check_integer("model.head_dim", config.model.head_dim, 0)
  if config.model.head_dim:
    for field in ("encoder_attention", "decoder_attention"):
      if not accepts_head_dim(config.model[field]):
        raise UsageError(f"config.model.head_dim={config.model.head_dim} needs softmax "
                         f"attention; config.model.{field}={config.model[field]!r} has no "
                         f"head size option (use head_dim=0).")
  elif config.model.embed_dim % config.model.num_heads:
    raise UsageError(f"config.model.num_heads={config.model.num_heads} must divide "
                     f"config.model.embed_dim={config.model.embed_dim}.")
  if config.shared_vocab and config.source_vocab != config.target_vocab:
    raise UsageError(f"config.shared_vocab=True builds one vocabulary for both sides: give "
                     f"source_vocab and target_vocab one size (now {config.source_vocab} and "
                     f"{config.target_vocab}).")
  if config.model.share_embeddings and not config.shared_vocab:
    raise UsageError("config.model.share_embeddings=True needs one vocabulary for both sides: "
                     "set config.shared_vocab=True (or share_embeddings=False).")
  if config.optimizer.lora.rank:
    raise UsageError(f"config.optimizer.lora.rank={config.optimizer.lora.rank} adapts a "
                     f"pretrained model's weights; a translation model has none: leave it at 0.")
  if config.optimizer.layer_decay != 1.0:
    raise UsageError(f"config.optimizer.layer_decay={config.optimizer.layer_decay} decays the "
                     f"rates of a pretrained encoder's layers (a classification run's "
                     f"model.pretrained); a translation model has none: leave it at 1.")
  if config.dataset.startswith(pairs_lib.TFDS_PREFIX):
    check_name(config.dataset[len(pairs_lib.TFDS_PREFIX):])
  elif not config.dataset or not os.path.isfile(config.dataset):
    raise DataConfigError(f"config.dataset={config.dataset!r}: give an existing pairs file (.txt/.tsv "
                    f"source<TAB>target per line, .csv or .jsonl) or a TFDS translation set "
                    f"as 'tfds:NAME' (e.g. 'tfds:ted_hrlr_translate/pt_to_en' with "
                    f"source_field='pt', target_field='en').")
