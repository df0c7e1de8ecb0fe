"""The Python examples of docs/turbine-params.md run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[3] / "docs" / "turbine-params.md"


def _blocks() -> list[str]:
    if not DOC.exists():
        return []
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


@pytest.mark.parametrize("index", range(len(_blocks())))
def test_doc_example_runs(index):
    code = _blocks()[index]
    if "import torch" in code:
        pytest.importorskip("torch")
    exec(compile(code, f"{DOC.name}[{index}]", "exec"), {"__name__": "__doc_example__"})


def test_doc_exists():
    if not DOC.exists():
        pytest.skip("docs/ is not part of this checkout")
    assert len(_blocks()) >= 4
