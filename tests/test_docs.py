"""The docs stay honest: README.md and docs/*.md name only configs, config fields, commands and
files that exist, and stay short (issue 52).

Checked, per doc and line:
  (a) every `--config=NAME` and `configs/NAME.py` names a shipped config (or an existing file);
      the first column of a table headed "config" too;
  (b) every `--config.FIELD=VALUE` (and a sweep's `--variant=NAME:FIELD=VALUE`) names a field of
      the config the same command loads, or, where the command names none, of some task's
      defaults or some shipped config; `config.FIELD=...` written in prose likewise;
  (c) every `python -m textattn.X` is a module that `python -m` can run (found, not run);
  (d) every relative link `[text](path)` and every repository path in code (`tests/...`,
      `textattn/...`, `experiments/...`, `configs/...`, `docs/...`) exists;
  (e) every citation of a RESULTS section (`RESULTS §N`, `RESULTS.md, section N`, in the docs,
      RESULTS itself, configs, code comments and experiments) names a `## N.` heading of
      experiments/RESULTS.md (and `§N.M` a `**N.M` paragraph of it), so sections keep their numbers.
ALL-CAPS words are placeholders (`--config=CONFIG`, `--config.FIELD=VALUE`) and are skipped.
Nothing is run: configs are loaded with the same loader as `--config`, modules only found.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import re
import sys
from pathlib import Path

import ml_collections
import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RESULTS = REPO / "experiments" / "RESULTS.md"
README_MAX_BYTES = 11 * 1000  # issue 52: README <= 11 KB
RESULTS_MAX_LINES = 600  # issue 52's hard cap (issue 82: 480 lines is the goal, new studies fit)
RESULTS_MAX_BYTES = 55 * 1000  # issue 82: RESULTS <= 55 KB
RESULTS_MAX_LINE_CHARS = 200  # issue 82: no line, tables included, wider than 200 characters

_CONFIG_FLAG = re.compile(r"--config=([^\s`'\"),;]+)")
_CONFIG_FILE = re.compile(r"(?<![\w/])configs/([\w{},]+)\.py")
_OVERRIDE = re.compile(r"--config\.([A-Za-z_][\w.]*)")
_PROSE_FIELD = re.compile(r"(?<![\w.-])config\.([A-Za-z_][\w.]*)\s*=")
_VARIANT = re.compile(r"--variant=[\w-]+:([^\s`'\"]+)")
_MODULE = re.compile(r"python3? -m (textattn(?:\.\w+)*)")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_REPO_PATH = re.compile(r"(?<![\w/.-])((?:textattn|tests|experiments|docs)/[\w./{},-]*\w)")
_SECTION_SIGN = re.compile(r"§(\d+(?:\.\d+)?)")
_SECTION_WORD = re.compile(r"RESULTS(?:\.md)?[,)\]]*\s*\(?sections?\s+"
                           r"(\d+(?:\s*(?:[–-]|,|and)\s*\d+)*)")
_OLD_VERSION = re.compile(r"(?:\b[0-9a-f]{7,40}:experiments/RESULTS\.md`?|\b[0-9a-f]{7,40})\s*$")


@dataclasses.dataclass
class Snippet:
  """A command or inline code span of a doc: its text, the doc and the line it starts on."""
  doc: Path
  line: int
  text: str

  def where(self, match_start: int = 0) -> str:
    line = self.line + self.text.count("\n", 0, match_start)
    return f"{self.doc.relative_to(REPO)}:{line}"


def _placeholder(text: str) -> bool:
  """NAME, FIELD, CONFIG, DIR: a doc's placeholder, not a name to check (asked only of a name
  that does not exist, so README.md and RESULTS.md are still checked)."""
  return any(part.isupper() for part in re.split(r"[./:{},]", text) if part)


def _expand_braces(text: str) -> list[str]:
  """lra_text_{softmax,causal}.py -> [lra_text_softmax.py, lra_text_causal.py]."""
  match = re.search(r"\{([^{}]*)\}", text)
  if not match:
    return [text]
  return [expanded for choice in match.group(1).split(",")
          for expanded in _expand_braces(text[:match.start()] + choice + text[match.end():])]


def snippets(doc: Path) -> list[Snippet]:
  """Each command of the doc's fenced code blocks (lines joined where they end in a backslash)
  and each inline code span of its prose."""
  lines = doc.read_text().splitlines()
  found, prose, fenced, command, start = [], [], False, [], 0
  for number, line in enumerate(lines, 1):
    if line.lstrip().startswith("```"):
      fenced = not fenced
      prose.append("")
      continue
    if not fenced:
      prose.append(line)
      continue
    prose.append("")
    if not command:
      start = number
    command.append(line.split(" #")[0] if not line.lstrip().startswith("#") else "")
    if not line.rstrip().endswith("\\"):
      found.append(Snippet(doc, start, "\n".join(command)))
      command = []
  text = "\n".join(prose)
  for match in re.finditer(r"`([^`]+)`", text):
    found.append(Snippet(doc, text.count("\n", 0, match.start()) + 1, match.group(1)))
  return found


def _load_config(value: str) -> ml_collections.ConfigDict:
  """The config `--config=value` loads (a shipped name or a path from the repository root), with
  the opt-in parts the command line may name (--config.source.text_fields=...)."""
  from textattn import run
  from textattn.config import load
  path = REPO / value
  return run.with_parts(run.complete(load(str(path) if path.is_file() else value)),
                       *run.option_parts())


@functools.cache
def _config(value: str) -> ml_collections.ConfigDict | None:
  try:
    return _load_config(value)
  except Exception:  # noqa: BLE001 -- reported by the config-name check
    return None


def _shipped() -> list[str]:
  return sorted(path.stem for path in (REPO / "textattn" / "configs").glob("*.py")
                if not path.name.startswith("_"))


@functools.cache
def _every_config() -> tuple[ml_collections.ConfigDict, ...]:
  """Each task's defaults and each shipped config: where a field a doc names without a config
  must exist."""
  from textattn import tasks
  configs = [tasks.get(name).defaults() for name in tasks.names()]
  return tuple(configs) + tuple(c for c in map(_config, _shipped()) if c is not None)


def _has_field(config: ml_collections.ConfigDict, path: str) -> bool:
  node = config
  for name in path.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or name not in node:
      return False
    node = node[name]
  return True


def _config_name_problem(value: str) -> str | None:
  value = value.split(":")[0]
  if (REPO / value).is_file() or value.removesuffix(".py") in _shipped() or _placeholder(value):
    return None
  return f"--config={value} is neither a shipped config ({', '.join(_shipped())}) nor a file"


def _field_problems(snippet: Snippet) -> list[str]:
  text = snippet.text
  named = [m.group(1) for m in _CONFIG_FLAG.finditer(text)]
  named = [value for value in named if not _placeholder(value) and
           _config_name_problem(value) is None]
  fields = [(m.start(), m.group(1)) for m in _OVERRIDE.finditer(text)]
  fields += [(m.start(), m.group(1)) for m in _PROSE_FIELD.finditer(text)]
  for match in _VARIANT.finditer(text):
    fields += [(match.start(), part.split("=")[0]) for part in match.group(1).split(",")
               if "=" in part]
  problems = []
  for start, field in fields:
    field = field.rstrip(".")
    if _placeholder(field):
      continue
    if named:
      config = _config(named[-1])
      if config is None:
        problems.append(f"{snippet.where(start)}: --config={named[-1]} does not load")
      elif not _has_field(config, field):
        problems.append(f"{snippet.where(start)}: config.{field} is not a field of "
                        f"--config={named[-1]}")
    elif not any(_has_field(config, field) for config in _every_config()):
      problems.append(f"{snippet.where(start)}: config.{field} is not a field of any task's "
                      f"defaults or shipped config")
  return problems


def _config_table_problems(doc: Path) -> list[str]:
  """The first column of a Markdown table headed `config`: backticked config file names."""
  problems, in_table = [], False
  for number, line in enumerate(doc.read_text().splitlines(), 1):
    if not line.startswith("|"):
      in_table = False
      continue
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    if not in_table:
      in_table, is_config_table = True, cells[0].startswith("config")
      continue
    if not is_config_table:
      continue
    for name in re.findall(r"`([\w{},]+\.py)`", cells[0]):
      for expanded in _expand_braces(name):
        if expanded.removesuffix(".py") not in _shipped():
          problems.append(f"{doc.relative_to(REPO)}:{number}: {expanded} is not a shipped config")
  return problems


def _module_problem(name: str) -> str | None:
  try:
    spec = importlib.util.find_spec(name)
  except ImportError as error:
    return f"python -m {name}: {error}"
  if spec is None:
    return f"python -m {name}: no such module"
  package = spec.submodule_search_locations is not None  # (python -m runs its __main__)
  if package and importlib.util.find_spec(name + ".__main__") is None:
    return f"python -m {name}: a package without __main__"
  return None


def _path_exists(path: str, base: Path) -> bool:
  return all((base / expanded).exists() for expanded in _expand_braces(path))


def problems_of(doc: Path) -> list[str]:
  problems = _config_table_problems(doc)
  for snippet in snippets(doc):
    for match in _CONFIG_FLAG.finditer(snippet.text):
      problem = _config_name_problem(match.group(1))
      if problem:
        problems.append(f"{snippet.where(match.start())}: {problem}")
    for match in _CONFIG_FILE.finditer(snippet.text):
      for name in _expand_braces(match.group(1)):
        if name not in _shipped() and not _placeholder(name):
          problems.append(f"{snippet.where(match.start())}: configs/{name}.py is not a shipped "
                          f"config")
    problems += _field_problems(snippet)
    for match in _MODULE.finditer(snippet.text):
      problem = _module_problem(match.group(1))
      if problem:
        problems.append(f"{snippet.where(match.start())}: {problem}")
    for match in _REPO_PATH.finditer(snippet.text):
      path = match.group(1)
      if not _path_exists(path, REPO) and not _placeholder(path):
        problems.append(f"{snippet.where(match.start())}: {path} does not exist")
  text = doc.read_text()
  for match in _LINK.finditer(text):
    target = match.group(1).split("#")[0]
    if not target or re.match(r"[a-z]+:", target):  # an anchor, https:, mailto:
      continue
    if not _path_exists(target, doc.parent):
      line = text.count("\n", 0, match.start()) + 1
      problems.append(f"{doc.relative_to(REPO)}:{line}: link to {target}, which does not exist")
  return problems


def _citing_files() -> list[Path]:
  """Where RESULTS sections are cited: the docs, RESULTS itself, the package, the experiments'
  notes and scripts, and the tests."""
  found = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
  for top, suffixes in (("textattn", (".py", ".cc", ".h")), ("tests", (".py",)),
                        ("experiments", (".md", ".py", ".sh", ".cc", ".txt"))):
    found += sorted(path for path in (REPO / top).rglob("*") if path.suffix in suffixes)
  return [path for path in found if path.resolve() != Path(__file__).resolve()]  # (its fixtures)


def _cited_sections(path: Path, text: str) -> list[tuple[int, str]]:
  """(offset, "N" or "N.M") for each RESULTS section the text cites. In README, docs and RESULTS
  every `§N` is one; elsewhere a `§N` within 80 characters after "RESULTS". A `§N` right after a
  commit (`git show C:experiments/RESULTS.md` §N, "8866ba7 §N") cites an old version: skipped."""
  anywhere = path.name in ("README.md", "RESULTS.md") or path.parent.name == "docs"
  cited = []
  for match in _SECTION_SIGN.finditer(text):
    before = text[max(0, match.start() - 80):match.start()]
    if _OLD_VERSION.search(before) or not (anywhere or "RESULTS" in before):
      continue
    cited.append((match.start(), match.group(1)))
  for match in _SECTION_WORD.finditer(text):
    if re.search(r"[0-9a-f]{7,40}:experiments/$", text[max(0, match.start() - 60):match.start()]):
      continue
    cited += [(match.start(1), number) for number in re.findall(r"\d+", match.group(1))]
  return cited


def citation_problems() -> list[str]:
  """Each citation of a RESULTS section that names no section of experiments/RESULTS.md."""
  results = (REPO / "experiments" / "RESULTS.md").read_text(encoding="utf-8")
  sections = set(re.findall(r"^## (\d+)\.", results, flags=re.MULTILINE))
  paragraphs = set(re.findall(r"^\*\*(\d+\.\d+) ", results, flags=re.MULTILINE))
  problems = []
  for path in _citing_files():
    text = path.read_text(encoding="utf-8", errors="replace")
    for offset, section in _cited_sections(path, text):
      if section.split(".")[0] in sections and ("." not in section or section in paragraphs):
        continue
      line = text.count("\n", 0, offset) + 1
      problems.append(f"{path.relative_to(REPO)}:{line}: cites RESULTS §{section}, which "
                      f"experiments/RESULTS.md does not have")
  return problems


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(REPO)) for d in DOCS])
def test_doc_names_only_configs_fields_commands_and_files_that_exist(doc):
  problems = problems_of(doc)
  assert not problems, "\n" + "\n".join(problems)


def test_checker_finds_each_kind_of_mistake(tmp_path, monkeypatch):
  """The checks above can fail: a doc with one mistake of each kind is reported line by line."""
  docs = tmp_path / "docs"
  docs.mkdir()
  doc = docs / "bad.md"
  doc.write_text(
      "# Bad\n"
      "```bash\n"
      "python -m textattn.main --config=no_such_config --workdir=runs/x\n"
      "python -m textattn.main --config=imdb_softmax --workdir=runs/x \\\n"
      "  --config.model.no_such_field=1\n"
      "python -m textattn.no_such_command\n"
      "```\n"
      "Also `--config.no_such_top_field=2`, [a link](missing.md), `tests/no_such_file.py`\n"
      "and `configs/no_such.py`; fine: `--config.FIELD=VALUE`, `--config.model.attention=additive`.\n")
  (tmp_path / "textattn" / "configs").mkdir(parents=True)
  (tmp_path / "textattn" / "configs" / "imdb_softmax.py").touch()  # the one shipped config here
  monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)  # (the functions read it)
  _config.cache_clear()
  _every_config.cache_clear()
  try:
    problems = problems_of(doc)
  finally:
    _config.cache_clear()
    _every_config.cache_clear()
  text = "\n".join(problems)
  assert "docs/bad.md:3: --config=no_such_config" in text
  assert "docs/bad.md:5: config.model.no_such_field is not a field of --config=imdb_softmax" in text
  assert "docs/bad.md:6: python -m textattn.no_such_command: no such module" in text
  assert "docs/bad.md:8: config.no_such_top_field is not a field of any task's" in text
  assert "docs/bad.md:8: link to missing.md" in text
  assert "docs/bad.md:8: tests/no_such_file.py does not exist" in text
  assert "docs/bad.md:9: configs/no_such.py is not a shipped config" in text
  assert "FIELD" not in text and "model.attention " not in text
  assert len(problems) == 7, text


def test_readme_and_results_stay_short():
  readme = (REPO / "README.md").stat().st_size
  lines = RESULTS.read_text(encoding="utf-8").splitlines()
  results_bytes = RESULTS.stat().st_size
  wide = [f"{number} ({len(line)} characters)" for number, line in enumerate(lines, 1)
          if len(line) > RESULTS_MAX_LINE_CHARS]
  assert readme <= README_MAX_BYTES, f"README.md is {readme} bytes; at most {README_MAX_BYTES}"
  assert len(lines) <= RESULTS_MAX_LINES, (f"experiments/RESULTS.md has {len(lines)} lines; at "
                                           f"most {RESULTS_MAX_LINES}")
  assert results_bytes <= RESULTS_MAX_BYTES, (f"experiments/RESULTS.md is {results_bytes} bytes; "
                                              f"at most {RESULTS_MAX_BYTES}")
  assert not wide, (f"experiments/RESULTS.md lines wider than {RESULTS_MAX_LINE_CHARS} "
                    f"characters (split the table or move the note under it): {', '.join(wide)}")


def test_results_citations_name_sections_that_exist():
  problems = citation_problems()
  assert not problems, "\n" + "\n".join(problems)


def test_citation_check_finds_a_missing_section(tmp_path, monkeypatch):
  """The citation check can fail: citations of absent sections are reported, present ones and
  citations of an old version (`git show C:experiments/RESULTS.md` §N) are not."""
  (tmp_path / "experiments").mkdir()
  (tmp_path / "experiments" / "RESULTS.md").write_text(
      "# Results\n## 1. One\n**1.1 A part** of it.\n## 3. Three\n")
  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "a.md").write_text(
      "Fine: RESULTS §1, §1.1 and §3; `git show 5351143:experiments/RESULTS.md` §9.\n"
      "Wrong: RESULTS §2 and §3.2.\n")
  (tmp_path / "README.md").write_text("See [RESULTS](experiments/RESULTS.md) (sections 1, 3).\n")
  (tmp_path / "textattn" / "configs").mkdir(parents=True)
  (tmp_path / "textattn" / "configs" / "c.py").write_text(
      '"""Result: experiments/RESULTS.md, sections\n1 and 4."""\n# RESULTS section 5\n')
  monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
  problems = citation_problems()
  text = "\n".join(problems)
  assert "docs/a.md:2: cites RESULTS §2," in text
  assert "docs/a.md:2: cites RESULTS §3.2," in text
  assert "textattn/configs/c.py:2: cites RESULTS §4," in text
  assert "textattn/configs/c.py:3: cites RESULTS §5," in text
  assert len(problems) == 4, text
