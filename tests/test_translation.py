"""The translation task end to end on a small synthetic pairs file: it learns, reports token
accuracy, BLEU and chrF, resumes exactly, and runs from textattn.main."""

import json
import os
import shutil

import numpy as np
import pytest

from tests.test_train import assert_trees_identical, restore_params
from textattn import defaults
from textattn import progress as progress_lib
from textattn import run as runner
from textattn.data.splits import DataError
from textattn.tasks import translation

WORDS = ["red", "blue", "green", "cat", "dog", "big", "small", "runs", "sleeps", "eats"]
SPANISH = {"red": "rojo", "blue": "azul", "green": "verde", "cat": "gato", "dog": "perro",
           "big": "grande", "small": "pequeño", "runs": "corre", "sleeps": "duerme",
           "eats": "come"}


def write_pairs(path, n=600, seed=0):
  """A learnable word-by-word 'translation' with a Spanish question mark to strip."""
  rng = np.random.default_rng(seed)
  with open(path, "w", encoding="utf-8") as f:
    for _ in range(n):
      words = list(rng.choice(WORDS, size=rng.integers(2, 6)))
      f.write(f"{' '.join(words).capitalize()}.\t¿{' '.join(SPANISH[w] for w in words)}?\n")
  return str(path)


def tiny(data, **overrides):
  config = defaults.complete(defaults.translation())
  config.dataset = data
  config.source_vocab = config.target_vocab = 40
  config.source_len = config.target_len = 8
  config.model.update(embed_dim=32, num_heads=2, ffn_dim=64, output_dropout_rate=0.1)
  config.optimizer.update(name="adam", learning_rate=3e-3, schedule="constant", warmup_steps=0)
  config.batch_size, config.platform.eval_batch_size = 16, 32
  config.num_train_steps, config.eval_every_steps, config.checkpoint_every_steps = 120, 40, 40
  config.log_every_steps = 20
  config.beam_size = 2
  for key, value in overrides.items():
    section, _, name = key.rpartition(".")
    (config[section] if section else config)[name] = value
  return config


@pytest.fixture(scope="module")
def causal_word(tmp_path_factory):
  """The default decoder (causal softmax) with word tokenizers, trained once (120 steps, beam 2):
  the BLEU check's first case and the translate CLI's model. -> (workdir, report)."""
  root = tmp_path_factory.mktemp("causal_word")
  config = tiny(write_pairs(root / "pairs.txt"))
  return root / "run", runner.train_and_evaluate(config, str(root / "run"))


def check_learned(report, workdir, shared):
  assert report["test/accuracy"] > 0.8, report
  assert report["test/bleu_greedy"] > 40 and report["test/chrf_beam2"] > 40, report
  assert report["test/bleu_signature"].startswith("nrefs:1")
  rows = [json.loads(line) for line in (workdir / "test_translations.jsonl").read_text(
      encoding="utf-8").splitlines()]
  assert len(rows) == 90 and set(rows[0]) == {"reference", "greedy", "beam2"}
  assert "¿" not in rows[0]["reference"] and "[end]" not in rows[0]["greedy"]
  saved = [(workdir / name).read_text(encoding="utf-8")
           for name in (translation.SOURCE_TOKENIZER, translation.TARGET_TOKENIZER)]
  assert (saved[0] == saved[1]) == shared


def test_translation_learns_and_reports_bleu(causal_word):
  check_learned(causal_word[1], causal_word[0], shared=False)


@pytest.mark.parametrize("decoder, tokenizer, shared", [("causal_additive_recurrent", "word", True),
                                                        ("causal", "bpe", False)])
def test_other_decoders_and_tokenizers_learn_too(tmp_path, decoder, tokenizer, shared,
                                                 monkeypatch, capsys):
  config = tiny(write_pairs(tmp_path / "pairs.txt"), **{"model.decoder_attention": decoder,
                                                        "tokenizer": tokenizer})
  if tokenizer == "bpe":  # room for the characters and merges
    config.update(source_vocab=80, target_vocab=80)
  if shared:  # one vocabulary, one token table for both sides and the output layer
    config.shared_vocab = True
    config.model.update(share_embeddings=True, tie_output=True)
  monkeypatch.setattr(progress_lib, "EVAL_PROGRESS_EVERY_S", 0.0)  # a progress line every batch
  report = runner.train_and_evaluate(config, str(tmp_path / "run"))
  check_learned(report, tmp_path / "run", shared)
  out = capsys.readouterr().out
  for line in ("  test: 64/90 examples", "  test greedy: 90/90 examples",
               "  test beam2: 32/90 examples"):
    assert line in out, out[-2000:]


