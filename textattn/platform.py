"""Where a run executes: CPU device count, XLA compiler options, the device mesh, and the
machine signature a checkpoint records (what a step's float rounding may depend on)."""

from __future__ import annotations

import hashlib
import os

import jax
import ml_collections

from textattn.errors import UsageError


def data_parallel_shardings() -> tuple[jax.NamedSharding, jax.NamedSharding]:
  """(batch sharded along a "data" axis over all devices, replicated) shardings."""
  mesh = jax.make_mesh((jax.device_count(),), ("data",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  return jax.NamedSharding(mesh, jax.P("data")), jax.NamedSharding(mesh, jax.P())


def to_global(batch: dict, data_sharding: jax.NamedSharding) -> dict:
  """This process's rows of a batch -> global arrays sharded along the data axis."""
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(data_sharding, x), batch)


XlaOptionValue = str | bool | int | float


def _xla_option_value(text: str) -> XlaOptionValue:
  """XLA takes typed option values: 'true'/'false' for its bool flags, numbers for its numeric
  ones; everything else stays a string (e.g. the empty list of --xla_cpu_experimental_ynn_...)."""
  if text.lower() in ("true", "false"):
    return text.lower() == "true"
  for kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      pass
  return text


def xla_compiler_options(config: ml_collections.ConfigDict) -> dict[str, XlaOptionValue]:
  """config.xla_flags ("--xla_name=value ...") as `jax.jit(compiler_options=...)`: XLA reads
  $XLA_FLAGS when jax is imported, too early for a config, so the flags go to the compilations
  of the train and eval steps instead."""
  flags = config.xla_flags
  tokens = flags.split() if isinstance(flags, str) else [None]
  if any(not (t and t.startswith("--xla_") and "=" in t) for t in tokens):
    raise UsageError(f"config.xla_flags={flags!r} must be a space-separated list of XLA flags "
                     f"of the form --xla_name=value (e.g. '--xla_cpu_experimental_ynn_fusion_"
                     f"type='), or empty.")
  return {name: _xla_option_value(value)
          for name, value in (t[2:].split("=", 1) for t in tokens)}


def check_xla_flags(config: ml_collections.ConfigDict) -> None:
  """ValueError (one sentence) unless XLA accepts config.xla_flags: a trial compilation of a
  scalar function with the step's compiler options, so an unknown flag or a bad value is
  refused at start (before any data is read or the workdir touched), not at the first step.
  Call after JAX has started (as step_compiler_options)."""
  import difflib
  import re

  options = step_compiler_options(config)
  if not options:
    return
  try:
    jax.jit(lambda x: x + 1, compiler_options=options).lower(
        jax.numpy.zeros((), jax.numpy.float32)).compile()
  except Exception as error:  # noqa: BLE001 -- XLA's own error (JaxRuntimeError): one sentence
    text = " ".join(str(error).split())
    unknown = re.search(r"No such compile option: '([^']+)'", text)
    if unknown is None:
      raise UsageError(f"config.xla_flags={config.xla_flags!r} is refused by XLA ({text}); "
                       f"give flags of the form --xla_name=value with values of the flag's "
                       f"type (true/false, a number or a string).") from None
    name = unknown.group(1)
    known = _known_xla_options()
    close = difflib.get_close_matches(name, known, n=1)
    raise UsageError(
        f"config.xla_flags={config.xla_flags!r}: --{name} is not a flag this XLA (jaxlib "
        f"{_jaxlib_version()}) knows; "
        + (f"did you mean --{close[0]}? " if close else "")
        + "allowed: XLA's compile options (listed by `XLA_FLAGS=--help python -c 'import jax; "
          "jax.numpy.ones(1)'`), or '' for none.") from None


def _jaxlib_version() -> str:
  import jaxlib
  return jaxlib.__version__


def _known_xla_options() -> list[str]:
  """The XLA option names jaxlib exposes to Python (a subset of all; for "did you mean")."""
  try:
    from jax._src.lib import xla_client
    debug_options = xla_client.CompileOptions().executable_build_options.debug_options
    return [name for name in dir(debug_options) if name.startswith("xla_")]
  except Exception:  # noqa: BLE001 -- a private API: no suggestion rather than an error
    return []


def step_compiler_options(
    config: ml_collections.ConfigDict) -> dict[str, XlaOptionValue] | None:
  """What the train and eval steps are compiled with: config.xla_flags, plus XLA's deterministic
  GPU ops when config.deterministic (the default) and the run is on a GPU. Call after JAX has
  started (it asks for the backend); an explicit --xla_gpu_deterministic_ops in xla_flags wins."""
  options = xla_compiler_options(config)
  if config.deterministic and jax.default_backend() == "gpu":
    options.setdefault("xla_gpu_deterministic_ops", True)
  return options or None


def request_cpu_devices(config: ml_collections.ConfigDict) -> None:
  """Apply config.num_cpu_devices (and check config.xla_flags); call before any JAX operation
  (the backend reads the device count once)."""
  xla_compiler_options(config)
  n = config.num_cpu_devices
  if not isinstance(n, int) or isinstance(n, bool) or n < 0:
    raise UsageError(f"config.num_cpu_devices={n!r} must be an integer >= 0 (0 = JAX's "
                     f"default: one CPU device).")
  if n == 0:
    return
  if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
    raise UsageError(f"config.num_cpu_devices={n} and XLA_FLAGS' "
                     f"--xla_force_host_platform_device_count both set the CPU device count; "
                     f"set only one.")
  jax.config.update("jax_num_cpu_devices", n)


def machine_signature(config: ml_collections.ConfigDict, attention_impl: str) -> dict:
  """What a step's float rounding may depend on: the backend and devices, JAX's version, the
  kernel and XLA settings, and on a CPU the cores this process may use (XLA's and the native
  kernels' thread counts follow them) and a hash of its feature flags (what -march=native and
  XLA compile for)."""
  import jaxlib
  signature = {"backend": jax.default_backend(), "devices": jax.device_count(),
               "device_kind": jax.devices()[0].device_kind, "jax": jax.__version__,
               "jaxlib": jaxlib.__version__,
               "attention_impl": attention_impl,
               "xla_flags": config.xla_flags, "deterministic": config.deterministic,
               # None: JAX's default (TF32 products on recent NVIDIA GPUs, float32 on CPUs).
               "matmul_precision": jax.config.jax_default_matmul_precision}
  if signature["backend"] == "cpu":
    from textattn import attention
    from textattn.attention import native
    signature["cpu_cores"] = attention.usable_cores()
    signature["cpu_features"] = hashlib.sha256(native.cpu_signature().encode()).hexdigest()[:12]
  return signature
