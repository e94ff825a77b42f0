"""Command-line entry point.

    python -m textattn.main --config=configs/imdb_fastformer.py --workdir=runs/fastformer \
        [--config.<field>=<value> ...]

Re-running the same command resumes from the newest checkpoint in --workdir. Several hosts:
start one process per host with --coordinator_address=HOST:PORT --num_processes=N
--process_id=I (or set JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID).
"""

from __future__ import annotations

import contextlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags, logging
from ml_collections import config_flags

from textattn import command_line
from textattn.errors import (
  DataError,
  NonFiniteLossError,
  RunError,
  Stopped,
  UsageError,
  fail,
)

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
_PROFILE_DIR = flags.DEFINE_string(
    "profile_dir", "", "Write a jax.profiler trace of the first training steps there (view it "
    "in TensorBoard's profile tab or XProf).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    fail(UsageError(f"unexpected arguments: {' '.join(argv[1:])} (flags are --name=value)."))
  import jax  # after flag parsing, so --help and flag errors are instant

  from textattn import attention, loop, platform, run  # (lazy, as jax: an instant --help)

  if not flags.FLAGS["verbosity"].present:
    # Quiet by default: the run's own lines only; absl's --verbosity=0 (INFO) or 1 shows the
    # libraries' logs (Orbax, JAX) too.
    logging.set_verbosity(logging.WARNING)
  workdir = _WORKDIR.value
  try:
    # Everything a run's config and flags can get wrong is checked before JAX starts or the
    # workdir is touched: exit 2, one line, nothing created.
    attention.load_plugins(_PLUGINS.value)  # (first: a plugin may register the config's task)
    config = run.complete(_CONFIG.value)  # (every opt-in part the config leaves out, defaulted)
    run.validate(config, None)
    platform.request_cpu_devices(config)  # before any JAX operation
    if not _COORDINATOR.value and (_NUM_PROCESSES.value or _PROCESS_ID.value is not None):
      raise UsageError("--num_processes/--process_id (or JAX_NUM_PROCESSES/JAX_PROCESS_ID) "
                       "need --coordinator_address=HOST:PORT (or JAX_COORDINATOR_ADDRESS) too.")
  except (UsageError, DataError) as error:
    fail(error)
  if _COORDINATOR.value:
    # Only affects CPU collectives; must be set before any backend starts.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  print(f"JAX process {jax.process_index()}/{jax.process_count()}, {jax.local_device_count()} "
        f"local / {jax.device_count()} global devices ({jax.default_backend()}).", flush=True)
  try:
    run.validate_devices(config, jax.device_count())  # the checks that ask the devices
    platform.check_xla_flags(config)
  except UsageError as error:
    fail(error)

  existed = os.path.exists(workdir)
  loop.sigterm_as_interrupt()
  try:
    run.train_and_evaluate(config, workdir, _PROFILE_DIR.value, checked=True)
  except (UsageError, DataError, RunError, NonFiniteLossError) as error:
    # A user's mistake (bad config, bad data, a workdir of another run) or a diverged run:
    # one clear sentence, and a workdir this command created is not left behind empty. Other
    # errors are bugs: their traceback is kept.
    if not existed:
      with contextlib.suppress(OSError):  # not empty (or never created): kept
        os.rmdir(workdir)
    fail(error)
  except Stopped as error:  # SIGINT/SIGTERM: "stopped at step N, checkpoint saved; ..."
    print(error.args[0], file=sys.stderr)
    sys.exit(error.exit_code)
  except KeyboardInterrupt as error:  # Ctrl-C or SIGTERM outside the loop (its own handler saves)
    print("interrupted before training started or while the report was written; nothing new "
          "was saved (earlier checkpoints are intact): run the same command to start or resume.",
          file=sys.stderr)
    sys.exit(getattr(error, "exit_code", 130))


if __name__ == "__main__":
  app.run(main, flags_parser=command_line.flags_parser("config"))
