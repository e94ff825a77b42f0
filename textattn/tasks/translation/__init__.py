"""The translation task: pairs -> Seq2Seq -> fit -> test report (token accuracy, BLEU, chrF).

For a config from `defaults.translation()` (config.py): reads the pairs (textattn/data/pairs.py), splits
them, builds word vocabularies of the training pairs (saved in the workdir as
source_tokenizer.json / target_tokenizer.json and reused from it), and trains
`seq2seq.Seq2Seq` with teacher forcing on the runner (textattn/run.py: the one loop, the same
checkpoints, run contract and exact resume, the workdir lock, data parallelism). Each example
is one packed int32 row [source_len + target_len + 1]: the source ids, then [start] w1 ... [end]
(so batches, shardings and resume are every task's). `textattn.load(workdir)` gives a
translate.Translator (.translate).

Metrics (train, validation, test): masked token cross-entropy and next-token accuracy over the
real target positions (the chapter's 67% is this accuracy on validation). The test report adds
sacreBLEU's BLEU and chrF of greedy and beam-search translations of the test split against its
standardised references (lower case, punctuation stripped, as the chapter's text), with
sacreBLEU's signatures.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from textattn import data as data_lib
from textattn import decoding, platform, restore, tasks
from textattn import progress as progress_lib
from textattn.data import pairs as pairs_lib
from textattn.data import tokenizer as tokenizer_lib
from textattn.data.splits import DataError, Dataset, Split
from textattn.data.tfds_source import tfds_data_dir
from textattn.errors import UsageError
from textattn.models import seq2seq
from textattn.models.layers import DTYPES
from textattn.tasks.translation.config import defaults, validate

SOURCE_TOKENIZER, TARGET_TOKENIZER = "source_tokenizer.json", "target_tokenizer.json"
# What the tokenizers were counted on: the training pairs (sha256) and the vocabulary settings.
TOKENIZERS_COUNTED_ON = "tokenizers_counted_on.json"


def _counted_on(config, pairs, train_rows) -> dict:
  digest = hashlib.sha256()
  for i in train_rows:
    digest.update(f"{pairs.sources[i]}\t{pairs.targets[i]}\n".encode())
  return {"train_pairs": digest.hexdigest(), "tokenizer": config.tokenizer,
          "source_vocab": int(config.source_vocab), "target_vocab": int(config.target_vocab)}


def _check_counted_on(workdir: str, record: str, counted_on: dict) -> None:
  """Tokenizers counted on other training pairs or vocabulary sizes (a run that stopped before
  its first checkpoint, then another data_seed, split_by or file) are refused on a fresh start
  (data_lib.refuse_other_training_data); tokenizers saved before the record pass."""
  if os.path.exists(record):
    with open(record, encoding="utf-8") as f:
      data_lib.refuse_other_training_data(workdir, json.load(f), counted_on,
                                          "pair of tokenizers",
                                          "pairs file, split or vocabulary size")


class Packed(nn.Module):
  """Seq2Seq over packed rows: inputs [B, S + T + 1] -> logits [B, T, vocab] for targets[:, 1:];
  or over (sources [B, s], targets [B, t + 1]) cut to a batch's width (`trim`)."""
  model: seq2seq.Seq2Seq

  def __call__(self, inputs, targets=None, *, train: bool = False, token_embeddings=None):
    del token_embeddings
    if targets is None:
      inputs, targets = inputs[:, :self.model.source_len], inputs[:, self.model.source_len:]
    return self.model(inputs, targets[:, :-1], train=train)


BUCKET = 4  # batch widths are multiples of this (a few shapes to compile)


def lengths(inputs: np.ndarray, source_len: int) -> np.ndarray:
  """Per packed row, the width it needs: max(source tokens, target tokens - 1)."""
  source = np.count_nonzero(inputs[:, :source_len], axis=1)
  target = np.count_nonzero(inputs[:, source_len:], axis=1) - 1
  return np.maximum(source, target)


