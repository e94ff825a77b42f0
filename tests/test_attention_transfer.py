"""Attention transfer's pieces (textattn/recipes/attention_transfer.py) on the tiny BERT
fixture: zero loss when the student is the teacher, a loss that falls in a few steps, and only
the parameters meant to train move."""

import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from textattn.models import bert
from textattn.pretrained import hf
from textattn.recipes import attention_transfer as transfer

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "tiny_bert"


@pytest.fixture(scope="module")
def setting():
  pretrained = hf.load(str(FIXTURE))
  c = pretrained.config
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(3, c.vocab_size, (4, 12)), jnp.int32)
  mask = jnp.asarray(np.arange(12)[None, :] < np.array([12, 9, 6, 12])[:, None])
  tokens = jnp.where(mask, tokens, 0)

  made = {}  # (each init compiles for a few seconds; jax arrays are immutable, so share them)

  def params_for(name, **options):
    """The classifier with attention `name`, started from the checkpoint (finetune's start)."""
    key = (name, tuple(sorted(options.items())))
    if key not in made:
      model = bert.BertClassifier(c, 2, pooling="mean", attention=name, attention_impl="xla",
                                  attention_options=key[1])
      made[key] = jax.tree.map(jnp.asarray,
                               hf.init_params(model, pretrained, jax.random.key(0), 12)[0])
    return made[key]
  return c, pretrained, tokens, mask, params_for


def test_the_loss_is_zero_when_the_student_is_the_teacher(setting):
  c, _, tokens, mask, params_for = setting
  teacher = params_for("softmax")
  @functools.partial(jax.jit, static_argnames="whole_block")
  def loss_against(student, teacher, tokens, mask, whole_block=False):
    inputs = transfer.layer_inputs(c, teacher, tokens, mask)
    return transfer.transfer_loss(c, "softmax", student, teacher, inputs, mask,
                                  whole_block=whole_block)
  for whole_block in (False, True):
    total, parts = loss_against(teacher, teacher, tokens, mask, whole_block)
    # Zero up to float32 rounding: XLA may fuse the teacher's and the student's copy of the
    # same layer differently (it does with the suite's CPU flags, tests/conftest.py); a wrong
    # layer, input or mask gives relative errors of order 1.
    assert float(total) <= 1e-12 and parts["layer"].shape == (c.num_layers,)
    assert np.all(np.asarray(parts["relative"]) <= 1e-6), parts["relative"]
  zero = jax.tree.map(jnp.zeros_like, teacher)  # outputs zeros: relative error exactly 1
  np.testing.assert_allclose(np.asarray(loss_against(zero, teacher, tokens, mask)[1]["relative"]),
                             1.0, rtol=1e-6)


@pytest.mark.parametrize("student,options,train,weights_loss", [
    ("causal_linear", {}, "new+out", 0.0),
    ("linear", {"feature_map": "hedgehog"}, "new", 0.0),
    ("linear", {"feature_map": "hedgehog"}, "new+out", 1.0),
    ("additive", {}, "new+out", 0.0),
    ("additive", {}, "block", 0.0),
    ("additive_value", {"query_residual": False}, "new+out+qk", 0.0),
])
def test_a_few_steps_lower_the_loss_and_move_only_the_trainable_parameters(setting, student,
                                                                           options, train,
                                                                           weights_loss):
  c, _, tokens, mask, params_for = setting
  teacher = params_for("softmax")
  params = params_for(student, **options)
  trains = transfer.trainable(params, teacher, train)
  flat = {jax.tree_util.keystr(p): t for p, t in jax.tree_util.tree_leaves_with_path(trains)}
  assert any(flat.values())
  if train == "block":  # every block parameter (the feed-forward's too), nothing outside blocks
    assert all(t == ("block_" in k) for k, t in flat.items()), flat
    assert any(t for k, t in flat.items() if "ffn_in" in k)
  else:
    assert not any(t for k, t in flat.items() if "attention" not in k)
  if train == "new":
    assert not any(t for k, t in flat.items() if "['out']" in k or "['query']" in k)
  if train.startswith("new"):  # the checkpoint's value projection stays as it is
    assert not any(t for k, t in flat.items() if "['value']" in k)
  tx, step = transfer.make_step(c, student, teacher, trains, 1e-2,
                                options=tuple(sorted(options.items())),
                                weights_loss=weights_loss, whole_block=train == "block")
  step = jax.jit(step)
  state = tx.init(params)
  before = params
  losses = []
  for _ in range(8):
    params, state, total, parts = step(params, state, tokens, mask)
    losses.append(float(total))
  assert losses[-1] < 0.8 * losses[0], losses
  assert ("weights_ce" in parts) == bool(weights_loss)
  for (path, a), b, t in zip(jax.tree_util.tree_leaves_with_path(before),
                             jax.tree.leaves(params), jax.tree.leaves(trains), strict=True):
    moved = bool(np.any(np.asarray(a) != np.asarray(b)))
    assert moved == bool(t), jax.tree_util.keystr(path)


