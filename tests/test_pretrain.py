"""Masked-language-model pretraining: BERT's masking, the loss, which text it sees, the
transfer into the classifier, the cache, and that only a fresh run pretrains."""

import json
import pathlib
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import recipes_config
from tests.test_data import fake_tfds, make_config
from tests.test_train import (
  assert_rows_close,
  cli_args,
  eval_rows,
  read_metrics,
  run_main,
  run_two_processes,
  write_sentiment_jsonl,
)
from textattn import data as ip
from textattn import defaults, models, optim, train_state
from textattn import run as runner
from textattn.data import tfds_source
from textattn.data import tokenizer as tokenizer_lib
from textattn.models import layers
from textattn.recipes import pretrain


def _batch(lengths, length=40, vocab=1000, seed=0):
  rng = np.random.default_rng(seed)
  tokens = np.zeros((len(lengths), length), np.int32)
  for row, n in enumerate(lengths):
    tokens[row, :n] = rng.integers(2, vocab, n)
  return jnp.asarray(tokens)


def test_masking_follows_berts_recipe_on_real_tokens_only():
  lengths = [40, 20, 7, 3, 1, 0] * 200
  tokens = _batch(lengths, vocab=1000)
  inputs, mask_input, positions, targets, weights = pretrain.mask_tokens(
      tokens, jax.random.key(0), mask_rate=0.15, max_predictions=5, vocab_size=1000)
  tokens, inputs, mask_input, positions, targets, weights = map(
      np.asarray, (tokens, inputs, mask_input, positions, targets, weights))
  expected = {40: 5, 20: 3, 7: 1, 3: 1, 1: 1, 0: 0}  # round(0.15 n), >= 1, <= 5, <= n
  assert weights.sum(1).tolist() == [expected[n] for n in lengths]
  rows = np.arange(len(lengths))[:, None]
  np.testing.assert_array_equal(targets, tokens[rows, positions])
  chosen = np.zeros_like(mask_input)
  chosen[np.nonzero(weights)[0], positions[weights > 0]] = True
  # The predicted positions are distinct real tokens; nothing else is corrupted.
  assert (chosen.sum(1) == weights.sum(1)).all() and (tokens[chosen] != 0).all()
  assert not mask_input[~chosen].any()
  np.testing.assert_array_equal(inputs[~chosen], tokens[~chosen])
  assert (inputs[chosen] >= tokenizer_lib.NUM_RESERVED).all()
  # 80% [MASK], 10% a random token, 10% kept (n = 1,800 predictions).
  n = chosen.sum()
  masked = mask_input.sum() / n
  replaced = (~mask_input & chosen & (inputs != tokens)).sum() / n
  assert abs(masked - 0.8) < 0.03 and abs(replaced - 0.1) < 0.02, (masked, replaced)
  # Uniform over a row's tokens, not its first ones: position counts over 200 rows of 40.
  counts = chosen[np.asarray(lengths) == 40].sum(0)
  assert counts.min() > 0 and counts[:20].sum() / counts.sum() == pytest.approx(0.5, abs=0.06)


def _mlm_state(config, vocab_size, k, steps=1000):
  model = models.build_model(config, 2, vocab_size)
  tx = optim.make_optimizer(config.optimizer, steps)
  params = model.init({"params": jax.random.key(0)}, jnp.ones((1, config.max_len), jnp.int32),
                      mlm_positions=jnp.zeros((1, k), jnp.int32),
                      mask_input=jnp.zeros((1, config.max_len), bool))["params"]
  return model, train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx,
                                        dropout_key=jax.random.key_data(jax.random.key(1)))


def _small_config(attention="softmax", length=12, vocab=24):
  config = recipes_config.get_config()
  config.vocab_size, config.max_len = vocab, length
  config.model.update(attention=attention, embed_dim=16, num_heads=2, ffn_dim=32,
                      attention_impl="fused" if attention != "additive" else "xla",
                      dropout_rate=0.0)
  config.optimizer.learning_rate = 3e-3
  return config


def _runs(rng):
  """Softmax attention's task: runs t, t+1, t+2, ... (mod 22, from a random start). A masked
  token is its left neighbour + 1, which only its context tells (chance: 1/22)."""
  starts = rng.integers(0, 22, (32, 1))
  return ((starts + np.arange(12)) % 22 + 2).astype(np.int32)