def trimmer(source_len: int, target_len: int):
  """trim(batch, width) -> {"sources" [B, w], "targets" [B, w' + 1], ...}: the packed rows split
  and cut to `width` rounded up to a multiple of BUCKET (None: uncut). The cut columns are
  padding in every row of the global batch, which the model masks: same logits, same sums."""
  def trim(batch, width):
    inputs = batch.pop("inputs")
    w = max(source_len, target_len) if width is None else -(-max(width, 1) // BUCKET) * BUCKET
    batch["sources"] = inputs[:, :min(w, source_len)]
    batch["targets"] = inputs[:, source_len:source_len + min(w, target_len) + 1]
    batch.pop("labels", None)
    return batch
  return trim


def build_model(config, source_vocab: int, target_vocab: int,
                mesh: jax.sharding.Mesh | None = None) -> seq2seq.Seq2Seq:
  """The config's Seq2Seq; `mesh`: the run's, for training with sequence parallelism (None:
  one device's, as decoding uses)."""
  m = config.model
  return seq2seq.Seq2Seq(
      source_vocab=source_vocab, target_vocab=target_vocab, source_len=config.source_len,
      target_len=config.target_len, embed_dim=m.embed_dim, num_heads=m.num_heads,
      ffn_dim=m.ffn_dim, encoder_layers=m.encoder_layers, decoder_layers=m.decoder_layers,
      encoder_attention=m.encoder_attention, decoder_attention=m.decoder_attention,
      dropout_rate=m.dropout_rate, output_dropout_rate=m.output_dropout_rate,
      head_dim=m.head_dim or None, share_embeddings=m.share_embeddings,
      tie_output=m.tie_output,
      mesh=mesh if config.mesh.sequence > 1 else None,
      dtype=DTYPES[m.dtype])


def load_tokenizers(workdir: str):
  """(source, target): the tokenizers a translation run saved in `workdir`."""
  loaded = []
  for name in (SOURCE_TOKENIZER, TARGET_TOKENIZER):
    with open(os.path.join(workdir, name), encoding="utf-8") as f:
      loaded.append(tokenizer_lib.from_json(f.read()))
  return tuple(loaded)


def load_data(config, workdir: str, write: bool = True):
  """(Dataset of packed rows, source tokenizer, target tokenizer, test references)."""
  if config.dataset.startswith(pairs_lib.TFDS_PREFIX):  # the set's own splits
    pairs, rows = pairs_lib.concatenate(pairs_lib.read_tfds_pairs(
        config.dataset[len(pairs_lib.TFDS_PREFIX):], config.source_field, config.target_field,
        tfds_data_dir(config)), config.data_seed)
  else:
    pairs = pairs_lib.read_pairs(config.dataset, config.source_field, config.target_field)
    rows = pairs_lib.split_indices(pairs, config.data_seed, config.split_by == "source")
  if any(len(rows[s]) == 0 for s in pairs_lib.SPLITS):
    raise DataError(f"{config.dataset}: {len(pairs.sources)} pairs are too few for a train / "
                    f"validation / test split.")
  saved = [os.path.join(workdir, name) for name in (SOURCE_TOKENIZER, TARGET_TOKENIZER)]
  counted_on = _counted_on(config, pairs, rows["train"])
  record = os.path.join(workdir, TOKENIZERS_COUNTED_ON)
  if all(os.path.exists(p) for p in saved):
    _check_counted_on(workdir, record, counted_on)
    source_tok, target_tok = load_tokenizers(workdir)
    if source_tok.kind != config.tokenizer:
      raise DataError(f"{workdir} holds {source_tok.kind} tokenizers, the config asks for "
                      f"config.tokenizer={config.tokenizer!r}; use another --workdir.")
    shared = source_tok.to_json() == target_tok.to_json()
    if shared != config.shared_vocab:
      raise DataError(f"{workdir} holds {'one shared' if shared else 'separate'} "
                      f"vocabularies, the config asks for config.shared_vocab="
                      f"{config.shared_vocab}; use another --workdir.")
  else:
    source_tok, target_tok = pairs_lib.train_tokenizers(
        pairs, rows["train"], config.source_vocab, config.target_vocab, config.tokenizer,
        shared=config.shared_vocab)
    if write:
      data_lib.atomic_write(record, lambda f: json.dump(counted_on, f))
      for tok, path in zip((source_tok, target_tok), saved):
        data_lib.atomic_write(path, lambda f, t=tok: f.write(t.to_json()))
  splits = {}
  for name in pairs_lib.SPLITS:
    encoded = pairs_lib.encode_pairs(source_tok, target_tok, pairs, rows[name],
                                     config.source_len, config.target_len)
    packed = np.concatenate([encoded["sources"], encoded["targets"]], axis=1).astype(np.int32)
    if name == "validation":  # by length, so its batches cut the most padding (same sums)
      packed = packed[np.argsort(lengths(packed, config.source_len), kind="stable")]
    splits[name] = Split(packed, np.zeros(len(packed), np.int32))
  references = [reference_text(pairs_lib.standardize_target(pairs.targets[i]))
                for i in rows["test"]]
  dataset = Dataset(train=splits["train"], validation=splits["validation"], test=splits["test"],
                    class_names=[], vocab_size=target_tok.vocab_size)
  return dataset, source_tok, target_tok, references


def reference_text(standardized_target: str) -> str:
  words = standardized_target.split()
  return " ".join(w for w in words if w not in (pairs_lib.START, pairs_lib.END))


def _token_sums(logits, targets, weights=None, label_smoothing: float = 0.0):
  """Per-position losses (label-smoothed if asked), real-token weights and correct tokens."""
  labels = targets[:, 1:]
  real = (labels != 0).astype(jnp.float32)
  if weights is not None:
    real = real * weights[:, None]
  if label_smoothing:
    smooth = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1]), label_smoothing)
    losses = optax.softmax_cross_entropy(logits.astype(jnp.float32), smooth)
  else:
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
  correct = (jnp.argmax(logits, -1) == labels) * real
  return losses, real, correct