def test_the_cosine_schedule_decays_the_stages_rate_to_zero(setting):
  from textattn.errors import UsageError
  part = transfer.default_config()
  part.update(num_steps=4, learning_rate=1e-2)
  assert transfer.learning_rate(part) == 1e-2
  part.schedule = "cosine"
  rate = transfer.learning_rate(part)
  np.testing.assert_allclose([rate(i) for i in range(5)],
                             [1e-2 * (1 + np.cos(np.pi * i / 4)) / 2 for i in range(5)], atol=1e-9)
  # In the step: the 5th update (the rate at step 4 is 0) leaves the parameters as they were.
  c, _, tokens, mask, params_for = setting
  teacher, params = params_for("softmax"), params_for("additive")
  trains = transfer.trainable(params, teacher, "new")
  tx, step = transfer.make_step(c, "additive", teacher, trains, rate)
  step = jax.jit(step)
  state = tx.init(params)
  for _ in range(4):
    params, state, _, _ = step(params, state, tokens, mask)
  after, _, _, _ = step(params, state, tokens, mask)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(after), strict=True):
    np.testing.assert_array_equal(a, b)
  config = ml_collections.ConfigDict({"attention_transfer": part, "model": {"pretrained": "x"}})
  part.schedule = "linear"
  with pytest.raises(UsageError, match="attention_transfer.schedule"):
    transfer.validate_config(config)


def test_the_weights_cross_entropy_is_the_teachers_entropy_when_the_weights_agree():
  """Hedgehog's loss against a float64 NumPy computation: a student whose phi(q).phi(k) is
  exp(q.k / sqrt(d)) (one-hot key features) has the teacher's weights, so the cross-entropy is
  their entropy; any other student's is larger. Padding keys get no weight; padding queries do
  not count."""
  rng = np.random.default_rng(3)
  b, l, h, d = 2, 6, 2, 4
  q, k = (rng.standard_normal((b, l, h, d)) for _ in range(2))
  mask = np.ones((b, l), bool)
  mask[1, 4:] = False
  scores = np.einsum("bthd,bihd->bhti", q, k) / np.sqrt(d)
  scores = np.where(mask[:, None, None, :], scores, -np.inf)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  rows = -np.sum(np.where(weights > 0, weights * np.log(np.where(weights > 0, weights, 1)), 0),
                 -1)
  entropy = np.sum(rows * mask[:, None, :]) / (mask.sum() * h)
  fk = np.broadcast_to(np.eye(l)[None, :, None, :], (b, l, h, l))  # key i -> e_i
  fq = np.exp(np.where(np.isfinite(scores), scores, -50)).transpose(0, 2, 1, 3)  # [b, t, h, i]
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  got = transfer.weights_cross_entropy(f32(q), f32(k), f32(fq), f32(fk), jnp.asarray(mask))
  np.testing.assert_allclose(float(got), entropy, rtol=1e-5)
  other = transfer.weights_cross_entropy(f32(q), f32(k), f32(np.abs(fq) + 1.0), f32(fk),
                                         jnp.asarray(mask))
  assert float(other) > entropy + 1e-3
  # A ReLU map's query that meets no key (all-zero features): finite loss and gradients.
  dead = f32(np.maximum(fq, 0.0)).at[0, 2].set(0.0)
  grads = jax.grad(lambda a, b: transfer.weights_cross_entropy(f32(q), f32(k), a, b,
                                                               jnp.asarray(mask)),
                   argnums=(0, 1))(dead, f32(fk))
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)


