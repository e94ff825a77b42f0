"""Masked-language-model pretraining of the encoder on unlabelled text (`config.pretrain`).

With `config.pretrain.objective = "mlm"`, a fresh run first trains the classifier's own
embedding and encoder blocks as a masked language model (BERT, Devlin et al. 2019) on text
without labels, then fine-tunes the whole classifier from them as usual:

- **Text**: the training split (validation carved out exactly as for training) plus the TFDS
  split `config.pretrain.unlabeled_split` ("unsupervised" for imdb_reviews: 50,000 reviews of
  the same data set, no labels). Never the validation or test split, and never a label.
  Encoded with the run's tokenizer, `max_len` and truncation, so positions and lengths are
  those the classifier sees.
- **Objective**: per text, `mask_rate` of its real tokens (at least one, at most
  `max_predictions`), chosen at random every step, are predicted from the rest; 80% of them are
  replaced by a learned [MASK] vector, 10% by a random token, 10% kept (BERT's recipe). The
  head is a dense + GELU + LayerNorm layer whose output layer is the token-embedding table
  (tied) plus a bias; only the embedding and encoder parameters move to the classifier.
- **Optimiser**: `config.optimizer`'s name, betas, epsilon, weight decay and clipping, with the
  pretraining's own learning rate, linear warm-up and cosine decay over `num_steps`.
- **Reproducible and cached**: the result depends only on the data, the tokenizer, the model
  and pretraining settings and their seed (`config.pretrain.seed`, not `config.seed`, so a seed
  sweep of the fine-tuning shares one pretraining); it is cached in `cache_dir` under a key of
  all of them, written atomically, and a later fresh run with the same settings reads it. A
  resumed run restores its parameters from its checkpoint and never pretrains. The training
  curve of the masked-token loss and accuracy goes to `DIR/pretrain.jsonl`.
"""

from __future__ import annotations

import copy
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging

from textattn import data as data_lib
from textattn import loop, models, optim, platform, train_state
from textattn.checkpointing import flatten, transfer, unflatten  # noqa: F401 -- transfer: API
from textattn.checks import check_integer
from textattn.data import tokenizer as tokenizer_lib
from textattn.errors import UsageError

OBJECTIVES = ("", "mlm")
MASK_FRACTION, RANDOM_FRACTION = 0.8, 0.1  # of the predicted tokens; the rest are kept
_CACHE_VERSION = 1


def default_config() -> ml_collections.ConfigDict:
  """The recipe's fields: a config that pretrains adds them as
  `config.pretrain = pretrain.default_config()` and sets `objective = "mlm"`."""
  p = ml_collections.ConfigDict()
  p.objective = ""  # "mlm" pretrains; "" = none
  # A TFDS split of unlabelled text added to the corpus ("unsupervised" for imdb_reviews);
  # "" = the training split's text only (always for local files). Labelled splits are refused.
  p.unlabeled_split = ""
  p.num_steps = 2000
  p.batch_size = 32
  p.learning_rate = 1e-3  # peak, after linear warm-up; cosine decay over num_steps
  p.warmup_steps = 200
  p.mask_rate = 0.15  # of each text's tokens predicted (>= 1, <= max_predictions)
  p.max_predictions = 64
  p.seed = 0  # the pretraining's own seed (init, masking, order), not config.seed
  return p


def enabled(config) -> bool:
  return "pretrain" in config and bool(config.pretrain.objective)


