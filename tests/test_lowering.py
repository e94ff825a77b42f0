"""Every accelerator path lowers for its platform, on a CPU (issue 53).

`jax.export` for "cuda" or "tpu" runs the platform's Pallas lowering (Triton for the GPU kernels,
Mosaic for the TPU ones) without the device, so a kernel that cannot lower fails here, in CI,
and not on a lent GPU. Each check also counts the kernel calls in the exported module, so a
kernel that silently fell back to XLA (interpret mode, an "auto" that chose XLA) fails too.
Lowering is not compilation: the GPU/TPU compiler, numerics and speed need the device
(experiments/gpu/accelerators.sh). cuDNN's flash attention cannot be exported at all without
cuDNN present ("cuDNN is not detected"), so its path has no test here; its numerics test
(tests/test_attention.py, cudnn) runs on a GPU (RESULTS section 28).
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import pytest

from textattn import defaults, models, optim, train_state
from textattn.attention import common, lowering, pallas_allowlist, pallas_gpu
from textattn.models import bert
from textattn.tasks import translation
from textattn.tasks.classification import step

CUDA, TPU = "cuda", "tpu"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(lowering.KERNELS))
def test_each_kernels_default_configuration_lowers_forward_and_backward_to_its_kernel_calls(
    name, dtype):
  # Each kernel as "auto" or a model would call it (no tiling given: its default configuration
  # for the platform). Odd head size (5), 15 features, length 100 (ragged last tiles), padding.
  # On b532f66 the fused additive kernel's CUDA export failed here: Mosaic GPU (jax's default
  # Pallas lowering for CUDA) refused it; its Triton compiler parameters fix that.
  calls = lowering.check_kernel(name, jnp.dtype(dtype))
  kernel = lowering.KERNELS[name]
  assert calls == {kernel.call: kernel.calls}
  assert kernel.backend == {TPU: "mosaic"}.get(kernel.platform, pallas_gpu.BACKENDS.get(name))


def test_a_configuration_reaches_the_triton_call():
  # The warps and stages of a TritonConfig are the Triton call's (each call's backend_config),
  # not a module-wide setting.
  kernel = lowering.KERNELS["causal_additive_recurrent_pallas"]
  config = pallas_gpu.TritonConfig(16, num_warps=8, num_stages=2)
  run = functools.partial(kernel.run, config=config)
  text = lowering.export(lowering.forward_backward(run), kernel.inputs(jnp.float32),
                         CUDA).mlir_module()
  assert re.findall(r"num_warps = (\d+)", text) == ["8", "8"]
  assert re.findall(r"num_stages = (\d+)", text) == ["2", "2"]


def test_a_kernel_traced_in_interpret_mode_is_caught_as_a_fallback():
  from textattn.attention.additive_pallas import Tiling, pallas_additive_attention

  def interpreted(q, k, mask, a, b):
    return pallas_additive_attention(q, k, mask, a, b, tiling=Tiling(32, 2, interpret=True))

  exported = lowering.export(lowering.forward_backward(interpreted),
                             lowering.kernel_inputs(jnp.float32), CUDA)
  assert not lowering.kernel_calls(exported)


def test_traced_for_is_what_the_kernels_read_and_ends_with_the_block():
  assert common.backend() == "cpu"
  with common.traced_for(CUDA):
    assert common.backend() == "gpu"
    with common.traced_for(TPU):
      assert common.backend() == "tpu"
    assert common.backend() == "gpu"
  assert common.backend() == "cpu"


def _train_step_calls(module, train_step, batch, init_length, platform):
  """The exported train step's kernel calls: forward, backward and the optimizer update of
  `module` (state shapes only: nothing is initialised or run)."""
  tx = optim.make_optimizer(defaults.optimizer(), total_steps=100)
  with common.traced_for(platform):
    state = jax.eval_shape(lambda: train_state.init_train_state(module, tx, jax.random.key(0),
                                                         init_length))
  return lowering.kernel_calls(lowering.export(train_step, (state, batch), platform))


def _tokens(batch, length):
  return jax.ShapeDtypeStruct((batch, length), jnp.int32)


def _classifier(attention, impl, dtype="float32", num_heads=2, embed_dim=24):
  config = defaults.complete(defaults.classification())
  config.vocab_size, config.max_len = 50, 40
  m = config.model
  m.attention, m.attention_impl, m.dtype = attention, impl, dtype
  m.embed_dim, m.num_heads, m.ffn_dim, m.num_layers = embed_dim, num_heads, 32, 2
  return config


# (attention, implementation, platform, dtype, head count, embed, kernel call expected)
ENCODER_PATHS = [
    ("additive", "pallas", CUDA, "float32", 2, 24, lowering.TRITON_CALL),
    ("additive", "pallas", CUDA, "bfloat16", 2, 24, lowering.TRITON_CALL),
    ("causal_additive_recurrent", "pallas", CUDA, "float32", 2, 24, lowering.TRITON_CALL),
    ("softmax", "auto", CUDA, "float32", 2, 24, None),  # XLA's dot_product (cuDNN: bfloat16)
    ("causal", "auto", CUDA, "float32", 2, 24, None),
    ("additive", "pallas_tpu", TPU, "float32", 2, 24, lowering.TPU_CALL),
    ("softmax", "splash", TPU, "bfloat16", 2, 256, lowering.TPU_CALL),
    # The newer families' accelerator path is XLA's (einsums, scans): it must lower, and with
    # no kernel call.
    ("linear", "auto", CUDA, "bfloat16", 2, 24, None),
    ("local", "auto", CUDA, "bfloat16", 2, 24, None),
    ("performer", "auto", CUDA, "bfloat16", 2, 24, None),
    ("local", "chunked", TPU, "bfloat16", 2, 24, None),
    ("window_linear", "xla", CUDA, "bfloat16", 2, 24, None),
    ("window_linear", "chunked", CUDA, "bfloat16", 2, 24, None),
    ("window_additive", "chunked", CUDA, "bfloat16", 2, 24, None),
]


@pytest.mark.parametrize("attention,impl,platform,dtype,heads,embed,call", ENCODER_PATHS,
                         ids=[f"{a}-{i}-{p}-{d}" for a, i, p, d, *_ in ENCODER_PATHS])
def test_the_attention_encoders_train_step_lowers_with_each_accelerator_path(
    attention, impl, platform, dtype, heads, embed, call):
  config = _classifier(attention, impl, dtype, heads, embed)
  length = 128 if impl == "splash" else config.max_len  # splash tiles 128 positions
  config.max_len = length
  with common.traced_for(platform):
    model = models.build_model(config, num_classes=2)
  batch = {"inputs": _tokens(4, length), "labels": jax.ShapeDtypeStruct((4,), jnp.int32)}
  calls = _train_step_calls(model, step.train_step, batch, length, platform)
  if call is None:
    assert not calls
  else:
    # Forward and backward kernels at least (identical layers' calls may share one function).
    assert set(calls) == {call} and calls[call] >= 2, calls


@pytest.fixture
def pallas_allowed(monkeypatch):
  """Every Pallas kernel allow-listed, as a GPU run's entry would: "auto" then picks them."""
  monkeypatch.setattr(pallas_allowlist, "refusal", lambda variant, entries=None: None)


