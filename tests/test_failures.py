"""Failures as a user (or an unlucky machine) meets them: signals, a busy workdir, corrupted
checkpoints, a full disk, NaN, restarts. Each ends in one line and a documented exit code, and
leaves what was saved before intact and resumable; a corrupted checkpoint is either refused or
replaced by an older good one, never restored silently."""

import errno
import glob
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests.test_train import (
  REPO,
  assert_trees_identical,
  cli_args,
  eval_rows,
  final_report,
  read_metrics,
  restore_params,
  run_main,
  tiny_config,
  write_sentiment_jsonl,
)
from textattn import checkpointing, errors, loop, restore
from textattn import run as runner
from textattn import workdir as workdir_lib
from textattn.tasks.classification import step as step_lib

STOP_LINE = r"stopped at step (\d+), checkpoint saved; run the same command to resume"

def start_main(args, workdir):
  """textattn.main in a subprocess (not waited for); stdout and stderr kept apart."""
  command = [sys.executable, "-m", "textattn.main"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  return subprocess.Popen(command + [f"--workdir={workdir}"] + args, cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(predicate, process, timeout=120):
  deadline = time.time() + timeout
  while time.time() < deadline and process.poll() is None:
    if predicate():
      return True
    time.sleep(0.01)
  return False


def has_checkpoint(workdir):
  directory = pathlib.Path(workdir) / "checkpoints"
  return directory.exists() and any(d.isdigit() for d in os.listdir(directory))


def one_error_line(stderr):
  assert "Traceback" not in stderr, stderr[-3000:]
  lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
  assert len(lines) == 1, stderr[-3000:]
  return lines[0]


@pytest.fixture
def data_file(tmp_path):
  return write_sentiment_jsonl(tmp_path / "reviews.jsonl")


def test_sigterm_stops_with_a_checkpoint_and_the_resume_is_bit_identical(tmp_path,
                                                                         data_file):
  # Checkpoints every 7 steps: a stop lands off that grid, so the stop's own save is tested.
  overrides = {"num_train_steps": 40, "checkpoint_every_steps": 7, "eval_every_steps": 7}
  run = tmp_path / "stopped"
  process = start_main(cli_args(data_file, tmp_path / "cache", **overrides), run)
  assert wait_for(lambda: has_checkpoint(run), process), process.communicate()
  process.send_signal(signal.SIGTERM)
  _out, err = process.communicate(timeout=120)
  assert process.returncode == 143, err[-3000:]
  assert "Traceback" not in err, err[-3000:]
  [stopped_at] = [int(m) for m in re.findall(STOP_LINE, err)]
  assert 7 <= stopped_at < 40, err[-2000:]
  assert max(int(d) for d in os.listdir(run / "checkpoints") if d.isdigit()) == stopped_at
  assert not (run / ".lock").exists()
  rows = read_metrics(run)
  assert not any("test/params_from_step" in r for r in rows)

  # (In-process from here: the same computation as the command, without its start-up time.)
  config = tiny_config(data_file, tmp_path / "cache", **overrides)
  straight = tmp_path / "straight"
  report = runner.train_and_evaluate(config, str(straight))
  assert runner.train_and_evaluate(config, str(run)) == report
  step_a, params_a = restore_params(straight)
  step_b, params_b = restore_params(run)
  assert step_a == step_b == 40
  assert_trees_identical(params_a, params_b)
  assert final_report(straight) == final_report(run)
  assert eval_rows(straight) == eval_rows(run)
  assert read_metrics(run)[:len(rows)] == rows
  assert untimed(read_metrics(run)) == untimed(read_metrics(straight))


def untimed(rows):
  """metrics.jsonl rows without their wall-clock fields (and the compile-time row)."""
  return [{k: v for k, v in r.items() if not k.endswith(("_s", "_per_sec"))}
          for r in rows if set(r) - {"step", "train/compile_s"}]


def test_a_stop_inside_a_log_window_resumes_with_the_uninterrupted_runs_rows(tmp_path,
                                                                            monkeypatch):
  # SIGTERM as step 8's batch is drawn (logging every 5, checkpoints every 10): the steps 6-8
  # of the cut window go into the stop's checkpoint, so the resumed run's step-10 row averages
  # steps 6-10 as the uninterrupted run's does (it once averaged 9-10 only).
  from textattn.data import batches as batches_lib
  data = write_sentiment_jsonl(tmp_path / "reviews.jsonl")
  config = lambda: tiny_config(data, tmp_path / "cache", num_train_steps=20,
                               checkpoint_every_steps=10, eval_every_steps=10,
                               log_every_steps=5)
  runner.train_and_evaluate(config(), str(tmp_path / "straight"))
  real, draws = batches_lib.TrainIterator.__next__, []

  def next_then_stop(iterator):
    draws.append(1)
    if len(draws) == 8:  # (draw 1 is step 1's, for the compilation)
      os.kill(os.getpid(), signal.SIGTERM)
    return real(iterator)
  monkeypatch.setattr(batches_lib.TrainIterator, "__next__", next_then_stop)
  with pytest.raises(errors.Stopped, match="stopped at step 8"):
    runner.train_and_evaluate(config(), str(tmp_path / "stopped"))
  monkeypatch.setattr(batches_lib.TrainIterator, "__next__", real)
  runner.train_and_evaluate(config(), str(tmp_path / "stopped"))
  assert (untimed(read_metrics(tmp_path / "stopped"))
          == untimed(read_metrics(tmp_path / "straight")))


def test_the_host_dispatches_at_most_max_in_flight_steps_ahead_so_a_stop_is_prompt(
    monkeypatch):
  # JAX dispatches asynchronously: unbounded, the host queued every step up to the next log
  # line, and a SIGTERM's checkpoint waited for all of them (2.5 min on a CPU fine-tune).
  waited = []
  real_wait = jax.block_until_ready
  monkeypatch.setattr(jax, "block_until_ready", lambda x: waited.append(x) or real_wait(x))
  waits_when_drawn = []

  def batches():
    while True:
      waits_when_drawn.append(len(waited))
      yield {"x": np.ones((4, 4), np.float32)}

  def train_step(state, batch):
    one = jnp.float32(1)
    return state + batch["x"].sum(), {"loss_sum": one, "correct": one, "count": one,
                                      "nonfinite": jnp.int32(0)}

  loop.fit(jnp.float32(0), train_step, batches(), loop.Schedule(20, log_every=0),
           loop.Hooks(progress=False))
  # Batch 0 compiles the step; batch n is drawn for step n + 1, once step n is dispatched:
  # by then the loop has waited for step n - MAX_IN_FLIGHT's results.
  assert len(waits_when_drawn) == 20
  for n, waits in enumerate(waits_when_drawn[1:], start=1):
    assert waits >= n - loop.MAX_IN_FLIGHT, waits_when_drawn
  assert all(set(sums) >= {"loss_sum", "nonfinite"} for sums in waited)


def test_sigterm_outside_the_training_loop_is_ctrl_c_with_exit_143_and_inside_it_saves():
  previous = signal.getsignal(signal.SIGTERM)
  try:
    loop.sigterm_as_interrupt()  # (textattn.main's, before the run starts)
    with pytest.raises(KeyboardInterrupt) as caught:  # main: one sentence, the lock released
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(5)
    assert isinstance(caught.value, errors.Terminated) and caught.value.exit_code == 143
    with loop.stop_on_signals() as stop:  # fit's: a flag; the step finishes and saves
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(0.2)
      assert stop.signum == signal.SIGTERM
    with pytest.raises(errors.Terminated):  # and after fit, the interrupt again
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(5)
  finally:
    signal.signal(signal.SIGTERM, previous)


def test_a_second_run_on_a_busy_workdir_refuses_naming_the_holder_and_ctrl_c_twice_exits(
    tmp_path, data_file):
  args = cli_args(data_file, tmp_path / "cache", num_train_steps=100000,
                  checkpoint_every_steps=20, eval_every_steps=20)
  run = tmp_path / "run"
  first = start_main(args, run)
  try:
    assert wait_for(lambda: has_checkpoint(run), first), first.communicate()
    lock = json.loads((run / ".lock").read_text())
    assert lock["pid"] == first.pid
    rows_before = read_metrics(run)
    started = time.time()
    second = run_main(args, run)
    assert second.returncode == 1
    line = one_error_line(second.stderr)
    assert (f"is in use by process {first.pid} on host {lock['host']}" in line
            and "use another --workdir" in line), line
    assert time.time() - started < 60  # (start-up included; the lock is the first check)
    assert json.loads((run / ".lock").read_text()) == lock  # still the first run's
    assert read_metrics(run)[:len(rows_before)] == rows_before
  finally:
    # Ctrl-C twice: the second exits at once, perhaps in the middle of a save.
    first.send_signal(signal.SIGINT)
    time.sleep(0.05)
    first.send_signal(signal.SIGINT)
    _out, err = first.communicate(timeout=120)
  assert first.returncode == 130 and "Traceback" not in err, err[-3000:]
  assert not (run / ".lock").exists()
  # Nothing half-written is taken for a checkpoint: the newest one restores and verifies.
  manager = checkpointing.open_manager(str(run), 1)
  latest = manager.latest_step()
  restored = manager.restore(latest, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(), data=ocp.args.JsonRestore()))
  assert restore.verify(restored, checkpointing.read_meta(manager, latest)) is None


def test_a_stale_lock_is_taken_over_and_a_nan_names_the_steps_and_no_checkpoint_yet(
    tmp_path, data_file, monkeypatch, capsys):
  run = tmp_path / "run"
  run.mkdir()
  dead = subprocess.Popen(["true"])
  dead.wait()
  (run / ".lock").write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename,
                                         "run_id": "old", "started": "then"}))
  real_step = step_lib.train_step

  def step_that_breaks_after_3(state, batch):
    new_state, metrics = real_step(state, batch)
    params = jax.tree.map(lambda p: jnp.where(new_state.step >= 3, jnp.nan, p),
                          new_state.params)
    return new_state.replace(params=params), metrics

  monkeypatch.setattr(step_lib, "train_step", step_that_breaks_after_3)
  config = tiny_config(data_file, tmp_path / "c", num_train_steps=20)
  with pytest.raises(errors.NonFiniteLossError) as raised:
    runner.train_and_evaluate(config, str(run))
  message = str(raised.value)
  assert "between steps 1 and 5" in message and "there is no checkpoint yet" in message
  assert "None" not in message and "replays the same NaN" in message
  assert "new --workdir" in message and "optimizer.learning_rate" in message
  out = capsys.readouterr().out
  assert f"taking over the lock of {run} left by process {dead.pid}" in out
  assert not (run / ".lock").exists()  # released on the error too


