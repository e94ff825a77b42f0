"""Where a run executes: CPU device count, XLA compiler options, the device mesh, and the
machine signature a checkpoint records (what a step's float rounding may depend on)."""

from __future__ import annotations

import hashlib
import os

import jax
import ml_collections
import numpy as np

from textattn import attention, sharding
from textattn.attention import native
from textattn.errors import RunError, UsageError


def default_config() -> ml_collections.ConfigDict:
  """config.platform, an opt-in part (config.complete): how a run uses the machine. None of it
  changes what is computed, only where and how fast (a resume may change any of it)."""
  part = ml_collections.ConfigDict()
  part.num_cpu_devices = 0  # CPU only: split the CPU into this many devices; 0 = JAX's default
  part.xla_flags = ""  # extra XLA flags for the train/eval steps ("--xla_name=value ...")
  part.deterministic = True  # bit-reproducible steps (--xla_gpu_deterministic_ops on GPUs)
  part.eval_batch_size = 256  # global; a multiple of the device count
  return part


def run_mesh(sequence: int = 1) -> jax.sharding.Mesh:
  """The run's device mesh, over all devices: with sequence = 1 one "data" axis (data
  parallelism, as every run had before config.mesh), else (data, sequence) with data =
  devices / sequence (context parallelism, textattn/attention/sequence.py)."""
  if sequence == 1:
    return jax.make_mesh((jax.device_count(),), (sharding.DATA,),
                         axis_types=(jax.sharding.AxisType.Auto,))
  return sharding.make_mesh(jax.device_count() // sequence, sequence)


def config_mesh(config: ml_collections.ConfigDict) -> jax.sharding.Mesh:
  """`run_mesh` of config.mesh.sequence: the one mesh of a run (the same for every caller)."""
  return run_mesh(config.mesh.sequence)


def replicated(mesh: jax.sharding.Mesh) -> jax.NamedSharding:
  """Whole on every device of `mesh` (a train state)."""
  return jax.NamedSharding(mesh, jax.P())


def batch_sharding(mesh: jax.sharding.Mesh, shape: tuple[int, ...]) -> jax.NamedSharding:
  """An array of a batch: [batch] split along "data"; [batch, length, ...] along "data" and,
  on a mesh with a sequence axis, "sequence", when the length splits evenly (otherwise whole:
  a model that pads the length to split it places it itself, models.Classifier)."""
  shards = sharding.sequence_size(mesh)
  if len(shape) >= 2 and shards > 1 and shape[1] % shards == 0:
    return sharding.length_sharding(mesh, len(shape))
  return jax.NamedSharding(mesh, jax.P(sharding.DATA))


def batch_shardings(mesh: jax.sharding.Mesh, batch: dict) -> dict:
  return jax.tree.map(lambda x: batch_sharding(mesh, x.shape), batch)


def row_block(mesh: jax.sharding.Mesh) -> tuple[int, int]:
  """(index, count): this process reads rows [index * B / count, (index + 1) * B / count) of
  every global batch of B rows (whole rows: all of their length), as data.TrainIterator and
  data.eval_batches take (process_index, process_count); `process_row_block` of the mesh's
  devices' processes."""
  devices = np.asarray(mesh.devices).reshape(mesh.shape[sharding.DATA], -1)
  processes = np.vectorize(lambda d: d.process_index, otypes=[int])(devices)
  return process_row_block(processes, jax.process_index())


def process_row_block(processes: np.ndarray, process_index: int) -> tuple[int, int]:
  """`row_block` of a mesh whose device [d, j] (data index d) belongs to process
  processes[d, j]: the rows are those of the data indices the process's devices hold, so
  processes whose devices share a data group (a sequence axis that spans processes) read the
  same rows, and count is the number of distinct row blocks (the process count when every data
  group lies within one process). UsageError (one sentence) unless every process holds one
  contiguous run of data indices, all runs of one size and aligned to it."""
  runs = {}
  for process in np.unique(processes):
    rows = np.flatnonzero((processes == process).any(axis=1))
    runs[int(process)] = [int(r) for r in rows]
  size = len(runs[process_index])
  if any(rows != list(range(rows[0], rows[0] + size)) or rows[0] % size
         for rows in runs.values()):
    raise UsageError(f"the device mesh gives the processes data rows {runs} (process: data "
                     f"indices), not equal blocks of adjacent rows; each process's devices "
                     f"must hold whole, adjacent data groups, as many as every other's.")
  return runs[process_index][0] // size, processes.shape[0] // size


def to_global(batch: dict, mesh: jax.sharding.Mesh) -> dict:
  """This process's rows of a batch (`row_block`'s, whole length) -> global arrays laid out as
  `batch_sharding` says: each device takes its [rows, length slice] from them (the length is
  global, so a process whose devices hold part of a sequence group cuts its part)."""
  count = row_block(mesh)[1]
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(
      batch_sharding(mesh, x.shape), x, (x.shape[0] * count,) + x.shape[1:]), batch)


