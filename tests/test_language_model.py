"""The language-modelling task (textattn/tasks/language_model/): packing, segment ids in causal
softmax, bits per byte, the Kneser-Ney reference, a run that resumes bit-identically, sampling,
and the one-sentence refusals."""

from __future__ import annotations

import json
import math
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from textattn import attention, defaults
from textattn import run as runner
from textattn.attention import softmax
from textattn.errors import UsageError
from textattn.tasks.language_model import data as data_lib
from textattn.tasks.language_model import ngram, sampling, tokenizers
from textattn.tasks.language_model import step as step_lib
from textattn.tasks.language_model.config import segment_variants
from textattn.tasks.language_model.model import LanguageModel
from textattn.train_state import TrainState

WORDS = ["the", "movie", "was", "good", "bad", "great", "awful", "plot", "actor", "film", "scene", "é", "ü", "ß"]


def tiny_config(dataset, **overrides):
  config = defaults.for_task("language_model")
  config.update(dataset=str(dataset), val_documents=8, test_documents=8, max_len=32,
                batch_size=8, num_train_steps=12, eval_every_steps=6, checkpoint_every_steps=6,
                log_every_steps=6, kn_order=3, keep_checkpoints=5, intervals_dataset="")
  config.model.update(embed_dim=16, num_heads=2, ffn_dim=32, num_layers=1)
  config.update(overrides)
  return config


def write_documents(path, count=80, seed=0):
  rng = np.random.default_rng(seed)
  documents = [" ".join(rng.choice(WORDS, rng.integers(2, 12))) for _ in range(count)]
  path.write_text("\n".join(documents) + "\n", encoding="utf-8")
  return documents


def test_packing_gives_exact_rows_segment_ids_positions_and_weights():
  rows = data_lib.pack([np.array([10, 11, 12]), np.array([20]), np.array([30, 31])], 4)
  np.testing.assert_array_equal(rows, [[1, 10, 11, 12, 2], [2, 1, 20, 2, 1], [1, 30, 31, 2, 0]])
  fields = jax.tree.map(np.asarray, data_lib.row_fields(jnp.asarray(rows)))
  np.testing.assert_array_equal(fields["inputs"], rows[:, :-1])
  np.testing.assert_array_equal(fields["targets"], rows[:, 1:])
  np.testing.assert_array_equal(fields["segment_ids"], [[1, 1, 1, 1], [1, 2, 2, 2], [1, 1, 1, 1]])
  np.testing.assert_array_equal(fields["positions"], [[0, 1, 2, 3], [0, 0, 1, 2], [0, 1, 2, 3]])
  padded = jax.tree.map(np.asarray, data_lib.row_fields(jnp.asarray(
      data_lib.pack([np.array([7])], 5))))  # [start] 7 [end] then padding
  np.testing.assert_array_equal(padded["segment_ids"], [[1, 1, 1, 0, 0]])
  np.testing.assert_array_equal(padded["positions"], [[0, 1, 2, 0, 0]])
  np.testing.assert_array_equal(padded["weights"], [[1, 1, 0, 0, 0]])
  # Every document's tokens and its [end] once; never [end] -> [start] or padding.
  np.testing.assert_array_equal(fields["weights"], [[1, 1, 1, 1], [0, 1, 1, 0], [1, 1, 1, 0]])
  assert fields["weights"].sum() == (3 + 1) + (1 + 1) + (2 + 1)