def test_matching_weights_is_refused_for_a_student_without_them(setting):
  from textattn import defaults
  from textattn.errors import UsageError
  from textattn.tasks.classification import config as classification_config
  c, _, tokens, mask, params_for = setting
  teacher, params = params_for("softmax"), params_for("additive")
  tx, step = transfer.make_step(c, "additive", teacher,
                                transfer.trainable(params, teacher), 1e-2, weights_loss=1.0)
  with pytest.raises(UsageError, match=r"'additive' attention does not expose"):
    step(params, tx.init(params), tokens, mask)
  # In a run, before anything loads: additive has no weights, a causal student's are not the
  # bidirectional teacher's (the loss normalises over all keys), window_linear records none.
  config = defaults.complete(defaults.classification())
  config.attention_transfer = transfer.default_config()
  config.attention_transfer.update(num_steps=5, weights_loss=1.0)
  config.model.pretrained = "models/bert"
  for attention in ("additive", "causal_linear", "window_linear"):
    config.model.attention = attention
    with pytest.raises(UsageError, match=rf"^config.attention_transfer.weights_loss=1.0 matches "
                                         rf"attention weights over all keys, which only 'linear' "
                                         rf"attention exposes .*; '{attention}' has none"):
      classification_config.validate(config, None)
  config.model.attention = "linear"
  classification_config.validate(config, None)


def test_a_stage_that_would_train_nothing_is_refused(setting):
  from textattn.errors import UsageError
  _, _, _, _, params_for = setting
  teacher, params = params_for("softmax"), params_for("linear")  # (elu1: no parameters)
  with pytest.raises(UsageError, match=r"^config.attention_transfer.train='new' trains nothing "
                                       r"for 'linear' attention"):
    transfer.check_trains_something(transfer.trainable(params, teacher, "new"), "new", "linear")
  transfer.check_trains_something(transfer.trainable(params, teacher, "new+out"), "new+out",
                                  "linear")


def test_a_run_with_a_transfer_stage_logs_it_and_resumes_bit_identically(tmp_path, monkeypatch):
  """The stage in a fine-tuning run: its per-layer curve is written and falls; a run killed in
  the stage (simulated: it dies after the stage's first step) and then stopped in fine-tuning
  ends with the uninterrupted run's parameters and report."""
  import os
  import shutil
  import signal

  from tests.test_finetune import finetune_config
  from tests.test_train import assert_trees_identical, restore_params
  from textattn import checkpointing, errors
  from textattn import run as runner
  from textattn.pretrained import finetune
  model_dir = tmp_path / "tiny_bert"
  shutil.copytree(FIXTURE, model_dir)
  config = finetune_config(tmp_path, model_dir, num_train_steps=16)
  config.model.attention = "additive"
  config.attention_transfer = transfer.default_config()
  config.attention_transfer.update(num_steps=6, log_every_steps=2, learning_rate=1e-2)
  straight = runner.train_and_evaluate(config, str(tmp_path / "straight"))
  curve = [json.loads(line) for line in
           (tmp_path / "straight" / transfer.CURVE_FILE).read_text().splitlines()]
  assert [row["step"] for row in curve] == [2, 4, 6]
  assert set(curve[0]) == {"step", "attention_transfer/loss", "attention_transfer/seconds",
                           "attention_transfer/layer_0",
                           "attention_transfer/layer_1", "attention_transfer/relative_0",
                           "attention_transfer/relative_1"}
  assert curve[-1]["attention_transfer/loss"] < curve[0]["attention_transfer/loss"]

  class Killed(Exception):
    pass

  original = transfer.make_step

  def dies_in_the_stage(*args, **kwargs):
    tx, step = original(*args, **kwargs)

    def step_then_die(*a):
      step(*a)
      raise Killed
    return tx, step_then_die
  monkeypatch.setattr(transfer, "make_step", dies_in_the_stage)
  # The workdir exists beforehand, so the run leaves what it wrote (a fresh workdir refused or
  # interrupted before training is removed): as a SIGKILL would, a stage with no checkpoint
  # yet, whose restart reloads the pretrained weights against the workdir's saved config.
  (tmp_path / "resumed").mkdir()
  with pytest.raises(Killed):
    runner.train_and_evaluate(config, str(tmp_path / "resumed"))
  assert (tmp_path / "resumed" / finetune.WORKDIR_FILE).is_file()
  assert not (tmp_path / "resumed" / "checkpoints").exists() or not any(
      p.name.isdigit() for p in (tmp_path / "resumed" / "checkpoints").iterdir())
  monkeypatch.setattr(transfer, "make_step", original)
  save = checkpointing.save

  def save_then_terminate(*args, **kwargs):
    save(*args, **kwargs)
    monkeypatch.setattr(checkpointing, "save", save)
    os.kill(os.getpid(), signal.SIGTERM)
  monkeypatch.setattr(checkpointing, "save", save_then_terminate)
  with pytest.raises(errors.Stopped):
    runner.train_and_evaluate(config, str(tmp_path / "resumed"))
  assert runner.train_and_evaluate(config, str(tmp_path / "resumed")) == straight
  assert_trees_identical(restore_params(tmp_path / "straight")[1],
                         restore_params(tmp_path / "resumed")[1])


