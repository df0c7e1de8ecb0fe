"""The Python examples of docs/turbine-params.md run with numpy alone (params-standalone).

Where torch is installed, tests/test_docs.py runs every block of the page (and of all the docs);
this test adds what that cannot show: the blocks that do not import torch need nothing else.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "turbine-params.md"
sys.path.insert(0, str(ROOT / "tests"))

import docs_blocks  # noqa: E402  (the repository's extractor: one reading of the markers)

BLOCKS = docs_blocks.python_blocks(DOC) if DOC.exists() else []
USES_TORCH = re.compile(r"^\s*(import|from)\s+torch\b", re.M)


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is not None,
    reason="torch is installed: tests/test_docs.py runs these blocks",
)
@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.where)
def test_doc_example_runs_without_torch(block, tmp_path, monkeypatch):
    code = "".join(b.code for b in docs_blocks.chain(BLOCKS, block))
    if block.skip_reason or USES_TORCH.search(code):
        pytest.skip(block.skip_reason or "the block uses torch")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(DOC), "exec"), {"__name__": "__main__"})


def test_doc_exists():
    if not DOC.exists():
        pytest.skip("docs/ is not part of this checkout")
    assert len(BLOCKS) >= 4
