"""What `attention_impl="auto"` picks on a one-device CPU: the native C++ kernel only where it was
measured faster than the XLA kernel on this machine, for that shape.

The first time "auto" resolves a shape class on a CPU where the native kernels build, the two
kernels' attention cores are timed, forward and backward (`jax.value_and_grad`), compiled first
(compilation is not timed), their calls interleaved, each kernel's median taken, within about
BUDGET_S seconds per kernel (at most MAX_CALLS timed calls each; stopped early once one kernel
is more than CLEAR_WIN times faster; a shape where one call alone takes longer is timed with one
call of each, so softmax at 4,096 tokens and beyond costs about one call of each kernel on two
rows). The verdict -- both times, the choice and a reason such as "native 1.8 ms vs xla 7.35 ms
at length 256" -- is cached beside the built native library
(`textattn_kernels-<hash>.calibration.json` in the native kernel cache): the library's hash
covers its sources, compiler, jaxlib and this CPU's feature flags, so a rebuild or another CPU
calibrates again. Native is chosen where it took at most 1 / (1 + MARGIN) of the XLA
kernel's time, else the XLA kernel (near a tie, the XLA kernel).

A shape class (`Shape`) is: the variant (softmax, causal and additive have their own), the length
bucket (the power of two nearest the length in log scale), the head size, the compute dtype,
the worker threads (usable_cores()), $XLA_FLAGS, and for additive attention the head count (its
scores mix heads). The batch is not part of it: each variant times a fixed problem per bucket
(its `calibration_problem`): enough rows to keep every thread busy and small enough to finish
in about a second at lengths up to a few thousand, with a padding pattern like real text's
(the first example full, the others down to half the length).

$TEXTATTN_CPU_AUTO: "measure" (default, as above), "native" (native wherever it runs: no timing,
the rule before calibration) or "xla" (never native); tests and exact reproductions set it.

Safe for processes that start at once: a process holds an exclusive lock (flock on
`<cache>.lock`) while it calibrates a shape and re-reads the cache once it has the lock, so two
processes never time against each other nor calibrate one shape twice; the cache is written to a
temporary file and renamed into place (os.replace), so a reader never sees half a file. An
unreadable or corrupt cache (or entry) is ignored, warned about once, and rewritten.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from absl import logging

from textattn.attention import native
from textattn.attention.common import usable_cores
from textattn.errors import UsageError

ENV = "TEXTATTN_CPU_AUTO"
MODES = ("measure", "native", "xla")
MARGIN = 0.05  # native must be at least this much faster (a tie keeps the XLA kernel)
BUDGET_S = 1.0  # timed calls per kernel and shape (one call each, where a call takes longer)
MAX_CALLS = 7
CLEAR_WIN = 2.0  # after one call each, a ratio past this ends the timing early
FORMAT_VERSION = 1


def mode() -> str:
  """$TEXTATTN_CPU_AUTO, checked: UsageError for a value that is not one of MODES."""
  value = os.environ.get(ENV, "measure") or "measure"
  if value not in MODES:
    raise UsageError(f"${ENV}={value!r} is not a valid setting; allowed: {', '.join(MODES)} "
                     f"(measure: time native against XLA per shape; native/xla: always that).")
  return value


def length_bucket(length: int) -> int:
  """The power of two nearest `length` in log scale (300 -> 256, 400 -> 512); at least 8."""
  return max(8, 2 ** round(math.log2(max(int(length), 1))))


@dataclasses.dataclass(frozen=True)
class Shape:
  """What a verdict is keyed by (see the module docstring)."""
  variant: str
  length: int  # the bucket, length_bucket(...)
  head_dim: int
  dtype: str
  threads: int
  heads: int | None = None  # only where the variant's cost mixes heads (additive)
  xla_flags: str = ""

  def key(self) -> str:
    flags = hashlib.sha256(self.xla_flags.encode()).hexdigest()[:8] if self.xla_flags else "-"
    heads = "-" if self.heads is None else str(self.heads)
    return (f"{self.variant}/L{self.length}/h{heads}/d{self.head_dim}/{self.dtype}"
            f"/t{self.threads}/x{flags}")


def shape(variant: str, length: int, head_dim: int, dtype: str, heads: int | None = None) -> Shape:
  return Shape(variant=variant, length=length_bucket(length), head_dim=int(head_dim),
               dtype=str(dtype), threads=usable_cores(), heads=heads,
               xla_flags=os.environ.get("XLA_FLAGS", ""))


def decide(native_ms: float, fallback_ms: float, margin: float = MARGIN) -> bool:
  """Whether native wins: it took at most 1 / (1 + margin) of the fallback's time."""
  return native_ms * (1.0 + margin) <= fallback_ms