def test_the_translation_models_train_step_lowers_with_the_pallas_encoder(pallas_allowed):
  config = defaults.complete(defaults.translation())
  config.source_len, config.target_len = 12, 12
  m = config.model
  m.embed_dim, m.num_heads, m.ffn_dim = 24, 2, 32
  m.encoder_attention, m.decoder_attention = "additive", "causal_additive_recurrent"
  with common.traced_for(CUDA):
    model = translation.Packed(translation.build_model(config, 60, 70))
  batch = {"sources": _tokens(4, 12), "targets": _tokens(4, 13)}
  calls = _train_step_calls(model, translation.train_step, batch, 12 + 12 + 1, CUDA)
  # The encoder's fused kernel, 3 + 3 calls. The decoder's self-attention is XLA by design
  # (models/seq2seq.py DecoderBlock: implementation "xla", the form its cached decoding steps
  # share), so it adds no kernel call.
  assert calls == {lowering.TRITON_CALL: 6}, calls


CAUSAL_FAMILIES = [("causal_linear", "chunked", CUDA), ("causal_linear", "recurrent", CUDA),
                   ("sliding_window", "chunked", CUDA), ("causal_performer", "chunked", CUDA),
                   ("causal_additive", "chunked", CUDA), ("causal_additive_recurrent", "auto", CUDA),
                   ("retnet", "chunked", CUDA), ("gla", "chunked", CUDA),
                   ("mamba2", "chunked", CUDA), ("retnet", "chunked", TPU),
                   ("gla", "chunked", TPU), ("mamba2", "chunked", TPU),
                   ("deltanet", "chunked", CUDA), ("gated_deltanet", "chunked", CUDA),
                   ("deltanet", "chunked", TPU), ("gated_deltanet", "chunked", TPU)]


