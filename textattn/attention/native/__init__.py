"""Builds and registers textattn's native CPU kernels (XLA FFI custom calls) on first use.

The C++ sources (textattn/attention/native/softmax_attention.cc and additive_attention.cc, which share
parallel.h and vec8.h) are compiled with the system C++ compiler (`$CXX`, else `c++`/`g++`/`clang++`)
against the XLA FFI headers that ship with jaxlib, for this machine's CPU (`-march=native`), into
one library in a cache directory:

    $TEXTATTN_NATIVE_CACHE, else native/ in defaults.cache_root() ($TEXTATTN_CACHE, else
    $XDG_CACHE_HOME/textattn, else ~/.cache/textattn)

The library's file name carries a hash of the sources, the compiler, its flags, jaxlib's version
and the CPU's feature flags, so a changed source or machine builds a new library instead of
loading a stale one; it is written under a temporary name and renamed into place, so concurrent
processes (several hosts on one machine, pytest-xdist) never load a half-written file.

Only a library this installation built is loaded: the build records the library's sha256 in
`<library>.sha256` beside it (written atomically, before the library is renamed into place),
and the bytes are hashed and compared before every load. A library with a different hash (one
planted or damaged) is refused; one without a recorded hash (an older build) is rebuilt. A
cache directory that other users may write to (group/other write permission, or owned by
another user) is refused outright: whoever can write there could plant code this process runs.

`load()` raises `NativeUnavailable` with one sentence saying why (no compiler, compile error, an
unwritable, shared or noexec cache directory, a library that fails its hash check, fails to load
or lacks a kernel's symbol, not a Linux or macOS host...); `available()` answers without
raising, so `attention_impl='auto'` falls back to the XLA kernel (with one warning, from the
attention variant's resolve()). Where they load, "auto" still uses them only where they were
timed faster (textattn/attention/calibration.py, whose verdicts live beside the library:
`calibration_path()`). Nothing here runs at import time.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from textattn.paths import cache_root

SOURCES = (Path(__file__).parent / "softmax_attention.cc",
           Path(__file__).parent / "additive_attention.cc")
HEADERS = tuple(Path(__file__).parent / name  # (hashed with the sources)
                for name in ("parallel.h", "vec8.h", "softmax_plain.h"))
FORWARD_TARGET = "textattn_softmax_attention_forward"
BACKWARD_TARGET = "textattn_softmax_attention_backward"
ADDITIVE_FORWARD_TARGET = "textattn_additive_attention_forward"
ADDITIVE_BACKWARD_TARGET = "textattn_additive_attention_backward"
# Reassociation lets the compiler vectorise the row max / sum reductions (the kernel does not
# depend on IEEE evaluation order beyond float32 rounding); infinities stay (no -ffast-math).
_FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-pthread", "-fno-math-errno",
          "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros")


KEY_LANES_ENV = "TEXTATTN_NATIVE_KEY_LANES"  # "8": the 8-float key path on an AVX-512 CPU


def flags() -> tuple[str, ...]:
  """The compiler flags: _FLAGS, and -DTEXTATTN_KEY_LANES=N when $TEXTATTN_NATIVE_KEY_LANES
  is set (8 forces the AVX2-width key vectors on an AVX-512 CPU, for tests and A/B timing; 16
  needs AVX-512F; unset: the CPU decides, vec8.h)."""
  lanes = os.environ.get(KEY_LANES_ENV, "")
  if not lanes:
    return _FLAGS
  if lanes not in ("8", "16"):
    raise NativeUnavailable(f"${KEY_LANES_ENV}={lanes!r} must be 8 or 16 (or unset).")
  return (*_FLAGS, f"-DTEXTATTN_KEY_LANES={lanes}")


class NativeUnavailable(RuntimeError):
  """The native kernels cannot be built or loaded on this machine (the message says why)."""


def cache_dir() -> Path:
  if os.environ.get("TEXTATTN_NATIVE_CACHE"):
    return Path(os.environ["TEXTATTN_NATIVE_CACHE"])
  return Path(cache_root()) / "native"


def find_compiler() -> list[str] | None:
  """The compiler command ($CXX may carry arguments, e.g. "ccache g++"), or None."""
  for command in (os.environ.get("CXX", ""), "c++", "g++", "clang++"):
    words = shlex.split(command)
    if words and shutil.which(words[0]):
      return [shutil.which(words[0]), *words[1:]]
  return None


def cpu_signature() -> str:
  """The CPU's feature flags (what -march=native compiles for)."""
  try:  # Linux: the feature flags decide what -march=native emits
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith(("flags", "Features")):
        return line
  except OSError:
    pass
  return platform.machine() + platform.processor()