def _ms(value: float) -> str:
  return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def verdict(shape_: Shape, fallback: str, native_ms: float, fallback_ms: float,
            calls: tuple[int, int] = (0, 0)) -> dict:
  """The cache entry for measured times: the choice and the reason, in words."""
  choice = "native" if decide(native_ms, fallback_ms) else fallback
  relation = "faster" if choice == "native" else (
      "not faster" if native_ms >= fallback_ms else f"not {MARGIN:.0%} faster")
  reason = (f"native {_ms(native_ms)} ms vs {fallback} {_ms(fallback_ms)} ms at length "
            f"{shape_.length}, forward+backward, measured on this CPU: native {relation}")
  return {"choice": choice, "fallback": fallback, "native_ms": native_ms,
          "fallback_ms": fallback_ms, "calls": list(calls), "reason": reason,
          "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _valid(entry, fallback: str) -> bool:
  return (isinstance(entry, dict) and entry.get("choice") in ("native", fallback)
          and entry.get("fallback") == fallback and isinstance(entry.get("reason"), str)
          and all(isinstance(entry.get(f), (int, float)) and entry[f] > 0
                  for f in ("native_ms", "fallback_ms")))


@functools.cache
def _warn_unreadable(path: str, why: str) -> None:
  logging.warning("The kernel calibration cache %s is unreadable (%s); it is ignored and "
                  "rewritten.", path, why)


def read_cache(path: Path) -> dict[str, dict]:
  """The cached verdicts by Shape.key(); {} for a missing, unreadable or corrupt file."""
  try:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
  except FileNotFoundError:
    return {}
  except (OSError, UnicodeDecodeError, ValueError) as error:
    _warn_unreadable(str(path), f"{type(error).__name__}: {error}")
    return {}
  if (not isinstance(data, dict) or data.get("version") != FORMAT_VERSION
      or not isinstance(data.get("entries"), dict)):
    _warn_unreadable(str(path), "not a calibration file of this version")
    return {}
  return data["entries"]


def write_cache(path: Path, entries: dict[str, dict]) -> None:
  """Writes the verdicts atomically: a temporary file in the same directory, then os.replace."""
  path = Path(path)
  fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      json.dump({"version": FORMAT_VERSION, "entries": entries}, f, indent=1, sort_keys=True)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
  finally:
    Path(tmp).unlink(missing_ok=True)  # gone already after a successful rename


@contextlib.contextmanager
def _locked(path: Path):
  """An exclusive lock on `<path>.lock` for this process (none where fcntl is missing)."""
  try:
    import fcntl
  except ImportError:  # (the native kernels are built for Linux and macOS only)
    yield
    return
  try:
    lock = open(Path(str(path) + ".lock"), "a")  # noqa: SIM115 -- closed below
  except OSError:  # a read-only cache: nothing will be written there either
    yield
    return
  with lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def cache_path() -> Path:
  """The calibration file beside the native library this process loaded."""
  return native.calibration_path()


# What a variant gives to `choose`: a function of a kernel name returning (the function to
# time, its arguments), made by a factory that `measure` calls (in its own thread) only when
# the shape is timed. Tests replace `measure` to inject timings.
Problem = Callable[[str], tuple[Callable, tuple]]


def _time_calls(make_problem: Callable[[], Problem], names: tuple[str, str], budget_s: float,
                max_calls: int) -> tuple[list[float], list[float]]:
  import jax
  problem = make_problem()
  compiled = {}
  for name in names:
    function, args = problem(name)
    compiled[name] = (jax.jit(function).lower(*args).compile(), args)
  times = {name: [] for name in names}

  def call(name):
    function, args = compiled[name]
    start = time.perf_counter()
    jax.block_until_ready(function(*args))
    return time.perf_counter() - start

  first = {name: call(name) for name in names}  # a warm-up, unless a call is long
  for name in names:
    if first[name] > budget_s / 4:
      times[name].append(first[name])
  spent = {name: sum(times[name]) for name in names}
  while True:
    if all(times.values()):
      a, b = (min(times[name]) for name in names)
      if max(a, b) / min(a, b) > CLEAR_WIN:
        break
    pending = [name for name in names
               if len(times[name]) < max_calls and (not times[name] or spent[name] < budget_s)]
    if not pending:
      break
    for name in pending:  # interleaved, so a change in the machine's load hits both
      seconds = call(name)
      times[name].append(seconds)
      spent[name] += seconds
  return times[names[0]], times[names[1]]


def measure(shape_: Shape, make_problem: Callable[[], Problem], fallback: str,
            budget_s: float = BUDGET_S,
            max_calls: int = MAX_CALLS) -> tuple[list[float], list[float]]:
  """Seconds of the timed calls of native and of `fallback`, on the problem `make_problem()`
  builds for `shape_` (logged: calibration pauses the run a few seconds). Runs in a thread of
  its own, so it works even when "auto" is resolved while JAX traces a function (JAX's trace
  state is per thread: arrays made there are concrete)."""
  # (INFO: timings nobody asked for, once per machine and shape; no warning -- nothing is
  # wrong. A failure, which falls back to `fallback` uncached, is a warning.)
  logging.info("Timing the native and %r %s kernels at length %d (once on this machine; a "
               "few seconds) ...", fallback, shape_.variant, shape_.length)
  outcome = {}

  def run():
    try:
      outcome["times"] = _time_calls(make_problem, ("native", fallback), budget_s, max_calls)
    except BaseException as error:  # noqa: BLE001 -- re-raised in the caller
      outcome["error"] = error

  thread = threading.Thread(target=run, name="textattn-kernel-calibration")
  thread.start()
  thread.join()
  if "error" in outcome:
    raise outcome["error"]
  return outcome["times"]


def _median(values: list[float]) -> float:
  values = sorted(values)
  middle = len(values) // 2
  return values[middle] if len(values) % 2 else 0.5 * (values[middle - 1] + values[middle])


_VERDICTS: dict[tuple[str, str], dict] = {}  # this process's, by (cache file, key)


def choose(shape_: Shape, fallback: str, problem: Callable[[], Problem]) -> str:
  """"native" or `fallback` for this shape class: the cached verdict, else measured now (and
  cached). `problem()` builds the timed problem (called only to measure, in measure's thread).
  Logs the choice and its reason once per process and shape class."""
  setting = mode()
  if setting == "native":
    return "native"
  if setting == "xla":
    entry = {"choice": fallback, "reason": f"${ENV}=xla"}
  else:
    path = cache_path()
    memo = (str(path), shape_.key())
    if memo not in _VERDICTS:
      _VERDICTS[memo] = _cached_or_measured(path, shape_, fallback, problem)
    entry = _VERDICTS[memo]
  _announce(shape_, entry)
  return entry["choice"]


def _cached_or_measured(path: Path, shape_: Shape, fallback: str,
                        problem: Callable[[], Problem]) -> dict:
  key = shape_.key()
  entry = read_cache(path).get(key)
  if _valid(entry, fallback):
    return entry
  with _locked(path):
    entries = read_cache(path)  # another process may have measured it meanwhile
    if _valid(entries.get(key), fallback):
      return entries[key]
    try:
      native_s, fallback_s = measure(shape_, problem, fallback)
    except Exception as error:  # noqa: BLE001 -- e.g. out of memory: never a crash
      logging.warning("Timing the %s kernels at length %d failed (%s: %s).", shape_.variant,
                      shape_.length, type(error).__name__, error)
      return {"choice": fallback, "reason": f"timing failed: {type(error).__name__} (not cached)"}
    entry = verdict(shape_, fallback, 1e3 * _median(native_s), 1e3 * _median(fallback_s),
                    (len(native_s), len(fallback_s)))
    entries = {name: value for name, value in entries.items() if isinstance(value, dict)}
    entries[key] = entry
    try:
      write_cache(path, entries)
    except OSError as error:  # a read-only cache: the verdict still serves this process
      logging.warning("Could not write the kernel calibration cache %s (%s).", path, error)
  return entry


@functools.cache
def _announce_once(key: str, variant: str, choice: str, reason: str) -> None:
  # INFO, once per process and shape class: the choice "auto" was asked to make, with its timings
  # (the user's choice is kept; softmax.warn_fallback warns where it cannot be).
  logging.info("%s attention_impl='auto': the %r kernel for %s (%s).", variant, choice, key,
               reason)


def _announce(shape_: Shape, entry: dict) -> None:
  _announce_once(shape_.key(), shape_.variant, entry["choice"], entry["reason"])


def clear() -> None:
  """Forgets this process's verdicts and announcements (tests)."""
  _VERDICTS.clear()
  _announce_once.cache_clear()
  _warn_unreadable.cache_clear()


def padding_lengths(rows: int, length: int):
  """Real tokens per example of a calibration problem: the first full, the others evenly down to
  half the length (real text's padding; the native kernels skip padded blocks)."""
  if rows == 1:
    return [length]
  return [length - (i * length) // (2 * (rows - 1)) for i in range(rows)]
