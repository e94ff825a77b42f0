"""Where attention_impl="auto" may choose a Pallas kernel: platforms a run has vouched for.

On a CPU the Pallas kernels run in interpret mode (tested, never fast); on an accelerator they go
through a compiler this project cannot run in CI (Triton on GPUs, Mosaic on TPUs: "pallas_tpu"
of additive attention, additive_tpu.py). CI proves the algorithm (interpret mode) and the
lowering (tests/test_lowering.py), not the compilation, numerics or speed on the device. "auto"
therefore picks a Pallas kernel only on a (device kind, JAX version) listed below, and elsewhere
keeps the XLA kernel and says why once. An entry is added by a run on that platform, in the same
commit as its RESULTS section: the kernel's tests passed there (`pytest
tests/test_additive_pallas.py tests/test_causal_additive.py` with JAX_PLATFORMS unset) and it
was timed faster than XLA (experiments/gpu/accelerators.sh, parts "bandwidth" and "tune"),
with the configuration it was timed at first in its kernel's CONFIGS (the default).

Entry: {"device_kind": jax.devices()[0].device_kind, "jax": jax.__version__,
        "variants": ("additive", ...), "results": "experiments/RESULTS.md section N",
        "command": "the command that measured it"}
"""

from __future__ import annotations

import jax

from textattn.attention import common

ALLOWED: tuple[dict, ...] = ()  # None: on an H200 (RESULTS section 28) both were slower than XLA.


def platform() -> tuple[str, str]:
  """(device kind, JAX version) of this process's first device: the allow-list's key."""
  return jax.devices()[0].device_kind, jax.__version__


def refusal(variant: str, entries: tuple[dict, ...] | None = None) -> str | None:
  """None where "auto" may use `variant`'s Pallas kernel here (the one for this backend: an entry
  names a device kind, so a TPU's entry vouches for the TPU kernel), else why not (one phrase)."""
  if common.backend() == "cpu":
    return "Pallas runs in interpret mode on a CPU (an emulator, for tests)"
  device_kind, version = platform()
  for entry in ALLOWED if entries is None else entries:
    if (entry["device_kind"] == device_kind and entry["jax"] == version
        and variant in entry["variants"]):
      return None
  return (f"its Pallas kernel is not allow-listed for {device_kind!r} with jax {version} "
          f"(textattn/attention/pallas_allowlist.py; a run on this platform adds it)")
