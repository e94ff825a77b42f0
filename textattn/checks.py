"""Field checkers: one sentence naming config.<field>, its value and what is allowed."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from textattn.errors import UsageError


def check_choice(field: str, value: Any, allowed: Iterable) -> None:
  """UsageError naming config.<field>, its value and the allowed values, unless allowed."""
  allowed = tuple(allowed)
  if value not in allowed:
    raise UsageError(f"config.{field}={value!r} is not allowed; "
                     f"allowed: {', '.join(map(str, allowed))}.")


def check_integer(field: str, value: Any, low: int) -> int:
  """UsageError naming config.<field> and its value unless it is an integer >= low (not a
  bool); returns it."""
  if not isinstance(value, int) or isinstance(value, bool) or value < low:
    raise UsageError(f"config.{field}={value!r} is invalid; it must be an integer >= {low}.")
  return value


def check_number(field: str, value: Any, ok: Callable[[float], bool], allowed: str) -> None:
  """UsageError naming config.<field> and its value unless it is a real number (not a bool) for
  which ok(value) holds; `allowed` ends the sentence ("a positive number")."""
  if isinstance(value, bool) or not isinstance(value, float | int) or not ok(value):
    raise UsageError(f"config.{field}={value!r} must be {allowed}.")
