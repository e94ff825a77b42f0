"""Fine-tuning a pretrained encoder in a classification run (config.model.pretrained), and
layer-wise learning-rate decay.

A run with model.pretrained = a Hugging Face model directory (or hf:ORG/NAME):
- at start, before the workdir is touched: `validate_config` (one sentence, exit 2): a
  directory that is not a BERT model, a max_len beyond its position table, settings that do
  not apply to it (padding before the tokens, word-vector or word2vec starts, keras_adam);
- data: the model's own tokenizer on the raw text (textattn/data/dataset.py), kept in the
  workdir (tokenizer.json), and the encoder's BertConfig in pretrained_config.json, so a resume,
  `textattn.predict` and `textattn.load` rebuild the model without the model directory;
- model: bert.BertClassifier with the config's attention variant and pooling
  (models.build_model);
- a fresh start: every encoder parameter the checkpoint has a value of the same name and shape
  for starts from it (hf.select), the rest is initialised; the three lines of hf.Transfer say
  which (`start_params`).

Layer-wise learning-rate decay (config.optimizer.layer_decay < 1; Clark et al. 2020, ELECTRA;
Howard & Ruder 2018's discriminative rates): the classifier head and the pooler learn at the full
rate, the last block at `decay` times it, each block below at `decay` times the one above, the
embeddings at decay ** (num_layers + 1). Lower layers hold the most general features and move
least. optim.make_optimizer appends `scale_by_depth(decay)`, which finds the depths from the
parameters' names; with a built model's parameters at hand the same is

    tx = optax.chain(optax.adamw(schedule, weight_decay=0.01),
                     scale_by_layer_decay(layer_decay_scales(params, num_layers, 0.9)))

Scaling AdamW's update scales its weight-decay term with it, as ELECTRA's and BEiT's
implementations do (they scale the layer's learning rate).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp

from textattn import attention
from textattn.checks import check_choice
from textattn.data import atomic_write
from textattn.errors import DataConfigError, DataError, UsageError
from textattn.models import bert, encoder, registry
from textattn.paths import cache_root
from textattn.pretrained import hf

WORKDIR_FILE = "pretrained_config.json"  # the encoder's BertConfig, as a run saved it


def enabled(config) -> bool:
  return bool(config.model.pretrained)


def validate_config(config) -> None:
  """The checks of a fine-tuning config that need no JAX backend: one sentence naming the field
  (a DataConfigError, exit 2, for a model directory that cannot be used). A hf:ORG/NAME model is
  fetched, and its limits checked, when the run prepares its data (check_limits); so is a local
  directory that does not exist (a resume does not need it; a fresh start is refused then)."""
  m = config.model
  if not m.pretrained:
    if config.optimizer.layer_decay != 1.0:
      raise UsageError(f"config.optimizer.layer_decay={config.optimizer.layer_decay} decays the "
                       f"rates of a pretrained encoder's layers; set config.model.pretrained, or "
                       f"leave layer_decay=1.")
    if config.optimizer.lora.rank:
      raise UsageError(f"config.optimizer.lora.rank={config.optimizer.lora.rank} adapts a "
                       f"pretrained encoder's weights and freezes the rest; set "
                       f"config.model.pretrained, or leave lora.rank=0.")
    return
  spec = m.pretrained
  if not isinstance(spec, str):
    raise UsageError(f"config.model.pretrained={spec!r} must be a model directory or "
                     f"hf:ORG/NAME.")
  check_choice("model.architecture", m.architecture, ("transformer",))
  check_choice("model.pooling", m.pooling, bert.POOLINGS)
  if config.embedding.init != "random":
    raise UsageError(f"config.embedding.init={config.embedding.init!r} cannot be used with "
                     f"config.model.pretrained: the pretrained model brings its own token "
                     f"embeddings; use 'random'.")
  if config.layout.padding != "after_masked":
    raise UsageError(f"config.layout.padding={config.layout.padding!r} cannot be used with "
                     f"config.model.pretrained: BERT's positions count from the first token; "
                     f"use 'after_masked'.")
  if config.optimizer.name == "keras_adam":
    raise UsageError("config.optimizer.name='keras_adam' (the Keras seed's token-table update) "
                     "cannot be used with config.model.pretrained; use adamw.")
  if spec.startswith(hf.HUB_PREFIX):
    name = spec[len(hf.HUB_PREFIX):]
    if name.count("/") != 1 or not all(name.split("/")):
      raise UsageError(f"config.model.pretrained={spec!r} is not of the form hf:ORG/NAME.")
    return
  if not os.path.lexists(os.path.expanduser(spec)):
    # A resume needs no model directory (the workdir has the encoder's config and tokenizer);
    # a fresh start says the directory is missing when it loads the weights (`load`).
    return
  try:
    directory = hf.resolve(spec)
    hf.check_files(directory)
    bert_config = hf.read_config(directory)
    check_limits(config, bert_config,
                 hf.read_tokenizer(directory, bert_config.pad_token_id).special_tokens())
  except DataConfigError:
    raise
  except DataError as e:  # the config names a directory that cannot be used: exit 2
    raise DataConfigError(str(e)) from None


def check_limits(config, bert_config, special_tokens: int) -> None:
  """What the config asks of the pretrained model it names: positions and room for a token
  beside the `special_tokens` its tokenizer adds ([CLS], [SEP]), which must be some: a
  tokenizer.json without a post-processor adds none, and the model (and cls pooling) would read
  texts without the markers it was trained with."""
  if special_tokens == 0:
    raise DataConfigError(f"The tokenizer of config.model.pretrained="
                          f"{config.model.pretrained!r} adds no special tokens ([CLS], [SEP]): "
                          f"its tokenizer.json has no post-processor; use the model's full "
                          f"tokenizer.json, as its training used it.")
  if config.max_len <= special_tokens:
    raise DataConfigError(f"config.max_len={config.max_len} leaves no room for a token beside "
                          f"the {special_tokens} special tokens the tokenizer of "
                          f"config.model.pretrained={config.model.pretrained!r} adds; use a "
                          f"larger max_len.")
  if config.max_len > bert_config.usable_positions:
    raise DataConfigError(f"config.max_len={config.max_len} is longer than the "
                          f"{bert_config.usable_positions} positions of config.model.pretrained="
                          f"{config.model.pretrained!r}; use max_len <= "
                          f"{bert_config.usable_positions}.")


def model_config(config):
  """The BertConfig of config.model.pretrained, from its config.json alone (a hub model is
  fetched): what builds the model where no workdir has saved it (textattn.summary, the
  benchmark)."""
  try:
    directory = hf.resolve(config.model.pretrained, _hub_cache(config))
    return hf.read_config(directory)
  except DataConfigError:
    raise
  except DataError as e:
    raise DataConfigError(str(e)) from None


def _hub_cache(config):
  """Where hf:ORG/NAME models are fetched to: CACHE/huggingface under the run's cache root
  (config.cache_dir, else $TEXTATTN_CACHE, else $XDG_CACHE_HOME/textattn), like every cache."""
  root = os.path.expanduser(config.cache_dir) if config.cache_dir else cache_root()
  return os.path.join(root, "huggingface")


def load(config):
  """The model directory (or hf:ORG/NAME) of config.model.pretrained: hf.Pretrained."""
  try:
    pretrained = hf.load(config.model.pretrained, _hub_cache(config))
  except DataConfigError:
    raise
  except DataError as e:  # a local directory that cannot be used is the config's mistake (exit 2)
    if config.model.pretrained.startswith(hf.HUB_PREFIX):
      raise
    raise DataConfigError(str(e)) from None
  check_limits(config, pretrained.config, pretrained.tokenizer.special_tokens())
  return pretrained


def save_config(workdir: str, bert_config) -> None:
  atomic_write(os.path.join(workdir, WORKDIR_FILE),
               lambda f: json.dump(dataclasses.asdict(bert_config), f, indent=2))


def read_config(workdir: str):
  """The BertConfig a run saved in `workdir`, or None if it has none yet."""
  path = os.path.join(workdir, WORKDIR_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      return bert.BertConfig(**json.load(f))
  except (OSError, ValueError, TypeError) as e:
    raise DataError(f"{path} is unreadable ({type(e).__name__}); restore it from a copy or use "
                    f"a new workdir.") from None


def start_params(model, length: int, pretrained, announce: bool):
  """The checkpoint's values for `model`'s encoder parameters (the nested dict
  step.init_train_state(pretrained_params=...) takes); `announce`: print what was kept."""
  abstract = jax.eval_shape(lambda: model.init(jax.random.key(0),
                                               jnp.ones((1, length), jnp.int32)))["params"]
  kept, report = hf.select(abstract, pretrained, prefix="encoder")
  if announce:
    print(report.summary(), flush=True)
  return kept


def _build(config, num_classes: int, vocab_size, bert_config, mesh):
  """bert.BertClassifier with the config's attention variant and pooling; `bert_config` None:
  read from the model's config.json (a model not trained yet: textattn.summary, the
  benchmark)."""
  del vocab_size, mesh  # (the encoder's own tokenizer and vocabulary; no sequence split)
  if bert_config is None:
    bert_config = model_config(config)
  m = config.model
  variant = attention.get(m.attention)
  # The variant's own checks, with the encoder's sizes (config.model.embed_dim / num_heads are
  # not the model's here).
  variant.validate(m.attention_impl, bert_config.hidden_size, bert_config.num_heads, m.dtype)
  impl = encoder.resolved_kernel(config, bert_config)
  return bert.BertClassifier(bert_config, num_classes, pooling=m.pooling, attention=m.attention,
                             attention_impl=impl, dtype=encoder.DTYPES[m.dtype],
                             attention_options=attention.build_options(variant, m))


def _describe(config) -> str:
  m = config.model
  return f"pretrained encoder {m.pretrained}, {m.attention} attention, {m.pooling} pooling"


registry.register(registry.Architecture("pretrained", _build, _describe,
                                        encoder_config=model_config))