def _rewrite_state(workdir, step, change):
  """Rewrites checkpoint `step`'s state arrays with change(name, array) through Orbax itself:
  bytes that decode fine but are not what was saved (what a flipped bit in raw data is)."""
  path = pathlib.Path(workdir) / "checkpoints" / str(step) / "state"
  checkpointer = ocp.StandardCheckpointer()
  state = checkpointer.restore(path)
  state = jax.tree_util.tree_map_with_path(
      lambda p, a: change(checkpointing._leaf_name(p), np.asarray(a)), state)
  shutil.rmtree(path)
  checkpointer.save(path, state)
  checkpointer.wait_until_finished()


def test_a_corrupted_latest_checkpoint_is_reported_and_the_previous_good_one_used(
    tmp_path, data_file, capsys):
  run = tmp_path / "run"
  config = tiny_config(data_file, tmp_path / "c", num_train_steps=20)
  runner.train_and_evaluate(config, str(run))
  params_at_20, report = restore_params(run, 20)[1], final_report(run)
  target = "params/logits/bias"
  _rewrite_state(run, 20, lambda name, a: a + 1e-3 if name == target else a)
  capsys.readouterr()
  assert runner.train_and_evaluate(config, str(run)) == {
      k: v for k, v in report.items() if k != "step"}
  out = capsys.readouterr().out
  assert (f"the checkpoint at step 20 in {run / 'checkpoints'} failed verification (array "
          f"{target} differs" in out and "trying step 10" in out), out[-2000:]
  assert "Resuming from checkpoint at step 10." in out
  assert (run / checkpointing.FAILED_DIR / "20").is_dir()  # kept aside, not deleted
  assert_trees_identical(params_at_20, restore_params(run, 20)[1])  # redone exactly
  assert final_report(run) == report

  # Checkpoints of an older textattn (no checksums) resume with a warning.
  older = tmp_path / "older"
  shutil.copytree(run, older)
  meta_path = older / "checkpoints" / "20" / "meta" / "metadata"
  meta = json.loads(meta_path.read_text())
  del meta["checksums"]
  meta_path.write_text(json.dumps(meta))
  runner.train_and_evaluate(config, str(older))
  out = capsys.readouterr().out
  assert "checkpoint at step 20 in" in out and "without checksums" in out, out[-2000:]

  # Every checkpoint damaged: refused in one line, nothing moved, the report kept.
  for step in (10, 20):
    _rewrite_state(run, step, lambda name, a: a * 0 if name == target else a)
  rows, listing = read_metrics(run), sorted(os.listdir(run / "checkpoints"))
  with pytest.raises(errors.RunError, match=r"No checkpoint in .* passed verification \(step 20: "
                                           r"array params/logits/bias; step 10: array"):
    runner.train_and_evaluate(config, str(run))
  assert read_metrics(run) == rows and sorted(os.listdir(run / "checkpoints")) == listing

  # The best-checkpoint restore of the test report verifies too.
  manager = checkpointing.open_manager(str(run), 1)
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                          manager.restore(20, args=ocp.args.Composite(
                              state=ocp.args.StandardRestore()))["state"])
  sharding = jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(jax.devices()[0]),
                          abstract)
  with pytest.raises(errors.RunError, match=r"best checkpoint \(step 20\) .* failed verification "
                                           r"\(array params/logits/bias .*no test report"):
    restore.restore_for_report(manager, 20, abstract, sharding)


