"""Attention transfer's pieces (textattn/recipes/attention_transfer.py) on the tiny BERT
fixture: zero loss when the student is the teacher, a loss that falls in a few steps, and only
the parameters meant to train move."""

import pathlib

import jax
import jax.numpy as jnp
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

  def params_for(name, **options):
    """The classifier with attention `name`, started from the checkpoint (finetune's start)."""
    model = bert.BertClassifier(c, 2, pooling="mean", attention=name, attention_impl="xla",
                                attention_options=tuple(sorted(options.items())))
    return jax.tree.map(jnp.asarray,
                        hf.init_params(model, pretrained, jax.random.key(0), 12)[0])
  return c, pretrained, tokens, mask, params_for


def test_the_loss_is_zero_when_the_student_is_the_teacher(setting):
  c, _, tokens, mask, params_for = setting
  teacher = params_for("softmax")
  inputs = transfer.layer_inputs(c, teacher, tokens, mask)
  total, per_layer = transfer.transfer_loss(c, "softmax", teacher, teacher, inputs, mask)
  assert float(total) == 0.0 and per_layer.shape == (c.num_layers,)


@pytest.mark.parametrize("student,options,train", [
    ("causal_linear", {}, "new+out"),
    ("linear", {"feature_map": "hedgehog"}, "new"),
    ("additive", {}, "new+out"),
])
def test_a_few_steps_lower_the_loss_and_move_only_the_trainable_parameters(setting, student,
                                                                           options, train):
  c, _, tokens, mask, params_for = setting
  teacher = params_for("softmax")
  params = params_for(student, **options)
  trains = transfer.trainable(params, teacher, train)
  flat = {jax.tree_util.keystr(p): t for p, t in jax.tree_util.tree_leaves_with_path(trains)}
  assert any(flat.values())
  assert not any(t for k, t in flat.items() if "attention" not in k)
  if train == "new":
    assert not any(t for k, t in flat.items() if "['out']" in k or "['query']" in k)
  tx, step = transfer.make_step(c, student, teacher, trains, 1e-2,
                                options=tuple(sorted(options.items())))
  step = jax.jit(step)
  state = tx.init(params)
  before = params
  losses = []
  for _ in range(8):
    params, state, total, _ = step(params, state, tokens, mask)
    losses.append(float(total))
  assert losses[-1] < 0.8 * losses[0], losses
  for (path, a), b, t in zip(jax.tree_util.tree_leaves_with_path(before),
                             jax.tree.leaves(params), jax.tree.leaves(trains), strict=True):
    moved = bool(np.any(np.asarray(a) != np.asarray(b)))
    assert moved == bool(t), jax.tree_util.keystr(path)
