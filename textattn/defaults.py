"""The classification task's default configuration, and loading configs by path.

Config files (configs/*.py) start from `classification()` or from another config file
(`sibling(__file__, "imdb_softmax.py")`) and change a few fields. Recipes add their own fields
only in the configs that use them (textattn/recipes/word2vec.py, textattn/recipes/pretrain.py).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from typing import Any

import ml_collections

from textattn.errors import UsageError

CONFIG_VERSION = 2  # of config.json and the run contract; migrate() brings older ones here


def run_fields(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The runner's fields, the same for every task (textattn/run.py, textattn/loop.py)."""
  config.config_version = CONFIG_VERSION  # what migrate() reads; set here, never by a user
  config.seed = 0  # parameters, dropout and batch order
  config.batch_size = 32  # global; a multiple of the device count
  config.eval_batch_size = 256
  config.num_epochs = 2
  config.num_train_steps = -1  # > 0 overrides num_epochs
  config.log_every_steps = 100
  config.eval_every_steps = 0  # 0 = automatic: evals_per_epoch times per epoch
  config.checkpoint_every_steps = 0  # 0 = at each automatic evaluation (and always at the end)
  config.evals_per_epoch = 4  # for the 0s above (1 = once per epoch, as before there was this)
  # The data set the two intervals above were chosen for ("" = any): on another they are
  # automatic (imdb_softmax.py's 350 steps would not fit a small file's run).
  config.intervals_dataset = ""
  config.final_params = "best"  # test report from the best-validation checkpoint, or "last"
  config.keep_checkpoints = 2  # the latest K are kept, plus the best by validation accuracy
  config.num_cpu_devices = 0  # CPU only: split the CPU into this many devices; 0 = JAX's default
  config.xla_flags = ""  # extra XLA flags for the train/eval steps ("--xla_name=value ...")
  config.deterministic = True  # bit-reproducible steps (--xla_gpu_deterministic_ops on GPUs)
  # The device mesh: the length of every batch split over `sequence` devices (context
  # parallelism; attention variants that declare it, textattn/attention/sequence.py), the batch
  # over the rest (data = devices / sequence). 1 = data parallelism only.
  config.mesh = ml_collections.ConfigDict()
  config.mesh.sequence = 1
  return config


def optimizer() -> ml_collections.ConfigDict:
  """The optimizer's fields (textattn/optim.py)."""
  config = ml_collections.ConfigDict()
  # adam | adamw | rmsprop (Keras') | keras_adam (Adam exactly as the seed Keras model computes it)
  config.name = "adam"
  config.learning_rate = 1e-3
  # constant | cosine | linear (decay to 0 at the last step, BERT's), all after linear warm-up
  config.schedule = "constant"
  config.warmup_steps = 0
  config.weight_decay = 0.0  # decoupled for adamw, L2 on the gradient otherwise
  config.grad_clip_norm = 0.0  # global-norm clipping; 0 = none
  config.b1 = 0.9
  config.b2 = 0.999
  config.eps = 1e-7  # Keras Adam's default, as in the seed
  config.label_smoothing = 0.0  # of the training loss; evaluation loss is plain
  # < 1: layer-wise learning-rate decay of a pretrained encoder (model.pretrained): each block
  # learns at this times the rate of the one above it (textattn/pretrained/finetune.py)
  config.layer_decay = 1.0
  return config


