"""Fine-tuning a pretrained encoder (config.model.pretrained) and starting from a file of word
vectors (embedding.init="vectors:PATH") as runs: they train, stop and resume exactly,
predict and explain from the workdir alone, and refuse what cannot work in one sentence before
the workdir is touched. Data: a small JSONL file of the tiny BERT fixture's words."""

import json
import os
import shutil
import signal

import jax
import numpy as np
import optax
import pytest

import textattn
from tests.test_train import REPO, assert_trees_identical, final_report, restore_params, run_main
from textattn import checkpointing, defaults, errors, optim
from textattn import run as runner
from textattn.pretrained import hf

FIXTURE = REPO / "tests" / "fixtures" / "tiny_bert"
FILLER = ["the", "movie", "film", "was", "plot", "acting", "this", "it", "and", "of"]


def write_reviews(path, n=160, seed=0):
  """A learnable task in the fixture's vocabulary: the label is whether "good" or "bad" occurs."""
  rng = np.random.default_rng(seed)
  with open(path, "w") as f:
    for _ in range(n):
      label = int(rng.integers(2))
      words = list(rng.choice(FILLER, size=rng.integers(3, 9)))
      words.insert(int(rng.integers(len(words) + 1)), ["bad", "good"][label])
      f.write(json.dumps({"text": " ".join(words), "label": ["neg", "pos"][label]}) + "\n")
  return str(path)


def finetune_config(tmp_path, model_dir, **overrides):
  config = defaults.complete(defaults.classification())
  config.dataset = write_reviews(tmp_path / "reviews.jsonl")
  config.cache_dir = str(tmp_path / "cache")
  config.model.pretrained = str(model_dir)
  config.model.pooling = "cls"
  config.max_len, config.batch_size, config.platform.eval_batch_size = 16, 8, 16
  config.num_train_steps, config.log_every_steps = 24, 4
  config.eval_every_steps = config.checkpoint_every_steps = 8
  config.optimizer.update(name="adamw", learning_rate=5e-3, schedule="linear", warmup_steps=4,
                          weight_decay=0.01, layer_decay=0.8)
  return defaults.set_fields(config, overrides)


def test_a_fine_tuning_run_stops_resumes_bit_identically_and_predicts_without_the_model(
    tmp_path, monkeypatch, capsys):
  model_dir = tmp_path / "tiny_bert"
  shutil.copytree(FIXTURE, model_dir)
  config = finetune_config(tmp_path, model_dir, num_train_steps=16)
  straight = runner.train_and_evaluate(config, str(tmp_path / "straight"))
  printed = capsys.readouterr().out
  # The start says which weights came from the checkpoint: all the encoder's, not the head.
  assert "pretrained: 39 parameter arrays" in printed
  assert "pretrained: 2 parameter arrays are new (initialised afresh): logits/{bias,kernel}" in (
      printed)

  # A SIGTERM after the first checkpoint: the run saves where it stopped and exits.
  save = checkpointing.save
  def save_then_terminate(*args, **kwargs):
    save(*args, **kwargs)
    monkeypatch.setattr(checkpointing, "save", save)  # (once: a second SIGTERM exits at once)
    os.kill(os.getpid(), signal.SIGTERM)
  monkeypatch.setattr(checkpointing, "save", save_then_terminate)
  stopped = tmp_path / "stopped"
  with pytest.raises(errors.Stopped):
    runner.train_and_evaluate(config, str(stopped))
  assert 8 <= restore_params(stopped)[0] < 16
  # The model directory is gone (moved, deleted): the workdir alone resumes the run.
  shutil.rmtree(model_dir)
  assert runner.train_and_evaluate(config, str(stopped)) == straight
  assert "Resuming from checkpoint" in capsys.readouterr().out
  step_a, params_a = restore_params(tmp_path / "straight")
  step_b, params_b = restore_params(stopped)
  assert step_a == step_b == 16
  assert_trees_identical(params_a, params_b)
  assert final_report(tmp_path / "straight") == final_report(stopped)

  # The workdir alone predicts and explains: the encoder's config and tokenizer are in it.
  classifier = textattn.load(str(stopped))
  rows = classifier.predict(["this movie was good", "bad plot"])
  assert [row["tokens"] for row in rows] == [6, 4]  # [CLS] ... [SEP]
  probabilities = classifier.predict_proba(["this movie was good", "bad plot"])
  np.testing.assert_allclose([list(r["probabilities"].values()) for r in rows], probabilities)
  # Predicting the run's own test texts from the workdir alone gives its test predictions: the
  # texts are encoded as training encoded them (the saved tokenizer, max_len, truncation).
  from textattn import compare
  from textattn.data import file_source
  raw = file_source.FileSource(config).read(config.val_fraction, config.data_seed)
  _, written = compare.load_predictions(str(stopped))
  np.testing.assert_allclose(classifier.predict_proba(raw.texts["test"]), written, rtol=1e-5,
                             atol=1e-6)
  [explained] = classifier.explain(["this movie was good"])
  assert explained["tokens"] == ["[CLS]", "this", "movie", "was", "good", "[SEP]"]
  assert len(explained["weights"]) == 6 and all(w is not None for w in explained["weights"])


