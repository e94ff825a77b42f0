"""Attention transfer (issue 55): train a pretrained encoder's new attention to reproduce its
softmax attention, layer by layer, before fine-tuning (Hedgehog, Zhang et al. 2024; LoLCATs'
first stage, arXiv 2410.10254).

The teacher is a frozen softmax BERT-family encoder (bert.BertClassifier's parameters); the
student is the same encoder with another attention variant (`config.model.attention`), started
from the teacher's weights where names and shapes match (textattn/pretrained/finetune.py). For
each layer l the teacher's hidden state h_l entering block l is computed once per batch (the
teacher's embeddings and blocks, dropout off); the teacher's attention output a_l = A_l(h_l) and
the student's s_l = A'_l(h_l), both before the residual and LayerNorm, are compared:

    loss = sum_l mean over real positions and features of (s_l - a_l)^2

Every layer sees the teacher's own input, so the layers train independently (LoLCATs' "layer-wise
attention transfer"), and the loss is exactly 0 when the student is the teacher (softmax into
softmax). What trains (`trainable`): the student attention's parameters the teacher does not have
(a feature map, a hybrid's mix, additive attention's alpha/beta) and, by default, its output
projection "out" ("new", "new+out", "new+out+qk": queries and keys too); everything else is
frozen (optax.masked: no update, no optimizer state). "block" instead trains each whole block
(attention, feed-forward, LayerNorms) to reproduce the teacher block's output h_{l+1} from h_l,
the same loss over the block's output (MOHAWK's hidden-state alignment, Bick et al. 2024): the
feed-forward can then adapt to what the new attention can and cannot express.

In a run (`config.attention_transfer.num_steps > 0` with `config.model.pretrained`): a fresh
start's encoder parameters are the checkpoint's (finetune.start_params) plus the student's new
ones, initialised from `config.seed`; `run_stage` then trains them for `num_steps` steps of
`config.batch_size` of the run's own training texts (shuffled by `config.seed`; never validation
or test) with Adam at `learning_rate` (constant, or cosine-decayed to 0 with schedule="cosine"),
and the fine-tuning starts from the result. The per-layer
losses (and relative errors, and the seconds since the stage began) go to
DIR/attention_transfer.jsonl. The stage is deterministic: a run killed during it
repeats it exactly when restarted; a run killed later resumes from its checkpoint and never
repeats it. The config's `attention_transfer` fields join the run contract (config.json).

With a fine-tuned teacher, the fine-tuning can also distil its predictions (`distill` > 0:
Hinton et al.'s loss, classification/step.py), which it gives the training split once
(TEACHER_FILE in the workdir).
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from textattn import attention as attention_lib
from textattn.checks import check_choice, check_integer, check_number
from textattn.data import atomic_write
from textattn.errors import UsageError
from textattn.models import bert, encoder
from textattn.pretrained import hf

TRAINS = ("new", "new+out", "new+out+qk", "block")
SCHEDULES = ("constant", "cosine")


CURVE_FILE = "attention_transfer.jsonl"
# The teacher's log-probabilities of the training split, and which teacher (its real path) gave them
TEACHER_FILE = "teacher_log_probs.npz"


def default_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.num_steps = 0  # 0: no transfer stage (e.g. 300)
  c.learning_rate = 1e-2  # (1e-3 imitated the teacher more slowly: RESULTS §31)
  # "constant", or "cosine": the rate decays to 0 over num_steps (a 600-step additive stage
  # diverged at step 325 at a constant 1e-2: RESULTS §31).
  c.schedule = "constant"
  c.train = "new+out"  # TRAINS ("block": whole blocks, matching their outputs)
  c.log_every_steps = 25
  # Hedgehog's loss beside the outputs' (0: off): this times the cross-entropy between each
  # layer's softmax attention weights and the student's (linear attention's normalised
  # phi(q).phi(k)), for students that have weights (the linear family).
  c.weights_loss = 0.0
  # "": the teacher is the pretrained checkpoint (config.model.pretrained); or the workdir of a
  # finished softmax classifier fine-tuned from that checkpoint on this task (Hedgehog's GLUE
  # teacher): its best checkpoint is the teacher, and the student starts from all its weights
  # (encoder and head), not the raw checkpoint's.
  c.teacher = ""
  # Distillation during the fine-tuning that follows the stage (0: off): each training example's
  # loss is (1 - distill) x cross-entropy + distill x T^2 KL(teacher || student) at temperature
  # T = distill_temperature (Hinton et al. 2015), the teacher's predictions (the finished
  # softmax run `teacher`, so it needs one) computed once over the training split and kept in
  # the workdir (TEACHER_FILE).
  c.distill = 0.0
  c.distill_temperature = 2.0
  return c


# The variants whose attention weights the weights loss can match: bidirectional linear
# attention records its features phi(q), phi(k) (a causal student's weights would need the
# causal mask on both sides; window and hybrid variants record none).
WEIGHTS_VARIANTS = ("linear",)


def enabled(config) -> bool:
  return "attention_transfer" in config and config.attention_transfer.num_steps > 0


def validate_config(config) -> None:
  """One sentence naming the first bad field."""
  if "attention_transfer" not in config:
    return
  part = config.attention_transfer
  check_integer("attention_transfer.num_steps", part.num_steps, 0)
  check_integer("attention_transfer.log_every_steps", part.log_every_steps, 1)
  check_choice("attention_transfer.train", part.train, TRAINS)
  check_choice("attention_transfer.schedule", part.schedule, SCHEDULES)
  check_number("attention_transfer.learning_rate", part.learning_rate, lambda x: x > 0,
               "a positive number")
  check_number("attention_transfer.weights_loss", part.weights_loss, lambda x: x >= 0,
               "a number >= 0 (0: match the attention outputs only)")
  if part.weights_loss and part.train == "block":
    raise UsageError(f"config.attention_transfer.weights_loss={part.weights_loss} matches "
                     f"attention weights, and train='block' matches the blocks' outputs; set "
                     f"weights_loss=0, or another train.")
  if part.weights_loss and config.model.attention not in WEIGHTS_VARIANTS:
    raise UsageError(f"config.attention_transfer.weights_loss={part.weights_loss} matches "
                     f"attention weights over all keys, which only "
                     f"{', '.join(map(repr, WEIGHTS_VARIANTS))} attention exposes (its feature "
                     f"maps); {config.model.attention!r} has none to match: set weights_loss=0.")
  if not isinstance(part.teacher, str):
    raise UsageError(f"config.attention_transfer.teacher={part.teacher!r} must be a workdir path, "
                     f"or '' for the pretrained checkpoint.")
  if part.teacher and not part.num_steps:
    raise UsageError(f"config.attention_transfer.teacher={part.teacher!r} is read only by the "
                     f"transfer stage, which num_steps=0 turns off; set "
                     f"config.attention_transfer.num_steps (e.g. 200), or teacher=''.")
  check_number("attention_transfer.distill", part.distill, lambda x: 0 <= x <= 1,
               "a number in [0, 1] (the distillation loss's share; 0: off)")
  check_number("attention_transfer.distill_temperature", part.distill_temperature,
               lambda x: 0 < x < float("inf"), "a positive number")
  if part.distill and not part.teacher:
    raise UsageError(f"config.attention_transfer.distill={part.distill} distils a fine-tuned "
                     f"softmax run's predictions, and teacher='' names none; set "
                     f"config.attention_transfer.teacher to its workdir, or distill=0.")
  if part.num_steps and not config.model.pretrained:
    raise UsageError(f"config.attention_transfer.num_steps={part.num_steps} trains a pretrained "
                     f"encoder's new attention to imitate its softmax attention; set "
                     f"config.model.pretrained, or num_steps=0.")


def layer_inputs(config: bert.BertConfig, teacher_params, tokens, padding_mask):
  """[h_0, ..., h_L]: the teacher's hidden state entering each block, then the last block's
  output (dropout off)."""
  c = config
  x = bert.BertEmbeddings(c).apply({"params": teacher_params["encoder"]["embeddings"]}, tokens,
                                   jnp.zeros_like(tokens), deterministic=True)
  inputs = []
  for i in range(c.num_layers):
    inputs.append(x)
    x = bert.BertBlock(c, "softmax", "xla").apply(
        {"params": teacher_params["encoder"][f"block_{i}"]}, x, padding_mask, deterministic=True)
  return inputs + [x]


def _attention(config: bert.BertConfig, name: str, implementation: str,
               options: tuple[tuple[str, Any], ...] = ()):
  return attention_lib.get(name).build(num_heads=config.num_heads,
                                       implementation=implementation, **dict(options))


def weights_cross_entropy(query, key, fq, fk, padding_mask):
  """Mean over real query positions and heads of -sum_j A_tj log B_tj: A the softmax weights of
  query . key / sqrt(d), B the student's phi(q).phi(k) normalised over the real keys (Hedgehog's
  attention-weight loss). query/key [b, l, h, d], fq/fk [b, l, h, f], padding_mask [b, l]."""
  keys = padding_mask.astype(bool)[:, None, None, :]
  scores = jnp.einsum("bthd,bihd->bhti", query.astype(jnp.float32), key.astype(jnp.float32))
  scores = jnp.where(keys, scores * query.shape[-1] ** -0.5, -jnp.inf)
  want = jnp.where(keys, jax.nn.softmax(jnp.where(jnp.any(keys, -1, keepdims=True), scores, 0.0),
                                        axis=-1), 0.0)
  # log B with a small floor on every real key's kernel (1e-6), so a query whose features meet
  # no key (a ReLU map's zeros) has a finite loss and finite gradients
  kernel = (jnp.einsum("bthf,bihf->bhti", fq.astype(jnp.float32), fk.astype(jnp.float32))
            + 1e-6) * keys
  log_got = jnp.log(jnp.where(keys, kernel, 1.0)) - jnp.log(
      jnp.sum(kernel, axis=-1, keepdims=True))
  rows = -jnp.sum(jax.lax.stop_gradient(want) * log_got, axis=-1)  # [b, h, t]
  real = padding_mask.astype(jnp.float32)[:, None, :]
  return jnp.sum(rows * real) / jnp.maximum(jnp.sum(real) * rows.shape[1], 1.0)


def transfer_loss(config: bert.BertConfig, student: str, student_params, teacher_params,
                  inputs, padding_mask, *, implementation: str = "xla",
                  options: tuple[tuple[str, Any], ...] = (), weights_loss: float = 0.0,
                  whole_block: bool = False):
  """(total, per-layer parts): the module docstring's loss plus `weights_loss` times each
  layer's weights_cross_entropy; parts (float32 [L] each): "layer" the output loss,
  "relative" it over the teacher's mean square output (1.0: no better than outputting zeros,
  comparable across layers and variants) and, with weights_loss > 0, "weights_ce". `inputs`:
  layer_inputs'. whole_block (train="block"): each block's output is compared, and "relative"
  is the loss over the mean square of the teacher block's change h_{l+1} - h_l (1.0: no better
  than passing its input through)."""
  if whole_block and weights_loss:
    raise ValueError("weights_loss matches attention weights; whole_block matches outputs only.")
  if weights_loss and student not in WEIGHTS_VARIANTS:
    raise UsageError(f"weights_loss={weights_loss} matches attention weights over all keys, "
                     f"which {student!r} attention does not expose; set weights_loss=0.")
  teacher_attention = _attention(config, "softmax", "xla")
  student_attention = _attention(config, student, implementation, options)
  student_block = bert.BertBlock(config, student, implementation, attention_options=options)
  real = padding_mask.astype(jnp.float32)[..., None]
  count = jnp.maximum(jnp.sum(real) * config.hidden_size, 1.0)
  mutable = ["intermediates"] if weights_loss else False
  losses, energies, entropies = [], [], []
  for i, h in enumerate(inputs[:config.num_layers]):
    block = f"block_{i}"
    if whole_block:
      got = student_block.apply({"params": student_params["encoder"][block]}, h, padding_mask,
                                deterministic=True)
      error = (got.astype(jnp.float32) - inputs[i + 1].astype(jnp.float32)) * real
      losses.append(jnp.sum(error * error) / count)
      change = (inputs[i + 1].astype(jnp.float32) - h.astype(jnp.float32)) * real
      energies.append(jnp.sum(change * change) / count)
      continue
    want = teacher_attention.apply(
        {"params": teacher_params["encoder"][block]["attention"]}, h, padding_mask,
        mutable=mutable)
    got = student_attention.apply(
        {"params": student_params["encoder"][block]["attention"]}, h, padding_mask,
        mutable=mutable)
    if weights_loss:
      (want, taught), (got, learnt) = want, got
      [(query, key)] = taught["intermediates"]["query_key"]
      [(fq, fk)] = learnt["intermediates"]["features"]
      entropies.append(weights_cross_entropy(query, key, fq, fk, padding_mask))
    error = (got.astype(jnp.float32) - jax.lax.stop_gradient(want).astype(jnp.float32)) * real
    losses.append(jnp.sum(error * error) / count)
    target = jax.lax.stop_gradient(want).astype(jnp.float32) * real
    energies.append(jnp.sum(target * target) / count)
  losses = jnp.stack(losses)
  parts = {"layer": losses, "relative": losses / jnp.maximum(jnp.stack(energies), 1e-30)}
  total = jnp.sum(losses)
  if weights_loss:
    parts["weights_ce"] = jnp.stack(entropies)
    total = total + weights_loss * jnp.sum(parts["weights_ce"])
  return total, parts


def trainable(student_params, teacher_params, train: str = "new+out"):
  """A pytree of bools like student_params: True where the stage trains (module docstring)."""
  check_choice("attention_transfer.train", train, TRAINS)
  if train == "block":  # every parameter of every block (new or not); nothing outside them
    return jax.tree_util.tree_map_with_path(
        lambda path, _: any(str(getattr(k, "key", k)).startswith("block_") for k in path),
        student_params)
  named = {"out"} | ({"query", "key"} if train == "new+out+qk" else set())
  teacher = {tuple(getattr(k, "key", k) for k in path): leaf.shape for path, leaf
             in jax.tree_util.tree_leaves_with_path(teacher_params)}

  def decide(path, leaf):
    keys = tuple(getattr(k, "key", k) for k in path)
    if "attention" not in keys:
      return False
    inside = keys[keys.index("attention") + 1:]
    if teacher.get(keys) != leaf.shape:
      return True  # new to the student (or reshaped): trains
    return train != "new" and bool(inside) and inside[0] in named
  return jax.tree_util.tree_map_with_path(decide, student_params)


def check_trains_something(mask_tree, train: str, attention: str) -> None:
  """A UsageError when `trainable`'s mask is all False: the stage would run its teacher and
  student passes and change nothing (train='new' for a variant with no parameters of its own,
  e.g. linear attention with the elu1 map)."""
  if not any(jax.tree.leaves(mask_tree)):
    raise UsageError(f"config.attention_transfer.train={train!r} trains nothing for "
                     f"{attention!r} attention: it has no parameters the softmax checkpoint "
                     f"lacks; use train='new+out' or 'new+out+qk' (or a learned feature map).")


def learning_rate(part) -> float | optax.Schedule:
  """The stage's Adam rate: config.attention_transfer's learning_rate, decayed by its schedule."""
  if part.schedule == "cosine":
    return optax.cosine_decay_schedule(float(part.learning_rate), part.num_steps)
  return float(part.learning_rate)


def make_step(config: bert.BertConfig, student: str, teacher_params, mask_tree,
              learning_rate: float | optax.Schedule, *, implementation: str = "xla",
              options: tuple[tuple[str, Any], ...] = (), weights_loss: float = 0.0,
              whole_block: bool = False):
  """(optimizer, step): step(student_params, opt_state, tokens, padding_mask) ->
  (student_params, opt_state, total, transfer_loss's per-layer parts), pure (jit it). Adam on
  the trainable leaves only; the others are returned unchanged. whole_block: transfer_loss's."""
  tx = optax.masked(optax.adam(learning_rate), mask_tree)

  def step(student_params, opt_state, tokens, padding_mask):
    inputs = layer_inputs(config, teacher_params, tokens, padding_mask)
    loss = functools.partial(transfer_loss, config, student, teacher_params=teacher_params,
                             inputs=inputs, padding_mask=padding_mask,
                             implementation=implementation, options=options,
                             weights_loss=weights_loss, whole_block=whole_block)
    (total, parts), grads = jax.value_and_grad(lambda p: loss(student_params=p), has_aux=True)(
        student_params)
    grads = jax.tree.map(lambda g, m: g if m else jnp.zeros_like(g), grads, mask_tree)
    updates, opt_state = tx.update(grads, opt_state, student_params)
    return optax.apply_updates(student_params, updates), opt_state, total, parts
  return tx, step


def run_stage(config, model, pretrained, train_inputs, *, announce: bool, teacher_params=None):
  """({"encoder": the student's encoder parameters after the stage}, the curve rows): `model`
  the run's BertClassifier, `pretrained` the loaded checkpoint (hf.Pretrained), `train_inputs`
  the training split's token ids int32 [N, max_len] (0 = padding). `teacher_params`: a
  fine-tuned softmax classifier's parameters (config.attention_transfer.teacher's); then they
  are the teacher, the student starts from every one of them its model has (same name and
  shape), and the result holds the student's head too."""
  part, c, m = config.attention_transfer, pretrained.config, config.model
  length = config.max_len
  student = hf.init_params(model, pretrained,
                           jax.random.fold_in(jax.random.key(config.seed), 0x7a7), length)[0]
  if teacher_params is None:
    teacher_model = bert.BertClassifier(c, 2, pooling=m.pooling, attention="softmax",
                                        attention_impl="xla")
    teacher = hf.init_params(teacher_model, pretrained, jax.random.key(0), length)[0]
  else:
    teacher = jax.tree.map(np.asarray, teacher_params)
    wanted = hf.flatten(student)
    student = hf.unflatten({**wanted, **{
        name: value for name, value in hf.flatten(teacher).items()
        if name in wanted and tuple(np.shape(value)) == tuple(np.shape(wanted[name]))}})
  teacher, student = (jax.tree.map(jnp.asarray, p) for p in (teacher, student))
  mask_tree = trainable(student, teacher, part.train)
  check_trains_something(mask_tree, part.train, m.attention)
  if part.weights_loss and part.train not in ("new+out+qk", "block") and not any(
      t for path, t in jax.tree_util.tree_leaves_with_path(mask_tree)
      if "feature_map" in jax.tree_util.keystr(path)):
    raise UsageError(f"config.attention_transfer.weights_loss={part.weights_loss} would train "
                     f"nothing: the {m.attention} attention's feature map has no parameters; use "
                     f"a learned map (hedgehog, t2r) or attention_transfer.train=new+out+qk.")
  implementation = encoder.resolved_kernel(config, c)
  options = attention_lib.build_options(attention_lib.get(m.attention), m)
  tx, step = make_step(c, m.attention, teacher, mask_tree, learning_rate(part),
                       implementation=implementation, options=options,
                       weights_loss=float(part.weights_loss),
                       whole_block=part.train == "block")
  step = jax.jit(step)
  opt_state = tx.init(student)
  rng = np.random.default_rng(config.seed)
  order, at, batch = rng.permutation(len(train_inputs)), 0, config.batch_size
  curve, window, started = [], [], time.perf_counter()
  reference = " block's change" if part.train == "block" else "'s output"
  if announce:
    count = sum(int(np.size(x)) for x, t in zip(jax.tree.leaves(student),
                                                 jax.tree.leaves(mask_tree), strict=True) if t)
    what = "blocks'" if part.train == "block" else "attention"
    print(f"Attention transfer: {part.num_steps} steps training {count:,} {m.attention} "
          f"{what} parameters to imitate the softmax teacher ...", flush=True)
  for i in range(1, part.num_steps + 1):
    if at + batch > len(order):
      order, at = rng.permutation(len(train_inputs)), 0
    tokens = jnp.asarray(train_inputs[order[at:at + batch]], jnp.int32)
    at += batch
    student, opt_state, _, parts = step(student, opt_state, tokens, tokens != 0)
    window.append(jax.tree.map(np.asarray, parts))
    if i % part.log_every_steps == 0 or i == part.num_steps:
      mean = {key: np.mean([w[key] for w in window], axis=0) for key in window[0]}
      curve.append(curve_row(i, mean, time.perf_counter() - started))
      window = []
      if announce:
        print(f"  transfer step {i}/{part.num_steps}: loss {float(mean['layer'].sum()):.4g} "
              f"(per layer: {', '.join(f'{v:.3g}' for v in mean['layer'])}; relative to the "
              f"teacher{reference}: {', '.join(f'{v:.3g}' for v in mean['relative'])})"
              + (f"; weights cross-entropy {float(mean['weights_ce'].sum()):.4g}"
                 if "weights_ce" in mean else ""), flush=True)
  if teacher_params is not None:
    return jax.tree.map(np.asarray, student), curve
  return {"encoder": jax.tree.map(np.asarray, student["encoder"])}, curve


def curve_row(step: int, mean: dict, seconds: float) -> dict:
  """One line of DIR/attention_transfer.jsonl from the window's mean per-layer parts."""
  row = {"step": step, "attention_transfer/loss": float(mean["layer"].sum()),
         "attention_transfer/seconds": round(seconds, 2)}
  if "weights_ce" in mean:
    row["attention_transfer/weights_ce"] = float(mean["weights_ce"].sum())
  for key, values in mean.items():
    row.update({f"attention_transfer/{key}_{j}": float(v) for j, v in enumerate(values)})
  return row


def write_curve(workdir: str, curve: list[dict]) -> None:
  text = "".join(json.dumps(row) + "\n" for row in curve)
  atomic_write(os.path.join(workdir, CURVE_FILE), lambda f: f.write(text))