def validate_config(config) -> None:
  """One sentence for a pretraining setting that cannot work, before any data is read."""
  if "pretrain" not in config:
    return
  p = config.pretrain
  if p.objective not in OBJECTIVES:
    raise UsageError(f"config.pretrain.objective={p.objective!r} is invalid; allowed: "
                     f"{', '.join(repr(o) for o in OBJECTIVES)} ('' = no pretraining).")
  if not p.objective:
    return
  if config.embedding.bigram_buckets:
    raise UsageError(f"config.pretrain.objective={p.objective!r} cannot be used with "
                     f"config.embedding.bigram_buckets={config.embedding.bigram_buckets}: a masked "
                     "token's bigrams would give it away; set bigram_buckets=0.")
  if data_lib.pads_before(config):
    raise UsageError(f"config.pretrain.objective={p.objective!r} needs config.layout.padding="
                     f"'after_masked' (got {config.layout.padding!r}): masked-language-model "
                     "pretraining predicts real tokens only.")

  for field, low in (("num_steps", 1), ("batch_size", 1), ("warmup_steps", 0), ("seed", 0),
                     ("max_predictions", 1)):
    check_integer(f"pretrain.{field}", p[field], low)
  if p.max_predictions > config.max_len:
    raise UsageError(f"config.pretrain.max_predictions={p.max_predictions} is invalid; it must "
                     f"be at most config.max_len={config.max_len}.")
  if not 0.0 < p.mask_rate < 1.0:
    raise UsageError(f"config.pretrain.mask_rate={p.mask_rate} is invalid; it must be in (0, 1).")
  if not p.learning_rate > 0:
    raise UsageError(f"config.pretrain.learning_rate={p.learning_rate} must be > 0.")
  if p.batch_size % jax.device_count():
    raise UsageError(f"config.pretrain.batch_size={p.batch_size} must be a multiple of the "
                     f"device count ({jax.device_count()}) so every device gets an equal share.")
  data_lib.check_unlabeled_split(config, "pretrain.unlabeled_split", "pretrain")
  if config.embedding.init == "word2vec":
    raise UsageError("config.pretrain.objective='mlm' trains the token embeddings itself; use "
                     "config.embedding.init='random' with it (or no pretraining).")


def settings(config) -> dict:
  """Everything the pretrained parameters depend on besides the data and the tokenizer."""
  opt = config.optimizer
  return {
      "pretrain": config.pretrain.to_dict(),
      # The classifier head's own settings do not reach the encoder: a sweep over them shares
      # one pretraining. Of the pooling, only whether a CLS token is prepended does.
      # (the fields config version 3 moved out of config.model, under their old names: the
      # cached pretrainings of older versions stay valid)
      "model": {**{k: v for k, v in config.model.to_dict().items()
                   if k not in ("mlp_dim", "pooling")},
                "bag_weighting": config.ngrams.weighting, "rnn_dim": config.bilstm.rnn_dim,
                "embedding_init": config.embedding.init,
                "vectors_scale": config.embedding.vectors_scale},
      "cls_token": config.model.pooling == "cls",
      "xla_flags": config.platform.xla_flags,  # (compiler options can change the numbers)
      "max_len": int(config.max_len), "truncation": config.layout.truncation,
      "optimizer": {**{k: opt[k] for k in ("name", "weight_decay", "grad_clip_norm")},
                    **{k: opt.adam[k] for k in ("b1", "b2", "eps")}},
      "devices": jax.device_count(), "version": _CACHE_VERSION,
  }


# ---------------------------------------------------------------------------------------------
# The objective (pure functions).


def mask_tokens(tokens: jax.Array, key: jax.Array, *, mask_rate: float, max_predictions: int,
                vocab_size: int):
  """BERT's corruption of a batch of token ids (0 = padding).

  Returns (inputs int [B, L]: the ids with the random replacements; mask_input bool [B, L]:
  True where the input is the [MASK] vector; positions int [B, K]; targets int [B, K]: the
  original ids there; weights float32 [B, K]: 1 for the predictions that count). Per row,
  round(mask_rate * real tokens) positions are predicted (at least 1 if the row has a token, at
  most K = max_predictions), chosen uniformly among its real tokens; the other K slots point at
  positions that are not corrupted and have weight 0.
  """
  batch, length = tokens.shape
  k = int(max_predictions)
  real = tokens != 0
  select_key, action_key, random_key = jax.random.split(key, 3)
  # Real tokens sort first, in random order; padding after them.
  scores = jnp.where(real, jax.random.uniform(select_key, (batch, length)), 2.0)
  _, positions = jax.lax.top_k(-scores, k)
  n_real = jnp.sum(real, axis=1)
  n_predict = jnp.minimum(jnp.maximum(jnp.round(mask_rate * n_real).astype(jnp.int32),
                                      (n_real > 0).astype(jnp.int32)), jnp.minimum(n_real, k))
  weights = jnp.arange(k)[None, :] < n_predict[:, None]
  targets = jnp.take_along_axis(tokens, positions, axis=1)
  action = jax.random.uniform(action_key, (batch, k))
  use_mask = weights & (action < MASK_FRACTION)
  use_random = weights & (action >= MASK_FRACTION) & (action < MASK_FRACTION + RANDOM_FRACTION)
  random_ids = jax.random.randint(random_key, (batch, k), tokenizer_lib.NUM_RESERVED,
                                  vocab_size, dtype=tokens.dtype)
  rows = jnp.arange(batch)[:, None]
  inputs = tokens.at[rows, positions].set(jnp.where(use_random, random_ids, targets))
  mask_input = jnp.zeros((batch, length), bool).at[rows, positions].set(use_mask)
  return inputs, mask_input, positions, targets, weights.astype(jnp.float32)


