"""The baselines (textattn/models/baselines.py, textattn/data/ngrams.py): n-gram features from the
training split only, TF-IDF and NB weights against direct computations, stable ids across
processes, BiLSTM masking, and the same train / resume / predict path as the transformer."""

import collections
import json
import math
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import textattn
from tests.test_train import (
  REPO,
  assert_trees_identical,
  cli_args,
  final_report,
  restore_params,
  run_main,
  tiny_config,
  write_sentiment_jsonl,
)
from textattn import compare, defaults, models
from textattn import progress as progress_lib
from textattn import run as runner
from textattn.data import file_source, ngrams
from textattn.data import tokenizer as tokenizer_lib
from textattn.models import baselines

TRAIN = ["the film was good and the plot was good", "a dull film", "the plot was dull dull",
         "good acting , good fun !", "bad bad film"]
TEST = ["a brand new phrase about the film", "good good good", ""]


def ngram_strings(text, order):
  words = tokenizer_lib.standardize(text).split()
  return [" ".join(words[i:i + n]) for n in range(1, order + 1)
          for i in range(len(words) - n + 1)]


@pytest.mark.parametrize("order", [1, 2, 3])
def test_vocabulary_is_the_most_frequent_training_ngrams_and_nothing_from_test(order):
  tok = ngrams.NgramTokenizer.train(TRAIN + TRAIN[:1], 12, order, counts=False)
  counts = collections.Counter(g for t in TRAIN + TRAIN[:1] for g in ngram_strings(t, order))
  vocab = [tok.describe(i) for i in range(2, tok.vocab_size)]
  assert len(vocab) == 10 == len(set(vocab))
  ranked = sorted(counts.values(), reverse=True)
  assert [counts[g] for g in vocab] == ranked[:10]  # by descending training count
  test_only = {g for t in TEST for g in ngram_strings(t, order)} - set(counts)
  assert test_only and not test_only & set(vocab)
  encoded = tok.encode(TEST, 16)
  # A test-only n-gram is the out-of-vocabulary feature; an empty text has no features.
  assert encoded[0][0] == tokenizer_lib.OOV_ID and not encoded[2].any()


@pytest.mark.parametrize("counts", [False, True])
def test_rows_hold_each_ngram_once_or_as_often_as_it_occurs_rarest_dropped_first(counts):
  tok = ngrams.NgramTokenizer.train(TRAIN, 100, 2, counts=counts)
  text = "the plot was dull dull"  # every n-gram a training one
  row = tok.encode([text], 32)[0]
  ids = row[row > 0]
  assert list(ids) == sorted(ids)
  expected = collections.Counter(ngram_strings(text, 2))
  got = collections.Counter(tok.describe(int(i)) for i in ids)
  assert got == (expected if counts else collections.Counter(set(expected)))
  short = tok.encode([text], 3)[0]
  np.testing.assert_array_equal(short, ids[:3])  # the most frequent (lowest ids) are kept
  assert tok.feature_counts([text])[0] == len(ids)