def classification() -> ml_collections.ConfigDict:
  """The classification task's defaults (textattn/tasks/classification.py)."""
  config = ml_collections.ConfigDict()
  config.task = "classification"  # a registered task (textattn/tasks/)

  # ---- Data ---------------------------------------------------------------------------------
  config.dataset = "imdb_reviews"  # a TFDS name, or the path of a .csv / .tsv / .jsonl file
  config.data_dir = ""  # TFDS data dir; "" = $TFDS_DATA_DIR, else TFDS's default
  config.text_fields = "text"  # local files: comma-separated text field(s), joined by a space
  config.label_field = "label"  # local files: the label field
  config.columns = ""  # headerless .csv/.tsv: the column names ("label,title,text"); "" = header
  config.validation_file = ""  # local files: the validation split's file; "" = carved from dataset
  config.test_file = ""  # local files: the test split's file; "" = carved from dataset
  # The text field(s) of validation_file / test_file where their header names them otherwise
  # ("content" where the training file has "sentence"); "" = text_fields
  config.validation_text_fields = ""
  config.test_text_fields = ""
  config.val_fraction = 0.1  # fraction of train held out as validation (data_seed decides which)
  config.eval_split = "validation"  # evaluated during training: validation | test
  config.data_seed = 0  # seeds the validation carve-out
  # word (Keras-style standardisation, vocabulary from train) | byte | ngram (textattn/data/ngrams.py)
  config.tokenizer = "word"
  config.vocab_size = 20000  # word / ngram: ids incl. 0 = padding and 1 = out-of-vocabulary
  config.ngram_order = 2  # ngram: the features are the n-grams of 1..ngram_order words
  config.ngram_counts = False  # ngram: True keeps repeats (counts, TF-IDF), False each once
  config.max_len = 200  # tokens per example (ngram: features per example)
  config.truncation = "pre"  # pre drops tokens from the start (Keras' default), post from the end
  # after_masked: padding after the tokens, masked; before_as_token: the Keras seed's layout
  # (padding first, attended to and pooled like a token)
  config.padding = "after_masked"
  config.cache_dir = ""  # tokenised arrays, vocabularies, vectors; "" = cache_root() below

  # ---- Model --------------------------------------------------------------------------------
  config.model = ml_collections.ConfigDict()
  # transformer | bag (n-gram bag, textattn/models/baselines.py) | bilstm (bidirectional LSTM)
  config.model.architecture = "transformer"
  config.model.bag_weighting = "none"  # bag: none | tfidf (Keras' idf) | nb (NBSVM-style ratios)
  config.model.rnn_dim = 32  # bilstm: LSTM units per direction
  config.model.attention = "softmax"  # a registered variant: softmax | causal | additive
  # kernel: auto | xla | dot_product | chunked | fused | native | cudnn (GPU, bf16) | splash
  # (TPU) for softmax/causal; auto | xla | native | pallas (GPU) | pallas_tpu (TPU) for additive;
  # auto | xla (scan) | chunked | pallas (GPU) for causal_additive_recurrent. auto = on a
  # one-device CPU, native where timed faster for the length (textattn/attention/calibration.py;
  # $TEXTATTN_CPU_AUTO); a Pallas kernel only where textattn/attention/pallas_allowlist.py lists
  # the GPU or TPU.
  config.model.attention_impl = "auto"
  config.model.embed_dim = 32
  config.model.num_heads = 2
  config.model.num_layers = 1
  config.model.ffn_dim = 32  # feed-forward hidden units per block
  config.model.mlp_dim = 20  # hidden units of the classifier head; 0 = none
  config.model.dropout_rate = 0.1  # after attention, FFN, pooling and the head's hidden layer
  config.model.token_dropout_rate = 0.0  # word dropout: a token's embedding zeroed in training
  config.model.bigram_buckets = 0  # > 0: hashed (previous, current) token embeddings, this many
  config.model.position = "learned"  # learned | sinusoidal
  config.model.norm = "post"  # post (as the seeds) | pre
  config.model.pooling = "mean"  # mean | max | attention | cls | last
  config.model.dtype = "float32"  # compute dtype: float32 | bfloat16 (parameters stay float32)
  # random (Keras' uniform) | word2vec (recipe) | vectors:PATH (a word2vec/GloVe file,
  # textattn/recipes/vectors.py)
  config.model.embedding_init = "random"
  config.model.vectors_scale = "raw"  # vectors:PATH: raw (the file's) | init (the random spread)
  # A BERT-family encoder to fine-tune: a Hugging Face model directory or hf:ORG/NAME. It sets
  # the model (architecture, sizes, dropout from its config.json) and the tokenizer (its
  # tokenizer.json; config.tokenizer and vocab_size are then unused); attention (any variant)
  # and pooling (cls | mean) still apply (textattn/pretrained/finetune.py).
  config.model.pretrained = ""

  config.optimizer = optimizer()
  run_fields(config)
  return config


def cache_root() -> str:
  """Where every textattn cache lives unless told otherwise: $TEXTATTN_CACHE, else
  $XDG_CACHE_HOME/textattn, else ~/.cache/textattn. The data cache (config.cache_dir = "") is
  this directory, hf:ORG/NAME models its huggingface/, the native kernels' its native/
  ($TEXTATTN_NATIVE_CACHE overrides that one)."""
  if os.environ.get("TEXTATTN_CACHE"):
    return os.path.expanduser(os.environ["TEXTATTN_CACHE"])
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "textattn")


