"""LoRA as an optax transformation (textattn/lora.py, config.optimizer.lora): the merged weight
follows explicit LoRA training exactly, and a fine-tuning run with it moves only what it should
and resumes bit-identically."""

import os
import shutil
import signal

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import textattn
from tests.test_finetune import FIXTURE, finetune_config
from tests.test_train import assert_trees_identical, restore_params
from textattn import checkpointing, errors, lora, optim
from textattn import run as runner
from textattn.errors import UsageError
from textattn.models import bert
from textattn.pretrained import hf


@pytest.mark.parametrize("shape", [(6, 5), (3, 2, 6)])
def test_the_merged_weight_follows_explicit_lora_training_in_float64(shape):
  """Adam on (A, B) with the loss of W0 + s AB, written out with jax.grad, against the
  transformation that only sees W's gradient: the same W after every step, and W - W0 of
  rank r. A (3, 2, 6) kernel (an attention output's [heads, head_dim, width]) is a 6 x 6 matrix."""
  with jax.enable_x64(True):
    rng = np.random.default_rng(0)
    w0 = jnp.asarray(rng.normal(size=shape))
    target = jnp.asarray(rng.normal(size=shape))
    loss = lambda w: jnp.sum((jnp.tanh(w) - target) ** 2)
    rank, alpha, rate = 2, 3.0, 0.05
    tx = lora.lora(optax.adam(rate), rank, alpha, seed=7)
    state = tx.init(w0)
    a, b = state.factors
    assert a.shape == (6, rank) and b.shape == (rank, shape[-1] if len(shape) == 2 else 6)
    assert not np.any(b)  # B starts at 0: the model starts as the checkpoint
    # (float32 factors in the state; the reference starts from the same values in float64)
    factors = (a.astype(jnp.float64), b.astype(jnp.float64))
    scale = alpha / rank
    merged = lambda ab: w0 + scale * (ab[0] @ ab[1]).reshape(shape)
    reference_tx = optax.adam(rate)
    reference_state = reference_tx.init(factors)
    w = w0
    for _ in range(5):
      moves, state = tx.update(jax.grad(loss)(w), state, w)
      w = optax.apply_updates(w, moves)
      steps, reference_state = reference_tx.update(
          jax.grad(lambda ab: loss(merged(ab)))(factors), reference_state, factors)
      factors = optax.apply_updates(factors, steps)
    assert not np.allclose(w, w0)
    np.testing.assert_allclose(w, merged(factors), rtol=1e-5, atol=1e-6)
    assert np.linalg.matrix_rank(np.asarray(w - w0).reshape(6, -1), tol=1e-6) == rank


def test_kernels_split_where_their_sides_are_closest():
  assert lora.matrix_split((384, 12, 32)) == 1  # a query kernel: [width, heads * head_dim]
  assert lora.matrix_split((12, 32, 384)) == 2  # the output kernel: [heads * head_dim, width]
  assert lora.matrix_split((384, 1536)) == 1


def test_bad_lora_settings_are_refused_in_one_sentence():
  opt = optim.full_defaults()
  opt.lora.rank = -1
  with pytest.raises(UsageError, match=r"^config.optimizer.lora.rank=-1"):
    optim.validate_config(opt)
  opt.lora.update(rank=4, targets="attention/(query")
  with pytest.raises(UsageError, match=r"^config.optimizer.lora.targets='attention/\(query' must "
                                       r"be a regular expression"):
    optim.validate_config(opt)
  opt.lora.targets = "attention/query/kernel$"
  opt.layer_decay = 0.8
  with pytest.raises(UsageError, match=r"^config.optimizer.lora.rank=4 trains low-rank factors, "
                                       r"which layer-wise decay"):
    optim.validate_config(opt)
  opt.layer_decay, opt.grad_clip_norm = 1.0, 1.0
  with pytest.raises(UsageError, match=r"^config.optimizer.lora.rank=4 trains low-rank factors, "
                                       r"whose gradients exist only inside LoRA's update"):
    optim.validate_config(opt)
  opt.grad_clip_norm, opt.lora.targets = 0.0, "no_such_parameter"
  with pytest.raises(UsageError, match=r"^config.optimizer.lora.targets='no_such_parameter' "
                                       r"names no parameter of this model"):
    optim.make_optimizer(opt, 10).init({"dense": {"kernel": jnp.ones((2, 2))}})