def test_flipped_or_truncated_array_files_are_refused_or_replaced_never_restored(tmp_path,
                                                                                data_file):
  """Fault injection: a byte flipped in, or a truncation of, each array file of the latest
  checkpoint at seeded random places. Every restore is refused (one line) or returns exactly
  the arrays of the (older) step it names: none returns wrong values."""
  base = tmp_path / "base"
  runner.train_and_evaluate(tiny_config(data_file, tmp_path / "c", num_train_steps=20),
                              str(base))
  originals = {step: restore_params(base, step)[1] for step in (10, 20)}
  files = sorted(p for p in glob.glob(str(base / "checkpoints" / "20" / "state" / "**" / "*"),
                                      recursive=True)
                 if os.path.isfile(p) and "/d/" in p)
  assert files
  rng = np.random.default_rng(27)
  trials = [(name, "flip") for name in files] + [(files[rng.integers(len(files))], "truncate")]
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                          {"params": originals[10], **_other_state(base)})
  sharding = jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(jax.devices()[0]),
                          abstract)
  outcomes = []
  for index, (original, fault) in enumerate(trials):
    trial = tmp_path / f"trial{index}"
    shutil.copytree(base, trial, ignore=shutil.ignore_patterns(".lock"))
    path = trial / os.path.relpath(original, base)
    data = bytearray(path.read_bytes())
    if fault == "flip":
      data[int(rng.integers(len(data)))] ^= 1 << int(rng.integers(8))
    else:
      data = data[:int(rng.integers(len(data)))]
    path.write_bytes(bytes(data))
    manager = checkpointing.open_manager(str(trial), 1)
    meta = {**checkpointing.read_meta(manager, 20), "step": 20}
    try:
      restored, used = restore.restore_verified(manager, meta, abstract, sharding)
    except errors.RunError as refused:
      assert "\n" not in str(refused)
      outcomes.append("refused")
    else:
      assert_trees_identical(restored["state"]["params"], originals[used["step"]])
      outcomes.append("intact" if used["step"] == 20 else "fell back")
    manager.close()
  assert len(outcomes) == len(trials)
  print("fault injection outcomes:", {o: outcomes.count(o) for o in set(outcomes)})


