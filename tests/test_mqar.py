"""The MQAR task (textattn/tasks/mqar/): Zoology's generator (pairs, query placement, distinct
keys, only the answers scored), training batches as a function of (seed, step), a tiny softmax
model that learns the task in seconds and resumes bit-identically, and the one-sentence
refusals."""

from __future__ import annotations

import shutil
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from textattn import defaults
from textattn import run as runner
from textattn.errors import UsageError
from textattn.tasks import mqar
from textattn.tasks.mqar import data as data_lib
from textattn.tasks.mqar import step as step_lib


def test_examples_hold_the_pairs_then_query_each_key_once_and_score_only_the_answers():
  setting = data_lib.Setting(64, 8)
  examples = data_lib.generate(np.random.default_rng(0), 500, setting, 64, 0.01)
  inputs, positions = examples.inputs, examples.query_positions
  keys, values = inputs[:, 0:16:2], inputs[:, 1:16:2]
  assert keys.min() >= 1 and keys.max() < 32 and values.min() >= 32 and values.max() < 64
  assert all(len(set(row)) == 8 for row in keys) and all(len(set(row)) == 8 for row in values)
  assert positions.min() >= 16 and positions.max() < 64 and np.all((positions - 16) % 2 == 0)
  assert all(len(set(row)) == 8 for row in positions)
  # Key i is queried at query_positions[:, i], its value is the answer there.
  np.testing.assert_array_equal(np.take_along_axis(inputs, positions, axis=1), keys)
  np.testing.assert_array_equal(examples.answers, values)
  targets = data_lib.dense_targets(examples)
  scored = targets != -1
  assert np.all(scored.sum(1) == 8)
  np.testing.assert_array_equal(np.nonzero(scored)[1].reshape(500, 8), np.sort(positions, 1))
  # Every other position is noise from 1 .. vocab - 1 (never the padding id 0), both halves.
  noise = np.ones(inputs.shape, bool)
  noise[:, :16] = False
  np.put_along_axis(noise, positions, False, axis=1)
  assert inputs.min() >= 1 and (inputs[noise] < 32).any() and (inputs[noise] >= 32).any()


def test_query_gaps_follow_zoologys_sequential_power_law_draw():
  # Key i's gap is the i-th draw, without replacement, of p(gap) ~ (gap + 1)^(alpha - 1): the
  # first key's gap has law p, the second's sum_g1 p(g1) p(g) / (1 - p(g1)) over g1 != g.
  pairs, space, alpha, rows = 3, 10, 0.3, 20000
  setting = data_lib.Setting(2 * pairs + 2 * space, pairs)
  examples = data_lib.generate(np.random.default_rng(1), rows, setting, 64, alpha)
  gaps = (examples.query_positions - 2 * pairs) // 2
  p = np.exp(data_lib.gap_log_weights(space, alpha))
  p /= p.sum()
  second = np.array([sum(p[a] * p[g] / (1 - p[a]) for a in range(space) if a != g)
                     for g in range(space)])
  for column, law in ((0, p), (1, second)):
    observed = np.bincount(gaps[:, column], minlength=space) / rows
    np.testing.assert_allclose(observed, law, atol=0.012)
  assert np.isclose(p[0], 1 / np.sum(np.arange(1, space + 1) ** (alpha - 1)))


def test_training_batches_are_a_function_of_seed_and_step():
  # A mixed setting's batch, then the training setting's, in turn.
  settings = (data_lib.Setting(16, 2), data_lib.Setting(32, 4))
  make = lambda seed, index=0, count=1: data_lib.TrainBatches(
      settings, 8, seed, 64, 0.01, steps_per_epoch=4, process_index=index, process_count=count)
  straight = make(3)
  batches = [next(straight) for _ in range(6)]
  assert [b["inputs"].shape[1] for b in batches] == [16, 32] * 3
  assert [b["answers"].shape[1] for b in batches] == [2, 4] * 3
  assert straight.get_state() == {"epoch": 1, "index": 2}
  resumed = make(3)
  resumed.set_state({"epoch": 1, "index": 1})  # batch 5
  for key, value in next(resumed).items():
    np.testing.assert_array_equal(value, batches[5][key])
  assert not np.array_equal(batches[0]["inputs"], batches[2]["inputs"])
  assert not np.array_equal(next(make(4))["inputs"], batches[0]["inputs"])
  # Two processes read the two halves of the same global batch.
  halves = [next(make(3, index, 2))["inputs"] for index in (0, 1)]
  np.testing.assert_array_equal(np.concatenate(halves), batches[0]["inputs"])