@pytest.mark.parametrize("implementation", softmax.SEGMENT_KERNELS)
def test_causal_softmax_with_segment_ids_equals_each_document_alone(implementation):
  module = attention.get("causal").build(num_heads=2, implementation=implementation,
                                         dtype=jnp.float64)
  with jax.enable_x64(True):
    # Row 0: two documents packed (3 and 4 positions, then padding); rows 1-2: each alone.
    x = np.array(jax.random.normal(jax.random.key(0), (3, 8, 8), jnp.float64))
    x[1, :3], x[2, :4] = x[0, :3], x[0, 3:7]
    lengths = np.array([7, 3, 4])
    mask = jnp.asarray(np.arange(8)[None] < lengths[:, None])
    segments = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 1, 0, 0, 0, 0, 0],
                          [1, 1, 1, 1, 0, 0, 0, 0]])
    params = jax.jit(module.init)(jax.random.key(1), x, mask)
    apply = jax.jit(module.apply)
    packed = np.asarray(apply(params, x, mask, segment_ids=segments))
    alone = np.asarray(apply(params, x, mask))  # (no segment ids: as before they existed)
    np.testing.assert_allclose(packed[0, :3], alone[1, :3], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(packed[0, 3:7], alone[2, :4], rtol=1e-12, atol=1e-12)
    for row in (1, 2):  # one segment a row: the same as no segment ids
      np.testing.assert_allclose(packed[row, :lengths[row]], alone[row, :lengths[row]],
                                 rtol=1e-12, atol=1e-12)
    q, k, v = (jax.random.normal(jax.random.key(i), (3, 8, 2, 4), jnp.float64) for i in range(3))
    core = softmax.KERNELS[implementation](q, k, v, mask, causal=True, segment_ids=segments)
    assert np.all(np.asarray(core[0, 7]) == 0)  # padding sees no key: exactly 0
  fused = attention.get("causal").build(num_heads=2, implementation="fused")
  with pytest.raises(UsageError, match=r"^attention_impl='fused' takes no segment ids"):
    fused.apply(fused.init(jax.random.key(1), x.astype(np.float32), mask),
                x.astype(np.float32), mask, segment_ids=segments)


def test_every_causal_variant_with_segment_ids_is_offered():
  # (the built-in ones; causal_window_linear's hybrid takes no segment ids, so it is not)
  assert segment_variants() == ["causal", "causal_additive", "causal_additive_recurrent",
                                "causal_linear", "sliding_window", "causal_performer",
                                "retnet", "gla", "mamba2", "deltanet", "gated_deltanet"]


@pytest.mark.parametrize("variant", segment_variants())
def test_each_document_alone_in_a_packed_row_and_cached_decoding_is_uncached_argmax(variant):
  # Another document in the same row leaves a document's logits unchanged; greedy decoding
  # through the cache draws the uncached model's argmax at every step.
  model = LanguageModel(vocab_size=tokenizers.ByteTokenizer.vocab_size, max_len=16,
                        embed_dim=16, num_heads=2, ffn_dim=32, num_layers=1, attention=variant)
  first = data_lib.pack([np.array([5, 6, 7]), np.array([8, 9, 10, 11])], 16)
  second = data_lib.pack([np.array([20, 21, 22, 23, 24]), np.array([8, 9, 10, 11])], 16)
  params = jax.jit(model.init)(jax.random.key(0), jnp.ones((1, 16), jnp.int32))["params"]
  apply = jax.jit(model.apply)
  fields = data_lib.row_fields(jnp.asarray(np.concatenate([first, second])))
  logits = np.asarray(apply({"params": params}, fields["inputs"], fields["segment_ids"],
                            fields["positions"]))
  alone = np.zeros((2, 16), np.int32)
  alone[0, :5] = [1, 8, 9, 10, 11]
  alone_logits = np.asarray(apply({"params": params}, jnp.asarray(alone)))
  np.testing.assert_allclose(logits[0, 5:10], alone_logits[0, :5], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(logits[1, 7:12], alone_logits[0, :5], rtol=1e-5, atol=1e-5)

  prompts = [np.array([40, 41, 42]), np.array([50])]
  drawn = sampling.sample(model, params, prompts, 8, temperature=0.0)
  batch = np.zeros((2, 16), np.int32)
  for row, (prompt, tokens) in enumerate(zip(prompts, drawn)):
    batch[row, :1 + len(prompt) + len(tokens)] = np.concatenate([[1], prompt, tokens])
  logits = np.array(apply({"params": params}, jnp.asarray(batch)))
  logits[..., [tokenizers.PAD_ID, tokenizers.START_ID]] = -np.inf
  for row, (prompt, tokens) in enumerate(zip(prompts, drawn)):
    np.testing.assert_array_equal(tokens, logits[row].argmax(-1)[len(prompt):][:len(tokens)])


@pytest.mark.parametrize("variant", [n for n in segment_variants() if attention.get(n).rotary])
def test_rotary_positions_are_relative_turn_queries_and_keys_and_decode_from_the_cache(variant):
  # position="rotary": a document packed after another has the logits it has alone (the
  # rotation depends on i - j only, so the row's positions need no restart), they differ from
  # the same parameters without positions (the modules do turn q and k), and greedy decoding
  # through the cache (its running index as the position) draws the uncached argmax.
  make = lambda position: LanguageModel(
      vocab_size=tokenizers.ByteTokenizer.vocab_size, max_len=16, embed_dim=16, num_heads=2,
      ffn_dim=0, num_layers=1, attention=variant, position=position)
  model = make("rotary")
  params = jax.jit(model.init)(jax.random.key(0), jnp.ones((1, 16), jnp.int32))["params"]
  assert "position" not in params["embed"] and "ffn_in" not in params["blocks_0"]
  # (queries and keys 8x larger than at initialisation: attention far from uniform, so the
  # rotation shows in the logits)
  params = jax.tree_util.tree_map_with_path(
      lambda path, p: p * 8 if any(getattr(k, "key", "") in ("query", "key") for k in path)
      else p, params)
  apply = jax.jit(model.apply)
  rows = data_lib.pack([np.array([20, 21, 22, 23, 24]), np.array([8, 9, 10, 11])], 16)
  fields = data_lib.row_fields(jnp.asarray(rows))
  logits = np.asarray(apply({"params": params}, fields["inputs"], fields["segment_ids"]))
  alone = np.zeros((1, 16), np.int32)
  alone[0, :5] = [1, 8, 9, 10, 11]
  alone_logits = np.asarray(apply({"params": params}, jnp.asarray(alone)))
  np.testing.assert_allclose(logits[0, 7:12], alone_logits[0, :5], rtol=1e-5, atol=1e-5)
  unturned = np.asarray(make("none").apply({"params": params}, jnp.asarray(alone)))
  assert np.abs(unturned[0, 1:5] - alone_logits[0, 1:5]).max() > 1e-3

  prompts = [np.array([40, 41, 42]), np.array([50])]
  drawn = sampling.sample(model, params, prompts, 8, temperature=0.0)
  batch = np.zeros((2, 16), np.int32)
  for row, (prompt, tokens) in enumerate(zip(prompts, drawn)):
    batch[row, :1 + len(prompt) + len(tokens)] = np.concatenate([[1], prompt, tokens])
  logits = np.array(apply({"params": params}, jnp.asarray(batch)))
  logits[..., [tokenizers.PAD_ID, tokenizers.START_ID]] = -np.inf
  for row, (prompt, tokens) in enumerate(zip(prompts, drawn)):
    np.testing.assert_array_equal(tokens, logits[row].argmax(-1)[len(prompt):][:len(tokens)])


def test_next_token_keeps_to_the_top_k_never_draws_a_banned_token_and_follows_the_key():
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(4, 12)), jnp.float32)
  banned = [tokenizers.PAD_ID, tokenizers.START_ID]
  allowed = np.asarray(logits).copy()
  allowed[:, banned] = -np.inf
  order = np.argsort(-allowed, axis=-1)

  def draws(temperature, top_k, count=64):  # [count, 4]: one draw per key
    keys = jax.random.split(jax.random.key(0), count)
    return np.asarray(jax.jit(jax.vmap(lambda key: sampling.next_token(
        logits, key, temperature, top_k)))(keys))

  np.testing.assert_array_equal(draws(1.0, 1), np.tile(order[:, 0], (64, 1)))  # top 1: greedy
  three = draws(1.0, 3)
  assert all(set(three[:, row]) <= set(order[row, :3]) for row in range(4))
  assert all(len(set(three[:, row])) > 1 for row in range(4))  # the key decides, within the 3
  # (a finite floor for banned tokens, divided by a huge temperature, came within reach)
  assert not np.isin(draws(1e10, 0, count=256), banned).any()
  np.testing.assert_array_equal(draws(1.0, 12), draws(1.0, 0))  # k = the vocabulary: all of it
  np.testing.assert_array_equal(draws(1.0, 500), draws(1.0, 0))  # (once a traceback)