@pytest.mark.parametrize("attention,impl,platform", CAUSAL_FAMILIES,
                         ids=["-".join(c) for c in CAUSAL_FAMILIES])
def test_the_language_models_train_step_lowers_with_each_causal_form(attention, impl, platform):
  """Packed rows with segment ids, bfloat16: each causal variant's form lowers for a GPU (and
  the recurrent families' chunked forms for a TPU): XLA only, no kernel call."""
  from textattn.tasks.language_model import config as lm_config
  from textattn.tasks.language_model import model as lm_model
  from textattn.tasks.language_model import step as lm_step
  config = lm_config.defaults()
  m = config.model
  m.attention, m.attention_impl, m.dtype = attention, impl, "bfloat16"
  m.embed_dim, m.num_heads, m.ffn_dim, m.num_layers = 24, 2, 32, 1
  config.max_len = 40
  with common.traced_for(platform):
    model = lm_model.build(config, 258)
  batch = {"inputs": _tokens(4, 41)}
  assert not _train_step_calls(model, lm_step.train_step, batch, 40, platform)


def test_the_language_models_train_step_lowers_with_the_pallas_chunked_kernel_and_segments():
  """Packed rows with segment ids in bfloat16 through the Pallas chunked kernel: its forward and
  backward Triton calls (one layer)."""
  from textattn.tasks.language_model import config as lm_config
  from textattn.tasks.language_model import model as lm_model
  from textattn.tasks.language_model import step as lm_step
  config = lm_config.defaults()
  m = config.model
  m.attention, m.attention_impl, m.dtype = "causal_additive_recurrent", "pallas", "bfloat16"
  m.embed_dim, m.num_heads, m.ffn_dim, m.num_layers = 32, 2, 32, 1
  config.max_len = 40
  with common.traced_for(CUDA):
    model = lm_model.build(config, 258)
  calls = _train_step_calls(model, lm_step.train_step, {"inputs": _tokens(4, 41)}, 40, CUDA)
  assert calls == {lowering.TRITON_CALL: 2}, calls


def test_a_pretrained_encoders_train_step_lowers_with_the_pallas_kernel():
  encoder = bert.BertConfig(vocab_size=60, hidden_size=24, num_layers=2, num_heads=2,
                            intermediate_size=32, max_positions=40)
  with common.traced_for(CUDA):
    model = bert.BertClassifier(encoder, 2, pooling="cls", attention="additive",
                                attention_impl="pallas", dtype=jnp.float32)
  batch = {"inputs": _tokens(4, 40), "labels": jax.ShapeDtypeStruct((4,), jnp.int32)}
  calls = _train_step_calls(model, step.train_step, batch, 40, CUDA)
  assert set(calls) == {lowering.TRITON_CALL} and calls[lowering.TRITON_CALL] == 2 * 6, calls