def check_mesh(config: ml_collections.ConfigDict, device_count: int) -> None:
  """UsageError (one sentence) unless config.mesh fits this run's devices: mesh.sequence a
  positive divisor of the device count (a sequence group may span processes: the processes
  that share one read the same rows, `row_block`)."""
  shards = config.mesh.sequence
  if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
    raise UsageError(f"config.mesh.sequence={shards!r} must be an integer >= 1 (the devices "
                     f"each sequence is split over; 1 = none).")
  if device_count % shards:
    raise UsageError(f"config.mesh.sequence={shards} must divide the device count "
                     f"({device_count}), so that data = devices / sequence is whole.")
  if jax.process_count() > 1:
    row_block(config_mesh(config))


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
  """config.platform.xla_flags ("--xla_name=value ...") as `jax.jit(compiler_options=...)`: XLA reads
  $XLA_FLAGS when jax is imported, too early for a config, so the flags go to the compilations
  of the train and eval steps instead."""
  flags = config.platform.xla_flags
  tokens = flags.split() if isinstance(flags, str) else [None]
  if any(not (t and t.startswith("--xla_") and "=" in t) for t in tokens):
    raise UsageError(f"config.platform.xla_flags={flags!r} must be a space-separated list of XLA flags "
                     f"of the form --xla_name=value (e.g. '--xla_cpu_experimental_ynn_fusion_"
                     f"type='), or empty.")
  return {name: _xla_option_value(value)
          for name, value in (t[2:].split("=", 1) for t in tokens)}


def check_xla_flags(config: ml_collections.ConfigDict) -> None:
  """ValueError (one sentence) unless XLA accepts config.platform.xla_flags: a trial compilation of a
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
      raise UsageError(f"config.platform.xla_flags={config.platform.xla_flags!r} is refused by XLA ({text}); "
                       f"give flags of the form --xla_name=value with values of the flag's "
                       f"type (true/false, a number or a string).") from None
    name = unknown.group(1)
    known = _known_xla_options()
    close = difflib.get_close_matches(name, known, n=1)
    raise UsageError(
        f"config.platform.xla_flags={config.platform.xla_flags!r}: --{name} is not a flag this XLA (jaxlib "
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
  """What the train and eval steps are compiled with: config.platform.xla_flags, plus XLA's deterministic
  GPU ops when config.platform.deterministic (the default) and the run is on a GPU. Call after JAX has
  started (it asks for the backend); an explicit --xla_gpu_deterministic_ops in xla_flags wins."""
  options = xla_compiler_options(config)
  if config.platform.deterministic and jax.default_backend() == "gpu":
    options.setdefault("xla_gpu_deterministic_ops", True)
  return options or None


def request_cpu_devices(config: ml_collections.ConfigDict) -> None:
  """Apply config.platform.num_cpu_devices (and check config.platform.xla_flags); call before any JAX operation
  (the backend reads the device count once)."""
  xla_compiler_options(config)
  n = config.platform.num_cpu_devices
  if not isinstance(n, int) or isinstance(n, bool) or n < 0:
    raise UsageError(f"config.platform.num_cpu_devices={n!r} must be an integer >= 0 (0 = JAX's "
                     f"default: one CPU device).")
  if n == 0:
    return
  if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
    raise UsageError(f"config.platform.num_cpu_devices={n} and XLA_FLAGS' "
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
               "xla_flags": config.platform.xla_flags, "deterministic": config.platform.deterministic,
               # None: JAX's default (TF32 products on recent NVIDIA GPUs, float32 on CPUs).
               "matmul_precision": jax.config.jax_default_matmul_precision,
               # Absent before config.mesh (a resume from such a checkpoint notes nothing).
               "mesh": dict(config_mesh(config).shape)}
  if signature["backend"] == "cpu":
    signature["cpu_cores"] = attention.usable_cores()
    signature["cpu_features"] = hashlib.sha256(native.cpu_signature().encode()).hexdigest()[:12]
  return signature


def any_process(flag: bool) -> int:
  """The index of the first process where `flag` holds, or -1 (every process calls it)."""
  if jax.process_count() == 1:
    return 0 if flag else -1
  from jax.experimental import multihost_utils
  flags = np.asarray(multihost_utils.process_allgather(np.asarray(flag, np.int32))).reshape(-1)
  return int(np.argmax(flags)) if flags.any() else -1


def raise_together(error: Exception | None) -> None:
  """Every process calls it, `error` a failure of this process's own work (files process 0
  alone writes: the metric log, the config, the report) or None. With several processes each
  learns whether any failed and raises at once, the failing one its own error, the others one
  line naming it, rather than waiting in their next collective until the coordinator's
  timeout (minutes) and aborting with a traceback; alone, an error is raised as it is."""
  if jax.process_count() == 1:
    if error is not None:
      raise error
    return
  where = any_process(error is not None)
  if error is not None:
    raise error
  if where >= 0:
    raise RunError(f"Process {where} failed to write the run's files (its output says which "
                   f"and why), so this process stopped too; fix that and run the same command "
                   f"on every process to resume from the last checkpoint.")


def on_main_process(write) -> None:
  """`write()` on process 0 only, its failure (any Exception) raised on every process at once
  (raise_together)."""
  error = None
  if jax.process_index() == 0:
    try:
      write()
    except Exception as e:  # noqa: BLE001 -- re-raised as it is, on every process together
      error = e
  raise_together(error)
