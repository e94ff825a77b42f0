"""The benchmark's utilisation figures: the stated formulas, the peaks, and the derived columns."""

import pytest

from textattn import attention
from textattn.benchmark import utilization


def test_attention_flops_follow_the_stated_formula():
  softmax = attention.get("softmax").forward_flops
  causal = attention.get("causal").forward_flops
  b, l, h, d = 2, 1024, 4, 64
  assert softmax(b, l, h, d) == 4 * b * h * l * l * d
  assert causal(b, l, h, d) == 2 * b * h * l * l * d  # half: only the lower triangle
  assert attention.get("additive").forward_flops is None  # linear: judged by bandwidth
  assert utilization.attention_flops(softmax, "attention", b, l, h, d) == softmax(b, l, h, d)
  assert utilization.attention_flops(softmax, "attention+backward", b, l, h, d) == (
      3.5 * softmax(b, l, h, d))
  # A model step's time is not attention's alone: no attention TFLOP/s (model_tflops says it).
  for mode in ("forward", "forward+backward", "train_step", "decode_step"):
    assert utilization.attention_flops(softmax, mode, b, l, h, d) is None
  assert utilization.attention_flops(None, "attention", b, l, h, d) is None


def test_model_flops_per_token_is_palms():
  # 6N + 12 * layers * L * width, attention term scaled (1 softmax, 0.5 causal, 0 linear).
  assert utilization.model_flops_per_token(1000, 4, 4096, 256, 1.0) == 6000 + 12 * 4 * 4096 * 256
  assert utilization.model_flops_per_token(1000, 4, 4096, 256, 0.5) == 6000 + 6 * 4 * 4096 * 256
  assert utilization.model_flops_per_token(1000, 4, 4096, 256, 0.0) == 6000


def test_known_peaks_and_derived_percentages():
  assert utilization.device_peak("NVIDIA H100 80GB HBM3", "bfloat16") == (989.0, 3.35)
  assert utilization.device_peak("NVIDIA H100 80GB HBM3", "float32") == (67.0, 3.35)
  assert utilization.device_peak("some new chip", "bfloat16") == (None, None)
  out = utilization.derived({"median_ms": 2.0}, attention_flop_count=1e12, bytes_accessed=4e9,
                            model_flops=None, peak_tflops=1000.0, peak_tbps=4.0)
  assert out["attention_tflops"] == pytest.approx(500.0)
  assert out["pct_of_peak"] == pytest.approx(50.0)
  assert out["achieved_tbps"] == pytest.approx(2.0)
  assert out["pct_of_bandwidth"] == pytest.approx(50.0)
  assert "mfu_pct" not in out


def test_the_cpu_peak_is_measured_and_positive():
  assert 0 < utilization.measured_cpu_peak(size=128, repeats=2) < 100  # TFLOP/s


def test_the_additive_cores_bytes_follow_the_stated_formula():
  # 4 passes of [B, L, F] forward (read q twice and k once, write u), 7 more backward, and the
  # int32 mask read by each pooling kernel: ~370 MB at [4, 16384, 4 x 64] in bfloat16 (issue 85).
  core = attention.get("additive").core_bytes
  b, l, h, d = 4, 16384, 4, 64
  forward = utilization.core_bytes(core, "attention", b, l, h, d, 2)
  both = utilization.core_bytes(core, "attention+backward", b, l, h, d, 2)
  assert forward == 4 * b * l * h * d * 2 + 2 * b * l * 4
  assert both == 11 * b * l * h * d * 2 + 4 * b * l * 4 == 370_147_328
  assert utilization.core_bytes(core, "train_step", b, l, h, d, 2) is None
  assert utilization.core_bytes(attention.get("softmax").core_bytes, "attention", b, l, h, d,
                                2) is None
  out = utilization.derived({"median_ms": 0.1}, attention_flop_count=None, bytes_accessed=None,
                            model_flops=None, peak_tflops=None, peak_tbps=4.8,
                            formula_bytes=both)
  assert out["core_tbps"] == pytest.approx(3.70147328)
  assert out["pct_core_bandwidth"] == pytest.approx(100 * 3.70147328 / 4.8)
