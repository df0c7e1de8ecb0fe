"""Dask: the fan-out demo (examples/dask_fanout.py) and the ``--turbine-generate-dask`` backend.

Opt-in (each starts a cluster whose workers import torch, ~30-60 s on two cores): set
TURBINE_TEST_DASK=1 and install dask's distributed scheduler (``pip install distributed``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[1] / "examples" / "dask_fanout.py"
TIMEOUT_S = 300


def _require_dask() -> None:
    if os.environ.get("TURBINE_TEST_DASK") != "1":
        pytest.skip("opt-in: set TURBINE_TEST_DASK=1 to run the Dask tests (they start clusters)")
    pytest.importorskip("distributed", reason="dask's distributed scheduler is not installed")


@pytest.mark.slow
def test_dask_fanout_demo_exports_every_variant(tmp_path: Path) -> None:
    _require_dask()
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


BUILD_FILE = textwrap.dedent(
    """
    from __future__ import annotations

    import os
    from pathlib import Path

    from iree.build import entrypoint, iree_build_main
    from turbine_aot.build_actions import turbine_generate


    class FakeExportOutput:
        def __init__(self, text: str):
            self.text = text

        def save_mlir(self, path) -> None:
            Path(path).write_text(self.text)


    def variant(n: int, *, mode: str = "ok") -> FakeExportOutput:
        if mode == "raise":
            raise ValueError(f"variant {n} cannot be exported")
        return FakeExportOutput(f"// variant {n} from pid {os.getpid()}\\nmodule {{}}\\n")


    @entrypoint
    def variants():
        outs = [turbine_generate(variant, i, name=f"v{i}") for i in range(3)]
        outs.append(turbine_generate(variant, 9, name="bad", mode="raise"))
        return outs


    if __name__ == "__main__":
        iree_build_main()
    """
)


@pytest.mark.slow
def test_generate_on_a_local_dask_cluster(tmp_path: Path) -> None:
    _require_dask()
    build_file = tmp_path / "builder.py"
    build_file.write_text(BUILD_FILE)
    cmd = [
        sys.executable,
        str(build_file),
        "--output-dir",
        str(tmp_path / "out"),
        "--turbine-generate-dask",
        "local",
        "--turbine-generate-jobs",
        "2",
    ]
    try:
        result = subprocess.run(
            cmd, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"Dask build hung for {TIMEOUT_S} s\nstderr so far:\n{e.stderr}")
    # The raising generator fails its action with its traceback; the others are built.
    assert result.returncode != 0
    assert "ValueError: variant 9 cannot be exported" in result.stderr
    gen = tmp_path / "out" / "genfiles" / "variants"
    assert sorted(p.name for p in gen.glob("*.mlir")) == ["v0.mlir", "v1.mlir", "v2.mlir"]
    assert (gen / "v1.mlir").read_text().startswith("// variant 1 from pid")