def test_a_temperature_that_is_not_a_finite_number_is_refused():
  # (nan once drew nothing and exited 0: an empty continuation)
  for bad in (float("nan"), float("inf"), -1.0):
    with pytest.raises(UsageError, match="must be a finite number >= 0"):
      sampling.sample(None, None, [np.array([5])], 4, temperature=bad)


def test_a_word_models_continuation_starts_with_the_space_after_the_prompt(monkeypatch):
  # (its decode joins words by spaces, with none before the first: "the movie" + "was good")
  import types

  from textattn.tasks import language_model
  generator = language_model.Generator.__new__(language_model.Generator)
  generator.model = generator.params = None
  generator.tokenizer = types.SimpleNamespace(
      kind="word", encode=lambda texts: [np.array([5])] * len(texts),
      decode=lambda ids: " ".join(["was", "good"][:len(ids)]))
  monkeypatch.setattr(sampling, "sample", lambda *_: [np.array([7, 8]), np.array([], int),
                                                      np.array([7])])
  assert generator.generate(["the movie", "a", "ends in a space "]) == [" was good", "", "was"]


_IDENTITY = optax.identity()


def _state(model, params):
  return TrainState.create(apply_fn=model.apply, params=params, tx=_IDENTITY,
                           dropout_key=jax.random.key_data(jax.random.key(0)))


