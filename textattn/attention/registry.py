"""The attention registry: each variant registers itself by name when its module is imported.

The model, the benchmark and the tests look variants up here and never branch on a name, so a
new variant is one new module that calls `register(...)`, plus a config that names it. A module
outside textattn registers its variants when imported: `load_plugins(["my_pkg.my_attention"])`
(the `--plugin` flag of textattn.main and textattn.benchmark).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import flax.linen as nn
import ml_collections

from textattn.checks import check_choice
from textattn.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Variant:
  """One attention variant behind the common signature.

  build(num_heads=, implementation=, dtype=, name=) returns a Linen module called as
  `module(x [batch, length, embed], padding_mask bool [batch, length]) -> [batch, length, embed]`
  (padding_mask True for real tokens). `implementations` are the accepted values of
  config.model.attention_impl, "auto" first; `resolve(implementation, head_dim, dtype)` names the
  kernel "auto" (or any accepted name) means on this platform for that compute dtype, and a
  resolve that also takes the keywords `length` and `num_heads` is given the shape (on a CPU
  "auto" picks by measured speed per shape, textattn/attention/calibration.py): call it through
  `kernel(...)`, which passes them only to a resolve that takes them (a plugin's older resolve
  keeps working); `check(implementation, embed_dim,
  num_heads, dtype)` raises ValueError naming the bad field. `reference` is the implementation
  the benchmark's --check_against_reference compares the others with. `causal`: each position
  sees only itself and earlier positions. `forward_flops`, `core_bytes` and `kernels` label
  benchmark rows (textattn/benchmark/utilization.py). `segment_ids`: the module also accepts
  `segment_ids` (int32 [batch, length], 0 = padding): a position attends only to positions of
  its own segment.
  `rotary`: build also takes `rotary=True`, and the module then turns its queries and keys by
  their position (rotary.apply_rotary; the cache's running index when decoding), so q_i . k_j
  depends on i - j only (what a model's config.model.position = "rotary" builds): 0 .. length - 1
  along the row for the dot-product families; a feature-map family (linear attention,
  Performer), whose phi(R_i q) . phi(R_j k) depends on i and j themselves, counts from the start
  of each segment, so a packed document is turned as it is alone.
  """
  name: str
  build: Callable[..., nn.Module]
  implementations: tuple[str, ...] = ("auto", "xla")
  resolve: Callable[..., str] = (
      lambda implementation, head_dim=None, dtype="float32":
      "xla" if implementation == "auto" else implementation)
  check: Callable[..., None] | None = None
  reference: str = "xla"
  causal: bool = False
  segment_ids: bool = False  # build's module takes the keyword segment_ids= (docstring above)
  rotary: bool = False  # build takes rotary=True (docstring above)
  description: str = ""
  # The benchmark's accounting: forward_flops(batch, length, heads, head_dim) of one layer's
  # attention core by formula (None: no quadratic term, judged by bandwidth), and a short label
  # per implementation ("naive", "flash", "native", ...).
  forward_flops: Callable[[int, int, int, int], float] | None = None
  kernels: tuple[tuple[str, str], ...] = ()
  # core_bytes(batch, length, heads, head_dim, itemsize, backward) -> bytes one layer's
  # attention core must move by formula, forward (and backward): a linear-time variant's
  # bandwidth figure (None: not counted).
  core_bytes: Callable[[int, int, int, int, int, bool], float] | None = None
  # Sequence parallelism: shard(mesh=, **build's keywords) returns a module with build's
  # parameters whose core runs split over the mesh's "sequence" axis (None: it cannot be split;
  # textattn/attention/sequence.py declares the built-ins' with `declare_shard`).
  shard: Callable[..., nn.Module] | None = None
  # Options: the variant's opt-in sub-config under config.model (e.g. "window" for
  # config.model.window.size), its fields and defaults, and `option_keywords(**fields)` -> the
  # build keywords they mean (raising UsageError on a bad value); identity when None.
  options: str = ""
  option_defaults: tuple[tuple[str, Any], ...] = ()
  option_keywords: Callable[..., dict] | None = None

  def __post_init__(self):
    if self.reference not in self.implementations:
      raise ValueError(f"attention variant {self.name!r}: reference={self.reference!r} is not one "
                       f"of its implementations ({', '.join(self.implementations)}).")

  def kernel(self, implementation: str, head_dim: int | None = None, dtype: str = "float32", *,
             length: int | None = None, num_heads: int | None = None,
             options: tuple[tuple[str, Any], ...] = ()) -> str:
    """`resolve`, given the sequence length and head count where it takes them, and the build
    options (`build_options`'s) it names, e.g. sliding_window's and window_linear's `window`
    (an "auto" threshold counted in windows)."""
    if not _takes_shape(self.resolve):
      return self.resolve(implementation, head_dim, dtype)
    named = _keyword_names(self.resolve)
    extra = {k: v for k, v in options if named is None or k in named}
    return self.resolve(implementation, head_dim, dtype, length=length, num_heads=num_heads,
                        **extra)

  def validate(self, implementation: str, embed_dim: int, num_heads: int,
               dtype: str = "float32") -> None:
    if self.check is not None:
      self.check(implementation, embed_dim, num_heads, dtype)
    else:
      check_choice("model.attention_impl", implementation, self.implementations)
      check_heads(embed_dim, num_heads)


def default_options(name: str) -> ml_collections.ConfigDict:
  """The opt-in sub-config of variant `name` with its defaults (config.model.<options>)."""
  return ml_collections.ConfigDict(dict(get(name).option_defaults))


def build_options(variant: Variant, model_config) -> tuple[tuple[str, Any], ...]:
  """The build keywords config.model's sub-config of `variant` asks for (its defaults where
  config.model has no such sub-config), as a sorted tuple (a module field: hashable). A field
  the variant does not know is refused in one sentence."""
  if not variant.options:
    return ()
  fields = dict(variant.option_defaults)
  given = (model_config[variant.options]
           if model_config is not None and variant.options in model_config else None)
  if given is not None:
    unknown = sorted(set(given) - set(fields))
    if unknown:
      raise UsageError(f"config.model.{variant.options}.{unknown[0]} is not an option of "
                       f"attention {variant.name!r}; its options: "
                       f"{', '.join(sorted(fields))}.")
    fields.update(dict(given))
  keywords = variant.option_keywords(**fields) if variant.option_keywords else fields
  return tuple(sorted(keywords.items()))


def _keyword_names(resolve: Callable[..., str]) -> set[str] | None:
  """The keywords `resolve` accepts by name; None when it takes **kwargs (any); an empty set
  when its signature cannot be read (a builtin)."""
  try:
    parameters = list(inspect.signature(resolve).parameters.values())
  except (TypeError, ValueError):
    return set()
  if any(p.kind == p.VAR_KEYWORD for p in parameters):
    return None
  return {p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def _takes_shape(resolve: Callable[..., str]) -> bool:
  """Whether `resolve` accepts the keywords length= and num_heads= (or **kwargs)."""
  named = _keyword_names(resolve)
  return named is None or {"length", "num_heads"} <= named


_VARIANTS: dict[str, Variant] = {}


def register(variant: Variant) -> Variant:
  """Adds `variant`; registering the same name twice with another definition is an error."""
  existing = _VARIANTS.get(variant.name)
  if existing is not None and existing != variant:
    raise ValueError(f"attention variant {variant.name!r} is already registered "
                     f"({existing.description or existing.build}); choose another name.")
  _VARIANTS[variant.name] = variant
  return variant


def declare_shard(name: str, shard: Callable[..., nn.Module]) -> Variant:
  """Gives the registered variant `name` its sequence-sharded build (Variant.shard)."""
  variant = dataclasses.replace(get(name), shard=shard)
  _VARIANTS[name] = variant
  return variant


def unregister(name: str) -> None:
  """Removes a variant (tests that register a toy one clean up with this)."""
  _VARIANTS.pop(name, None)


def names() -> tuple[str, ...]:
  return tuple(_VARIANTS)


def rotary_names() -> tuple[str, ...]:
  """The registered variants whose build takes rotary=True."""
  return tuple(name for name in _VARIANTS if _VARIANTS[name].rotary)


def get(name: str) -> Variant:
  if name not in _VARIANTS:
    raise UsageError(f"config.model.attention={name!r} is not a known attention; allowed: "
                     f"{', '.join(_VARIANTS)} (a module that registers more can be loaded "
                     f"with --plugin=MODULE).")
  return _VARIANTS[name]


def load_plugins(modules: Iterable[str]) -> None:
  """Imports each module (dotted name), which registers its variants."""
  for module in modules:
    if not module:
      continue
    try:
      importlib.import_module(module)
    except ImportError as e:
      raise UsageError(f"--plugin={module!r} cannot be imported ({e}); give the dotted name of "
                       f"a module on the Python path that registers attention variants.") from e


def check_heads(embed_dim: int, num_heads: int) -> None:
  if not isinstance(num_heads, int) or num_heads < 1 or embed_dim % num_heads:
    raise UsageError(f"config.model.num_heads={num_heads} must be a positive divisor of "
                     f"config.model.embed_dim={embed_dim}.")