def test_batches_cut_to_their_width_give_the_same_sums_as_full_width(tmp_path):
  import jax

  from textattn import train_state
  # (no dropout: its masks are drawn per shape, so a cut batch draws other masks)
  config = tiny(write_pairs(tmp_path / "pairs.txt"),
                **{"model.dropout_rate": 0.0, "model.output_dropout_rate": 0.0})
  data, source_tok, target_tok, _ = translation.load_data(config, str(tmp_path))
  packed = translation.Packed(translation.build_model(config, source_tok.vocab_size,
                                                      target_tok.vocab_size))
  import optax  # plain SGD: the update is the gradient (Adam would blow float noise up to lr)
  state = train_state.init_train_state(packed, optax.sgd(1.0), jax.random.key(0), 17, config.optimizer)
  trim = translation.trimmer(config.source_len, config.target_len)
  inputs = data.validation.inputs[:32]  # sorted by length: short rows first
  widths = translation.lengths(inputs, config.source_len)
  assert widths.max() < config.source_len  # so the cut is real
  full = trim({"inputs": inputs, "weights": np.ones(32, np.float32)}, None)
  cut = trim({"inputs": inputs, "weights": np.ones(32, np.float32)}, int(widths.max()))
  assert cut["sources"].shape[1] < full["sources"].shape[1]
  eval_step, train_step = jax.jit(translation.eval_step), jax.jit(translation.train_step)
  a, b = eval_step(state, full), eval_step(state, cut)
  assert float(a["count"]) == float(b["count"]) > 0 and float(a["correct"]) == float(b["correct"])
  np.testing.assert_allclose(float(a["loss_sum"]), float(b["loss_sum"]), rtol=1e-5)
  state_a, sums_a = train_step(state, full)
  state_b, sums_b = train_step(state, cut)
  np.testing.assert_allclose(float(sums_a["loss_sum"]), float(sums_b["loss_sum"]), rtol=1e-5)
  jax.tree.map(lambda x, y, p: np.testing.assert_allclose(x - p, y - p, rtol=1e-4, atol=1e-6),
               state_a.params, state_b.params, state.params)


