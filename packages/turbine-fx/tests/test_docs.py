"""The Python examples in docs/turbine-fx.md run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[3] / "docs" / "turbine-fx.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_runs(index):
    code = BLOCKS[index]
    if "# turbine_ir.ModuleBuilder: the module to import into" in code:
        pytest.skip("signature listing, not a runnable example")
    exec(compile(code, f"{DOC.name}[block {index}]", "exec"), {"__name__": "__doc_example__"})