def test_a_transfer_stage_needs_a_pretrained_encoder():
  from textattn import defaults
  from textattn.errors import UsageError
  from textattn.tasks.classification import config as classification_config
  config = defaults.complete(defaults.classification())
  config.attention_transfer = transfer.default_config()
  config.attention_transfer.num_steps = 5
  with pytest.raises(UsageError, match=r"^config.attention_transfer.num_steps=5 trains a "
                                       r"pretrained encoder's new attention"):
    classification_config.validate(config, None)
  # A teacher without a stage would be ignored silently (the run would start from the
  # pretrained checkpoint, not the teacher's weights): refused.
  config.attention_transfer.num_steps = 0
  config.attention_transfer.teacher = "runs/softmax"
  with pytest.raises(UsageError, match=r"^config.attention_transfer.teacher='runs/softmax' is "
                                       r"read only by the transfer stage"):
    classification_config.validate(config, None)
  config.attention_transfer.update(num_steps=5, teacher="", distill=0.5)
  config.model.pretrained = "models/bert"
  with pytest.raises(UsageError, match=r"^config.attention_transfer.distill=0.5 distils a "
                                       r"fine-tuned softmax run's predictions"):
    classification_config.validate(config, None)
  config.attention_transfer.update(distill=0.0, train="block", weights_loss=1.0)
  with pytest.raises(UsageError, match=r"^config.attention_transfer.weights_loss=1.0 matches "
                                       r"attention weights, and train='block'"):
    classification_config.validate(config, None)


