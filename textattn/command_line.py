"""Command-line helpers shared by textattn.main and textattn.benchmark: errors in the flags or
the config file become one sentence and exit code 2, never a traceback."""

from __future__ import annotations

import os
import sys

import ml_collections

from textattn import config as config_lib
from textattn.config import load
from textattn.errors import DataError, UsageError, one_line


def text_lines(texts: list[str], path: str | None, what: str = "texts") -> list[str]:
  """The texts of a command that takes them as --text=STR (repeatable) or --input=FILE (its
  non-blank lines, UTF-8): exactly one of the two (UsageError), a readable file with at least one
  (DataError)."""
  if bool(texts) == bool(path):
    raise UsageError(f"give the {what} with --text=STR (repeatable) or --input=FILE (one per "
                     f"line), not both and not neither.")
  if not path:
    return list(texts)
  try:
    with open(path, encoding="utf-8") as f:
      lines = [line.rstrip("\n") for line in f if line.strip()]
  except (OSError, UnicodeDecodeError) as e:
    raise DataError(f"--input={path}: cannot be read as UTF-8 text ({e}).") from None
  if not lines:  # (a run that printed nothing and exited 0 looked like success)
    raise DataError(f"--input={path} holds no {what}: every line is blank; give one per line.")
  return lines


def field_paths(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  """Every leaf field of a config as a dotted path ("model.attention", "batch_size")."""
  paths = []
  for name, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      paths.extend(field_paths(value, f"{prefix}{name}."))
    else:
      paths.append(prefix + name)
  return paths


def unknown_field(config: ml_collections.ConfigDict, path: str) -> str | None:
  """One sentence for `config.<path>` if the config has no such field, with a "did you mean"
  (difflib over the config's fields); None if it exists."""
  import difflib
  node, walked = config, []
  for name in path.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or name not in node:
      where = f" in config.{'.'.join(walked)}" if walked else ""
      siblings = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
      close = difflib.get_close_matches(path, field_paths(config), n=1, cutoff=0.7) or [
          ".".join(walked + [s]) for s in difflib.get_close_matches(name, siblings, n=1)]
      moved = config_lib.MOVED_IN_V3.get(path)
      if moved:
        return (f"config.{path}: the config has no field {path!r}; since config version 3 it "
                f"is config.{moved} (an opt-in part, textattn/config.py).")
      hint = (f"did you mean config.{close[0]}?" if close else
              f"the fields{where} are: {', '.join(siblings)}." if 0 < len(siblings) <= 20 else
              "--helpfull lists every field." if siblings else
              f"config.{'.'.join(walked)} has no fields.")
      return f"config.{path}: the config has no field {name!r}{where}; {hint}"
    node = node[name]
    walked.append(name)
  return None


def _flag_values(argv: list[str], name: str) -> list[str]:
  """The values given to --<name> (as --name=value or --name value) in argv."""
  values = []
  for i, arg in enumerate(argv):
    if arg.startswith(f"--{name}="):
      values.append(arg.split("=", 1)[1])
    elif arg == f"--{name}" and i + 1 < len(argv):
      values.append(argv[i + 1])
  return values


def _overrides(argv: list[str], config_flag: str) -> list[tuple[str, str]]:
  """(field path, value) of every --<config_flag>.<path>=<value> in argv."""
  found = []
  for i, arg in enumerate(argv):
    if arg.startswith(f"--{config_flag}."):
      name, sep, value = arg[len(config_flag) + 3:].partition("=")
      if not sep and i + 1 < len(argv):
        value = argv[i + 1]
      found.append((name, value))
  return found


def flag_error_message(error: BaseException, argv: list[str], config_flag: str = "config"
                       ) -> str:
  """One sentence for an error raised while parsing the flags of a command with a config file
  flag (ml_collections' config_flags): a missing or unloadable config file, an unknown config
  field (with a "did you mean"), a value of the wrong type, an unknown or bad flag."""
  import difflib

  from absl import flags
  paths = _flag_values(argv, config_flag)
  path = paths[-1].split(":")[0] if paths else None
  if path is not None and not os.path.isfile(path):
    close = difflib.get_close_matches(os.path.basename(path).removesuffix(".py"),
                                      config_lib.shipped_configs(), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return (f"--{config_flag}={paths[-1]}: no such config file{hint}; give a config file's path "
            f"or a shipped config's name (textattn/configs/, listed by `ls configs`).")
  config = None
  if path is not None:
    try:
      config = load(path)
    except Exception as load_error:  # noqa: BLE001 -- the user's file: one sentence, no traceback
      return (f"--{config_flag}={paths[-1]}: loading the config file failed "
              f"({type(load_error).__name__}: {one_line(load_error)}).")
  if config is not None:
    for field, value in _overrides(argv, config_flag):
      message = unknown_field(config, field)
      if message is not None:
        return f"--{config_flag}.{field}={value}: " + message.split(": ", 1)[1]
  text = str(error)
  if isinstance(error, flags.Error) and "Traceback (most recent call last)" in text:
    # An exception inside the config file's get_config(): its last line says what.
    last = [line for line in text.splitlines() if line.strip()][-1]
    return (f"--{config_flag}={paths[-1] if paths else ''}: loading the config file failed "
            f"({last.strip()}).")
  if isinstance(error, flags.UnrecognizedFlagError):
    name = getattr(error, "flagname", None) or text
    close = difflib.get_close_matches(name, list(flags.FLAGS), n=1)
    return (f"unknown flag --{name}" + (f"; did you mean --{close[0]}?" if close else
                                        "; see --helpfull for the flags."))
  if isinstance(error, flags.IllegalFlagValueError) and text.startswith(f"flag --{config_flag}."):
    field = text[len(f"flag --{config_flag}."):].split("=", 1)[0]
    message = text[len("flag "):]
    if config is not None:
      try:
        node = config
        for name in field.split("."):
          node = node[name]
        message += f"; config.{field} takes a {type(node).__name__} (default {node!r})"
      except (KeyError, AttributeError, TypeError):
        pass
    return one_line(message) + "."
  if isinstance(error, flags.Error) and text.startswith("flag --"):
    return one_line(text[len("flag "):])
  return one_line(f"{type(error).__name__}: {text}" if not isinstance(error, flags.Error)
                   else text)


def resolve_config_names(argv: list[str], config_flag: str = "config") -> list[str]:
  """argv with each --config=NAME of a shipped config replaced by its path."""
  out = []
  for i, arg in enumerate(argv):
    if arg.startswith(f"--{config_flag}="):
      arg = f"--{config_flag}=" + config_lib.config_path(arg[len(config_flag) + 3:])
    elif i and argv[i - 1] == f"--{config_flag}":
      arg = config_lib.config_path(arg)
    out.append(arg)
  return out


def _split_part_overrides(argv: list[str], config_flag: str):
  """(argv without, [(part, field path, value)] of) the --config.PART.FIELD=VALUE overrides of
  an opt-in part (run.PARTS, Task.parts) that the config file leaves out: ml_collections knows
  only the fields a config has, so these are applied after parsing (_apply_part_overrides)."""
  prefix = f"--{config_flag}."
  argv = [prefix + config_lib.MOVED_IN_V3.get(a[len(prefix):].partition("=")[0],
                                               a[len(prefix):].partition("=")[0])
          + "".join(a[len(prefix):].partition("=")[1:]) if a.startswith(prefix) else a
          for a in argv]  # (a field's config-version-2 name still works: --config.columns=...)
  paths = _flag_values(argv, config_flag)
  overrides = [(f, v) for f, v in _overrides(argv, config_flag) if "." in f]
  if not paths or not overrides:
    return argv, []
  try:
    config = load(paths[-1])
    from textattn import run  # (lazy: JAX and the registries load only for such overrides)
    known = {**run.parts(config.task), **run.option_parts()}
  except Exception:  # noqa: BLE001 -- the normal parse reports a broken config or task
    return argv, []
  late = []
  for field, value in overrides:
    part = next((p for p in sorted(known, key=len, reverse=True) if field.startswith(p + ".")),
                None)
    if part is not None and unknown_field(config, part) is not None:
      late.append((part, field, value))
  if not late:
    return argv, []
  fields = {f for _, f, _ in late}
  kept, skip = [], False
  for arg in argv:
    if skip:
      skip = False
      continue
    name = arg[len(config_flag) + 3:].partition("=")[0] if arg.startswith(
        f"--{config_flag}.") else None
    if name in fields:
      skip = "=" not in arg  # (--config.x value: the value is the next argument)
      continue
    kept.append(arg)
  return kept, late


def _parse_value(text: str, default):
  if isinstance(default, bool):
    if text.lower() in ("true", "1", "yes"):
      return True
    if text.lower() in ("false", "0", "no"):
      return False
    raise ValueError("true or false")
  if isinstance(default, int):
    return int(text)
  if isinstance(default, float):
    return float(text)
  return text


def _apply_part_overrides(config: ml_collections.ConfigDict, late, config_flag: str) -> None:
  """Adds each opt-in part named by `late` (at its defaults) and sets the overridden fields;
  one line `error: ...` and exit code 2 for an unknown field or a value of the wrong type."""
  from textattn import run  # (lazy, as above)
  with config.unlocked():
    run.with_parts(config, *{part for part, _, _ in late})
    for _, field, value in late:
      message = unknown_field(config, field)
      if message is not None:
        print(f"error: --{config_flag}.{field}={value}: " + message.split(": ", 1)[1],
              file=sys.stderr)
        sys.exit(2)
      *parents, name = field.split(".")
      node = config
      for parent in parents:
        node = node[parent]
      try:
        node[name] = _parse_value(value, node[name])
      except ValueError:
        print(f"error: --{config_flag}.{field}={value}: config.{field} takes a "
              f"{type(node[name]).__name__} (default {node[name]!r}).", file=sys.stderr)
        sys.exit(2)


def flags_parser(config_flag: str | None = "config"):
  """A `flags_parser` for absl's app.run: parses the flags, and for any error in them (an
  unknown flag or config field, a wrong type, a missing or broken config file) prints one line
  `error: ...` on stderr and exits with code 2 (a usage error), never a traceback.
  config_flag None: a command without a config (predict, generate, ...)."""
  from absl import flags

  def plain(argv: list[str]) -> list[str]:
    try:
      return flags.FLAGS(argv)
    except flags.Error as error:
      print(f"error: {one_line(error)}", file=sys.stderr)
      sys.exit(2)

  def parse(argv: list[str]) -> list[str]:
    typed = list(argv)
    argv = [argv[0], *resolve_config_names(argv[1:], config_flag)]
    given = argv
    argv, late = _split_part_overrides(argv, config_flag)
    if argv != given:  # (ml_collections reads the overrides from sys.argv, not from argv)
      sys.argv = list(argv)
    try:
      remaining = flags.FLAGS(argv)
      config = flags.FLAGS[config_flag].value
      if config is not None:
        config.keys()  # a config file that failed to load raises only when first used
    except Exception as error:  # noqa: BLE001 -- absl, ml_collections and the config file
      # raise many types (flags.Error, KeyError/AttributeError for an unknown field,
      # OSError/SyntaxError loading the file): all are the user's, all one line.
      print(f"error: {flag_error_message(error, argv[1:], config_flag)}", file=sys.stderr)
      sys.exit(2)
    if late:
      _apply_part_overrides(config, late, config_flag)
    sys.argv = typed  # (the command as typed, for what records it: the benchmark's report)
    return remaining
  return parse if config_flag else plain