def mlm_train_step(state, batch: dict, *, mask_rate: float, max_predictions: int,
                   vocab_size: int):
  """One optimiser step of the masked-language-model loss (mean over the predicted tokens).
  `state` is a train.TrainState of the classifier; the masking and dropout keys come from
  fold_in(state.dropout_key, step). Metrics are sums, as train_step's."""
  step_key = jax.random.fold_in(jax.random.wrap_key_data(state.dropout_key), state.step)
  mask_key, dropout_key = jax.random.split(step_key)
  tokens = batch["inputs"]
  inputs, mask_input, positions, targets, weights = mask_tokens(
      tokens, mask_key, mask_rate=mask_rate, max_predictions=max_predictions,
      vocab_size=vocab_size)

  def loss_fn(params):
    logits = state.apply_fn({"params": params}, inputs, train=True, padding_mask=tokens != 0,
                            rngs={"dropout": dropout_key}, mlm_positions=positions,
                            mask_input=mask_input)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets) * weights
    return jnp.sum(losses) / jnp.maximum(jnp.sum(weights), 1.0), (losses, logits)

  grads, (losses, logits) = jax.grad(loss_fn, has_aux=True)(state.params)
  state = state.apply_gradients(grads=grads)
  metrics = {
      "loss_sum": jnp.sum(losses),
      "correct": jnp.sum((jnp.argmax(logits, -1) == targets) * weights),
      "count": jnp.sum(weights),
      "nonfinite": jnp.sum(~jnp.isfinite(losses)).astype(jnp.int32),
  }
  return state, metrics


# ---------------------------------------------------------------------------------------------
# Parameters in and out.


def encoder_params(params) -> dict:
  """The parameters the classifier shares with the pretraining model: embedding (without the
  [MASK] vector), encoder blocks and the pre-LN final norm; the MLM head is dropped."""
  shared = {k: v for k, v in params.items() if not k.startswith("mlm_")}
  if "embedding" in shared:
    shared["embedding"] = {k: v for k, v in shared["embedding"].items() if k != "mask"}
  return shared


def _load(path: str):
  def read(path):
    with np.load(path, allow_pickle=False) as archive:
      params = {k[len("param:"):]: archive[k] for k in archive.files if k.startswith("param:")}
      curve = json.loads(str(archive["curve"]))
    return unflatten(params), curve
  return data_lib.read_cache(path, "pretraining", read)


def _host(x) -> np.ndarray:
  """A replicated (possibly multi-process) array as a NumPy array."""
  return np.asarray(x.addressable_data(0))


# ---------------------------------------------------------------------------------------------
# The pretraining run.


def pretrain(config, tokenizer, vocab_size: int, *, write: bool = True):
  """Pretrained encoder parameters (nested dict of NumPy arrays, as `encoder_params`) and the
  training curve (a list of {"step", "pretrain/loss", "pretrain/accuracy", ...} rows), from the
  cache or trained now."""
  validate_config(config)
  p = config.pretrain
  key_settings = settings(config)
  path = data_lib.source_cache_path(
      config, "mlm", {"tokenizer": tokenizer.fingerprint(), "vocab_size": int(vocab_size),
                      "settings": key_settings}, ".npz", write=write)
  cached = _load(path) if path else None
  if jax.process_count() > 1:
    # Every process must take the same branch (pretraining steps are collective): pretrain
    # unless every process found the cache (caches may be per host). Deterministic, so a
    # process that had it computes the same parameters again.
    from jax.experimental import multihost_utils
    if not np.all(multihost_utils.process_allgather(np.int32(cached is not None))):
      cached = None
  if cached is not None:
    logging.info("Loaded the pretrained encoder from %s.", path)
    print(f"Pretrained encoder (masked language model, {p.num_steps} steps) read from the "
          f"cache {path}.", flush=True)
    return cached

  inputs, cacheable = corpus(config, tokenizer)
  will_cache = bool(write and cacheable and path)
  if will_cache and jax.process_index() == 0:
    print(f"The pretrained encoder will be cached in {path} for later runs.", flush=True)
  params, curve = train_encoder(config, inputs, vocab_size)
  if will_cache:
    arrays = {f"param:{name}": value for name, value in flatten(params).items()}
    try:
      data_lib.atomic_write(
          path, lambda f: np.savez(f, curve=np.asarray(json.dumps(curve)), **arrays), "wb")
    except OSError as e:  # A read-only or full cache dir must not stop training.
      logging.warning("Could not write the pretraining cache %s (%s).", path, e)
  return params, curve


