"""Checkpoints of state replicated over several CPU devices (textattn/checkpointing.py).

On a CPU, Orbax's replica-parallel save is turned off: each save of replicated state then
compiles no program (with it, R eager slices per array shape: ~1.5 s a save of a tiny model on 8
devices, most of a small multi-device run). The script below runs in a process of its own with
8 CPU devices (the suite's processes have one) and prints one JSON line.
"""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SCRIPT = r"""
import json, tempfile
import jax, jax.numpy as jnp, numpy as np
import orbax.checkpoint as ocp
from jax import monitoring
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from textattn import checkpointing

compiles = []
monitoring.register_event_duration_secs_listener(
    lambda event, duration, **_: compiles.append(event)
    if event == "/jax/core/compile/backend_compile_duration" else None)
replicated = NamedSharding(Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "sequence")),
                           PartitionSpec())
state = {"w": jnp.arange(64 * 48, dtype=jnp.float32).reshape(64, 48) / 7,
         "b": jnp.linspace(0, 1, 1000, dtype=jnp.float32), "step": jnp.int32(5)}
state = jax.device_put(state, replicated)
abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
shardings = jax.tree.map(lambda a: a.sharding, state)
workdir, old_workdir = tempfile.mkdtemp(), tempfile.mkdtemp()

manager = checkpointing.checkpoint_manager(workdir, keep=3)
start = len(compiles)
for step in (1, 2):
  checkpointing.save(manager, step, state, {}, {}, {"val/accuracy": 0.5})
  checkpointing.finish_saves(manager)
saved = len(compiles) - start
new_restored = checkpointing.restore(manager, 2, abstract, shardings)["state"]

# A checkpoint as textattn wrote it before: Orbax's default handler (replica-parallel on a CPU).
ocp.type_handlers.register_type_handler(jax.Array, ocp.type_handlers.ArrayHandler(
    use_replica_parallel=True), override=True)
start = len(compiles)
old = ocp.CheckpointManager(old_workdir + "/checkpoints", options=ocp.CheckpointManagerOptions(
    create=True))
old.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                    data=ocp.args.JsonSave({}), meta=ocp.args.JsonSave({})))
old.wait_until_finished()
before = len(compiles) - start
old_restored = checkpointing.restore(checkpointing.checkpoint_manager(old_workdir, keep=3), 1,
                                     abstract, shardings)["state"]
same = all(np.array_equal(np.asarray(r[k]), np.asarray(state[k])) and r[k].sharding == replicated
           for r in (old_restored, new_restored) for k in state)
print(json.dumps({"devices": jax.device_count(), "old_save_compiles": before,
                  "save_compiles": saved, "same": same}))
"""


@pytest.mark.cpu_only
def test_replicated_state_saves_without_compiling_and_old_checkpoints_restore():
  """Two saves of state replicated over 8 CPU devices compile nothing, where a save with Orbax's
  replica-parallel default (how textattn saved before) compiles eager slices (so the count is
  not vacuous); a checkpoint written that older way restores to the same arrays, as do the new
  ones."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=" ".join(
      [os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8"]))
  done = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert result["devices"] == 8
  assert result["save_compiles"] == 0, result
  assert result["old_save_compiles"] > 0, result  # (replica-parallel slices: not vacuous)
  assert result["same"], result
