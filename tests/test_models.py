"""The classifier: parameter count, padding invariance for every variant x pooling, validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from textattn import attention, defaults, models
from textattn.models import layers

VARIANTS = [("softmax", "xla"), ("softmax", "dot_product"),
            ("softmax", "chunked"), ("softmax", "fused"),
            ("softmax", "native"),
            ("causal", "xla"), ("additive", "xla")]


def small_config(attention_name="softmax", impl="xla", pooling="mean", **model):
  config = defaults.complete(defaults.classification())
  config.vocab_size, config.max_len = 50, 16
  config.model.update(attention=attention_name, attention_impl=impl, pooling=pooling, embed_dim=8,
                      num_heads=2, num_layers=2, ffn_dim=8, mlp_dim=4)
  return defaults.set_fields(config, {f"model.{k}": v for k, v in model.items()})


def test_seed_configuration_has_the_keras_parameter_count():
  model = models.build_model(defaults.complete(defaults.classification()), num_classes=2)
  params = models.abstract_params(model, 200)
  assert models.count_parameters(params) == 653_566
  assert "653,566" in models.parameter_table(params)


# Every variant with mean pooling, every pooling with the fused softmax, and causal attention
# with each pooling it allows (causal + cls is rejected: test_causal_with_cls_pooling_is_rejected):
# padding handling is the attention's and the pooling's separately, so the full cross product
# would only repeat these cases.
LOGIT_CASES = sorted(
    {variant + ("mean",) for variant in VARIANTS}
    | {("softmax", "fused", pooling) for pooling in models.POOLINGS}
    | {("causal", "xla", pooling) for pooling in models.POOLINGS if pooling != "cls"})


@pytest.mark.parametrize("attention_name,impl,pooling", LOGIT_CASES)
def test_logits_ignore_padding(attention_name, impl, pooling):
  config = small_config(attention_name, impl, pooling)
  model = models.build_model(config, num_classes=3)
  rng = np.random.default_rng(0)
  lengths = np.array([10, 3, 1])
  mask = np.arange(10)[None] < lengths[:, None]
  tokens = np.where(mask, rng.integers(1, 50, (3, 10)), 0).astype(np.int32)
  params = model.init(jax.random.key(0), tokens)
  apply = jax.jit(lambda t, m: model.apply(params, t, padding_mask=m))
  logits = np.asarray(apply(tokens, mask))

  # Tokens under the padding mask changed to arbitrary ids: logits unchanged.
  junk = np.where(mask, tokens, rng.integers(1, 50, tokens.shape)).astype(np.int32)
  np.testing.assert_allclose(np.asarray(apply(junk, mask)), logits, atol=1e-5, rtol=1e-5)
  # More padding appended (length 10 -> 16): logits unchanged.
  longer = np.pad(tokens, ((0, 0), (0, 6)))
  np.testing.assert_allclose(np.asarray(jax.jit(model.apply)(params, longer)), logits,
                             atol=1e-5, rtol=1e-5)
  # And the padding mask is real: changing a real token does change the logits.
  changed = tokens.copy()
  changed[0, 0] = 1 + changed[0, 0] % 49
  assert not np.allclose(np.asarray(apply(changed, mask))[0], logits[0])


def test_padding_is_a_token_when_config_padding_is_before_as_token():
  # The Keras seed's computation: nothing masked, so the number and the embedding of the
  # padding ids change the logits; the masked default model ignores both.
  config = small_config()
  config.layout.padding = "before_as_token"
  unmasked = models.build_model(config, num_classes=2)
  assert not unmasked.mask_padding and models.build_model(small_config(), 2).mask_padding
  tokens = np.array([[0, 0, 0, 7, 8, 9]], np.int32)
  params = unmasked.init(jax.random.key(0), tokens)
  fewer = np.array([[0, 7, 8, 9]], np.int32)
  logits = np.asarray(unmasked.apply(params, tokens))
  assert not np.allclose(np.asarray(unmasked.apply(params, fewer)), logits, atol=1e-4)
  table = params["params"]["embedding"]["token"]["embedding"]
  moved = jax.tree_util.tree_map(lambda x: x, params)
  moved["params"]["embedding"]["token"]["embedding"] = table.at[0].add(1.0)
  assert not np.allclose(np.asarray(unmasked.apply(moved, tokens)), logits, atol=1e-4)
  masked = models.build_model(small_config(), num_classes=2)
  np.testing.assert_allclose(np.asarray(masked.apply(moved, tokens)),
                             np.asarray(masked.apply(params, tokens)), atol=1e-5)


def test_add_positions_gradients_are_the_float64_ones():
  # layers.add_positions' hand-written backward (the positions' gradient as one matrix-vector
  # product over the batch) against NumPy float64: x's gradient is g, the positions' is g summed
  # over the batch.
  rng = np.random.default_rng(0)
  x, g = (rng.standard_normal((5, 7, 8)).astype(np.float32) for _ in range(2))
  p = rng.standard_normal((7, 8)).astype(np.float32)
  out, vjp = jax.vjp(layers.add_positions, jnp.asarray(x), jnp.asarray(p))
  np.testing.assert_allclose(np.asarray(out), x.astype(np.float64) + p, rtol=1e-6)
  d_x, d_p = vjp(jnp.asarray(g))
  np.testing.assert_array_equal(np.asarray(d_x), g)
  np.testing.assert_allclose(np.asarray(d_p), g.astype(np.float64).sum(axis=0), rtol=1e-5,
                             atol=1e-6)


def test_bigram_ids_are_in_range_and_order_sensitive():
  tokens = jnp.array([[5, 9, 9, 5, 0, 0], [9, 5, 9, 5, 9, 5]], jnp.int32)
  ids = np.asarray(layers.bigram_ids(tokens, 1000))
  assert ids.dtype == np.int32 and ids.min() >= 0 and ids.max() < 1000
  assert ids[0, 1] == ids[1, 2] == ids[1, 4]  # (5, 9) wherever it occurs
  assert ids[0, 3] == ids[1, 1]  # (9, 5)
  assert len({ids[0, 1], ids[0, 2], ids[0, 3]}) == 3  # (5, 9), (9, 9), (9, 5): all distinct
  assert ids[0, 0] != ids[1, 1]  # the opening word (0, 5) is not (9, 5)


def test_bigram_embedding_starts_at_zero_ignores_padding_and_sees_word_order():
  config = small_config(bigram_buckets=64)
  model = models.build_model(config, num_classes=2)
  plain = models.build_model(small_config(), num_classes=2)
  tokens = np.array([[3, 4, 5, 6, 0, 0]], np.int32)
  params = model.init(jax.random.key(0), tokens)
  table = params["params"]["embedding"]["bigram"]["embedding"]
  assert table.shape == (64, 8) and not np.asarray(table).any()
  # At the start the model is the unigram model: drop the bigram table and the logits agree.
  unigram = jax.tree_util.tree_map(lambda x: x, params)
  del unigram["params"]["embedding"]["bigram"]
  np.testing.assert_allclose(np.asarray(model.apply(params, tokens)),
                             np.asarray(plain.apply(unigram, tokens)), atol=1e-6)
  trained = jax.tree_util.tree_map(lambda x: x, params)
  trained["params"]["embedding"]["bigram"]["embedding"] = jax.random.normal(
      jax.random.key(1), table.shape)
  apply = jax.jit(lambda p, t: model.apply(p, t))
  logits = np.asarray(apply(trained, tokens))
  assert not np.allclose(logits, np.asarray(apply(params, tokens)), atol=1e-4)
  # Padding still changes nothing: more of it appended, logits unchanged.
  np.testing.assert_allclose(np.asarray(apply(trained, np.pad(tokens, ((0, 0), (0, 4))))), logits,
                             atol=1e-5)


def test_training_mode_uses_dropout_and_eval_mode_is_deterministic():
  config = small_config(dropout_rate=0.5)
  model = models.build_model(config, num_classes=2)
  tokens = np.ones((4, 16), np.int32)
  params = model.init(jax.random.key(0), tokens)
  a = model.apply(params, tokens, train=True, rngs={"dropout": jax.random.key(1)})
  b = model.apply(params, tokens, train=True, rngs={"dropout": jax.random.key(2)})
  assert not np.allclose(a, b)
  # Evaluation ignores a dropout key even when one is given (without one, Flax would raise if
  # dropout ran; with one it would silently drop).
  plain = np.asarray(model.apply(params, tokens))
  for key in (1, 2):
    np.testing.assert_array_equal(
        model.apply(params, tokens, train=False, rngs={"dropout": jax.random.key(key)}), plain)


def test_token_dropout_zeroes_whole_token_embeddings_in_training_only():
  ids = np.arange(56).reshape(4, 14) % 49 + 1
  tokens = np.concatenate([ids, np.zeros((4, 2))], 1).astype(np.int32)
  model = models.build_model(small_config(dropout_rate=0.0, token_dropout_rate=0.5), 2)
  params = model.init(jax.random.key(0), tokens)
  table = np.asarray(params["params"]["embedding"]["token"]["embedding"])
  position = np.asarray(params["params"]["embedding"]["position"])[None, :16]

  def embedded(train, token_embeddings=None):
    _, state = model.apply(params, tokens, train=train, rngs={"dropout": jax.random.key(1)},
                           token_embeddings=token_embeddings,
                           capture_intermediates=lambda mdl, _: mdl.name == "embedding",
                           mutable=["intermediates"])
    (out,) = state["intermediates"]["embedding"]["__call__"]
    return np.asarray(out)

  full = table[tokens] + position
  out = embedded(True)
  dropped = np.all(out == np.broadcast_to(position, out.shape), axis=-1)  # token part zeroed
  kept = np.all(np.isclose(out, full), axis=-1)
  assert np.all(dropped | kept)
  real = tokens != 0
  assert 0.35 < dropped[real].mean() < 0.65, dropped[real].mean()
  # The lazy update looks the rows up itself: the same tokens must be dropped.
  np.testing.assert_array_equal(embedded(True, jnp.asarray(table[tokens])), out)
  np.testing.assert_allclose(embedded(False), full, rtol=1e-6)  # evaluation never drops
  off = models.build_model(small_config(dropout_rate=0.0), 2)
  np.testing.assert_array_equal(
      off.apply(params, tokens, train=True, rngs={"dropout": jax.random.key(1)}),
      off.apply(params, tokens))  # rate 0 (the default): training is deterministic here


@pytest.mark.parametrize("norm,position", [("pre", "sinusoidal"), ("post", "learned")])
def test_options_build_and_are_finite(norm, position):
  config = small_config(norm=norm, position=position)
  model = models.build_model(config, num_classes=2)
  tokens = np.ones((2, 16), np.int32)
  params = model.init(jax.random.key(0), tokens)
  assert np.all(np.isfinite(model.apply(params, tokens)))
  has_position_param = "position" in params["params"]["embedding"]
  assert has_position_param == (position == "learned")


def test_bfloat16_compute_keeps_float32_parameters_and_logits():
  config = small_config(dtype="bfloat16")
  model = models.build_model(config, num_classes=2)
  tokens = np.ones((2, 16), np.int32)
  params = model.init(jax.random.key(0), tokens)
  assert all(p.dtype == jnp.float32 for p in jax.tree_util.tree_leaves(params))
  logits = model.apply(params, tokens)
  assert logits.dtype == jnp.float32 and np.all(np.isfinite(logits))


@pytest.mark.parametrize("field,value,words", [
    ("model.num_heads", 3, ["config.model.num_heads=3", "embed_dim=8"]),
    ("model.attention", "linformer", ["config.model.attention", "linformer", "additive"]),
    ("model.pooling", "sum", ["config.model.pooling", "'sum'", "mean, max, attention, cls, last"]),
    ("model.position", "rotary", ["config.model.position", "sinusoidal"]),
    ("model.dtype", "float16", ["config.model.dtype", "bfloat16"]),
    ("model.embed_dim", 0, ["config.model.embed_dim=0", "integer >= 1"]),
    ("model.dropout_rate", 1.5, ["config.model.dropout_rate=1.5"]),
    ("embedding.token_dropout_rate", 1.0, ["config.embedding.token_dropout_rate=1.0", "[0, 1)"]),
    ("embedding.bigram_buckets", -5, ["config.embedding.bigram_buckets=-5", "integer >= 0"]),
])
def test_bad_model_config_is_a_clear_value_error(field, value, words):
  config = small_config()
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(ValueError) as error:
    models.build_model(config, num_classes=2)
  for word in words:
    assert word in str(error.value), str(error.value)


def test_input_longer_than_max_len_is_a_clear_value_error():
  model = models.build_model(small_config(), num_classes=2)
  with pytest.raises(ValueError, match=r"config.max_len=16 is smaller than the input length 20"):
    model.init(jax.random.key(0), np.ones((1, 20), np.int32))


def test_attention_registry_is_complete():
  assert attention.names() == ("softmax", "causal", "additive", "additive_value",
                               "causal_additive",
                               "causal_additive_recurrent", "linear", "causal_linear",
                               "sliding_window", "local", "performer", "causal_performer",
                               "window_linear", "causal_window_linear", "window_additive",
                               "retnet", "gla", "mamba2", "deltanet", "gated_deltanet")
  for name in attention.names():
    module = attention.get(name).build(num_heads=2)
    x = jnp.ones((1, 4, 8))
    params = module.init(jax.random.key(0), x, jnp.ones((1, 4), bool))
    assert module.apply(params, x, jnp.ones((1, 4), bool)).shape == x.shape


def test_causal_with_cls_pooling_is_rejected():
  with pytest.raises(ValueError, match="pooling='cls' cannot be used with"):
    models.build_model(small_config("causal", pooling="cls"), num_classes=2)


def test_cudnn_kernel_is_refused_without_gpu_and_bf16():
  if jax.default_backend() == "gpu":
    pytest.skip("on a GPU the cudnn kernel is allowed with bfloat16")
  with pytest.raises(ValueError, match="attention_impl='cudnn' needs a GPU"):
    models.build_model(small_config(impl="cudnn"), num_classes=2)


def test_native_kernel_is_refused_with_several_devices_or_off_cpu(monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")  # whatever runs the test
  monkeypatch.setattr(jax, "device_count", lambda: 2)
  with pytest.raises(ValueError, match="attention_impl='native' needs a single device, and "
                                       "this run has 2"):
    models.build_model(small_config(impl="native"), num_classes=2)
  # "auto" falls back to the XLA kernel instead of refusing.
  assert attention.get("softmax").resolve("auto", 4) == "fused"
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  with pytest.raises(ValueError, match="attention_impl='native' runs on a CPU only"):
    models.build_model(small_config(impl="native"), num_classes=2)
