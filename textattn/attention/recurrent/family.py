"""A recurrent family's registry entry and the helpers its layer needs beyond the core: one
function builds every family's `registry.Variant` (forms, reference, options checked by type)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from textattn.attention import registry
from textattn.attention.recurrent.layer import FORMS, KERNEL_LABELS, resolve
from textattn.errors import UsageError

Array = jax.Array


def positions(module: nn.Module, mode: str, length: int) -> Array:
  """Token positions [length] for rotary: 0..length-1 (training, and the first decode call, which
  allocates the cache's running index), else the index decoded so far plus 0..length-1."""
  if mode == "off":
    return jnp.arange(length)
  if mode == "allocate":
    module.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
    return jnp.arange(length)
  index = module.variable("cache", "index")
  start = index.value
  index.value = start + length
  return start + jnp.arange(length)


def _checked(sub_config: str, defaults: tuple[tuple[str, Any], ...],
             check: Callable[[dict], None] | None):
  """option_keywords for config.model.<sub_config>: each field of its default's type (a positive
  integer where the default is one), then the family's own `check`; the fields as keywords."""
  kinds = dict(defaults)

  def keywords(**fields) -> dict:
    for name, value in fields.items():
      default = kinds[name]
      where = f"config.model.{sub_config}.{name}={value!r}"
      if isinstance(default, bool):
        if not isinstance(value, bool):
          raise UsageError(f"{where} must be True or False.")
      elif isinstance(default, int):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
          raise UsageError(f"{where} must be a positive integer.")
      elif isinstance(default, float):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
          raise UsageError(f"{where} must be a positive number.")
    if check is not None:
      check(fields)
    return dict(fields)

  return keywords


def variant(name: str, build: Callable[..., nn.Module], *, options: str,
            defaults: tuple[tuple[str, Any], ...], description: str,
            forward_flops: Callable[..., float] | None = None,
            check: Callable[[dict], None] | None = None) -> registry.Variant:
  """A causal recurrent family: forms auto/chunked/recurrent (reference: recurrent), segment
  ids, options under config.model.<options> (`check(fields)` raises UsageError on a bad
  combination)."""
  return registry.Variant(
      name=name, build=build, implementations=FORMS, resolve=resolve, reference="recurrent",
      causal=True, segment_ids=True, options=options, option_defaults=defaults,
      option_keywords=_checked(options, defaults, check), forward_flops=forward_flops,
      kernels=KERNEL_LABELS, description=description)