def translation() -> ml_collections.ConfigDict:
  """The translation task's defaults (textattn/tasks/translation.py): Deep Learning with Python's
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
  config.optimizer = optimizer()
  config.optimizer.update(name="adam", learning_rate=1e-3, b2=0.98, schedule="cosine",
                          warmup_steps=1000)  # (the chapter: RMSprop 1e-3, constant)
  run_fields(config)
  config.batch_size = 64
  config.evals_per_epoch = 1
  # ---- Test report --------------------------------------------------------------------------
  config.beam_size = 4  # 0: greedy only
  config.length_penalty = 0.6  # GNMT's alpha
  return config


# What a version-1 config (written before config versions, until 2026-11-26) meant where it
# lacks a field that has another default now: the value the code fell back to then.
_V1_FALLBACKS = {"evals_per_epoch": 1}


def migrate(saved: dict, base: ml_collections.ConfigDict) -> dict:
  """A workdir's config (config.json, or a checkpoint's run contract, as a nested dict) brought
  to CONFIG_VERSION: every field of `base` (the task's defaults) it lacks is added with the
  value its version meant (_V1_FALLBACKS for version 1, else the default), so code reads every
  field directly and a resume compares every field. Fields `base` lacks (a recipe's) are kept."""
  version = saved.get("config_version", 1)
  if version > CONFIG_VERSION:
    from textattn.errors import RunError
    raise RunError(f"This workdir was written by a newer textattn (config version {version}; "
                   f"this one reads up to {CONFIG_VERSION}); upgrade textattn to use it.")
  fallbacks = _V1_FALLBACKS if version == 1 else {}

  def fill(node: dict, defaults: dict, prefix: str) -> dict:
    out = dict(node)
    for key, default in defaults.items():
      name = prefix + key
      if isinstance(default, dict):
        out[key] = fill(node.get(key, {}), default, name + ".")
      elif key not in node:
        out[key] = fallbacks.get(name, default)
    return out

  migrated = fill(saved, base.to_dict(), "")
  migrated["config_version"] = CONFIG_VERSION
  return migrated


def read_workdir_config(workdir: str, plugins=()) -> ml_collections.ConfigDict:
  """The config a training workdir recorded (config.json), migrated to today's fields."""
  import json

  from textattn import attention, tasks
  from textattn.data.splits import DataError
  attention.load_plugins(plugins)  # a plugin's task or attention variant, as in training
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise DataError(f"{workdir} has no config.json: it is not a textattn training workdir (or "
                    f"its run has not started).")
  with open(path) as f:
    saved = json.load(f)
  task = tasks.get(saved.get("task", "classification"))  # (v1: only translation named it)
  return ml_collections.ConfigDict(migrate(saved, task.defaults()))


CONFIGS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def shipped_configs() -> list[str]:
  """The names of the configs that ship with textattn (textattn/configs/*.py)."""
  return sorted(name[:-3] for name in os.listdir(CONFIGS_DIR)
                if name.endswith(".py") and not name.startswith("_"))


def config_path(value: str) -> str:
  """--config's value as a path: an existing file as given, else a shipped config's name
  ("imdb_fastformer" or "imdb_fastformer.py", with an optional ":argument") as the path of
  that file in the installed package, so a name works from any directory."""
  path, sep, argument = value.partition(":")
  if os.path.isfile(path):
    return value
  name = path.removesuffix(".py")
  if os.sep not in name and name in shipped_configs():
    return os.path.join(CONFIGS_DIR, name + ".py") + sep + argument
  return value


def load(path: str) -> ml_collections.ConfigDict:
  """get_config() of the config file at `path` (or of the shipped config of that name), loaded
  by path (configs are not a package)."""
  path = config_path(path)
  if not os.path.isfile(path):
    raise UsageError(f"config file {path!r} does not exist.")
  name = "textattn_config_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def sibling(config_file: str, name: str) -> ml_collections.ConfigDict:
  """Inside a config file: `defaults.sibling(__file__, "imdb_softmax.py")` is the config of that
  file in the same directory, to start from."""
  return load(os.path.join(os.path.dirname(os.path.abspath(config_file)), name))


def check_choice(field: str, value: Any, allowed: Iterable) -> None:
  """ValueError naming config.<field>, its value and the allowed values, unless allowed."""
  allowed = tuple(allowed)
  if value not in allowed:
    raise UsageError(f"config.{field}={value!r} is not allowed; "
                     f"allowed: {', '.join(map(str, allowed))}.")


def check_integer(field: str, value: Any, low: int) -> int:
  """ValueError naming config.<field> and its value unless it is an integer >= low (not a
  bool); returns it."""
  if not isinstance(value, int) or isinstance(value, bool) or value < low:
    raise UsageError(f"config.{field}={value!r} is invalid; it must be an integer >= {low}.")
  return value