def test_feature_ids_are_the_same_in_another_process_and_after_saving():
  tok = ngrams.NgramTokenizer.train(TRAIN, 30, 3, counts=True)
  again = ngrams.tokenizer_from_json(tok.to_json())
  np.testing.assert_array_equal(again.encode(TEST + TRAIN, 20), tok.encode(TEST + TRAIN, 20))
  assert again.fingerprint() == tok.fingerprint()
  code = ("import sys, json; from textattn.data import ngrams; "
          f"t = ngrams.NgramTokenizer.train({TRAIN!r}, 30, 3, counts=True); "
          f"print(t.fingerprint()); print(json.dumps(t.encode({TEST + TRAIN!r}, 20).tolist()))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env=dict(os.environ, PYTHONHASHSEED="12345"), cwd=REPO).stdout.split("\n")
  assert out[0] == tok.fingerprint()
  np.testing.assert_array_equal(np.array(eval(out[1])), tok.encode(TEST + TRAIN, 20))


def bag_logits(config, tok, texts, frozen, width):
  """The bag model's logits with a known feature table (identity-like) and zero bias."""
  model = models.build_model(config, num_classes=width, vocab_size=tok.vocab_size)
  tokens = jnp.asarray(tok.encode(texts, config.max_len))
  params = jax.tree.map(np.asarray, model.init(jax.random.key(0), tokens)["params"])
  params = {**params, **frozen}
  return model, params, tokens


def test_tfidf_features_match_a_direct_computation():
  config = textattn_config(order=2, counts=True, weighting="tfidf", mlp_dim=0)
  tok = ngrams.NgramTokenizer.train(TRAIN, 40, 2, counts=True)
  inputs = tok.encode(TRAIN, config.max_len)
  frozen = baselines.frozen_parameters(config, inputs, np.zeros(len(TRAIN), np.int32), 2,
                                       tok.vocab_size)
  vocab = {tok.describe(i): i for i in range(2, tok.vocab_size)}
  df = collections.Counter(g for t in TRAIN for g in set(ngram_strings(t, 2)))
  idf = {g: math.log(1 + len(TRAIN) / (1 + df[g])) for g in vocab}
  mean_idf = np.mean(list(idf.values()))
  # Direct: the TF-IDF vector of each text, dotted with a random [vocabulary, 2] table.
  table = np.random.default_rng(0).normal(size=(tok.vocab_size, 2)).astype(np.float32)
  texts = TRAIN + TEST
  expected = np.zeros((len(texts), 2))
  for row, text in enumerate(texts):
    for gram, count in collections.Counter(ngram_strings(text, 2)).items():
      weight, feature = (idf[gram], vocab[gram]) if gram in vocab else (mean_idf, 1)
      expected[row] += count * weight * table[feature]
  model, params, tokens = bag_logits(config, tok, texts, frozen, 2)
  params["features"], params["bias"] = table, np.zeros(2, np.float32)
  got = model.apply({"params": params}, tokens)
  np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)


def test_nb_ratios_match_wang_and_mannings_formula():
  config = textattn_config(order=1, counts=False, weighting="nb", mlp_dim=0)
  labels = np.array([1, 0, 0, 1, 0], np.int32)
  tok = ngrams.NgramTokenizer.train(TRAIN, 40, 1, counts=False)
  inputs = tok.encode(TRAIN, config.max_len)
  ratios = baselines.frozen_parameters(config, inputs, labels, 2, tok.vocab_size)[
      "frozen_nb_ratio"]
  vocab = [tok.describe(i) for i in range(2, tok.vocab_size)]
  present = np.array([[w in set(ngram_strings(t, 1)) for w in vocab] for t in TRAIN], float)
  p = 1 + present[labels == 1].sum(0)
  q = 1 + present[labels == 0].sum(0)
  r = np.log(p / p.sum()) - np.log(q / q.sum())
  np.testing.assert_allclose(ratios[2:, 1], r, rtol=1e-5)
  np.testing.assert_allclose(ratios[2:, 0], -r, rtol=1e-5)


def test_frozen_weights_never_change_in_training(tmp_path):
  data = write_sentiment_jsonl(tmp_path / "reviews.jsonl")
  for weighting in ("tfidf", "nb"):
    config = baseline_tiny(data, tmp_path / "cache", "bag", bag_weighting=weighting)
    config.keep_checkpoints = 5
    workdir = str(tmp_path / weighting)
    runner.train_and_evaluate(config, workdir)
    _, first = restore_params(workdir, 10)
    _, last = restore_params(workdir)
    name = "frozen_idf" if weighting == "tfidf" else "frozen_nb_ratio"
    np.testing.assert_array_equal(first[name], last[name])
    assert np.abs(first[name]).sum() > 0  # filled from the data, not the zero initialisation
    trained = "features" if weighting == "tfidf" else "nb_weight"
    assert not np.array_equal(first[trained], last[trained])


