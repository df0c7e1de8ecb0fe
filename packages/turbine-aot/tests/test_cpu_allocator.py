"""CPU devices with IREE's caching allocator: a call's freed buffers kept for the next call on
``local-sync`` (docs/running.md, "Memory between calls"; ``_runtime.cpu_devices``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import iree.runtime as rt
import numpy as np
import pytest
import torch

from turbine_aot import runtime as R
from turbine_aot._runtime import cpu_devices

CPU_FLAGS = R.device_compile_flags(["local-task"])

MLIR = """
module @twice {
util.global private mutable @state = dense<0.0> : tensor<64x64xf32>
func.func @main(%x: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %init = tensor.empty() : tensor<64x64xf32>
  %zero = arith.constant 0.0 : f32
  %fill = linalg.fill ins(%zero : f32) outs(%init : tensor<64x64xf32>) -> tensor<64x64xf32>
  %mm = linalg.matmul ins(%x, %x : tensor<64x64xf32>, tensor<64x64xf32>)
                      outs(%fill : tensor<64x64xf32>) -> tensor<64x64xf32>
  %r = arith.addf %mm, %x : tensor<64x64xf32>
  util.global.store %r, @state : tensor<64x64xf32>
  return %r : tensor<64x64xf32>
}
func.func @last() -> tensor<64x64xf32> {
  %l = util.global.load @state : tensor<64x64xf32>
  return %l : tensor<64x64xf32>
}
}
"""


@pytest.fixture(scope="module")
def vmfb(tmp_path_factory):
    return R.compile_mlir(MLIR, CPU_FLAGS, cache=R.CompileCache(tmp_path_factory.mktemp("cc")))


def _want(x: torch.Tensor) -> torch.Tensor:
    return x @ x + x


@pytest.mark.parametrize(
    ("value", "driver", "want"),
    [
        (None, "local-sync", "caching:*=536870912;1073741824;64"),
        (None, "local-task", None),
        ("auto", "local-task", None),
        ("caching", "local-task", "caching:*=536870912;1073741824;64"),
        ("iree", "local-sync", None),
        ("caching:*=1mib;4mib;8", "local-task", "caching:*=1mib;4mib;8"),
    ],
)
def test_the_choice_per_driver(monkeypatch, value, driver, want):
    monkeypatch.delenv(cpu_devices.ENV_VAR, raising=False)
    if value is not None:
        monkeypatch.setenv(cpu_devices.ENV_VAR, value)
    assert cpu_devices.allocator_spec(driver) == want


def test_an_unknown_choice_is_refused_naming_the_variable(monkeypatch, vmfb):
    monkeypatch.setenv(cpu_devices.ENV_VAR, "pooled")
    with pytest.raises(R.TurbineRuntimeError, match=r"TURBINE_CPU_ALLOCATOR='pooled'.*'auto'"):
        R.load_module(vmfb, device="local-sync")
    monkeypatch.setenv(cpu_devices.ENV_VAR, "caching:nosuchheap=1")
    with pytest.raises(R.TurbineRuntimeError, match=r"refused the allocator spec.*nosuchheap"):
        R.load_module(vmfb, device="local-sync")


@pytest.mark.parametrize("choice", ["auto", "caching"])
@pytest.mark.parametrize("device", ["local-sync", "local-task"])
def test_results_stay_right_while_buffers_are_reused(monkeypatch, vmfb, device, choice):
    """Each call's result is right; a result kept from an earlier call keeps its values while
    later calls reuse the freed buffers; module state survives; two loads share the device."""
    monkeypatch.setenv(cpu_devices.ENV_VAR, choice)
    m = R.load_module(vmfb, device=device)
    again = R.load_module(vmfb, device=device)
    assert m.devices[0] is again.devices[0]
    cached = choice == "caching" or device == "local-sync"
    assert (m.devices[0] is rt.get_device(device)) is not cached
    xs = [torch.randn(64, 64) for _ in range(6)]
    kept = m.main(xs[0])
    want0 = _want(xs[0])
    for x in xs[1:]:
        torch.testing.assert_close(m.main(x), _want(x), rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(m.last(), _want(x), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(kept, want0, rtol=1e-5, atol=1e-4)
    step = R.PreparedCall([m.main], [xs[0]])
    for x in xs[:3]:
        step.inputs[0][...] = x.numpy()
        np.testing.assert_allclose(step(0)[0], _want(x).numpy(), rtol=1e-5, atol=1e-4)
    R.release_cached_memory()  # the free buffers go back; calls allocate afresh
    torch.testing.assert_close(m.main(xs[1]), _want(xs[1]), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(kept, want0, rtol=1e-5, atol=1e-4)


def test_iree_choice_uses_irees_device(monkeypatch, vmfb):
    monkeypatch.setenv(cpu_devices.ENV_VAR, "iree")
    m = R.load_module(vmfb, device="local-sync")
    assert m.devices[0] is rt.get_device("local-sync")
    x = torch.randn(64, 64)
    torch.testing.assert_close(m.main(x), _want(x), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("device", ["local-sync", "local-task"])
def test_results_alive_at_exit_do_not_outlive_their_device(vmfb, tmp_path, device):
    """A cached buffer points at its pool without a reference (IREE 3.13): results and prepared
    views kept at exit by a module imported before turbine, the loaded module dropped, must be
    freed before the device. With the devices in turbine's own module globals this script died
    with SIGSEGV at exit (in some runs: the order Python clears modules in decides), so it runs
    three times."""
    path = tmp_path / "m.vmfb"
    path.write_bytes(vmfb)
    script = tmp_path / "keep_results.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            import torch
            from turbine_aot import runtime as R
            m = R.load_module({str(path)!r}, device={device!r})
            x = torch.randn(64, 64)
            step = R.PreparedCall([m.main], [x])
            import json  # imported before turbine (by torch): cleared after turbine's globals
            json._kept = [m.main(x) for _ in range(3)] + [step(0)[0], step.inputs[0], m.last()]
            views = step.inputs
            del m, step
            print("done")
            """
        )
    )
    env = {**os.environ, cpu_devices.ENV_VAR: "caching"}
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == "done"
        assert "leaked" not in done.stderr, done.stderr[-2000:]