def test_a_roberta_model_fine_tunes_and_predicts_with_its_padding_id_as_0(tmp_path):
  """RoBERTa pads with id 1 and starts with <s> = 0: the ids and embedding rows exchange them, so
  padding is 0 in the batches and <s> is a token the model sees (a run that took <s> for
  padding would mask every row's first token and predict on its text without it)."""
  config = finetune_config(tmp_path, REPO / "tests" / "fixtures" / "tiny_roberta",
                           num_train_steps=4, eval_every_steps=4, checkpoint_every_steps=4,
                           max_len=20)
  runner.train_and_evaluate(config, str(tmp_path / "run"))
  classifier = textattn.load(str(tmp_path / "run"))
  [explained] = classifier.explain(["this movie was good"])
  assert explained["tokens"][0] == "<s>" and explained["tokens"][-1] == "</s>", explained
  config.max_len = 21  # 22 position rows, of which RoBERTa's numbering skips pad_token_id + 1
  with pytest.raises(errors.UsageError, match="longer than the 20 positions"):
    runner.tasks.get("classification").validate(config, None)


def test_the_fine_tuned_model_learns_the_task(tmp_path):
  config = finetune_config(tmp_path, FIXTURE, num_train_steps=60, **{
      "optimizer.layer_decay": 1.0, "optimizer.learning_rate": 5e-3})
  report = runner.train_and_evaluate(config, str(tmp_path / "run"))
  assert report["test/accuracy"] >= 0.8, report


def test_additive_attention_on_the_pretrained_encoder_trains_and_says_what_is_new(tmp_path,
                                                                                 capsys):
  # A learning rate of 1e-30: the trained state is the start the runner built, to float32.
  config = finetune_config(tmp_path, FIXTURE, num_train_steps=4, eval_every_steps=4,
                           checkpoint_every_steps=4, **{"model.attention": "additive",
                                                         "model.pooling": "mean",
                                                         "optimizer.learning_rate": 1e-30})
  report = runner.train_and_evaluate(config, str(tmp_path / "run"))
  printed = capsys.readouterr().out
  # A run that learns nothing says so at its evaluations and keeps it in the test report.
  assert "Warning: all 16 validation examples are predicted 'neg': the model has collapsed" in (
      printed)
  assert "Warning: all 16 test examples are predicted 'neg'" in report["test/warning"]
  assert final_report(tmp_path / "run")["test/warning"] == report["test/warning"]
  assert "parameter arrays are new (initialised afresh): encoder/block_*/attention/" in printed
  assert "checkpoint weights are unused: encoder/block_*/attention/" in printed
  # Every pretrained weight with a place (all but the value projections) is in the run's state.
  pretrained = hf.load(str(FIXTURE)).params
  _, params = restore_params(tmp_path / "run")
  trained = hf.flatten(params)
  kept = [name for name in pretrained if "/value/" not in name]
  assert len(kept) == len(pretrained) - 4  # (2 blocks: their value kernel and bias)
  for name in kept:
    np.testing.assert_allclose(trained[f"encoder/{name}"], pretrained[name], rtol=1e-6,
                               atol=1e-20, err_msg=name)
  assert not any("/value/" in name for name in trained)