def test_a_lora_run_moves_only_what_it_should_and_resumes_bit_identically(tmp_path, monkeypatch):
  """Fine-tuning the tiny BERT with rank-2 LoRA on every attention projection: the embeddings,
  feed-forward layers, LayerNorms and biases end as the checkpoint's, each adapted kernel moves by
  a rank-2 matrix, the head trains; a run stopped after its first checkpoint resumes to the same
  parameters and report."""
  model_dir = tmp_path / "tiny_bert"
  shutil.copytree(FIXTURE, model_dir)
  config = finetune_config(tmp_path, model_dir, num_train_steps=16)
  config.optimizer.layer_decay = 1.0
  config.optimizer.lora.rank = 2
  straight = runner.train_and_evaluate(config, str(tmp_path / "straight"))
  trained = restore_params(tmp_path / "straight")[1]
  start = hf.load(str(FIXTURE)).params
  moved = {"adapted": 0, "head": 0}
  for path, leaf in jax.tree_util.tree_leaves_with_path(trained):
    name = "/".join(str(getattr(key, "key", key)) for key in path)
    if name.startswith("logits/"):  # (new: no checkpoint value)
      continue
    if name.startswith("encoder/pooler/"):
      moved["head"] += not np.array_equal(leaf, start[name.removeprefix("encoder/")])
      continue
    delta = np.asarray(leaf, np.float64) - np.asarray(start[name.removeprefix("encoder/")], np.float64)
    if name.endswith("kernel") and "/attention/" in name:
      rows = lora.matrix_split(leaf.shape)
      assert np.linalg.matrix_rank(delta.reshape(int(np.prod(leaf.shape[:rows])), -1),
                                   tol=1e-5) == 2, name
      moved["adapted"] += 1
    else:
      assert not np.any(delta), f"{name} is frozen under LoRA but moved"
  assert moved == {"adapted": 8, "head": 2}

  save = checkpointing.save

  def save_then_terminate(*args, **kwargs):
    save(*args, **kwargs)
    monkeypatch.setattr(checkpointing, "save", save)
    os.kill(os.getpid(), signal.SIGTERM)
  monkeypatch.setattr(checkpointing, "save", save_then_terminate)
  with pytest.raises(errors.Stopped):
    runner.train_and_evaluate(config, str(tmp_path / "resumed"))
  assert runner.train_and_evaluate(config, str(tmp_path / "resumed")) == straight
  assert_trees_identical(trained, restore_params(tmp_path / "resumed")[1])
  # The workdir alone predicts: its optimizer state (the factors) restores with the parameters.
  assert len(textattn.load(str(tmp_path / "resumed")).predict(["a good film", "bad"])) == 2


@pytest.mark.parametrize("attention,options,new", [
    ("additive", (), {"alpha_kernel", "beta_kernel"}),
    ("linear", (("feature_map", "hedgehog"),), {"feature_map/query_kernel",
                                                "feature_map/query_bias", "feature_map/key_kernel",
                                                "feature_map/key_bias"})])
def test_a_swapped_in_attentions_new_parameters_train_in_full(attention, options, new):
  """The default groups on a student encoder: its attention projections' kernels through the
  factors, its new attention parameters (not the checkpoint's) and the head in full, the rest
  frozen (the LayerNorm named norm_attention too)."""
  config = hf.load(str(FIXTURE)).config
  model = bert.BertClassifier(config, 2, attention=attention, attention_impl="xla",
                              attention_options=options)
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.ones((1, 8), jnp.int32)))
  labels = optim._lora_labels(lora.default_config(), None, params["params"])
  groups = {}
  for path, label in jax.tree_util.tree_leaves_with_path(labels):
    name = "/".join(str(getattr(key, "key", key)) for key in path)
    groups.setdefault(label, set()).add(name.replace("block_1", "block_0"))
  assert groups["lora"] == {f"encoder/block_0/attention/{p}/kernel"
                            for p in ("query", "key", "value", "out")} - (
      {"encoder/block_0/attention/value/kernel"} if attention == "additive" else set())
  assert groups["train"] == ({f"encoder/block_0/attention/{n}" for n in new}
                             | {"encoder/pooler/kernel", "encoder/pooler/bias", "logits/kernel",
                                "logits/bias"})
  assert "encoder/block_0/norm_attention/bias" in groups["frozen"]


def test_a_frozen_parameter_stays_frozen_when_lora_targets_it():
  opt = optim.full_defaults()
  opt.lora.update(rank=2, targets="query/kernel$")
  params = {"attention": {"query": {"kernel": jnp.ones((4, 4))}},
            "block": {"query": {"kernel": jnp.ones((4, 4))}}}
  frozen_attention = lambda path: "attention" not in jax.tree_util.keystr(path)
  labels = optim._lora_labels(opt.lora, frozen_attention, params)
  assert labels == {"attention": {"query": {"kernel": "frozen"}},
                    "block": {"query": {"kernel": "lora"}}}