def test_bilstm_padding_changes_nothing_and_each_direction_reads_only_real_tokens():
  model = baselines.BiLSTM(num_classes=3, vocab_size=50, embed_dim=8, rnn_dim=4)
  real = jnp.array([[5, 9, 3, 7, 2]])
  params = model.init(jax.random.key(0), real)["params"]
  apply = jax.jit(lambda tokens, mask=None: model.apply({"params": params}, tokens,
                                                         padding_mask=mask))
  unpadded = apply(real)
  padded = jnp.pad(real, ((0, 0), (0, 7)))
  np.testing.assert_allclose(apply(padded), unpadded, rtol=1e-6, atol=1e-6)
  # What sits in masked positions is never read, by either direction.
  junk = padded.at[:, 5:].set(11)
  np.testing.assert_allclose(apply(junk, padded != 0), unpadded, rtol=1e-6, atol=1e-6)
  # And the backward direction does read the last real token (a change there shows).
  changed = apply(padded.at[0, 4].set(8))
  assert not np.allclose(changed, unpadded)


def textattn_config(order, counts, weighting, mlp_dim):
  from textattn import defaults
  config = defaults.complete(defaults.classification())
  config.tokenizer, config.ngrams.order, config.ngrams.counts = "ngram", order, counts
  config.max_len = 64
  config.model.update(architecture="bag", mlp_dim=mlp_dim)
  config.ngrams.weighting = weighting
  return config


def baseline_tiny(data, cache, architecture, **model):
  config = tiny_config(data, cache)
  if architecture == "bag":
    config.tokenizer, config.ngrams.order, config.vocab_size = "ngram", 2, 200
    config.max_len = 48
  config.optimizer.learning_rate = 0.03 if architecture == "bag" else 0.01
  config.model.update(architecture=architecture, embed_dim=16)
  config.bilstm.rnn_dim = 8
  return defaults.set_fields(config, {f"model.{k}": v for k, v in model.items()})


MODELS = {"nb": ("bag", {"bag_weighting": "nb", "mlp_dim": 0}),
          "bag": ("bag", {"bag_weighting": "none"}),
          "bilstm": ("bilstm", {})}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """Each baseline trained for 100 steps on one small file: name -> (workdir, config, report)."""
  tmp = tmp_path_factory.mktemp("baselines")
  data = write_sentiment_jsonl(tmp / "reviews.jsonl")
  runs = {}
  for name, (architecture, model) in MODELS.items():
    config = baseline_tiny(data, tmp / "cache", architecture, **model)
    config.num_train_steps = 100
    runs[name] = (str(tmp / name), config,
                  runner.train_and_evaluate(config, str(tmp / name)))
  return runs


@pytest.mark.parametrize("name", list(MODELS))
def test_baselines_learn_and_predict_reproduces_their_test_report(trained, name):
  workdir, config, report = trained[name]
  assert report["test/accuracy"] > 0.85, report
  raw = file_source.FileSource(config).read(config.val_fraction, config.data_seed)
  loaded = textattn.load(workdir)
  probabilities = loaded.predict_proba(raw.texts["test"])
  labels, expected = compare.load_predictions(workdir)
  np.testing.assert_allclose(probabilities, expected, rtol=1e-6, atol=1e-7)
  assert np.mean(probabilities.argmax(-1) == labels) == pytest.approx(report["test/accuracy"])


def test_explain_reads_the_bilstms_tokens_and_refuses_a_bag_in_one_sentence(trained):
  rows = textattn.load(trained["bilstm"][0]).explain(["a good film", "the plot was awful"])
  assert [len(r["weights"]) for r in rows] == [3, 4]
  assert all(np.isfinite(w) for r in rows for w in r["weights"])
  with pytest.raises(ValueError, match="bag model's inputs are n-gram features"):
    textattn.load(trained["bag"][0]).explain(["a good film"])


def test_ensemble_weights_are_chosen_on_validation_and_its_predictions_compare(trained,
                                                                                tmp_path):
  from textattn import ensemble
  members = [trained["nb"][0], trained["bilstm"][0]]
  result = ensemble.run(members, str(tmp_path / "ens"), step=0.1)
  weights = [m["weight"] for m in result["members"]]
  assert sum(weights) == pytest.approx(1.0)
  # The grid holds each member alone, so validation can only improve on the best member.
  assert result["val_accuracy"] >= max(m["val_accuracy"] for m in result["members"])
  labels, probabilities = compare.load_predictions(str(tmp_path / "ens"))
  assert np.mean(probabilities.argmax(-1) == labels) == pytest.approx(result["test_accuracy"])
  for member in result["members"]:
    own = next(r for w, _, r in trained.values() if w == member["workdir"])
    assert member["test_accuracy"] == pytest.approx(own["test/accuracy"])
    assert member["test_probabilities"] == "test report"  # (the same step: no second pass)