def corpus(config, tokenizer) -> tuple[np.ndarray, bool]:
  """The pretraining texts encoded as the classifier's inputs (int [N, max_len], empty texts
  dropped) and whether they may be cached (see data_lib.pretraining_texts)."""
  p = config.pretrain
  texts, cacheable = data_lib.pretraining_texts(config, p.unlabeled_split,
                                                      "pretrain.unlabeled_split")
  inputs = tokenizer.encode(texts, config.max_len, config.layout.truncation)
  return inputs[(inputs != 0).any(axis=1)], cacheable


def train_encoder(config, inputs: np.ndarray, vocab_size: int):
  """Pretrains the encoder of `config`'s classifier on the encoded texts `inputs` (int [N, L])
  with the training loop; returns (encoder parameters as NumPy arrays, curve). Not cached: see
  `pretrain`."""
  p = config.pretrain
  if len(inputs) < p.batch_size:
    raise data_lib.DataError(
        f"the pretraining corpus has {len(inputs)} non-empty text(s), fewer than one batch of "
        f"config.pretrain.batch_size={p.batch_size}; lower it or add text.")
  corpus = data_lib.Split(inputs, np.zeros(len(inputs), np.int32))
  if jax.process_index() == 0:
    print(f"Pretraining the encoder as a masked language model: {len(corpus):,} texts "
          f"({int((inputs != 0).sum()):,} tokens), {p.num_steps} steps of {p.batch_size} "
          f"({p.num_steps * p.batch_size / len(corpus):.2f} epochs).", flush=True)
  model = models.build_model(config, num_classes=2, vocab_size=vocab_size)
  opt = copy.deepcopy(config.optimizer)
  with opt.unlocked():
    opt.learning_rate, opt.warmup_steps, opt.schedule = (p.learning_rate, p.warmup_steps,
                                                         "cosine")
  tx = optim.make_optimizer(opt, p.num_steps)
  k = int(p.max_predictions)

  def init(rng):
    params_rng, dropout_rng = jax.random.split(rng)
    dummy = jnp.ones((1, config.max_len), jnp.int32)
    params = model.init({"params": params_rng}, dummy, mlm_positions=jnp.zeros((1, k), jnp.int32),
                        mask_input=jnp.zeros((1, config.max_len), bool))["params"]
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx,
                                  dropout_key=jax.random.key_data(dropout_rng))

  replicated = platform.replicated(platform.run_mesh())  # (data parallel: no mesh.sequence)
  abstract = jax.eval_shape(init, jax.random.key(p.seed))
  state = jax.jit(init, out_shardings=jax.tree.map(lambda _: replicated, abstract))(
      jax.random.key(p.seed))
  batches = data_lib.TrainIterator(corpus, p.batch_size, p.seed, jax.process_index(),
                                   jax.process_count())
  train_step = lambda s, b: mlm_train_step(s, b, mask_rate=p.mask_rate, max_predictions=k,
                                           vocab_size=vocab_size)
  schedule = loop.Schedule(p.num_steps, config.log_every_steps or 100, batch_size=p.batch_size,
                           prefix="pretrain",
                           compiler_options=platform.step_compiler_options(config))
  result = loop.fit(state, train_step, batches, schedule, loop.Hooks(recovery=loop.Recovery(
      advice=lambda: ("Nothing was cached. Try a lower config.pretrain.learning_rate or "
                      "config.optimizer.grad_clip_norm > 0."))))
  curve = [row for row in result.history if "pretrain/loss" in row]
  return jax.tree.map(_host, encoder_params(result.state.params)), curve


def write_curve(workdir: str, curve: list[dict]) -> None:
  """DIR/pretrain.jsonl: one row per logged pretraining window."""
  data_lib.atomic_write(os.path.join(workdir, "pretrain.jsonl"),
                              lambda f: f.write("".join(json.dumps(r) + "\n" for r in curve)))