def test_bits_per_byte_is_the_hand_computed_figure():
  texts = ["ab", "héllo", "xyz!"]  # 2 + 6 + 4 = 12 bytes, 3 [end]s
  byte_count = 12
  byte_tok = tokenizers.ByteTokenizer()
  rows = data_lib.pack(byte_tok.encode(texts), 32)  # one row: every document whole
  split = data_lib.Split(rows, np.zeros(len(rows), np.int32))
  model = LanguageModel(vocab_size=byte_tok.vocab_size, max_len=32, embed_dim=8, num_heads=2,
                        ffn_dim=16, num_layers=1)
  params = jax.jit(model.init)(jax.random.key(0), jnp.ones((1, 32), jnp.int32))["params"]
  evaluate = step_lib.make_evaluator(4)
  # A uniform model (zero output layer): log2(259) bits for each byte and each [end].
  uniform = jax.tree.map(jnp.zeros_like, params)
  metrics = evaluate(_state(model, uniform), split, "test", byte_count)
  assert metrics["test/tokens"] == 15
  assert metrics["test/bits_per_byte"] == pytest.approx(math.log2(259) * 15 / 12, rel=1e-6)
  assert metrics["test/perplexity"] == pytest.approx(259, rel=1e-5)
  # A random tiny model: each document scored alone, [start] then its bytes, in float64.
  total = 0.0
  sequences = [np.concatenate([[1], ids, [2]]) for ids in byte_tok.encode(texts)]
  batch = np.zeros((len(sequences), 8), np.int32)  # (padding after: causal logits unchanged)
  for row, sequence in enumerate(sequences):
    batch[row, :len(sequence) - 1] = sequence[:-1]
  all_logits = np.asarray(jax.jit(model.apply)({"params": params}, jnp.asarray(batch)),
                          np.float64)
  for logits, sequence in zip(all_logits, sequences):
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    total -= log_probs[np.arange(len(sequence) - 1), sequence[1:]].sum() / math.log(2)
  metrics = evaluate(_state(model, params), split, "test", byte_count)
  assert metrics["test/bits_per_byte"] == pytest.approx(total / byte_count, rel=1e-5)


def test_a_lossy_tokenizer_has_no_bits_per_byte():
  assert not tokenizers.train("word", ["Hello, World!"], 16).lossless
  assert "test/bits_per_byte" not in step_lib.metrics(
      "test", {"loss_sum": 2.0, "correct": 0.0, "count": 2.0}, None)


def test_kneser_ney_distributions_sum_to_one_and_learn_the_text():
  model = ngram.KneserNey(4).fit([b"abracadabra", b"abba", "h\xe9".encode()])
  for history in (b"", b"ab", b"abr", b"zzz", b"\xff\xfe\x00"):
    distribution = model.distribution(history)
    assert distribution.shape == (257,) and np.all(distribution > 0)
    assert distribution.sum() == pytest.approx(1.0, abs=1e-12)
  assert model.distribution(b"abr").argmax() == ord("a")
  seen = -model.log2_likelihood([b"abracadabra"]) / 11
  assert seen < ngram.bits_per_byte(["abracadabra"], ["qwertyuiop"], 4) and seen < 3


def test_bpe_is_lossless():
  texts = ["Ceci n'est pas une pipe.\tTabs,  double spaces", "naïve café — 日本語 🙂", " lead",
           "a literal [END] and <|endoftext|>"]
  bpe = tokenizers.train("bpe", texts * 5, 300)
  again = tokenizers.from_json(bpe.to_json())
  for text, ids in zip(texts, again.encode(texts)):
    assert ids.min() >= tokenizers.NUM_SPECIAL and again.decode(ids) == text


