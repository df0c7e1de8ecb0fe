"""Each IREE backend the suite targets can compile and run a module (hand-written MLIR)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

MATMUL_ADD = """
func.func @main(%x: tensor<4x8xf32>, %w: tensor<8x3xf32>, %b: tensor<4x3xf32>) -> tensor<4x3xf32> {
  %init = tensor.empty() : tensor<4x3xf32>
  %zero = arith.constant 0.0 : f32
  %fill = linalg.fill ins(%zero : f32) outs(%init : tensor<4x3xf32>) -> tensor<4x3xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<4x8xf32>, tensor<8x3xf32>)
                      outs(%fill : tensor<4x3xf32>) -> tensor<4x3xf32>
  %r = arith.addf %mm, %b : tensor<4x3xf32>
  return %r : tensor<4x3xf32>
}
"""


def test_compile_and_run_matmul(iree_device):
    module = iree_device.load(iree_device.compile(MATMUL_ADD))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8), dtype=np.float32)
    w = rng.standard_normal((8, 3), dtype=np.float32)
    b = rng.standard_normal((4, 3), dtype=np.float32)
    got = np.asarray(module.main(x, w, b).to_host())
    np.testing.assert_allclose(got, x @ w + b, rtol=1e-5, atol=1e-5)


_AFTER_A_LOSS = """
import numpy as np
import pytest

LOST = []


def test_loses_the_device(iree_device):
    LOST.append(iree_device.device)
    raise RuntimeError(
        "Error invoking function: c/runtime/src/iree/hal/drivers/vulkan/queue.c:6000: "
        "DATA_LOSS; [vkWaitSemaphores] VK_ERROR_DEVICE_LOST; while invoking native function "
        "hal.fence.await"
    )


def test_runs_after_the_loss(iree_device):
    assert len(LOST) == 2  # lost on its run and on its rerun
    assert all(iree_device.device is not lost for lost in LOST)
    module = iree_device.load(iree_device.compile(MATMUL_ADD))
    x, w, b = np.ones((4, 8), np.float32), np.ones((8, 3), np.float32), np.ones((4, 3), np.float32)
    np.testing.assert_allclose(np.asarray(module.main(x, w, b).to_host()), x @ w + b)


def test_an_ordinary_failure_keeps_the_device(iree_device):
    kept = iree_device.device
    assert all(kept is not lost for lost in LOST)
    LOST.append(kept)
    raise RuntimeError("an ordinary failure")


def test_the_device_was_kept(iree_device):
    assert iree_device.device is LOST[-1]
"""


def test_a_lost_device_fails_only_the_test_that_lost_it(iree_device, tmp_path):
    """Issue 23: on lavapipe one test lost the device (VK_ERROR_DEVICE_LOST) and every later
    test of the worker failed on it, since all shared IREE's cached device. The fixture now
    creates a new device after a test fails with a lost-device error (simulated here, with the
    error text IREE's Vulkan driver gives), reruns that test once on it (this one loses it
    again, so it fails), and keeps the device after other failures."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    inner = tmp_path / "test_inner.py"
    inner.write_text(f"MATMUL_ADD = {MATMUL_ADD!r}\n" + _AFTER_A_LOSS)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "conftest",  # the repository's conftest.py (the fixture under test), from cwd
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-q",
            f"--device={iree_device.name}",
            str(inner),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr
    assert "2 failed, 2 passed" in summary, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "FAILED" in proc.stdout and "test_loses_the_device" in proc.stdout
    assert "the IREE device was lost" in proc.stdout  # the rerun's warning