def train_step(state, batch):
  """Teacher forcing; sums over real target tokens (loss_sum, correct, count are per token)."""
  dropout_key = jax.random.fold_in(jax.random.wrap_key_data(state.dropout_key), state.step)
  targets = batch["targets"]

  def loss_fn(params):
    logits = state.apply_fn({"params": params}, batch["sources"], targets, train=True,
                            rngs={"dropout": dropout_key})
    losses, real, correct = _token_sums(logits, targets, label_smoothing=state.label_smoothing)
    loss = jnp.sum(losses * real) / jnp.maximum(jnp.sum(real), 1.0)
    return loss, (losses, real, correct)

  grads, (losses, real, correct) = jax.grad(loss_fn, has_aux=True)(state.params)
  state = state.apply_gradients(grads=grads)
  return state, {
      "loss_sum": jnp.sum(losses * real), "correct": jnp.sum(correct),
      "count": jnp.sum(real),
      "grad_norm_sum": optax.global_norm(grads), "steps": jnp.asarray(1, jnp.int32),
      "nonfinite": (jnp.sum(~jnp.isfinite(losses) * real) + sum(
          jnp.sum(~jnp.isfinite(p)) for p in jax.tree_util.tree_leaves(state.params))
      ).astype(jnp.int32)}


def eval_step(state, batch):
  logits = state.apply_fn({"params": state.params}, batch["sources"], batch["targets"],
                          train=False)
  losses, real, correct = _token_sums(logits, batch["targets"], batch["weights"])
  return {"loss_sum": jnp.sum(losses * real), "correct": jnp.sum(correct), "count": jnp.sum(real)}


