"""docs/architecture.md's module map lists every module of every package, one line each, in an
order where a module imports only modules listed above it.

A line is ``- `<module>` — <its concern>`` (nested for a subpackage's modules), ``<module>``
relative to its package (``_irpa_parser``, ``_compiler.targets``); a package's own
``__init__`` is its heading.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import check_layers  # noqa: E402

ARCHITECTURE = ROOT / "docs" / "architecture.md"
LINE = re.compile(r"^\s*- `([\w.]+)` — \S")


def _map_text() -> str:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    start = text.index("\n## Module map\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _listed() -> tuple[dict[str, list[str]], list[str]]:
    """package -> its modules in map order; and the bullet lines that are not one module each."""
    listed: dict[str, list[str]] = {}
    bad: list[str] = []
    package = None
    for line in _map_text().splitlines():
        heading = re.match(r"^\*\*(turbine_\w+)\*\*", line)
        if heading:
            package = heading.group(1)
            listed[package] = []
        elif line.lstrip().startswith("- "):
            m = LINE.match(line)
            if m is None or package is None:
                bad.append(line)
            else:
                listed[package].append(m.group(1))
    return listed, bad


def _modules(package: str) -> set[str]:
    """Every module of the package, relative to it (its own ``__init__`` left out)."""
    src = check_layers._sources(ROOT, package)
    names = set()
    for path in src.rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts:
            names.add(".".join(parts))
    return names


def test_every_bullet_names_one_module():
    _, bad = _listed()
    assert not bad, "module map lines must read '- `module` — concern':\n" + "\n".join(bad)


@pytest.mark.parametrize("package", check_layers.LAYERS)
def test_every_module_is_listed_and_every_listed_module_exists(package):
    listed, _ = _listed()
    assert package in listed, f"the module map has no **{package}** heading"
    names = listed[package]
    repeated = sorted({n for n in names if names.count(n) > 1})
    assert not repeated, f"{package}: listed more than once: {repeated}"
    actual = _modules(package)
    missing = sorted(actual - set(names))
    gone = sorted(set(names) - actual)
    assert not missing, f"{package}: modules missing from docs/architecture.md's map: {missing}"
    assert not gone, f"{package}: listed in docs/architecture.md but not in the tree: {gone}"


@pytest.mark.parametrize("package", check_layers.LAYERS)
def test_modules_import_only_modules_listed_above_them(package):
    # Inside a known cycle (KNOWN_CYCLES, turbine_aot's until its reorganization) no order exists;
    # every other import is checked.
    cycles = [frozenset(cycle) for cycle in check_layers.KNOWN_CYCLES]
    listed, _ = _listed()
    position = {f"{package}.{name}": i for i, name in enumerate(listed.get(package, []))}
    graph = check_layers.package_graph(check_layers._sources(ROOT, package), package)
    wrong: set[str] = set()
    for e in graph.edges:
        if package in (e.importer, e.imported) or e.imported.startswith(e.importer + "."):
            continue  # the package's __init__, a subpackage's __init__ importing its modules
        if any({e.importer, e.imported} <= cycle for cycle in cycles):
            continue
        above = position.get(e.imported, -1) < position.get(e.importer, len(position))
        if e.importer in position and e.imported in position and not above:
            wrong.add(f"{e.importer} imports {e.imported} (line {e.line}), listed below it")
    assert not wrong, "reorder docs/architecture.md's module map:\n" + "\n".join(sorted(wrong))
