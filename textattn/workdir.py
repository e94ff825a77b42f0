"""The workdir lock: one run at a time per workdir.

A run holds `workdir/.lock`, a JSON file naming its process id, host, run id and start time,
created with O_EXCL (atomic on local file systems and NFSv3+). A second run on the same workdir
refuses at once with one sentence naming the holder (RunError). The processes of one multi-host
run share the lock: process 0 takes it, under a run id it broadcasts, and the others learn its
verdict through the same agreement as the resume check, so they never refuse each other. A lock
left by a process that is gone (same host, pid not running: a SIGKILL, a power cut) is taken
over with one warning line. The lock is released when the run ends, also on errors and on a
second Ctrl-C (see textattn.loop.stop_on_signals).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid

from textattn.errors import RunError

LOCK_FILE = ".lock"
CHECKPOINTS = "checkpoints"  # the workdir's Orbax checkpoint directory, one subdirectory a step


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(workdir, CHECKPOINTS)


def checkpoint_steps(workdir: str) -> list[int]:
  """The steps of the checkpoints saved in `workdir`, newest first ([] for none; an in-flight
  save's temporary directory is not one)."""
  directory = checkpoint_dir(workdir)
  if not os.path.isdir(directory):
    return []
  return sorted((int(name) for name in os.listdir(directory) if name.isdigit()), reverse=True)


def _pid_running(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # someone else's process: running
    return True
  return True


def _read_record(path: str) -> dict | None:
  """A lock file's record; {} if unreadable (being written, or damaged); None if gone."""
  try:
    with open(path) as f:
      return json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError):
    return {}


class WorkdirLock:
  """acquire() / release(); `enabled=False` (processes other than 0) holds nothing."""

  def __init__(self, workdir: str, run_id: str | None = None, enabled: bool = True,
               num_processes: int = 1):
    self.path = os.path.join(workdir, LOCK_FILE)
    self.run_id = run_id or uuid.uuid4().hex
    self.enabled = enabled
    self.num_processes = num_processes
    self.held = False

  def _record(self) -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "run_id": self.run_id,
            "processes": self.num_processes, "started": time.strftime("%Y-%m-%d %H:%M:%S")}

  def _create(self) -> bool:
    try:
      fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "w") as f:
      json.dump(self._record(), f)
    return True

  def _holder(self) -> dict | None:
    return _read_record(self.path)

  def acquire(self, wait_s: float = 2.0) -> None:
    if not self.enabled:
      return
    deadline = time.monotonic() + wait_s
    while True:
      try:
        if self._create():
          self.held = True
          return
      except OSError as e:  # read-only workdir, permissions: say so rather than "in use"
        raise RunError(f"Cannot create the workdir lock {self.path} ({type(e).__name__}: "
                       f"{e.strerror or e}); the workdir must be writable.") from e
      holder = self._holder()
      if holder is None:
        continue  # released between our two looks
      host, pid = holder.get("host"), holder.get("pid")
      if host == socket.gethostname() and isinstance(pid, int) and not _pid_running(pid):
        # Stale: move it aside under a unique name first, so of two runs taking over at once
        # only one wins the O_EXCL create above. What was moved must be the stale record read
        # above: another run may have taken over in between, and its live lock goes back.
        aside = f"{self.path}.stale-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        try:
          os.replace(self.path, aside)
        except FileNotFoundError:
          continue
        if _read_record(aside) != holder:
          try:
            os.link(aside, self.path)
          except FileExistsError:
            pass
          os.remove(aside)
          continue
        os.remove(aside)
        print(f"Warning: taking over the lock of {os.path.dirname(self.path)} left by process "
              f"{pid} on {host}, which is no longer running (killed or crashed).", flush=True)
        continue
      if holder or time.monotonic() >= deadline:
        since = f" since {holder['started']}" if holder.get("started") else ""
        who = (f"process {pid} on host {host}{since}" if holder
               else "another run (its lock file is unreadable)")
        raise RunError(
            f"The workdir {os.path.dirname(self.path)} is in use by {who}; wait for that run to "
            f"end or stop it, or use another --workdir (if that run is gone, delete "
            f"{self.path}).")
      time.sleep(0.05)  # being written by its creator: look again

  def release(self) -> None:
    """Removes the lock if this process holds it (and it is still ours)."""
    if not self.held:
      return
    self.held = False
    holder = self._holder()
    if holder and holder.get("run_id") != self.run_id:
      return  # taken over meanwhile (we were thought dead): not ours to remove
    try:
      os.remove(self.path)
    except OSError:
      pass
