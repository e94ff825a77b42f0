"""The language-modelling task's config: its fields with their defaults, and their checks."""

from __future__ import annotations

import ml_collections

from textattn import attention, optim
from textattn.attention import sequence
from textattn.checks import check_choice, check_integer
from textattn.data import tfds_source
from textattn.data.raw import not_a_file
from textattn.errors import DataConfigError, UsageError
from textattn.models import decoder
from textattn.tasks.language_model import data as data_lib
from textattn.tasks.language_model import ngram, tokenizers


def defaults() -> ml_collections.ConfigDict:
  """The task's own defaults (the runner adds its fields: run.fields): a small byte-level
  decoder on IMDB's unlabelled reviews that trains in minutes on a CPU."""
  config = ml_collections.ConfigDict()
  config.task = "language_model"  # a registered task (textattn/tasks/)
  # ---- Data (textattn/tasks/language_model/data.py) ------------------------------------------
  config.dataset = "imdb_reviews"  # a TFDS name, or a local .txt (a document a line) / .jsonl
  config.data_dir = ""  # TFDS: its data dir (else $TFDS_DATA_DIR)
  config.text_field = "text"  # the TFDS feature / .jsonl field holding a document's text
  config.train_split = "unsupervised"  # TFDS: trained on (IMDB: 50,000 unlabelled reviews)
  config.heldout_split = "test"  # TFDS: validation and test are drawn from it, never trained on
  # Drawn from the held-out split (a local file: from its documents) by data_seed, disjoint;
  # IMDB test reviews average ~1.3 KB: ~0.3 MB of validation, ~1.3 MB of test bytes.
  config.val_documents = 250
  config.test_documents = 1000
  config.data_seed = 0
  config.cache_dir = ""  # the raw documents' cache ("": textattn's cache dir)
  config.tokenizer = "bytes"  # bytes (lossless) | bpe (byte-level, lossless) | word (lossy)
  config.vocab_size = 4096  # bpe and word: ids, the 3 special ones included
  config.max_len = 256  # tokens per packed row (the longest context)
  # ---- Model (textattn/models/decoder.py) ----------------------------------------------------
  config.model = ml_collections.ConfigDict()
  config.model.attention = "causal"  # a causal variant that declares segment ids
  config.model.attention_impl = "auto"  # its kernel (chunked / recurrent forms; 'auto' picks)
  config.model.embed_dim = 128
  config.model.num_heads = 4
  config.model.head_dim = 0  # 0: embed_dim / num_heads
  config.model.ffn_dim = 512  # 0: no feed-forward (attention-only blocks)
  config.model.num_layers = 2
  # learned (a table of max_len rows) | rotary (queries and keys turned by position inside the
  # attention, a variant that declares it) | none (only the causal mask orders the tokens)
  config.model.position = "learned"
  config.model.dropout_rate = 0.0
  config.model.tie_output = False  # output layer = the token table, transposed, + bias
  config.model.dtype = "float32"
  config.optimizer = optim.defaults()
  config.optimizer.update(name="adam", learning_rate=2e-3, schedule="cosine", warmup_steps=100,
                          grad_clip_norm=1.0)
  config.num_train_steps = 2000  # (the runner's default: 2 epochs, ~16,000 steps on IMDB)
  config.eval_every_steps = 250
  config.checkpoint_every_steps = 250
  config.intervals_dataset = "imdb_reviews"  # (other data: automatic intervals)
  # ---- Test report ---------------------------------------------------------------------------
  config.kn_order = 5  # the byte n-gram reference (Kneser-Ney); 0: none
  return config


def segment_variants() -> list[str]:
  """The registered causal variants that take segment ids (what the task can train)."""
  return [n for n in attention.names() if attention.get(n).causal
          and getattr(attention.get(n), "segment_ids", False)]


def validate(config, device_count: int | None) -> None:
  """UsageError naming the first bad field of the task's own (the runner checks its own)."""
  if device_count is not None:
    return
  check_choice("tokenizer", config.tokenizer, tokenizers.KINDS)
  check_integer("max_len", config.max_len, 2)
  check_integer("vocab_size", config.vocab_size, 260 if config.tokenizer == "bpe" else 4)
  check_integer("val_documents", config.val_documents, 1)
  check_integer("test_documents", config.test_documents, 1)
  check_integer("data_seed", config.data_seed, 0)
  if check_integer("kn_order", config.kn_order, 0) > ngram.MAX_ORDER:
    raise UsageError(f"config.kn_order={config.kn_order} is invalid; it must be 0 (none) to "
                     f"{ngram.MAX_ORDER}.")
  m = config.model
  variant = attention.get(m.attention)
  if not (variant.causal and getattr(variant, "segment_ids", False)):
    raise UsageError(f"config.model.attention={m.attention!r} does not keep packed documents "
                     f"apart (no segment ids); a language model needs one that does: "
                     f"{', '.join(segment_variants()) or 'none is registered'}.")
  decoder.validate_config(m, config.mesh.sequence)
  if config.optimizer.lora.rank:
    raise UsageError(f"config.optimizer.lora.rank={config.optimizer.lora.rank} adapts a "
                     f"pretrained model's weights; a language model has none: leave it at 0.")
  if config.optimizer.layer_decay != 1.0:
    raise UsageError(f"config.optimizer.layer_decay={config.optimizer.layer_decay} decays a "
                     f"pretrained encoder's layers; a language model has none: leave it at 1.")
  if data_lib.is_local(config.dataset):
    problem = not_a_file(config.dataset)
    if problem or not config.dataset.lower().endswith(data_lib.LOCAL_EXTENSIONS):
      raise DataConfigError(f"config.dataset={config.dataset!r} ({problem or 'not .txt/.jsonl'})"
                            f": give an existing .txt (a document a line) or .jsonl file, or a "
                            f"TFDS name such as 'imdb_reviews'.")
  else:
    tfds_source.check_name(config.dataset,
                           tfds_source.data_root(tfds_source.tfds_data_dir(config)))
