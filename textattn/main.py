"""Command-line entry point.

    python -m textattn.main --config=configs/imdb_fastformer.py --workdir=runs/fastformer \
        [--config.<field>=<value> ...]

Re-running the same command resumes from the newest checkpoint in --workdir. Several hosts:
start one process per host with --coordinator_address=HOST:PORT --num_processes=N
--process_id=I (or set JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags, logging
from ml_collections import config_flags

from textattn import command_line

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Training configuration file (configs/*.py).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and logs.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", os.environ.get("JAX_COORDINATOR_ADDRESS"),
    "host:port of process 0, for multi-process runs.")
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", int(os.environ.get("JAX_NUM_PROCESSES", "0")) or None,
    "Number of processes in a multi-process run.")
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", int(os.environ["JAX_PROCESS_ID"]) if "JAX_PROCESS_ID" in os.environ else None,
    "This process's index in a multi-process run.")
_PLUGINS = flags.DEFINE_multi_string(
    "plugin", [], "Module (dotted name) to import first, e.g. one that registers an attention "
    "variant; repeatable.")
flags.mark_flags_as_required(["config", "workdir"])


def _usage_error(message: str) -> None:
  """A mistake in the command (flags, config): one line, exit code 2."""
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def _remove_if_created_empty(workdir: str, existed: bool) -> None:
  """A rejected run leaves no workdir behind: removed if this run created it and it is empty."""
  if not existed:
    try:
      os.rmdir(workdir)
    except OSError:  # not empty (or never created): kept
      pass


def main(argv):
  if len(argv) > 1:
    _usage_error(f"unexpected arguments: {' '.join(argv[1:])} (flags are --name=value).")
  import jax  # after flag parsing, so --help and flag errors are instant

  from textattn import attention, classify, platform
  from textattn import data as data_lib
  from textattn.errors import NonFiniteLossError, RunError, Stopped

  if not flags.FLAGS["verbosity"].present:
    # Quiet by default: the run's own lines only; absl's --verbosity=0 (INFO) or 1 shows the
    # libraries' logs (Orbax, JAX) too.
    logging.set_verbosity(logging.WARNING)
  config, workdir = _CONFIG.value, _WORKDIR.value
  try:
    # Everything a run's config and flags can get wrong is checked before JAX starts or the
    # workdir is touched: exit 2, one line, nothing created.
    task = config.get("task", "classification")
    if task != "translation":
      data_lib.validate_config(config)
    platform.request_cpu_devices(config)  # before any JAX operation
    attention.load_plugins(_PLUGINS.value)
  except ValueError as error:
    _usage_error(str(error))

  if not _COORDINATOR.value and (_NUM_PROCESSES.value or _PROCESS_ID.value is not None):
    _usage_error("--num_processes/--process_id (or JAX_NUM_PROCESSES/JAX_PROCESS_ID) need "
                 "--coordinator_address=HOST:PORT (or JAX_COORDINATOR_ADDRESS) too.")
  if _COORDINATOR.value:
    # Only affects CPU collectives; must be set before any backend starts.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  print(f"JAX process {jax.process_index()}/{jax.process_count()}, {jax.local_device_count()} "
        f"local / {jax.device_count()} global devices ({jax.default_backend()}).", flush=True)
  try:
    if task == "translation":
      from textattn import translation
      translation.validate_config(config, jax.device_count())
    else:
      classify.validate_config(config, jax.device_count())
    platform.check_xla_flags(config)
  except ValueError as error:
    _usage_error(str(error))

  existed = os.path.exists(workdir)
  try:
    if task == "translation":
      translation.train_and_evaluate(config, workdir)
    else:
      classify.train_and_evaluate(config, workdir)
  except (ValueError, NonFiniteLossError) as error:
    # A user's mistake (bad config, bad data, a workdir of another run) or a diverged run:
    # one clear sentence; exit 2 for the config (a usage error), 1 for the data or the run.
    # Other ValueErrors are bugs: their traceback is kept.
    usage = str(error).startswith(("config.", "--"))
    if usage or isinstance(error, (data_lib.DataError, RunError, NonFiniteLossError)):
      _remove_if_created_empty(workdir, existed)
      print(f"error: {error}", file=sys.stderr)
      sys.exit(2 if usage else 1)
    raise
  except Stopped as error:  # SIGINT/SIGTERM: "stopped at step N, checkpoint saved; ..."
    print(error.args[0], file=sys.stderr)
    sys.exit(error.exit_code)
  except KeyboardInterrupt:  # Ctrl-C outside the training loop (its own handler saves)
    print("interrupted before training started or while the report was written; nothing new "
          "was saved (earlier checkpoints are intact): run the same command to start or resume.",
          file=sys.stderr)
    sys.exit(130)


if __name__ == "__main__":
  app.run(main, flags_parser=command_line.flags_parser("config"))