def test_a_translation_run_resumes_bit_identically(tmp_path):
  # (The shipped config through textattn.main: tests/test_sequence_training.py's translation test.)
  data = write_pairs(tmp_path / "pairs.txt")
  config = tiny(data, num_train_steps=60, eval_every_steps=20, checkpoint_every_steps=20,
                keep_checkpoints=5, beam_size=0)
  runner.train_and_evaluate(config, str(tmp_path / "straight"))
  shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
  for step in ("40", "60"):
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / step)
  report = runner.train_and_evaluate(config, str(tmp_path / "resumed"))
  assert_trees_identical(restore_params(tmp_path / "straight")[1],
                         restore_params(tmp_path / "resumed")[1])
  straight_rows = [json.loads(line) for line in
                   (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
  untimed = lambda row: {k: v for k, v in row.items() if "seconds" not in k}  # (wall clock)
  assert untimed(straight_rows[-1]) == untimed({"step": 60, **report})
  assert "test/decode_seconds_greedy" in report


def test_translate_cli_round_trip_and_one_sentence_errors(tmp_path, causal_word):
  import subprocess
  import sys

  from textattn import translate
  run = causal_word[0]
  translator = translate.load(str(run))
  assert translator.translate(["Red cat runs."]) == ["rojo gato corre"]
  # No word once standardised: nothing to translate (the decoder invented a sentence from an
  # all-padding source); more words than source_len: counted, the command says so.
  assert translator.translate(["?!", "Red cat runs."]) == ["", "rojo gato corre"]
  from textattn.errors import UsageError
  with pytest.raises(UsageError, match="wider than the target vocabulary"):  # (out of memory)
    translator.translate(["Red cat runs."], beam=100000)
  long = " ".join(["cat"] * (translator.config.source_len + 1))
  assert translator.cut(["Red cat runs.", long]) == 1
  (tmp_path / "in.txt").write_text(f"Big dog eats.\n\nSmall cat sleeps.\n{long}\n",
                                   encoding="utf-8")
  repo = os.path.join(os.path.dirname(__file__), "..")
  done = subprocess.run([sys.executable, "-m", "textattn.translate", f"--workdir={run}",
                         f"--input={tmp_path / 'in.txt'}", "--beam=2", "--json",
                         "--plugin=tests.toy_attention"], cwd=repo,
                        capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr
  rows = [json.loads(line) for line in done.stdout.splitlines()]
  assert [r["text"] for r in rows] == ["Big dog eats.", "Small cat sleeps.", long]
  assert rows[0]["translation"] == "grande perro come"
  assert f"Note: 1 text(s) have more than source_len={translator.config.source_len} words" in (
      done.stderr)
  bad = subprocess.run([sys.executable, "-m", "textattn.translate", f"--workdir={tmp_path}",
                        "--text=hi"], cwd=repo, capture_output=True, text=True, check=False)
  assert bad.returncode == 1 and bad.stderr.startswith("error: ") and "config.json" in bad.stderr
  neither = subprocess.run([sys.executable, "-m", "textattn.translate", f"--workdir={run}"],
                           cwd=repo, capture_output=True, text=True, check=False)
  assert neither.returncode == 2 and neither.stderr.startswith("error: give the texts with ")


def test_the_chapter_config_builds_the_chapters_19_960_216_parameter_model():
  import jax
  import jax.numpy as jnp
  config = defaults.complete(defaults.load("configs/spa_eng_chapter.py"))
  model = translation.build_model(config, 15000, 15000)  # the chapter's vocabulary sizes
  ones = jnp.ones((1, 20), jnp.int32)
  params = jax.eval_shape(model.init, jax.random.key(0), ones, ones)["params"]
  assert sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(params)) == 19_960_216
  default = translation.build_model(defaults.complete(defaults.load("configs/spa_eng_transformer.py")), 15000, 15000)
  params = jax.eval_shape(default.init, jax.random.key(0), ones, ones)["params"]
  assert sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(params)) == 14_439_064


def test_a_head_size_or_shared_table_the_model_cannot_have_is_refused_in_one_sentence(tmp_path):
  config = tiny(write_pairs(tmp_path / "pairs.txt"),
                **{"model.head_dim": 16, "model.encoder_attention": "additive"})
  with pytest.raises(ValueError, match=r"head_dim=16 needs softmax attention; "
                                       r"config.model.encoder_attention='additive'"):
    runner.validate(config, 1)
  config = tiny(write_pairs(tmp_path / "pairs.txt"), **{"model.share_embeddings": True})
  with pytest.raises(ValueError, match=r"share_embeddings=True needs one vocabulary for both "
                                       r"sides: set config.shared_vocab=True"):
    runner.validate(config, 1)
  config.update(shared_vocab=True, source_vocab=30)
  with pytest.raises(ValueError, match=r"shared_vocab=True builds one vocabulary for both sides: "
                                       r"give source_vocab and target_vocab one size \(now 30 and 40\)"):
    runner.validate(config, 1)


def test_bpe_tokenizers_round_trip_standardised_text_and_keep_start_end_whole(tmp_path):
  from textattn.data import pairs as pairs_lib
  from textattn.data import tokenizer as tokenizer_lib
  pairs = pairs_lib.read_pairs(write_pairs(tmp_path / "pairs.txt"))
  rows = np.arange(len(pairs.sources))
  source, target = pairs_lib.train_tokenizers(pairs, rows, 60, 60, "bpe")
  assert source.kind == target.kind == "bpe" and target.vocab_size <= 60
  text = pairs_lib.standardize_target(pairs.targets[0])
  ids = target.encode([text], 40, "post", standardized=True)[0]
  assert ids[0] == target.token_id(pairs_lib.START) and pairs_lib.START not in target.decode(ids)
  assert target.decode(ids) == translation.reference_text(text)
  assert np.count_nonzero(ids) > len(text.split())  # subwords, not words
  again = tokenizer_lib.from_json(target.to_json())
  np.testing.assert_array_equal(again.encode([text], 40, "post", standardized=True)[0], ids)
  assert tokenizer_lib.from_json(
      pairs_lib.train_tokenizers(pairs, rows, 60, 60)[0].to_json()).kind == "word"


def test_a_tfds_translation_set_is_read_with_its_own_splits(tmp_path):
  import tensorflow as tf
  import tensorflow_datasets as tfds
  sizes = {"train": 30, "validation": 6, "test": 8}

  def as_dataset(self, split, *args, **kwargs):
    name = str(split)
    if name not in sizes:
      raise ValueError(f"Unknown split {name!r}.")
    texts = [f"{name} frase {i}" for i in range(sizes[name])]
    return tf.data.Dataset.from_tensor_slices({"pt": texts, "en": [t.upper() for t in texts]})

  config = tiny("tfds:ted_hrlr_translate/pt_to_en", source_field="pt", target_field="en")
  runner.validate(config, 1)
  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    data, _, _, references = translation.load_data(config, str(tmp_path))
    assert (len(data.train), len(data.validation), len(data.test)) == (30, 6, 8)
    assert references[0] == "test frase 0"  # the test split is TFDS's, standardised
    del sizes["validation"]  # a set without one: 15% of train is carved for it
    data, _, _, _ = translation.load_data(config, str(tmp_path / "carved"))
    assert (len(data.train), len(data.validation), len(data.test)) == (25, 5, 8)
    config.target_field = "de"
    with pytest.raises(DataError, match=r"has no feature 'de' \(it has en, pt\)"):
      translation.load_data(config, str(tmp_path / "bad"))


def test_tokenizers_counted_on_other_training_pairs_are_refused_on_a_fresh_start(tmp_path):
  # A run stopped before its first checkpoint, then started again with another split: its saved
  # tokenizers held words of the new held-out sentences (and new vocabulary sizes were ignored).
  data = write_pairs(tmp_path / "pairs.txt")
  workdir = tmp_path / "work"
  workdir.mkdir()
  translation.load_data(tiny(data), str(workdir))
  saved = (workdir / translation.SOURCE_TOKENIZER).read_bytes()
  translation.load_data(tiny(data), str(workdir))  # the same data: reused
  for changed in (tiny(data, data_seed=1), tiny(data, source_vocab=30)):
    with pytest.raises(DataError, match=r"holds a pair of tokenizers counted on other training data"):
      translation.load_data(changed, str(workdir))
  assert (workdir / translation.SOURCE_TOKENIZER).read_bytes() == saved