def _library_path(compiler: list[str]) -> Path:
  import jaxlib
  version = subprocess.run([*compiler, "--version"], capture_output=True, text=True,
                           check=False).stdout.splitlines()[:1]
  key = hashlib.sha256()
  for part in (*(source.read_bytes() for source in SOURCES + HEADERS), repr(version).encode(),
               repr(flags()).encode(), jaxlib.__version__.encode(), cpu_signature().encode(),
               sys.platform.encode()):
    key.update(part)
  return cache_dir() / f"textattn_kernels-{key.hexdigest()[:16]}.so"


@functools.cache
def calibration_path() -> Path:
  """Where textattn.attention.calibration keeps its verdicts for this machine's library: beside
  it, named after it (`<library>.calibration.json`), so a rebuild or another CPU calibrates
  again. Builds and loads the library first (NativeUnavailable if it cannot)."""
  load()
  return _library_path(find_compiler()).with_suffix(".calibration.json")


def _sha256(path: Path) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def _hash_path(library: Path) -> Path:
  return library.with_name(library.name + ".sha256")


def check_cache_dir(directory: Path) -> None:
  """NativeUnavailable unless `directory` is owned by this user and not writable by group or
  others: a library loaded from a directory someone else can write to runs their code."""
  info = directory.stat()
  getuid = getattr(os, "getuid", None)
  if getuid is not None and info.st_uid != getuid():
    raise NativeUnavailable(f"the native kernel cache {directory} is owned by user id "
                            f"{info.st_uid}, not this user ({getuid()}); libraries there are "
                            f"not loaded. Set TEXTATTN_NATIVE_CACHE to a directory of your own.")
  if info.st_mode & 0o022:
    raise NativeUnavailable(f"the native kernel cache {directory} is writable by group or "
                            f"others (mode {info.st_mode & 0o777:o}); libraries there are not "
                            f"loaded. "
                            f"Run `chmod go-w {directory}` or set TEXTATTN_NATIVE_CACHE to a "
                            f"private directory.")


def verify(library: Path) -> None:
  """NativeUnavailable unless `library`'s bytes have the sha256 its build recorded."""
  try:
    recorded = _hash_path(library).read_text(encoding="ascii").strip()
  except (OSError, UnicodeDecodeError) as error:
    raise NativeUnavailable(f"{library} has no readable recorded hash ({_hash_path(library).name}: "
                            f"{error}); it is not loaded. Remove it to rebuild.") from None
  actual = _sha256(library)
  if actual != recorded:
    raise NativeUnavailable(f"{library} does not match the sha256 its build recorded (found "
                            f"{actual[:12]}..., recorded {recorded[:12]}...); it was not built "
                            f"by this installation or is damaged, and is not loaded. Remove it "
                            f"(and {_hash_path(library).name}) to rebuild.")


def _write_hash(library: Path, digest: str) -> None:
  """<library>.sha256, atomically (temporary file in the same directory, then rename)."""
  fd, tmp = tempfile.mkstemp(prefix=library.name + ".", suffix=".sha256.tmp", dir=library.parent)
  try:
    with os.fdopen(fd, "w", encoding="ascii") as f:
      f.write(digest + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, _hash_path(library))
  finally:
    Path(tmp).unlink(missing_ok=True)


