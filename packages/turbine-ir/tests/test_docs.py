"""The Python examples in docs/turbine-ir.md run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[3] / "docs" / "turbine-ir.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL) if DOC.exists() else []


@pytest.mark.skipif(not DOC.exists(), reason="docs/turbine-ir.md is not in this checkout")
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_runs(index, capsys):
    exec(compile(BLOCKS[index], f"{DOC.name}[block {index}]", "exec"), {})


@pytest.mark.parametrize("module", ["turbine_ir._global_attrs", "turbine_ir._module_builder"])
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