def _halves(rng):
  """Additive attention's task (Fastformer mixes tokens only through global summaries, so it
  cannot see a neighbour): the first 6 tokens are one random id, the last 6 another; a masked
  token is its half's id, which only the rest of the text tells (chance: 1/22)."""
  first, second = rng.integers(2, 24, (2, 32, 1))
  return np.where(np.arange(12) < 6, first, second).astype(np.int32)


@pytest.mark.parametrize("attention,task,learned", [("softmax", _runs, 0.6),
                                                    ("additive", _halves, 0.2)])
def test_the_masked_tokens_are_learned_from_their_context(attention, task, learned):
  # (300 steps: softmax reaches ~0.75, additive ~0.3; chance is 0.045.)
  config = _small_config(attention)
  _, state = _mlm_state(config, config.vocab_size, k=3)
  step = jax.jit(lambda s, b: pretrain.mlm_train_step(s, b, mask_rate=0.25, max_predictions=3,
                                                      vocab_size=config.vocab_size))
  rng = np.random.default_rng(0)
  history = []
  for _ in range(300):
    state, metrics = step(state, {"inputs": task(rng)})
    history.append(float(metrics["correct"] / metrics["count"]))
  assert np.mean(history[:20]) < 0.15
  assert np.mean(history[-30:]) > learned, np.mean(history[-30:])


def test_transfer_copies_the_embedding_and_encoder_and_keeps_the_classifier_head():
  config = _small_config()
  config.model.mlp_dim = 8
  model, state = _mlm_state(config, config.vocab_size, k=2)
  pretrained = pretrain.encoder_params(state.params)
  assert set(pretrained) == {"embedding", "block_0"} and set(pretrained["embedding"]) == {
      "token", "position"}  # no MLM head, no [MASK] vector
  fresh = model.init({"params": jax.random.key(5)}, jnp.ones((1, 12), jnp.int32))["params"]
  merged = pretrain.transfer(fresh, pretrained)
  flat, flat_fresh, flat_pre = map(pretrain.flatten, (merged, fresh, pretrained))
  assert set(flat) == set(flat_fresh)
  for name, value in flat.items():
    source = flat_pre if name in flat_pre else flat_fresh
    np.testing.assert_array_equal(value, source[name])
  assert any(n.startswith(("mlp", "logits")) for n in flat) and not set(flat_pre) & {
      n for n in flat if n.startswith(("mlp", "logits"))}
  other = _small_config()
  other.model.embed_dim = 8
  _, small = _mlm_state(other, other.vocab_size, k=2)
  # (checked in sorted order, so the first mismatch named is always the same one)
  with pytest.raises(ValueError, match=re.escape(
      "The pretrained parameter block_0/attention/key/bias has shape (2, 4); the model's: "
      "(2, 8).")):
    pretrain.transfer(fresh, pretrain.encoder_params(small.params))