def one_sentence(error):
  message = str(error)
  assert "\n" not in message and message.endswith("."), message
  return message


@pytest.mark.parametrize("problem, fragment", [
    ("no_weights", "has no model.safetensors"),
    ("too_long", "config.max_len=64 is longer than the 32 positions"),
    ("too_short", "config.max_len=2 leaves no room for a token beside the 2 special tokens"),
    ("not_bert", "describes a 'gpt2' model"),
])
def test_a_pretrained_model_that_cannot_be_used_is_one_sentence_before_jax(tmp_path, problem,
                                                                          fragment):
  model_dir = tmp_path / "model"
  shutil.copytree(FIXTURE, model_dir)
  overrides = {}
  if problem == "no_weights":
    (model_dir / "model.safetensors").unlink()
  elif problem in ("too_long", "too_short"):
    overrides["max_len"] = 64 if problem == "too_long" else 2
  else:
    settings = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**settings, "model_type": "gpt2"}))
  config = finetune_config(tmp_path, model_dir, **overrides)
  with pytest.raises(errors.UsageError) as raised:  # exit 2
    runner.tasks.get("classification").validate(config, None)
  assert fragment in one_sentence(raised.value)


def test_a_missing_model_directory_is_refused_at_a_fresh_start_in_one_sentence(tmp_path):
  # (not before JAX starts, as a resume needs no model directory; the workdir is not left)
  config = finetune_config(tmp_path, tmp_path / "no_such_model")
  runner.tasks.get("classification").validate(config, None)
  with pytest.raises(errors.UsageError) as raised:  # exit 2
    runner.train_and_evaluate(config, str(tmp_path / "run"))
  assert "is not a directory" in one_sentence(raised.value)
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides, fragment", [
    ({"model.pooling": "max"}, "config.model.pooling='max' is not allowed"),
    ({"padding": "before_as_token"}, "config.layout.padding='before_as_token' cannot be used"),
    ({"optimizer.name": "keras_adam", "optimizer.weight_decay": 0.0},
     "cannot be used with config.model.pretrained"),
    ({"model.pretrained": "hf:only-a-name"}, "is not of the form hf:ORG/NAME"),
])
def test_settings_a_pretrained_model_cannot_take_are_refused(tmp_path, overrides, fragment):
  config = finetune_config(tmp_path, FIXTURE, **overrides)
  with pytest.raises(errors.UsageError, match=fragment):
    runner.tasks.get("classification").validate(config, None)


def test_layer_decay_needs_a_pretrained_model(tmp_path):
  config = finetune_config(tmp_path, FIXTURE, **{"model.pretrained": ""})
  with pytest.raises(errors.UsageError, match="config.optimizer.layer_decay=0.8"):
    runner.tasks.get("classification").validate(config, None)


def test_a_bad_model_directory_exits_2_in_one_line_and_creates_no_workdir(tmp_path):
  workdir = tmp_path / "run"
  result = run_main([f"--config={REPO / 'tests' / 'recipes_config.py'}",
                     f"--config.dataset={write_reviews(tmp_path / 'r.jsonl')}",
                     f"--config.model.pretrained={tmp_path / 'nowhere'}"], workdir)
  assert result.returncode == 2, result.stderr[-2000:]
  [line] = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert f"config.model.pretrained='{tmp_path / 'nowhere'}' is not a directory" in line
  assert "Traceback" not in result.stderr and not workdir.exists()