def _other_state(workdir):
  manager = ocp.CheckpointManager(os.path.join(workdir, "checkpoints"))
  state = manager.restore(10, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
  return {k: v for k, v in state.items() if k != "params"}


def test_a_failed_save_stops_training_in_one_line_and_earlier_ones_stay_resumable(
    tmp_path, data_file, monkeypatch, capsys):
  """A full disk at the first checkpoint, then at the second; then the disk is freed. Also:
  a restart before the first checkpoint leaves one step-0 row and one TensorBoard file."""
  run = tmp_path / "run"
  config = tiny_config(data_file, tmp_path / "c", num_train_steps=20)
  real_save = ocp.CheckpointManager.save
  full_at = {"step": 10}

  def save(self, step, *args, **kwargs):
    if step == full_at["step"]:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.directory / str(step)))
    return real_save(self, step, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "save", save)
  with pytest.raises(errors.RunError, match=(
      rf"Saving the checkpoint at step 10 to {run / 'checkpoints' / '10'} failed \(OSError: No "
      rf"space left on device\); training stopped and no earlier checkpoint exists")):
    runner.train_and_evaluate(config, str(run))
  assert not has_checkpoint(run) and not (run / ".lock").exists()
  full_at["step"] = 20
  with pytest.raises(errors.RunError, match=r"step 20 .* No space left on device\); training "
                                           r"stopped and the checkpoints saved before \(latest: "
                                           r"step 10\) are intact: free disk space"):
    runner.train_and_evaluate(config, str(run))
  rows = read_metrics(run)
  assert [r["step"] for r in rows if "train/compile_s" in r] == [0]
  assert len(glob.glob(str(run / "events.out.tfevents.*"))) == 1
  assert not any("test/params_from_step" in r for r in rows)
  full_at["step"] = None
  capsys.readouterr()
  runner.train_and_evaluate(config, str(run))
  assert "Resuming from checkpoint at step 10." in capsys.readouterr().out
  assert restore_params(run)[0] == 20