def test_with_a_cls_token_the_logits_read_the_predicted_tokens_own_hidden_state():
  # The CLS token shifts every position by one; reading the neighbour's state would still
  # learn (test above), so check the head against a hand computation on the captured states.
  config = _small_config()
  config.model.pooling = "cls"
  model, state = _mlm_state(config, config.vocab_size, k=3)
  tokens = jnp.asarray(np.random.default_rng(0).integers(2, 24, (2, 12)), jnp.int32)
  positions = jnp.asarray([[0, 5, 11], [3, 3, 7]])
  logits, variables = model.apply(
      {"params": state.params}, tokens, mlm_positions=positions,
      mask_input=jnp.zeros((2, 12), bool),
      capture_intermediates=lambda module, _: isinstance(module, layers.EncoderBlock))
  hidden = variables["intermediates"]["block_0"]["__call__"][0]
  assert hidden.shape == (2, 13, 16)  # CLS first
  p = state.params
  h = hidden[:, 1:][jnp.arange(2)[:, None], positions]
  h = nn.gelu(h @ p["mlm_dense"]["kernel"] + p["mlm_dense"]["bias"])
  h = (h - h.mean(-1, keepdims=True)) / jnp.sqrt(h.var(-1, keepdims=True) + 1e-6)
  h = h * p["mlm_norm"]["scale"] + p["mlm_norm"]["bias"]
  expected = h @ p["embedding"]["token"]["embedding"].T + p["mlm_bias"]
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_pretraining_text_is_train_plus_unlabeled_never_validation_or_test(tmp_path):
  train_rows = [(f"trainrow{i} shared".encode(), i % 2) for i in range(20)]
  splits = {"train": train_rows, "test": [(b"testrow shared", 0)] * 5,
            "unsupervised": [(f"unsuprow{i} shared".encode(), -1) for i in range(7)]}
  config = make_config(tmp_path, val_fraction=0.1)
  with fake_tfds(splits):
    texts, _ = ip.pretraining_texts(config, "unsupervised", "pretrain.unlabeled_split")
    raw = tfds_source.TfdsSource(config).read(config.val_fraction, config.data_seed)
    for split in ("test", "validation_matched", "train"):
      with pytest.raises(ip.DataError, match=re.escape(
          f"config.pretrain.unlabeled_split={split!r} is a labelled split")):
        ip.pretraining_texts(config, split, "pretrain.unlabeled_split")
    for split in ("unsupervised+test", "test[:20%]", "unsupervised[:50%]"):  # TFDS would take them
      with pytest.raises(ip.DataError, match=re.escape(
          f"config.pretrain.unlabeled_split={split!r} is not a plain split name")):
        ip.pretraining_texts(config, split, "pretrain.unlabeled_split")
  markers = [t.split()[0] for t in texts]
  assert len(markers) == 18 + 7 and sum(m.startswith("unsuprow") for m in markers) == 7
  held_out = {t.split()[0] for t in raw.texts["validation"]}
  assert len(held_out) == 2 and not held_out & set(markers)
  assert not any(m.startswith("testrow") for m in markers)


@pytest.mark.parametrize("field,value,message", [
    ("pretrain.objective", "clm", "config.pretrain.objective='clm' is invalid"),
    ("pretrain.mask_rate", 0.0, "config.pretrain.mask_rate=0.0 is invalid"),
    ("pretrain.max_predictions", 500, ("config.pretrain.max_predictions=500 is invalid; it must "
                                      "be at most config.max_len=200")),
    ("pretrain.num_steps", 0, "config.pretrain.num_steps=0 is invalid"),
    ("pretrain.learning_rate", 0.0, "config.pretrain.learning_rate=0.0 must be > 0"),
    ("embedding.init", "word2vec", ("config.pretrain.objective='mlm' trains the token "
                                         "embeddings itself")),
    ("dataset", "reviews.csv", "config.pretrain.unlabeled_split='unsupervised' names a TFDS"),
    ("padding", "before_as_token", "needs config.layout.padding='after_masked'"),
    ("embedding.bigram_buckets", 1000, "config.embedding.bigram_buckets=1000: a masked token's bigrams"),
])
def test_bad_pretraining_settings_are_one_clear_sentence(field, value, message, tmp_path):
  config = recipes_config.get_config()
  config.pretrain.objective = "mlm"
  config.pretrain.unlabeled_split = "unsupervised"
  if field == "dataset":  # (a local file that exists: the recipe, not the path, is refused)
    value = str(tmp_path / value)
    pathlib.Path(value).write_text("text,label\nfine,a\n")
  defaults.set_fields(config, {field: value})
  with pytest.raises(ValueError, match=re.escape(message)):
    runner.validate(config, 1)