def test_ensemble_computes_a_members_test_probabilities_its_report_did_not_make(
    trained, tmp_path, monkeypatch, capsys):
  # A member whose test_predictions.npz came from other parameters (another step) and says
  # wrong things: the ensemble must not use them, but predict the test split itself.
  from textattn import ensemble
  from textattn.tasks.classification import classifier
  workdir, _, report = trained["bilstm"]
  stale = tmp_path / "stale"
  subprocess.run(["cp", "-r", workdir, str(stale)], check=True)
  labels, probabilities, names = compare.load_run(workdir)
  compare.write_predictions(str(stale), labels, probabilities[:, ::-1], names,
                            params_from_step=10**6)
  calls = []
  original = classifier.Classifier.probabilities
  monkeypatch.setattr(classifier.Classifier, "probabilities",
                      lambda self, inputs, **kw: calls.append(len(inputs))
                      or original(self, inputs, **kw))
  monkeypatch.setattr(progress_lib, "EVAL_PROGRESS_EVERY_S", 0)
  result = ensemble.run([trained["nb"][0], str(stale)], str(tmp_path / "ens"), step=0.1)
  assert [m["test_probabilities"] for m in result["members"]] == ["test report", "computed"]
  assert result["members"][1]["test_accuracy"] == pytest.approx(report["test/accuracy"])
  validation = len(ensemble._member(workdir, "best")[1].validation.labels)
  assert calls == [validation, validation, len(labels)]
  err = capsys.readouterr().err  # progress lines on stderr, one per batch at interval 0
  assert f"  stale test: {len(labels):,}/{len(labels):,} examples" in err
  assert f"  nb validation: {validation:,}/{validation:,} examples" in err
  # A run stopped before its test report (checkpoints, no test_predictions.npz) is refused.
  (stale / compare.PREDICTIONS_FILE).unlink()
  with pytest.raises(textattn.data.DataError, match="has no test report .* must be a finished"):
    ensemble.run([trained["nb"][0], str(stale)], str(tmp_path / "ens2"), step=0.1)
  assert not (tmp_path / "ens2").exists()
  # --out a training run's workdir (its test report was replaced) or a file (a traceback after
  # the work): refused before it.
  report_file = pathlib.Path(workdir, compare.PREDICTIONS_FILE)
  before = report_file.read_bytes()
  for out, message in [(workdir, "is a training run's workdir"),
                       (str(stale / "config.json"), "is a file; give a directory")]:
    with pytest.raises(textattn.data.DataError, match=message):
      ensemble.run([trained["nb"][0], str(stale)], out, step=0.1)
  assert report_file.read_bytes() == before
  # A damaged config.json: one line, whoever reads the workdir.
  (stale / "config.json").write_text('{"task": "classif')
  with pytest.raises(textattn.data.DataError, match="cannot be read as a run's config"):
    textattn.load(str(stale))
  (stale / "config.json").write_text("[1, 2]")
  with pytest.raises(textattn.data.DataError, match="holds no run config"):
    textattn.load(str(stale))


def test_choose_weights_finds_the_mixture_validation_prefers():
  from textattn import ensemble
  labels = np.array([0, 1, 1, 0])
  a = np.array([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.8, 0.2]])  # wrong on example 1
  b = np.array([[0.4, 0.6], [0.1, 0.9], [0.3, 0.7], [0.7, 0.3]])  # wrong on example 0
  weights, accuracy, _ = ensemble.choose_weights([a, b], labels, step=0.1)
  mixed = weights[0] * a + weights[1] * b
  assert accuracy == 1.0 == np.mean(mixed.argmax(-1) == labels)
  assert 0 < weights[0] < 1
  assert len(ensemble.simplex_grid(3, 0.1)) == 66  # C(12, 2)


