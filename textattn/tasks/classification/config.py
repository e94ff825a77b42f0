"""The classification task's config: its fields with their defaults, and their checks.

The runner's fields (batch size, epochs, checkpoints, ...) and the optimizer's are added and
checked by the runner (textattn/run.py, textattn/optim.py). Recipes (word2vec, vectors, MLM
pretraining) and architectures keep their own sub-configs.
"""

from __future__ import annotations

import ml_collections

from textattn import attention, models, optim
from textattn import data as data_lib
from textattn.attention import sequence
from textattn.checks import check_choice
from textattn.data import ngrams
from textattn.errors import UsageError
from textattn.models import baselines, layers
from textattn.pretrained import finetune
from textattn.recipes import attention_transfer, pretrain, word2vec

EVAL_SPLITS = ("validation", "test")

# The task's opt-in parts (tasks.Task.parts): what only one data source, architecture or recipe
# uses, each with its defaults where it is read.
PARTS = {
    "source": data_lib.source_config,  # field names; a local file's validation/test files
    "layout": data_lib.layout_config,  # truncation, padding
    "ngrams": ngrams.default_config,  # tokenizer="ngram", architecture="bag"
    "embedding": layers.embedding_config,  # init (random | word2vec | vectors:PATH), extras
    "bilstm": baselines.bilstm_config,  # architecture="bilstm"
    # a pretrained encoder's new attention trained to imitate its softmax first
    "attention_transfer": attention_transfer.default_config,
}


def defaults() -> ml_collections.ConfigDict:
  """The classification task's own defaults (the runner adds its fields: run.fields)."""
  config = ml_collections.ConfigDict()
  config.task = "classification"  # a registered task (textattn/tasks/)

  # ---- Data ---------------------------------------------------------------------------------
  config.dataset = "imdb_reviews"  # a TFDS name, or the path of a .csv / .tsv / .jsonl file
  config.data_dir = ""  # TFDS data dir; "" = $TFDS_DATA_DIR, else TFDS's default
  config.val_fraction = 0.1  # fraction of train held out as validation (data_seed decides which)
  config.eval_split = "validation"  # evaluated during training: validation | test
  config.data_seed = 0  # seeds the validation carve-out
  # word (Keras-style standardisation, vocabulary from train) | byte | ngram (textattn/data/ngrams.py)
  config.tokenizer = "word"
  config.vocab_size = 20000  # word / ngram: ids incl. 0 = padding and 1 = out-of-vocabulary
  config.max_len = 200  # tokens per example (ngram: features per example)
  config.cache_dir = ""  # tokenised arrays, vocabularies, vectors; "" = paths.cache_root()
  # Opt-in parts (PARTS below; the runner's: run.PARTS) are left out: a config adds one only
  # to change it (`config.source = defaults.part("source")`, or on the command line
  # --config.source.text_fields=review), and the runner fills in the rest.

  # ---- Model --------------------------------------------------------------------------------
  config.model = ml_collections.ConfigDict()
  # transformer | bag (n-gram bag, textattn/models/baselines.py) | bilstm (bidirectional LSTM)
  config.model.architecture = "transformer"
  config.model.attention = "softmax"  # a registered variant (textattn/attention/: softmax, additive, linear, ...)
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
  config.model.position = "learned"  # learned | sinusoidal
  config.model.norm = "post"  # post (as the seeds) | pre
  config.model.pooling = "mean"  # mean | max | attention | cls | last
  config.model.dtype = "float32"  # compute dtype: float32 | bfloat16 (parameters stay float32)
  # A BERT-family encoder to fine-tune: a Hugging Face model directory or hf:ORG/NAME. It sets
  # the model (architecture, sizes, dropout from its config.json) and the tokenizer (its
  # tokenizer.json; config.tokenizer and vocab_size are then unused); attention (any variant)
  # and pooling (cls | mean) still apply (textattn/pretrained/finetune.py).
  config.model.pretrained = ""

  config.optimizer = optim.defaults()
  return config


def validate(config: ml_collections.ConfigDict, device_count: int | None) -> None:
  """The task's own fields (the runner checks its own: run.validate): one sentence naming the
  first bad field, its value and what is allowed. Without a device count, the checks that need
  no JAX backend (run before JAX starts); with it, those that may ask the backend (which
  kernels run here)."""
  if device_count is not None:
    models.validate_model_config(config)
    word2vec.validate_config(config)
    pretrain.validate_config(config)
    return
  data_lib.validate_config(config)
  if config.model.architecture == "transformer" and not config.model.pretrained:
    # (before JAX starts: a variant that cannot be split is refused before anything runs)
    sequence.check_declared(attention.get(config.model.attention), config.mesh.sequence)
  finetune.validate_config(config)
  attention_transfer.validate_config(config)
  if config.model.pretrained and pretrain.enabled(config):
    raise UsageError(f"config.pretrain.objective={config.pretrain.objective!r} pretrains a model "
                     f"from scratch; config.model.pretrained starts from one already trained: "
                     f"set one of them.")
  check_choice("eval_split", config.eval_split, EVAL_SPLITS)
  if config.final_params == "best" and config.eval_split == "test":
    raise UsageError("config.final_params='best' with config.eval_split='test' would choose the "
                     "model on the test set; use final_params='last' or eval_split='validation'.")
