"""The shipped example build file, end to end: turbine_aot.export in worker processes,
iree.build's compile for the host CPU, the results run with iree.runtime against eager PyTorch.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "example_builder.py"
TIMEOUT_S = 300


def _load_example():
    spec = importlib.util.spec_from_file_location("turbine_example_builder", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(out: Path, *targets: str) -> subprocess.CompletedProcess:
    # One worker: each one costs seconds of CPU to import torch and warm torch.export up, and
    # running several at once is covered by test_build_actions.py.
    cmd = [sys.executable, str(EXAMPLE), "--output-dir", str(out), "--turbine-generate-jobs", "1"]
    cmd += targets
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"example build hung for {TIMEOUT_S} s\nstderr so far:\n{e.stderr}")


def _run_vmfb(path: Path, x: torch.Tensor) -> torch.Tensor:
    import iree.runtime as rt

    module = rt.load_vm_flatbuffer_file(str(path), driver="local-task")
    result = module.main(np.ascontiguousarray(x.numpy()))
    return torch.from_numpy(np.array(result.to_host()))


def test_example_builder_end_to_end(tmp_path: Path) -> None:
    example = _load_example()
    out = tmp_path / "out"
    result = _build(out)
    assert result.returncode == 0, result.stderr
    gen = out / "genfiles" / "two_branch"
    bins = out / "bin" / "two_branch"

    signatures = {}
    for stem in example.VARIANTS:
        mlir = gen / f"{stem}.mlir"
        vmfb = bins / f"{stem}_cpu-host.vmfb"
        assert mlir.is_file() and vmfb.is_file()
        assert str(vmfb) in result.stdout
        (signature,) = re.findall(r"func\.func @main\(([^)]*)\)", mlir.read_text())
        signatures[stem] = signature
    assert "!torch.vtensor<[?,16],f32>" in signatures["two_branch_dyn"]
    assert "!torch.vtensor<[1,16],f32>" in signatures["two_branch_b1"]
    assert "!torch.vtensor<[8,16],f32>" in signatures["two_branch_b8"]
    # Exported in worker processes, not in the build process.
    assert "(out of process)" in result.stderr

    # Each compiled variant computes what eager PyTorch does; the dynamic one at two batches.
    model = example.make_model(0)
    torch.manual_seed(1)
    for stem, batch_size in example.VARIANTS.items():
        for batch in [batch_size] if batch_size else [3, 5]:
            x = torch.randn(batch, example.FEATURES)
            with torch.no_grad():
                expected = model(x)
            actual = _run_vmfb(bins / f"{stem}_cpu-host.vmfb", x)
            torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)

    # A second build (of the .mlir targets only, to skip recompiling) reuses the exports: the
    # files are not rewritten and no worker is started.
    mtimes = {p.name: p.stat().st_mtime_ns for p in gen.glob("*.mlir")}
    again = _build(out, *(f"two_branch/{stem}.mlir" for stem in example.VARIANTS))
    assert again.returncode == 0, again.stderr
    assert {p.name: p.stat().st_mtime_ns for p in gen.glob("*.mlir")} == mtimes
    for stem in example.VARIANTS:
        assert str(gen / f"{stem}.mlir") in again.stdout