def test_ensemble_cli_refuses_members_of_other_carves_in_one_sentence(trained, tmp_path):
  other = tmp_path / "other"
  subprocess.run(["cp", "-r", trained["nb"][0], str(other)], check=True)
  info = other / "config.json"
  config = json.loads(info.read_text())
  config["data_seed"] = 7
  info.write_text(json.dumps(config))
  done = subprocess.run([sys.executable, "-m", "textattn.ensemble",
                         f"--workdir={trained['bag'][0]}", f"--workdir={other}",
                         f"--out={tmp_path / 'ens'}"], cwd=REPO, capture_output=True,
                        text=True, check=False)
  assert done.returncode == 1
  assert done.stderr.strip().splitlines()[-1].startswith("error: ") and "data_seed" in done.stderr
  assert not (tmp_path / "ens").exists()
  typo = subprocess.run([sys.executable, "-m", "textattn.ensemble", "--workdir=a", "--workdir=b",
                         "--out=c", "--step=abc"], cwd=REPO, capture_output=True, text=True,
                        check=False)  # (absl's two FATAL lines and exit 1 before)
  assert typo.returncode == 2 and typo.stderr.strip() == (
      "error: flag --step=abc: could not convert string to float: 'abc'")


@pytest.mark.parametrize("architecture", ["bag", "bilstm"])
def test_a_killed_baseline_run_resumes_bit_identically(tmp_path, architecture):
  data = write_sentiment_jsonl(tmp_path / "reviews.jsonl")
  extra = ({"tokenizer": "ngram", "vocab_size": 200, "max_len": 48, "model.architecture": "bag",
            "ngrams.weighting": "nb", "model.mlp_dim": 0} if architecture == "bag"
           else {"model.architecture": "bilstm", "bilstm.rnn_dim": 8})
  args = cli_args(data, tmp_path / "cache", num_train_steps=30, **extra)
  straight = run_main(args, tmp_path / "straight")
  assert straight.returncode == 0, straight.stdout + straight.stderr
  # A copy that lost everything after its first checkpoint (as a kill there would leave it).
  subprocess.run(["cp", "-r", str(tmp_path / "straight"), str(tmp_path / "half")], check=True)
  checkpoints = tmp_path / "half" / "checkpoints"
  for step in sorted(int(d) for d in os.listdir(checkpoints) if d.isdigit())[1:]:
    subprocess.run(["rm", "-rf", str(checkpoints / str(step))], check=True)
  resumed = run_main(args, tmp_path / "half")
  assert resumed.returncode == 0, resumed.stdout + resumed.stderr
  resumed_at = int(resumed.stdout.split("Resuming from checkpoint at step ")[1].split(".")[0])
  assert resumed_at < 30
  assert_trees_identical(restore_params(tmp_path / "straight")[1],
                         restore_params(tmp_path / "half")[1])
  assert final_report(tmp_path / "straight") == final_report(tmp_path / "half")


@pytest.mark.parametrize("field,value,message", [
    ("model.architecture", "cnn", "config.model.architecture='cnn' is not allowed"),
    ("ngrams.weighting", "bm25", "config.ngrams.weighting='bm25' is not allowed"),
    ("optimizer.name", "keras_adam", "is for the transformer"),
])
def test_bad_baseline_settings_are_one_clear_sentence(field, value, message):
  config = textattn_config(order=2, counts=False, weighting="none", mlp_dim=16)
  defaults.set_fields(config, {field: value})
  with pytest.raises(ValueError, match=message):
    models.build_model(config, 2)


def test_rmsprop_is_keras_rmsprop_with_eps_outside_the_square_root():
  from textattn import defaults, optim
  config = defaults.complete(defaults.classification())
  config.optimizer.name, config.optimizer.learning_rate = "rmsprop", 0.1
  tx = optim.make_optimizer(config.optimizer, 10)
  params = {"w": jnp.zeros(3)}
  state = tx.init(params)
  velocity = np.zeros(3)
  for g in ([1e-3, 0.0, 2.0], [0.0, 1e-4, -1.0]):
    updates, state = tx.update({"w": jnp.asarray(g)}, state, params)
    velocity = 0.9 * velocity + 0.1 * np.square(g)  # keras.optimizers.RMSprop.update_step
    np.testing.assert_allclose(updates["w"], -0.1 * np.asarray(g) / (np.sqrt(velocity) + 1e-7),
                               rtol=1e-5)
