"""Where textattn keeps what it can rebuild: tokenised data, downloads, compiled kernels."""

from __future__ import annotations

import os


def cache_root() -> str:
  """Where every textattn cache lives unless told otherwise: $TEXTATTN_CACHE, else
  $XDG_CACHE_HOME/textattn, else ~/.cache/textattn. The data cache (config.cache_dir = "") is
  this directory, hf:ORG/NAME models its huggingface/, the native kernels' its native/
  ($TEXTATTN_NATIVE_CACHE overrides that one)."""
  if os.environ.get("TEXTATTN_CACHE"):
    return os.path.expanduser(os.environ["TEXTATTN_CACHE"])
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "textattn")