def test_a_run_refused_before_training_leaves_no_workdir_it_created(tmp_path, data_file):
  config = tiny_config(data_file, tmp_path / "c", val_fraction=0.0)
  with pytest.raises(ValueError, match=r"val_fraction=0.0 is invalid"):
    runner.train_and_evaluate(config, str(tmp_path / "new"))
  assert not (tmp_path / "new").exists()
  (tmp_path / "existing").mkdir()
  with pytest.raises(ValueError, match=r"val_fraction=0.0 is invalid"):
    runner.train_and_evaluate(config, str(tmp_path / "existing"))
  assert (tmp_path / "existing").is_dir()


def test_a_run_refused_by_the_lock_of_a_run_that_created_the_workdir_first_leaves_it(
    tmp_path, monkeypatch):
  # Two runs start on one new workdir: the second is refused by the first's lock, and must not
  # remove the workdir it thought it had created (the first run's, training).
  workdir = tmp_path / "new"

  def refused(self, wait_s=2.0):
    (workdir / "checkpoint_of_the_first_run").write_text("kept")
    raise errors.RunError("in use by the first run")
  monkeypatch.setattr(workdir_lib.WorkdirLock, "acquire", refused)
  with pytest.raises(errors.RunError, match="in use by the first run"):
    runner.in_workdir(str(workdir), lambda *_: pytest.fail("ran without the lock"))
  assert (workdir / "checkpoint_of_the_first_run").read_text() == "kept"
  monkeypatch.undo()
  (tmp_path / "file").write_text("")
  with pytest.raises(errors.RunError, match=r"--workdir=.*file/run cannot be created "
                                           r"\((FileExistsError|NotADirectoryError)"):
    runner.in_workdir(str(tmp_path / "file" / "run"), lambda *_: None)


def test_a_stale_lock_taken_over_by_another_run_meanwhile_is_not_taken_from_it(tmp_path,
                                                                              monkeypatch):
  # B reads a stale record; before B moves it aside, run A takes over and writes its own lock.
  # B must put A's live lock back and refuse, not move it away and run beside A.
  dead = subprocess.Popen(["true"])
  dead.wait()
  stale = {"pid": dead.pid, "host": os.uname().nodename, "run_id": "old", "started": "then"}
  first = workdir_lib.WorkdirLock(str(tmp_path), run_id="A")
  first.acquire()  # (A's live lock, in place when B moves "the stale one" aside)
  second = workdir_lib.WorkdirLock(str(tmp_path), run_id="B")
  looks = iter([stale])
  monkeypatch.setattr(second, "_holder", lambda: next(looks, None) or
                      workdir_lib._read_record(second.path))
  with pytest.raises(errors.RunError, match=rf"is in use by process {os.getpid()}"):
    second.acquire(wait_s=0.1)
  assert json.loads((tmp_path / ".lock").read_text())["run_id"] == "A"
  assert [p.name for p in tmp_path.iterdir()] == [".lock"]  # (nothing left aside)