def test_refusals_name_the_variants_that_work(tmp_path):
  path = tmp_path / "docs.txt"
  write_documents(path)
  for variant in ("softmax", "linear"):
    with pytest.raises(UsageError, match=rf"^config.model.attention='{variant}' does not keep "
                                         r"packed documents apart .*: causal.*\.$"):
      runner.validate(tiny_config(path, model={"attention": variant}), None)
  # On a sequence mesh: the variants whose sharded forms take segment ids (ring, prefix).
  with pytest.raises(UsageError, match=r"^config.model.attention='sliding_window' declares no "
                                       r"sequence sharding, so it cannot run with "
                                       r"mesh.sequence=2; use mesh.sequence=1 or"):
    runner.validate(tiny_config(path, mesh={"sequence": 2},
                                model={"attention": "sliding_window"}), None)
  runner.validate(tiny_config(path, mesh={"sequence": 2}), None)
  runner.validate(tiny_config(path), 1)
  # Rotary positions need a variant that turns its queries and keys (registry.Variant.rotary).
  with pytest.raises(UsageError, match=r"^config.model.position='rotary' needs an attention .* "
                                       r"config.model.attention='causal_additive' does not; "
                                       r"allowed: causal, causal_linear, sliding_window, "
                                       r"causal_performer\.$"):
    runner.validate(tiny_config(path, model={"attention": "causal_additive",
                                             "position": "rotary"}), None)
  runner.validate(tiny_config(path, model={"position": "rotary", "ffn_dim": 0}), None)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  root = tmp_path_factory.mktemp("lm")
  write_documents(root / "docs.txt")
  config = tiny_config(root / "docs.txt", cache_dir=str(root / "cache"))
  report = runner.train_and_evaluate(config, str(root / "straight"))
  return root, config, report


def test_a_run_reports_test_metrics_and_references_and_resumes_bit_identically(trained):
  from tests.test_train import assert_trees_identical, restore_params
  root, config, report = trained
  assert {"test/bits_per_byte", "test/perplexity", "test/loss", "test/xz_bits_per_byte",
          "test/kn3_bits_per_byte"} <= set(report)
  written = json.loads((root / "straight" / "lm_report.json").read_text())
  assert [row["name"] for row in written["rows"]][1:] == [
      "xz -9e", "byte 3-gram, interpolated Kneser-Ney"]
  assert written["rows"][0]["bits_per_byte"] == report["test/bits_per_byte"]
  shutil.copytree(root / "straight", root / "resumed")
  shutil.rmtree(root / "resumed" / "checkpoints" / "12")
  resumed = runner.train_and_evaluate(config, str(root / "resumed"))
  assert_trees_identical(restore_params(root / "straight")[1],
                         restore_params(root / "resumed")[1])
  untimed = lambda row: {k: v for k, v in row.items() if "seconds" not in k}  # (wall clock)
  assert untimed(resumed) == untimed(report)