def tiny_config(**overrides):
  config = defaults.for_task("mqar")
  config.update(vocab_size=32, length=24, pairs=3, mixed_settings="12x2",
                test_settings="24x3,48x3,48x6",
                val_examples=64, test_examples=64, batch_size=32, num_train_steps=200,
                eval_every_steps=100, checkpoint_every_steps=100, log_every_steps=100)
  config.model.update(embed_dim=32, attention_impl="xla")
  config.optimizer.update(learning_rate=1e-2, warmup_steps=20)
  config.update(overrides)
  return config


def test_the_loss_and_accuracy_are_of_the_answers_only():
  config = tiny_config()
  model = mqar.build(config)
  examples = data_lib.generate(np.random.default_rng(2), 4, data_lib.Setting(24, 3), 32, 0.01)
  params = jax.jit(model.init)(jax.random.key(0), jnp.ones((1, 24), jnp.int32))["params"]
  batch = {**examples.batch(slice(None)), "weights": np.ones(4, np.float32)}
  sums = jax.jit(lambda params, batch: step_lib.eval_step(
      types.SimpleNamespace(apply_fn=model.apply, params=params), batch))(params, batch)
  logits = jax.jit(model.apply)({"params": params}, jnp.asarray(examples.inputs))  # all
  targets = data_lib.dense_targets(examples)
  scored = targets != -1
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, np.maximum(targets, 0))
  np.testing.assert_allclose(float(sums["loss_sum"]), float(jnp.sum(losses * scored)), rtol=1e-5)
  assert float(sums["count"]) == scored.sum() == 12
  assert float(sums["correct"]) == float(jnp.sum((jnp.argmax(logits, -1) == targets) & scored))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  root = tmp_path_factory.mktemp("mqar")
  config = tiny_config()
  report = runner.train_and_evaluate(config, str(root / "straight"))
  return root, config, report


def test_a_tiny_softmax_model_learns_mqar_and_reports_every_setting(trained):
  import textattn
  root, _, report = trained
  # Chance is 1/16 (the values' half of the vocabulary); the training setting is learned.
  assert report["test/24x3/accuracy"] >= 0.9
  assert {"test/48x3/accuracy", "test/48x6/accuracy", "test/accuracy"} <= set(report)
  assert report["test/accuracy"] == pytest.approx(np.mean(
      [report[f"test/{s}/accuracy"] for s in ("24x3", "48x3", "48x6")]))
  # textattn.load: the best checkpoint recalls fresh examples of the training setting.
  assert textattn.load(str(root / "straight")).evaluate("24x3", count=64) >= 0.9


def test_a_resumed_run_equals_the_uninterrupted_one(trained):
  from tests.test_train import assert_trees_identical, restore_params
  root, config, report = trained
  shutil.copytree(root / "straight", root / "resumed")
  shutil.rmtree(root / "resumed" / "checkpoints" / "200")
  resumed = runner.train_and_evaluate(config, str(root / "resumed"))
  assert_trees_identical(restore_params(root / "straight")[1],
                         restore_params(root / "resumed")[1])
  assert resumed == report


@pytest.mark.parametrize("overrides,words", [
    ({"model": {"attention": "causal_additive"}},
     ["config.model.position='rotary'", "'causal_additive'", "causal, causal_linear"]),
    ({"model": {"attention": "softmax", "position": "none"}},
     ["config.model.attention='softmax' is not causal", "causal"]),
    ({"test_settings": "24x3,48"}, ["config.test_settings='24x3,48'", "'48' is not one"]),
    ({"pairs": 7}, ["config.length and config.pairs", "24x7", "4 * pairs <= length"]),
    ({"num_train_steps": -1}, ["config.num_train_steps=-1 must be > 0"]),
])
def test_refusals_name_the_field_and_what_is_allowed(overrides, words):
  config = tiny_config(**overrides)
  with pytest.raises(UsageError) as error:
    runner.validate(config, None)
  for word in words:
    assert word in str(error.value), str(error.value)
