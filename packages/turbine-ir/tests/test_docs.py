"""The docstring examples of turbine_ir run (docs/turbine-ir.md's blocks run in tests/test_docs.py)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "module", ["turbine_ir._global_attrs", "turbine_ir._module_builder", "turbine_ir._vtensor"]
)
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