def test_a_pretrained_run_fine_tunes_from_the_cache_and_a_resume_never_pretrains(tmp_path,
                                                                                 monkeypatch):
  data = write_sentiment_jsonl(tmp_path / "reviews.jsonl", n=240)
  overrides = {"pretrain.objective": "mlm", "pretrain.num_steps": 12,
               "pretrain.batch_size": 8, "pretrain.max_predictions": 4,
               "pretrain.warmup_steps": 2}
  args = cli_args(data, tmp_path / "cache", num_train_steps=10, **overrides)
  first = run_main(args, tmp_path / "run")
  assert first.returncode == 0, first.stderr[-3000:]
  assert "Pretraining the encoder as a masked language model" in first.stdout
  cached = list((tmp_path / "cache").glob("*-mlm-*.npz"))
  assert len(cached) == 1
  curve = [json.loads(line) for line in (tmp_path / "run" / "pretrain.jsonl").open()]
  assert [row["step"] for row in curve] == [5, 10, 12]  # log_every_steps=5, and the last
  assert all(np.isfinite(row["pretrain/loss"]) for row in curve)
  report = read_metrics(tmp_path / "run")[-1]
  assert report["test/params_from_step"] == 10 and np.isfinite(report["test/loss"])

  # The cached encoder is what a fresh run starts from, read back bit for bit.
  config = recipes_config.get_config()
  config.update(dataset=data, cache_dir=str(tmp_path / "cache"), vocab_size=64, max_len=16,
                batch_size=8, log_every_steps=5)
  config.model.update(embed_dim=16, num_heads=2, ffn_dim=16, mlp_dim=8)
  config.optimizer.learning_rate = 3e-3
  config.pretrain.update(objective="mlm", num_steps=12, batch_size=8, max_predictions=4,
                         warmup_steps=2)
  loaded = ip.load_dataset(config, None)

  def no_training(*args, **kwargs):
    raise AssertionError("pretrained again instead of read from the cache")
  monkeypatch.setattr(ip, "pretraining_texts", no_training)
  params, cached_curve = pretrain.pretrain(config, loaded.tokenizer, loaded.vocab_size)
  assert cached_curve == curve
  with np.load(cached[0]) as archive:
    np.testing.assert_array_equal(params["block_0"]["ffn_in"]["kernel"],
                                  archive["param:block_0/ffn_in/kernel"])
  model = models.build_model(config, 2, loaded.vocab_size)
  state = train_state.init_train_state(model, optim.make_optimizer(config.optimizer, 10),
                                 jax.random.key(0), 16, config.optimizer,
                                 pretrained_params=params)
  np.testing.assert_array_equal(state.params["embedding"]["token"]["embedding"],
                                params["embedding"]["token"]["embedding"])
  config.pretrain.seed = 1  # other settings: another cache entry, so it must pretrain
  with pytest.raises(AssertionError, match="pretrained again"):
    pretrain.pretrain(config, loaded.tokenizer, loaded.vocab_size)
  config.model.pooling = "max"  # a head-only setting: the same cache entry
  config.pretrain.seed = 0
  assert pretrain.pretrain(config, loaded.tokenizer, loaded.vocab_size)[1] == curve
  monkeypatch.undo()
  config.pretrain.batch_size = 1000
  with pytest.raises(ip.DataError, match=re.escape(
      "the pretraining corpus has 192 non-empty text(s), fewer than one batch of "
      "config.pretrain.batch_size=1000")):
    pretrain.pretrain(config, loaded.tokenizer, loaded.vocab_size)

  # A finished or resumed run restores its parameters: it never pretrains again.
  (tmp_path / "cache").rename(tmp_path / "cache-moved")
  again = run_main(args, tmp_path / "run")
  assert again.returncode == 0 and "Pretrain" not in again.stdout, again.stdout[-2000:]


def test_two_processes_pretrain_together_when_only_one_has_the_cache(tmp_path):
  # Pretraining steps are collective: if process 0 took its cached encoder while process 1
  # pretrained, the run would hang. Process 0 here has the cache of a one-process run, process
  # 1 an empty cache dir: both must pretrain, and the run must match the one-process run.
  data = write_sentiment_jsonl(tmp_path / "reviews.jsonl", n=240)
  overrides = {"num_train_steps": 20, "pretrain.objective": "mlm", "pretrain.num_steps": 12,
               "pretrain.batch_size": 8, "pretrain.max_predictions": 4,
               "pretrain.warmup_steps": 2}
  one = run_main(cli_args(data, tmp_path / "cache0", **overrides), tmp_path / "one")
  assert one.returncode == 0, one.stderr[-3000:]
  procs, outputs = run_two_processes(
      lambda i: cli_args(data, tmp_path / f"cache{i}", **overrides), tmp_path / "two",
      timeout=300)
  assert all(p.returncode == 0 for p in procs), outputs
  assert "Pretraining the encoder" in outputs[0] and "read from the cache" not in outputs[0]
  assert list((tmp_path / "cache1").glob("*-mlm-*.npz"))  # process 1 wrote its own cache
  assert_rows_close(eval_rows(tmp_path / "one"), eval_rows(tmp_path / "two"))