def make_evaluator(state_sharding, eval_batch_size: int, source_len: int, target_len: int,
                   options=None, mesh=None):
  """evaluate(state, split, prefix) -> token loss/accuracy/count over the split; each global
  batch cut to its own width (a split sorted by length, as validation is, cuts the most) and
  laid out on `mesh` (the run's; None: data parallelism over all devices)."""
  mesh = mesh if mesh is not None else platform.run_mesh()
  jitted = {}

  def compiled(state, batch):
    shapes = tuple((key, batch[key].shape) for key in sorted(batch))
    if shapes not in jitted:
      jitted[shapes] = jax.jit(
          eval_step, in_shardings=(state_sharding, platform.batch_shardings(mesh, batch)),
          out_shardings=platform.replicated(mesh), compiler_options=options)
    return jitted[shapes](state, batch)

  trim = trimmer(source_len, target_len)

  def evaluate(state, split, prefix):
    totals = None
    widths = lengths(split.inputs, source_len)
    countdown = progress_lib.Countdown(prefix, len(split), jax.process_index() == 0)
    for index, batch in enumerate(data_lib.eval_batches(split, eval_batch_size,
                                                        *platform.row_block(mesh))):
      width = int(widths[index * eval_batch_size:(index + 1) * eval_batch_size].max())
      sums = compiled(state, platform.to_global(trim(batch, width), mesh))
      totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
      countdown.update((index + 1) * eval_batch_size, totals)
    totals = jax.device_get(totals)
    count = max(float(totals["count"]), 1.0)
    return {f"{prefix}/loss": float(totals["loss_sum"]) / count,
            f"{prefix}/accuracy": float(totals["correct"]) / count,
            f"{prefix}/tokens": int(totals["count"])}

  return evaluate


def translate_ids(seq2seq_model, params, sources: np.ndarray, target_tok, batch_size: int,
                  beam_size: int = 0, alpha: float = 0.6, progress: str = "") -> list[str]:
  """Translations (standardised words, no [start]/[end]) of source id rows; `progress`: a name
  under which a long decoding prints a progress line every progress.EVAL_PROGRESS_EVERY_S."""
  start_id = target_tok.token_id(pairs_lib.START)
  end_id = target_tok.token_id(pairs_lib.END)
  if beam_size:
    search = jax.jit(lambda p, s: decoding.beam_search(seq2seq_model, p, s, start_id, end_id,
                                                       beam_size, alpha)[0])
  else:
    search = jax.jit(lambda p, s: decoding.greedy_decode(seq2seq_model, p, s, start_id, end_id))
  # Batches of similar source length end decoding at about the same step (the search stops
  # when its whole batch has ended); outputs go back to the input order.
  order = np.argsort(np.count_nonzero(sources, axis=1), kind="stable")
  out = [""] * len(sources)
  countdown = progress_lib.Countdown(progress, len(sources),
                                    bool(progress) and jax.process_index() == 0)
  for begin in range(0, len(sources), batch_size):
    rows = order[begin:begin + batch_size]
    padded = np.zeros((batch_size, sources.shape[1]), np.int32)
    padded[:len(rows)] = sources[rows]
    for i, row in zip(rows, np.asarray(search(params, padded))[:len(rows)]):
      out[i] = target_tok.decode([t for t in row if t != end_id])
    countdown.update(begin + len(rows))
  return out


def bleu_chrf(hypotheses: list[str], references: list[str]) -> dict:
  import sacrebleu
  bleu = sacrebleu.metrics.BLEU()
  chrf = sacrebleu.metrics.CHRF()
  return {"bleu": bleu.corpus_score(hypotheses, [references]).score,
          "chrf": chrf.corpus_score(hypotheses, [references]).score,
          "bleu_signature": str(bleu.get_signature()),
          "chrf_signature": str(chrf.get_signature())}


def prepare(config, workdir: str, is_main: bool) -> tasks.Job:
  data, source_tok, target_tok, references = load_data(config, workdir, write=is_main)
  model = build_model(config, source_tok.vocab_size, target_tok.vocab_size)  # (decoding's)
  mesh = platform.config_mesh(config)
  packed = Packed(build_model(config, source_tok.vocab_size, target_tok.vocab_size, mesh))
  train_iter = data_lib.TrainIterator(
      data.train, config.batch_size, config.seed, *platform.row_block(mesh),
      lengths=lengths(data.train.inputs, config.source_len), length_pool=config.length_pool,
      trim=trimmer(config.source_len, config.target_len))
  evaluator = None

  def evaluate(state, split, prefix):
    nonlocal evaluator
    if evaluator is None:
      evaluator = make_evaluator(jax.tree.map(lambda _: platform.replicated(mesh), state),
                                 config.platform.eval_batch_size, config.source_len, config.target_len,
                                 platform.step_compiler_options(config), mesh)
    return evaluator(state, split, prefix), None

  def report(state, report_step, reused):
    del report_step, reused
    return _test_report(config, state, evaluate, data, model, target_tok, references, workdir,
                        is_main)

  def describe(params):
    count = sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(params))
    return (f"Model: {config.model.encoder_attention} encoder, {config.model.decoder_attention} "
            f"decoder, {count:,} parameters; {len(data.train):,} / {len(data.validation):,} / "
            f"{len(data.test):,} pairs")

  return tasks.Job(data=data, module=packed, init_length=config.source_len + config.target_len + 1,
                 train_iter=train_iter, train_step=train_step, evaluate=evaluate, report=report,
                 describe=describe)