def test_lock_file_protocol(tmp_path):
  first = workdir_lib.WorkdirLock(str(tmp_path))
  first.acquire()
  with pytest.raises(errors.RunError, match=rf"is in use by process {os.getpid()} on host "):
    workdir_lib.WorkdirLock(str(tmp_path)).acquire(wait_s=0.1)
  assert workdir_lib.WorkdirLock(str(tmp_path), enabled=False).acquire() is None  # process > 0
  first.release()
  second = workdir_lib.WorkdirLock(str(tmp_path))
  second.acquire()
  first.release()  # not held: does not remove the other's lock
  assert (tmp_path / ".lock").exists()
  second.release()
  assert not (tmp_path / ".lock").exists()


def test_a_changed_config_on_resume_keeps_every_earlier_one_aside(tmp_path):
  import ml_collections
  config = lambda rate: ml_collections.ConfigDict({"learning_rate": rate})
  runner.write_config(str(tmp_path), config(1.0), 0)
  runner.write_config(str(tmp_path), config(2.0), 8)  # resumed at 8 with another config
  runner.write_config(str(tmp_path), config(3.0), 8)  # and again from the same checkpoint
  read = lambda name: json.loads((tmp_path / name).read_text())["learning_rate"]
  assert [read("config.before-step-8.json"), read("config.before-step-8.2.json"),
          read("config.json")] == [1.0, 2.0, 3.0]
  runner.write_config(str(tmp_path), config(3.0), 8)  # the same: nothing set aside
  assert len(list(tmp_path.glob("config.before-step-*"))) == 2


def tensorboard_events(workdir):
  """{(step, tag): value} of every event file in `workdir` (TensorFlow's reader)."""
  import tensorflow as tf
  events = {}
  for path in sorted(pathlib.Path(workdir).glob("events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      for value in event.summary.value:
        events[(event.step, value.tag)] = events.get((event.step, value.tag), []) + [
            round(value.simple_value, 5)]
  return events


def test_tensorboard_is_written_anew_from_the_kept_rows_at_every_start(tmp_path):
  # TensorBoard is a view of metrics.jsonl: events a kill left unflushed (tensorboardX buffers
  # 30 s), events past the step resumed from, and an old report's are in no file after a start;
  # a purge_step once left the first lost for good and the others shown twice.
  from textattn.metrics import MetricWriter
  writer = MetricWriter(str(tmp_path), enabled=True)
  writer.drop_after(None)
  for step in (1, 2, 3, 4):
    writer.write(step, {"train/loss": 1.0 / step})
  writer.write_report(4, {"test/accuracy": 0.5, "test/params_from_step": 4})
  del writer  # (killed: nothing flushed or closed)
  resumed = MetricWriter(str(tmp_path), enabled=True)
  resumed.drop_after(2)  # a resume from step 2's checkpoint
  resumed.write(3, {"train/loss": 0.3})
  resumed.rewind(3)  # a NaN replay from step 3
  resumed.write(4, {"train/loss": 0.4})
  resumed.write_report(4, {"test/accuracy": 0.75, "test/params_from_step": 4})
  resumed.close()
  assert tensorboard_events(tmp_path) == {
      (1, "train/loss"): [1.0], (2, "train/loss"): [0.5], (3, "train/loss"): [0.3],
      (4, "train/loss"): [0.4], (4, "test/accuracy"): [0.75], (4, "test/params_from_step"): [4.0]}
  assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1


def test_a_resumed_windows_examples_per_sec_counts_only_the_steps_timed_here(monkeypatch):
  # The carried steps (a stop's checkpoint) ran before this process's clock started: counted
  # in, the rate was ~10x too high after a resume at step 9 of a 10-step window.
  def train_step(state, batch):
    one = jnp.float32(1)
    return state + 1, {"loss_sum": one, "correct": one, "count": jnp.float32(2),
                       "nonfinite": jnp.int32(0)}

  def batches():
    while True:
      yield {"x": np.ones((2,), np.float32)}
  examples = []
  real = loop._train_row
  monkeypatch.setattr(loop, "_train_row", lambda totals, prefix, n, *rest: examples.append(n)
                      or real(totals, prefix, n, *rest))
  carried = [{"loss_sum": np.float32(1), "correct": np.float32(1), "count": np.float32(2),
              "nonfinite": np.int32(0)}] * 9
  result = loop.fit(jnp.float32(0), train_step, batches(),
                    loop.Schedule(10, log_every=10, batch_size=2),
                    loop.Hooks(progress=False, window=list(carried)), start_step=9)
  assert examples == [2] and result.history[-1]["train/loss"] == 0.5  # (10 steps' sums)
