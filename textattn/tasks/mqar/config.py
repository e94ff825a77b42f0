"""MQAR's config: its fields with their defaults (Zoology's model and data), and their checks."""

from __future__ import annotations

import ml_collections

from textattn import attention, optim
from textattn.checks import check_integer, check_number
from textattn.errors import UsageError
from textattn.models import decoder
from textattn.tasks.mqar import data as data_lib


def defaults() -> ml_collections.ConfigDict:
  """The task's own defaults (the runner adds its fields: run.fields): Zoology's MQAR model,
  two attention-only layers of one head with rotary positions and a tied output layer, trained
  at length 256 with 32 key-value pairs (easier settings mixed in), tested on longer sequences
  and more pairs as well."""
  config = ml_collections.ConfigDict()
  config.task = "mqar"  # a registered task (textattn/tasks/)
  # ---- Data (textattn/tasks/mqar/data.py) ----------------------------------------------------
  config.vocab_size = 8192  # keys from its first half, values from its second (Zoology's)
  config.length = 256  # tokens per training sequence
  config.pairs = 32  # key-value pairs per training sequence (each queried once)
  # Easier settings (LENGTHxPAIRS, comma-separated) whose batches come in turn before each batch
  # of the training setting, as Zoology's training mixture; "": the training setting only.
  config.mixed_settings = "64x4,128x8,256x16"
  config.alpha = 0.01  # the query gaps' power law, p(gap) ~ (gap + 1)^(alpha - 1) (power_a)
  # The test sets, LENGTHxPAIRS comma-separated: the training setting, fewer and more pairs,
  # and longer sequences than trained on (each reported on its own: test/<setting>/accuracy).
  config.test_settings = "64x4,128x8,256x16,256x32,256x64,512x32,512x64,1024x64"
  config.val_examples = 1000  # at the training setting; the best checkpoint is chosen on it
  config.test_examples = 1000  # per test setting
  config.data_seed = 0  # the validation and test draws (training batches: seed and the step)
  # ---- Model (textattn/models/decoder.py: the language model's decoder) -----------------------
  config.model = ml_collections.ConfigDict()
  config.model.attention = "causal"  # any causal variant
  config.model.attention_impl = "auto"
  config.model.embed_dim = 128  # Zoology's d_model
  config.model.num_heads = 1
  config.model.head_dim = 0  # 0: embed_dim / num_heads
  config.model.ffn_dim = 0  # Zoology's state_mixer is the identity: no feed-forward
  config.model.num_layers = 2
  # rotary (a variant that declares it) | none; learned (a table) cannot extrapolate
  config.model.position = "rotary"
  config.model.dropout_rate = 0.0
  config.model.tie_output = True  # (Zoology's: the output layer is the token table)
  config.model.dtype = "float32"
  config.optimizer = optim.defaults()
  config.optimizer.update(name="adamw", learning_rate=3e-3, weight_decay=0.1, schedule="cosine",
                          warmup_steps=100, grad_clip_norm=1.0)
  config.batch_size = 64
  config.num_train_steps = 1200  # fresh examples every step: the run's length, no epochs
  config.eval_every_steps = 300
  config.checkpoint_every_steps = 300
  config.log_every_steps = 100
  return config


def causal_variants() -> list[str]:
  """The registered causal variants (what the task can train)."""
  return [n for n in attention.names() if attention.get(n).causal]


def validate(config, device_count: int | None) -> None:
  """UsageError naming the first bad field of the task's own (the runner checks its own)."""
  if device_count is not None:
    return
  if config.num_train_steps <= 0:
    raise UsageError(f"config.num_train_steps={config.num_train_steps} must be > 0: MQAR draws "
                     f"fresh examples every step, so a run has no epochs to count.")
  check_integer("vocab_size", config.vocab_size, 4)
  check_number("alpha", config.alpha, lambda a: a > 0, "a positive number (1: uniform gaps)")
  check_integer("val_examples", config.val_examples, 1)
  check_integer("test_examples", config.test_examples, 1)
  check_integer("data_seed", config.data_seed, 0)
  check_integer("length", config.length, 2)
  check_integer("pairs", config.pairs, 1)
  data_lib.check_setting(data_lib.training_setting(config), config.vocab_size,
                         "config.length and config.pairs")
  for setting in data_lib.training_settings(config)[:-1]:
    data_lib.check_setting(setting, config.vocab_size, "config.mixed_settings")
  for setting in data_lib.test_settings(config):
    data_lib.check_setting(setting, config.vocab_size, "config.test_settings")
  m = config.model
  if not attention.get(m.attention).causal:
    raise UsageError(f"config.model.attention={m.attention!r} is not causal; MQAR reads its "
                     f"tokens left to right: allowed: {', '.join(causal_variants())}.")
  decoder.validate_config(m, config.mesh.sequence)
  if config.optimizer.lora.rank or config.optimizer.layer_decay != 1.0:
    raise UsageError(f"config.optimizer.lora.rank={config.optimizer.lora.rank} and "
                     f"config.optimizer.layer_decay={config.optimizer.layer_decay} adapt a "
                     f"pretrained model; an MQAR model has none: leave them at 0 and 1.")