def test_depth_scaling_from_the_names_equals_the_scales_of_a_built_model():
  params = {"encoder": {"embeddings": {"w": np.ones(2)}, "block_0": {"w": np.ones(2)},
                        "block_1": {"w": np.ones(2)}, "pooler": {"w": np.ones(2)}},
            "logits": {"w": np.ones(2)}}
  by_names, _ = optim.scale_by_depth(0.5).update(params, optax.EmptyState())
  expected, _ = optim.scale_by_layer_decay(
      optim.layer_decay_scales(params, 2, 0.5)).update(params, optax.EmptyState())
  jax.tree.map(np.testing.assert_array_equal, by_names, expected)
  assert float(by_names["encoder"]["embeddings"]["w"][0]) == 0.125  # 0.5 ** 3


def test_the_linear_schedule_warms_up_then_falls_to_zero_at_the_last_step():
  opt = defaults.optimizer()
  opt.update(name="adamw", schedule="linear", learning_rate=1.0, warmup_steps=2)
  opt.adam = optim.adam_config()
  opt.adam.update(eps=1e-12, b1=0.0, b2=0.0)  # (so an update's size is the learning rate)
  tx = optim.make_optimizer(opt, total_steps=6)
  params = {"w": np.zeros(1, np.float32)}
  state = tx.init(params)
  sizes = []
  for _ in range(6):
    updates, state = tx.update({"w": np.ones(1, np.float32)}, state, params)
    sizes.append(round(-float(updates["w"][0]), 4))
  assert sizes == [0.0, 0.5, 1.0, 0.75, 0.5, 0.25]


# ---- Word vectors from a file ------------------------------------------------------------------


def test_a_vectors_file_starts_the_token_table_and_the_run_prints_its_coverage(tmp_path,
                                                                             capsys):
  vectors_path = tmp_path / "glove.tiny.txt"
  rng = np.random.default_rng(1)
  given = {word: rng.normal(size=8).round(4) for word in ["good", "bad", "movie", "Film"]}
  vectors_path.write_text("".join(f"{w} {' '.join(map(str, v))}\n" for w, v in given.items()))
  config = finetune_config(tmp_path, "", num_train_steps=1, eval_every_steps=1,
                           checkpoint_every_steps=1, vocab_size=40, **{
      "model.pooling": "mean", "model.embed_dim": 8, "model.num_heads": 2,
      "embedding.init": f"vectors:{vectors_path}",
      "optimizer.layer_decay": 1.0, "optimizer.learning_rate": 1e-9})
  runner.train_and_evaluate(config, str(tmp_path / "run"))
  printed = capsys.readouterr().out
  assert "vectors: 4 of" in printed and "start from a vector of glove.tiny.txt" in printed
  assert "1 matched ignoring case" in printed  # "film" from "Film"
  tokenizer = textattn.load(str(tmp_path / "run")).tokenizer
  _, params = restore_params(tmp_path / "run")
  table = np.asarray(params["embedding"]["token"]["embedding"])
  for word, vector in given.items():  # (one step at a learning rate of 1e-9 moved nothing)
    np.testing.assert_allclose(table[tokenizer.token_id(word.lower())], vector, atol=1e-6)
  untouched = tokenizer.token_id("plot")
  assert 0 < np.abs(table[untouched]).max() <= 0.05  # the random initialiser's rows


def test_a_missing_vectors_file_is_one_sentence(tmp_path):
  config = finetune_config(tmp_path, "", **{"embedding.init": "vectors:/no/such.txt",
                                            "optimizer.layer_decay": 1.0})
  with pytest.raises(errors.UsageError) as raised:
    runner.validate(config, 1)
  assert "/no/such.txt is not a file" in one_sentence(raised.value)



def test_html_line_breaks_cost_no_tokens():
  from textattn.pretrained import hf
  tokenizer = hf.load(str(FIXTURE)).tokenizer
  with_breaks = ["good film.<br /><br />bad plot<BR/>!"]
  np.testing.assert_array_equal(tokenizer.encode(with_breaks, 16, "post"),
                                tokenizer.encode(["good film.  bad plot !"], 16, "post"))
  assert list(tokenizer.lengths(with_breaks)) == [8]  # [CLS] good film . bad plot ! [SEP]
