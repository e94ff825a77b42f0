"""The package's shape (issue 52): imports point down, no circles, few lazy imports, short modules.

Layers, lowest first; a module may import its own layer and those below. An import of a
`textattn` module inside a function is allowed only with a comment giving its reason (on its
line or the line above), and only a few: the commands keep `--help` instant that way.
"""

from __future__ import annotations

import ast
import collections
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "textattn"

# (module prefix, layer); the longest matching prefix decides.
LAYERS = {
    # 0. ground floor: errors, field checkers, where caches live, loading config files
    "textattn.errors": 0, "textattn.checks": 0, "textattn.paths": 0, "textattn.config": 0,
    # 1. data and attention, and what every layer above uses of JAX's devices and metrics
    "textattn.data": 1, "textattn.attention": 1, "textattn.sharding": 1, "textattn.platform": 1,
    "textattn.metrics": 1, "textattn.workdir": 1, "textattn.progress": 1, "textattn.flax_layers": 1,
    # 2. models, recipes, pretrained encoders; the train state, optimizer, checkpoints, decoding
    "textattn.models": 2, "textattn.recipes": 2, "textattn.pretrained": 2, "textattn.optim": 2,
    "textattn.train_state": 2, "textattn.checkpointing": 2, "textattn.decoding": 2,
    "textattn.restore": 2,
    # 3. tasks
    "textattn.tasks": 3,
    # 4. the loop and the runner (which composes each task's config with its own fields)
    "textattn.loop": 4, "textattn.run": 4,
    # 5. commands and the package's front door
    "textattn": 5, "textattn.main": 5, "textattn.predict": 5, "textattn.compare": 5,
    "textattn.ensemble": 5, "textattn.sweep": 5, "textattn.sweep_summary": 5, "textattn.translate": 5, "textattn.summary": 5,
    "textattn.command_line": 5, "textattn.benchmark": 5, "textattn.defaults": 5,
    "textattn.configs": 5,
}
MAX_UPWARD = 3
MAX_LOCAL = 15
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, pathlib.Path]:
  modules = {}
  for path in PACKAGE.rglob("*.py"):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    modules[name] = path
  return modules


MODULES = _modules()


def _resolve(name: str) -> str:
  while name not in MODULES and "." in name:
    name = name.rsplit(".", 1)[0]
  return name


def _imports():
  """(importer, imported, line, inside a function, has a comment) for every textattn import."""
  found = []
  for name, path in MODULES.items():
    lines = path.read_text().splitlines()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]

    def visit(node, in_function, name=name, lines=lines, package=package):
      for child in ast.iter_child_nodes(node):
        inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
        targets = []
        if isinstance(child, ast.Import):
          targets = [_resolve(a.name) for a in child.names if a.name.startswith("textattn")]
        elif isinstance(child, ast.ImportFrom):
          base = child.module or ""
          if child.level:
            parts = package.split(".")
            base = ".".join(parts[:len(parts) - child.level + 1] + ([base] if base else []))
          if base.startswith("textattn"):
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else _resolve(base)
                       for a in child.names]
        else:
          visit(child, inner)
          continue
        line = child.lineno
        commented = "#" in lines[line - 1] or lines[line - 2].strip().startswith("#")
        found.extend((name, target, line, in_function, commented)
                     for target in dict.fromkeys(targets) if target != name)
    visit(ast.parse(path.read_text()), False)
  return found


IMPORTS = _imports()


def _layer(module: str) -> int:
  prefix = module
  while prefix not in LAYERS:
    if "." not in prefix:
      raise AssertionError(f"{module} has no layer in tests/test_architecture.py's LAYERS")
    prefix = prefix.rsplit(".", 1)[0]
  return LAYERS[prefix]


def _cycles(edges):
  """Strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def strong(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in edges[v]:
      if w not in index:
        strong(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in list(edges):
    if v not in index:
      strong(v)
  return found


def test_every_module_has_a_layer():
  for module in MODULES:
    _layer(module)


def test_no_import_circle_inside_the_package_counting_imports_inside_functions():
  edges = collections.defaultdict(set)
  for importer, imported, *_ in IMPORTS:
    edges[importer].add(imported)
    edges[imported]
  assert not _cycles(edges), _cycles(edges)


def test_imports_point_down_with_at_most_three_exceptions():
  upward = sorted({(a, b) for a, b, *_ in IMPORTS
                   if _layer(b) > _layer(a) and not b.startswith(a + ".")})
  assert len(upward) <= MAX_UPWARD, "\n".join(f"{a} (layer {_layer(a)}) -> {b} ({_layer(b)})"
                                              for a, b in upward)


def test_few_imports_inside_functions_each_with_its_reason():
  local = [(a, b, line, commented) for a, b, line, inside, commented in IMPORTS if inside]
  where = "\n".join(f"{MODULES[a].relative_to(PACKAGE.parent)}:{line} -> {b}"
                    for a, b, line, _ in local)
  assert len({(a, line) for a, _, line, _ in local}) <= MAX_LOCAL, where
  unexplained = [f"{MODULES[a].relative_to(PACKAGE.parent)}:{line}"
                 for a, b, line, commented in local if not commented]
  assert not unexplained, f"function-local imports without a comment: {unexplained}"


def test_modules_and_functions_are_short():
  long_modules, long_functions = [], []
  for name, path in MODULES.items():
    text = path.read_text()
    if len(text.splitlines()) > MAX_MODULE_LINES:
      long_modules.append(f"{name}: {len(text.splitlines())}")
    for node in ast.walk(ast.parse(text)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        length = node.end_lineno - node.lineno + 1
        if length > MAX_FUNCTION_LINES:
          long_functions.append(f"{name}.{node.name}: {length}")
  assert not long_modules, long_modules
  assert not long_functions, long_functions