def test_a_finished_softmax_run_is_a_teacher_the_student_starts_from(tmp_path, monkeypatch):
  """config.attention_transfer.teacher = a fine-tuned softmax run's workdir: the stage's
  student starts from all of that run's weights (head included), the run finishes and predict
  reproduces its test report; a teacher that is not a softmax run is one sentence."""
  import shutil

  import textattn
  from tests.test_finetune import finetune_config
  from tests.test_train import restore_params
  from textattn import compare
  from textattn import run as runner
  from textattn.data import file_source
  from textattn.errors import UsageError
  model_dir = tmp_path / "tiny_bert"
  shutil.copytree(FIXTURE, model_dir)
  teacher_config = finetune_config(tmp_path, model_dir, num_train_steps=8)
  runner.train_and_evaluate(teacher_config, str(tmp_path / "teacher"))
  teacher = restore_params(tmp_path / "teacher")[1]

  config = finetune_config(tmp_path, model_dir, num_train_steps=4)
  config.model.attention = "additive"
  config.attention_transfer = transfer.default_config()
  config.attention_transfer.update(num_steps=2, log_every_steps=1,
                                   teacher=str(tmp_path / "teacher"), distill=0.5)
  stages = []
  run_stage = transfer.run_stage

  def recorded(*args, **kwargs):
    stages.append(run_stage(*args, **kwargs)[0])
    return stages[-1], []
  monkeypatch.setattr(transfer, "run_stage", recorded)
  from textattn.tasks.classification import step
  plain_step, distilled = step.train_step, []

  def spied_step(state, batch, **kwargs):
    distilled.append(kwargs)
    return plain_step(state, batch, **kwargs)
  monkeypatch.setattr(step, "train_step", spied_step)
  runner.train_and_evaluate(config, str(tmp_path / "student"))
  [start] = stages
  # distill > 0: the fine-tuning's loss mixes in the teacher's predictions of the training split
  # (kept in the workdir), row for row
  assert distilled and distilled[0] == {"distill": 0.5, "temperature": 2.0}
  raw = file_source.FileSource(config).read(config.val_fraction, config.data_seed)
  saved = np.exp(np.load(tmp_path / "student" / transfer.TEACHER_FILE)["log_probs"])
  wanted = textattn.load(str(tmp_path / "teacher")).predict_proba(raw.texts["train"])
  np.testing.assert_allclose(saved, wanted, rtol=1e-5, atol=1e-6)
  assert not np.allclose(saved, np.roll(wanted, 1, axis=0), rtol=1e-5, atol=1e-6)  # (rows differ)
  flat_start, flat_teacher = hf.flatten(start), hf.flatten(teacher)
  shared = [name for name in flat_start if "/attention/" not in name]
  assert "logits/kernel" in shared and len(shared) > 20
  for name in shared:  # (the stage trains only attention parameters)
    np.testing.assert_array_equal(flat_start[name], flat_teacher[name], err_msg=name)
  probabilities = textattn.load(str(tmp_path / "student")).predict_proba(raw.texts["test"])
  np.testing.assert_allclose(probabilities, compare.load_predictions(str(tmp_path / "student"))[1],
                             rtol=1e-6, atol=1e-7)

  config.attention_transfer.teacher = str(tmp_path / "student")
  with pytest.raises(UsageError, match=r"has 'additive' attention; the teacher must be a softmax "
                                       r"run\.$"):
    runner.train_and_evaluate(config, str(tmp_path / "another"))
  config.attention_transfer.teacher = str(tmp_path / "teacher")
  config.max_len = teacher_config.max_len + 1
  with pytest.raises(UsageError, match=r"has max_len=\d+, this run \d+; the teacher must be "
                                       r"fine-tuned on the same data, split and encoding\.$"):
    runner.train_and_evaluate(config, str(tmp_path / "another_3"))
  config.max_len = teacher_config.max_len
  config.attention_transfer.teacher = str(tmp_path / "nowhere")
  with pytest.raises(UsageError, match=r"has no config.json"):
    runner.train_and_evaluate(config, str(tmp_path / "another_2"))