def build() -> Path:
  """Compile the kernels if this machine has no up-to-date build; return the library's path."""
  if sys.platform not in ("linux", "darwin"):
    raise NativeUnavailable(f"native kernels are built for Linux and macOS only, not "
                            f"{sys.platform}; use config.model.attention_impl='fused'.")
  compiler = find_compiler()
  if compiler is None:
    raise NativeUnavailable("no C++ compiler found ($CXX, c++, g++ or clang++) to build the "
                            "native kernels; install one or use config.model.attention_impl="
                            "'fused'.")
  try:
    library = _library_path(compiler)
    # 0o755 & ~umask: never group-writable, even under a umask of 002.
    library.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    check_cache_dir(library.parent)
    if library.exists() and _hash_path(library).exists():
      return library  # (verified by _load before it is loaded)
    import jax
    fd, tmp = tempfile.mkstemp(prefix=library.stem + ".", suffix=".tmp.so", dir=library.parent)
    os.close(fd)
    try:
      command = [*compiler, *flags(), "-I", jax.ffi.include_dir(), *map(str, SOURCES), "-o", tmp]
      result = subprocess.run(command, capture_output=True, text=True, check=False)
      if result.returncode != 0:
        # The first error, not the last lines: jaxlib's headers add warnings after it.
        lines = result.stderr.strip().splitlines()
        errors = [line for line in lines if "error" in line.lower() and "warning" not in line]
        tail = " ".join(errors[:2] or lines[-3:])
        names = ", ".join(source.name for source in SOURCES)
        raise NativeUnavailable(f"compiling {names} failed ({' '.join(command)}): {tail}")
      os.chmod(tmp, 0o755)  # mkstemp makes it private; a shared cache must be loadable by all
      _write_hash(library, _sha256(Path(tmp)))  # first: a library in place always has its hash
      os.replace(tmp, library)
    finally:
      Path(tmp).unlink(missing_ok=True)  # gone already after a successful rename
  except (OSError, RuntimeError, subprocess.SubprocessError) as error:
    if isinstance(error, NativeUnavailable):
      raise
    raise NativeUnavailable(f"building the native kernels failed ({type(error).__name__}: "
                            f"{error}); set TEXTATTN_NATIVE_CACHE to a writable directory or use "
                            f"config.model.attention_impl='fused'.") from error
  return library


def load() -> ctypes.CDLL:
  """Build (if needed), load and register the kernels with XLA's CPU backend, once a process."""
  library, error = _load_once()
  if error is not None:
    raise error
  return library


@functools.cache
def _load_once() -> tuple[ctypes.CDLL | None, NativeUnavailable | None]:
  try:
    return _load(), None
  except NativeUnavailable as error:  # remembered: a failed build is not retried every call
    return None, error


def _load() -> ctypes.CDLL:
  import jax
  path = build()
  try:
    verify(path)
    library = ctypes.cdll.LoadLibrary(str(path))
  except OSError as error:  # e.g. a noexec cache directory, or not a loadable library
    raise NativeUnavailable(f"loading the native kernels from {path} failed ({error}); set "
                            f"TEXTATTN_NATIVE_CACHE elsewhere or use config.model.attention_impl="
                            f"'fused'.") from error
  symbols = []
  for target, name in ((FORWARD_TARGET, "TextattnSoftmaxAttentionForward"),
                       (BACKWARD_TARGET, "TextattnSoftmaxAttentionBackward"),
                       (ADDITIVE_FORWARD_TARGET, "TextattnAdditiveAttentionForward"),
                       (ADDITIVE_BACKWARD_TARGET, "TextattnAdditiveAttentionBackward")):
    try:
      symbols.append((target, getattr(library, name)))
    except AttributeError:
      raise NativeUnavailable(f"{path} lacks the kernel symbol {name}; it is not used. Remove "
                              f"it (and {_hash_path(path).name}) to rebuild.") from None
  try:
    for target, symbol in symbols:
      jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(symbol), platform="cpu")
  except Exception as error:  # noqa: BLE001 -- XLA refusing a target: the fallback, not a crash
    raise NativeUnavailable(f"registering the native kernels from {path} with XLA failed "
                            f"({type(error).__name__}: {error}).") from None
  return library


def key_lanes() -> int:
  """Floats per key vector in the loaded build's blocked softmax kernels, and per feature chunk
  in its additive kernel where head_dim is a multiple of 16: 16 where it was compiled for
  AVX-512F, else 8 ($TEXTATTN_NATIVE_KEY_LANES overrides). NativeUnavailable if the kernels
  cannot be loaded."""
  return int(load().textattn_key_lanes())


def available() -> bool:
  try:
    load()
  except NativeUnavailable:
    return False
  return True


def unavailable_reason() -> str | None:
  try:
    load()
  except NativeUnavailable as error:
    return str(error)
  return None
