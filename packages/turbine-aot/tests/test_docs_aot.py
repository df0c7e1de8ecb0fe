"""Every ``python`` code block of docs/turbine-aot.md and the README quick start runs as written
(they export, compile with IREE, run and compare with eager)."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "docs" / "turbine-aot.md", ROOT / "README.md"]


def _blocks() -> list[tuple[str, int, str]]:
    found = []
    for doc in DOCS:
        if not doc.exists():
            continue
        text = doc.read_text(encoding="utf-8")
        for m in re.finditer(r"```python\n(.*?)```", text, flags=re.S):
            line = text[: m.start()].count("\n") + 1
            found.append((doc.name, line, m.group(1)))
    return found


@pytest.mark.parametrize(
    ("doc", "line", "code"), _blocks(), ids=[f"{d}:{n}" for d, n, _ in _blocks()]
)
def test_doc_example_runs(doc, line, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # A real module: torch.export (strict) looks up the module of the classes it traces.
    name = f"turbine_doc_example_{doc.replace('.', '_').replace('-', '_')}_{line}"
    module = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, module)
    exec(compile(code, f"{doc}:{line}", "exec"), module.__dict__)
