"""The Dask fan-out demo (examples/dask_fanout.py): the generators of the example build file run
as RemoteGenerator thunks on a local Dask cluster.

Opt-in (it starts a cluster whose workers each import torch, ~30-60 s on two cores): set
TURBINE_TEST_DASK=1 and install dask's distributed scheduler (``pip install distributed``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[1] / "examples" / "dask_fanout.py"
TIMEOUT_S = 300


@pytest.mark.slow
def test_dask_fanout_demo_exports_every_variant(tmp_path: Path) -> None:
    if os.environ.get("TURBINE_TEST_DASK") != "1":
        pytest.skip("opt-in: set TURBINE_TEST_DASK=1 to run the Dask demo (starts a cluster)")
    pytest.importorskip("distributed", reason="dask's distributed scheduler is not installed")
    out = tmp_path / "out"
    cmd = [sys.executable, str(DEMO), "--output-dir", str(out), "--workers", "2"]
    try:
        result = subprocess.run(
            cmd, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"Dask demo hung for {TIMEOUT_S} s\nstderr so far:\n{e.stderr}")
    assert result.returncode == 0, result.stderr
    assert "3 variants exported on the cluster" in result.stdout
    signatures = {
        p.stem: re.search(r"func\.func @main\(([^)]*)\)", p.read_text()).group(1)
        for p in out.glob("*.mlir")
    }
    assert sorted(signatures) == ["two_branch_b1", "two_branch_b8", "two_branch_dyn"]
    assert "[?,16]" in signatures["two_branch_dyn"]
    assert "[8,16]" in signatures["two_branch_b8"]