def test_generation_is_deterministic_for_a_seed_and_greedy_is_the_argmax(trained):
  import textattn
  root, _, _ = trained
  generator = textattn.load(str(root / "straight"))
  prompts = ["the movie", "a"]
  drawn = generator.generate(prompts, max_tokens=10, temperature=1.0, top_k=5, seed=3)
  assert drawn == generator.generate(prompts, max_tokens=10, temperature=1.0, top_k=5, seed=3)
  # A prompt's continuation is its own, alone or in another row of another batch (a draw once
  # took the batch's noise at the prompt's row).
  assert [drawn[1]] == generator.generate(["a"], max_tokens=10, temperature=1.0, top_k=5, seed=3)
  assert generator.generate(["no", "the movie", "a"], max_tokens=10, temperature=1.0, top_k=5,
                            seed=3)[1:] == drawn
  encoded = generator.tokenizer.encode(prompts)
  greedy = sampling.sample(generator.model, generator.params, encoded, 10, temperature=0.0)
  # The uncached model over [start] prompt drawn: each drawn token is its argmax.
  sequences = [np.concatenate([[tokenizers.START_ID], p, t]) for p, t in zip(encoded, greedy)]
  batch = np.zeros((len(sequences), 32), np.int32)
  for row, sequence in enumerate(sequences):
    batch[row, :len(sequence)] = sequence
  all_logits = np.array(jax.jit(generator.model.apply)({"params": generator.params},
                                                       jnp.asarray(batch)))
  all_logits[..., [tokenizers.PAD_ID, tokenizers.START_ID]] = -np.inf
  for prompt, tokens, sequence, logits in zip(encoded, greedy, sequences, all_logits):
    expected = logits.argmax(-1)[len(prompt):len(sequence) - 1]
    np.testing.assert_array_equal(tokens, expected)
    assert len(tokens) == 10 or logits[len(sequence) - 1].argmax() == tokenizers.END_ID
  with pytest.raises(UsageError, match=r"does not fit the model's context of max_len=32"):
    generator.generate(["x" * 30], max_tokens=10)
  # [start], 21 prompt bytes and the first 10 of 11 drawn are the 32 positions fed: it fits
  # (it was refused), one more byte does not.
  assert len(generator.generate(["x" * 21], max_tokens=11, temperature=0.0)) == 1
  with pytest.raises(UsageError, match=r"a prompt of 22 tokens plus --max_tokens=11 does not"):
    generator.generate(["x" * 22], max_tokens=11)

  # The command line draws what the library draws, one JSON line per prompt; bad input: one line.
  import subprocess
  import sys
  command = [sys.executable, "-m", "textattn.generate", f"--workdir={root / 'straight'}",
             "--text=the movie", "--text=a", "--max_tokens=10", "--temperature=1.0", "--top_k=5",
             "--seed=3", "--json"]
  repo = str(pathlib.Path(__file__).resolve().parents[1])
  done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300,
                        cwd=repo)
  assert done.returncode == 0, done.stderr[-2000:]
  lines = [json.loads(line) for line in done.stdout.splitlines()]
  assert lines == [{"text": p, "continuation": d} for p, d in zip(prompts, drawn)]
  refused = subprocess.run(command[:4], capture_output=True, text=True, check=False, timeout=60,
                           cwd=repo)
  assert refused.returncode == 2 and refused.stderr.startswith("error: give the prompts with ")


def test_tfds_trains_on_its_train_split_and_draws_held_out_documents_from_another(tmp_path):
  import tensorflow as tf
  import tensorflow_datasets as tfds
  sizes = {"unsupervised": 12, "test": 9}

  def as_dataset(self, split, *args, **kwargs):
    texts = [f"{split} review {i}" for i in range(sizes[str(split)])]
    return tf.data.Dataset.from_tensor_slices({"text": texts, "label": [0] * len(texts)})

  config = defaults.for_task("language_model")
  config.update(val_documents=3, test_documents=4, data_dir=str(tmp_path / "tfds"),
                cache_dir=str(tmp_path / "cache"))
  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    documents = data_lib.read_documents(config)
  assert documents["train"] == [f"unsupervised review {i}" for i in range(12)]
  held_out = documents["validation"] + documents["test"]
  assert (len(documents["validation"]), len(documents["test"])) == (3, 4)
  assert len(set(held_out)) == 7 and all(t.startswith("test review ") for t in held_out)
  assert not list((tmp_path / "cache").glob("*documents*"))  # mocked data is never cached


def test_a_workdir_tokenizer_counted_on_other_documents_is_refused_on_a_fresh_start(tmp_path):
  # (it was reused: a word or BPE vocabulary counted on what is now a held-out document)
  from textattn.data.splits import DataError
  path = tmp_path / "docs.txt"
  write_documents(path)
  workdir = tmp_path / "run"
  workdir.mkdir()
  config = tiny_config(path, tokenizer="word", vocab_size=40)
  first = data_lib.load_data(config, str(workdir))
  assert data_lib.load_data(config, str(workdir)).tokenizer.to_json() == first.tokenizer.to_json()
  for change in ({"data_seed": 1}, {"vocab_size": 30}):
    with pytest.raises(DataError, match="counted on other training data"):
      data_lib.load_data(tiny_config(path, tokenizer="word", **{"vocab_size": 40, **change}),
                         str(workdir))
  byte = tmp_path / "bytes"
  byte.mkdir()
  data_lib.load_data(tiny_config(path, tokenizer="bytes"), str(byte))  # (counted on nothing)
  data_lib.load_data(tiny_config(path, tokenizer="bytes", data_seed=1), str(byte))
  assert not (byte / data_lib.COUNTED_ON).exists()