def test_distillation_is_a_float64_kl_mixed_with_the_cross_entropy_row_by_row():
  """attention_transfer.distill: step.distillation_losses is T^2 KL(p_T || q_T) (float64
  reference), zero when the student predicts what the teacher does; train_step's loss is the
  (1 - w) CE + w KD mix; TrainIterator batches the teacher's rows with their own inputs."""
  import optax

  from textattn.data.batches import TrainIterator
  from textattn.data.splits import Split
  from textattn.tasks.classification import step
  from textattn.train_state import TrainState
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(6, 3)) * 3
  teacher = np.log(rng.dirichlet(np.ones(3), size=6))
  for temperature in (1.0, 2.5):
    t = teacher / temperature
    p = np.exp(t - np.log(np.exp(t).sum(-1, keepdims=True)))
    s = logits / temperature
    log_q = s - np.log(np.exp(s).sum(-1, keepdims=True))
    want = temperature ** 2 * np.sum(p * (np.log(p) - log_q), -1)
    np.testing.assert_allclose(step.distillation_losses(jnp.asarray(logits, jnp.float32),
                                                        jnp.asarray(teacher, jnp.float32),
                                                        temperature), want, rtol=1e-5, atol=1e-6)
    same = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32))
    np.testing.assert_allclose(step.distillation_losses(same * 1.0, same, temperature), 0.0,
                               atol=1e-5)

  inputs = rng.integers(1, 9, size=(8, 4)).astype(np.int32)
  labels = rng.integers(0, 3, size=8).astype(np.int32)
  split = Split(inputs, labels)
  extras = {"teacher_log_probs": np.log(rng.dirichlet(np.ones(3), size=8)).astype(np.float32),
            "row": np.arange(8)}
  batch = next(TrainIterator(split, 4, seed=3, extras=extras))
  rows = batch["row"]
  np.testing.assert_array_equal(batch["inputs"], inputs[rows])
  np.testing.assert_array_equal(batch["teacher_log_probs"], extras["teacher_log_probs"][rows])
  del batch["row"]

  def apply_fn(variables, tokens, train=False, rngs=None, token_embeddings=None):
    return jnp.mean(variables["params"]["w"][tokens], axis=1)
  params = {"w": jnp.asarray(rng.normal(size=(9, 3)), jnp.float32)}
  state = TrainState.create(apply_fn=apply_fn, params=params, tx=optax.sgd(0.1),
                            dropout_key=jax.random.key_data(jax.random.key(0)))
  out = apply_fn({"params": params}, batch["inputs"])
  ce = optax.softmax_cross_entropy_with_integer_labels(out, batch["labels"])
  kd = step.distillation_losses(out, batch["teacher_log_probs"], 2.0)
  _, sums = step.train_step(state, batch, distill=0.25, temperature=2.0)
  np.testing.assert_allclose(sums["loss_sum"], np.sum(0.75 * ce + 0.25 * kd), rtol=1e-5)
  _, plain = step.train_step(state, batch)
  np.testing.assert_allclose(plain["loss_sum"], np.sum(ce), rtol=1e-5)


def test_saved_teacher_predictions_serve_only_the_teacher_that_gave_them(tmp_path, monkeypatch):
  # A workdir restarted before its first checkpoint may name another teacher: its saved
  # predictions (once checked by shape only) must not be distilled from.
  from textattn.tasks import classification

  class Teacher:
    def __init__(self, p):
      self.p = p

    def probabilities(self, inputs, progress=None):
      computed.append(self.p)
      return np.tile(np.float32([self.p, 1 - self.p]), (len(inputs), 1))

  class Train:
    inputs = np.zeros((4, 3), np.int32)

    def __len__(self):
      return 4

  computed = []
  monkeypatch.setattr(classification.classifier, "softmax_teacher",
                      lambda workdir, *_: Teacher(0.25 if workdir.endswith("a") else 0.75))
  data = type("Data", (), {"train": Train(), "class_names": ["neg", "pos"]})()
  config = ml_collections.ConfigDict({"attention_transfer": {"teacher": str(tmp_path / "a")}})

  def log_probs(teacher):
    config.attention_transfer.teacher = str(tmp_path / teacher)
    return np.exp(classification.teacher_log_probs(config, data, str(tmp_path), True, None))

  np.testing.assert_allclose(log_probs("a")[:, 0], 0.25)
  np.testing.assert_allclose(log_probs("a")[:, 0], 0.25)  # saved: not computed again
  np.testing.assert_allclose(log_probs("b")[:, 0], 0.75)  # another teacher: computed
  assert computed == [0.25, 0.75]
  (tmp_path / transfer.TEACHER_FILE).write_bytes(b"damaged")
  np.testing.assert_allclose(log_probs("b")[:, 0], 0.75)  # unreadable: computed again
  assert computed == [0.25, 0.75, 0.75]
  Train.inputs = np.ones((4, 3), np.int32)  # other training rows, as many (another data_seed)
  log_probs("b")
  assert computed == [0.25, 0.75, 0.75, 0.75]  # (once reused: row i got another row's target)