def _test_report(config, state, evaluate, data, model, target_tok, references, workdir,
                 is_main) -> dict:
  """Test token metrics and BLEU/chrF (greedy, beam) of `state`; writes
  test_translations.jsonl."""
  report, _ = evaluate(state, data.test, "test")
  sources = data.test.inputs[:, :config.source_len]
  params = jax.device_get(state.params)["model"]
  outputs = {}
  for name, beam in [("greedy", 0)] + ([(f"beam{config.beam_size}", config.beam_size)]
                                       if config.beam_size else []):
    started = time.perf_counter()  # (compilation included: what a user waits for)
    outputs[name] = translate_ids(model, params, sources, target_tok, config.platform.eval_batch_size,
                                  beam, config.length_penalty, progress=f"test {name}")
    report[f"test/decode_seconds_{name}"] = time.perf_counter() - started
  for name, hypotheses in outputs.items():
    scores = bleu_chrf(hypotheses, references)
    report[f"test/bleu_{name}"], report[f"test/chrf_{name}"] = scores["bleu"], scores["chrf"]
    report["test/bleu_signature"], report["test/chrf_signature"] = (scores["bleu_signature"],
                                                                    scores["chrf_signature"])
  if is_main:
    lines = "".join(json.dumps({"reference": reference, **{k: v[i] for k, v in outputs.items()}},
                               ensure_ascii=False) + "\n" for i, reference in enumerate(references))
    data_lib.atomic_write(os.path.join(workdir, "test_translations.jsonl"),
                          lambda f: f.write(lines))
  return report


class Translator:
  """What textattn.load(workdir) gives for a translation workdir: `.translate(texts, beam)`."""

  def __init__(self, workdir: str, checkpoint: str, config):
    self.config = config
    self.source_tokenizer, self.target_tokenizer = load_tokenizers(workdir)
    self.model = build_model(config, self.source_tokenizer.vocab_size,
                             self.target_tokenizer.vocab_size)
    length = config.source_len + config.target_len + 1
    self.step, params = restore.restore_params(workdir, checkpoint, config, Packed(self.model),
                                               length)
    self.params = params["model"]

  def translate(self, texts: list[str], beam: int = 0) -> list[str]:
    """Each text's translation; "" for a text with no word once standardised (e.g. "?!": the
    decoder would otherwise invent a sentence from an empty source). A text longer than
    config.source_len words is translated from its first source_len (`cut` counts them)."""
    if beam >= self.target_tokenizer.vocab_size:  # (its buffers: beam x vocabulary a step)
      raise UsageError(f"--beam={beam} is wider than the target vocabulary "
                       f"({self.target_tokenizer.vocab_size} ids); beams of 1-10 are usual.")
    standardized = [pairs_lib.standardize_source(t) for t in texts]
    sources = self.source_tokenizer.encode(standardized, self.config.source_len, "post",
                                           standardized=True)
    outputs = translate_ids(self.model, self.params, sources, self.target_tokenizer,
                            int(self.config.platform.eval_batch_size), beam,
                            float(self.config.length_penalty))
    return [output if text.split() else "" for text, output in zip(standardized, outputs)]

  def cut(self, texts: list[str]) -> int:
    """How many texts have more words than the model reads (config.source_len)."""
    return sum(len(pairs_lib.standardize_source(t).split()) > self.config.source_len
               for t in texts)


tasks.register(tasks.Task(
    name="translation", defaults=defaults, validate=validate, prepare=prepare,
    load=Translator, description="sequence-to-sequence translation (textattn/tasks/translation.py)"))
