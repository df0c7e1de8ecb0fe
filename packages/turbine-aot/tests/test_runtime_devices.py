"""The runner on each backend (``--device``) and with two devices in one program."""

from __future__ import annotations

import pytest
import torch

from turbine_aot import runtime as R

PARAM_MLIR = """
module @affine {
util.global private @w = #flow.parameter.named<"model"::"w"> : tensor<8x3xf32>
util.global private mutable @ncalls = dense<0.0> : tensor<f32>
func.func @main(%x: tensor<4x8xf32>, %b: tensor<3xf32>) -> tensor<4x3xf32> {
  %w = util.global.load @w : tensor<8x3xf32>
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<4x3xf32>
  %fill = linalg.fill ins(%zero : f32) outs(%init : tensor<4x3xf32>) -> tensor<4x3xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<4x8xf32>, tensor<8x3xf32>)
                      outs(%fill : tensor<4x3xf32>) -> tensor<4x3xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (j)>,
                                        affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%mm, %b : tensor<4x3xf32>, tensor<3xf32>) outs(%init : tensor<4x3xf32>) {
    ^bb0(%a: f32, %c: f32, %o: f32):
      %s = arith.addf %a, %c : f32
      linalg.yield %s : f32
  } -> tensor<4x3xf32>
  %n = util.global.load @ncalls : tensor<f32>
  %one = arith.constant dense<1.0> : tensor<f32>
  %n1 = arith.addf %n, %one : tensor<f32>
  util.global.store %n1, @ncalls : tensor<f32>
  return %r : tensor<4x3xf32>
}
func.func @calls() -> tensor<f32> {
  %n = util.global.load @ncalls : tensor<f32>
  return %n : tensor<f32>
}
}
"""


def test_runner_on_backend(iree_device, tmp_path):
    """Parameters from an .irpa, state, torch in/out on the device picked by --device."""
    import iree.runtime as rt

    vmfb = R.compile_mlir(PARAM_MLIR, iree_device.compile_args, cache=False)
    w = torch.randn(8, 3)
    rt.save_archive_file({"w": w.numpy()}, str(tmp_path / "w.irpa"))
    m = R.load_module(vmfb, device=iree_device.driver, parameters=tmp_path / "w.irpa")
    x, b = torch.randn(4, 8), torch.randn(3)
    for _ in range(2):
        torch.testing.assert_close(m.main(x, b), x @ w + b, atol=1e-4, rtol=1e-4)
    assert m.calls().item() == 2.0


TWO_DEVICE_MLIR = """
module @two_devices {
func.func @main(%x: tensor<4xf32> {iree.abi.affinity = #hal.device.promise<@__device_0>},
                %y: tensor<4xf32> {iree.abi.affinity = #hal.device.promise<@__device_1>})
    -> tensor<4xf32> {
  %a = arith.mulf %x, %x : tensor<4xf32>
  %b = arith.addf %y, %y : tensor<4xf32>
  %bt = flow.tensor.transfer %b : tensor<4xf32> to #hal.device.promise<@__device_0>
  %r = arith.addf %a, %bt : tensor<4xf32>
  return %r : tensor<4xf32>
}
}
"""


def _assert_work_on_both_devices(mlir: str, flags: list[str], input_type: str = "auto") -> None:
    """Compiles to the stream phase: both devices exist and each gets work placed on it."""
    import iree.compiler as ic

    stream = ic.compile_str(
        mlir, input_type=input_type, extra_args=[*flags, "--compile-to=stream"]
    ).decode()
    for device in ("@__device_0", "@__device_1"):
        assert f"util.global private {device} " in stream, f"{device} was not created"
        assert f"on(#hal.device.affinity<{device}>)" in stream, f"no work placed on {device}"


def test_two_cpu_devices():
    flags = R.device_compile_flags(["local-task", "local-task"])
    # Identical targets need ordinals, or IREE merges them into one device.
    assert "--iree-hal-target-device=local[0]" in flags
    assert "--iree-hal-target-device=local[1]" in flags
    _assert_work_on_both_devices(TWO_DEVICE_MLIR, flags)
    vmfb = R.compile_mlir(TWO_DEVICE_MLIR, flags, cache=False)
    m = R.load_module(vmfb, device=["local-task", "local-task"])
    assert len(m.devices) == 2 and m.devices[0] is not m.devices[1]
    assert [s.device for s in m.main.signature.inputs] == ["__device_0", "__device_1"]
    x, y = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(m.main(x, y), x * x + 2 * y)
    # Loading a two-device program on one device is refused with the fix in the message.
    with pytest.raises(R.TurbineRuntimeError, match=r"device"):
        R.load_module(vmfb, device="local-task").main(x, y)


def test_exported_two_device_program_matches_eager():
    import turbine_aot

    export = getattr(turbine_aot, "export", None)
    if export is None:
        pytest.skip("turbine_aot.export is not available in this checkout yet")
    from turbine_params import DeviceAffinity, DeviceTensorTrait

    class TwoDevices(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(8, 8)
            self.b = torch.nn.Linear(8, 8)

        def forward(self, x, y):
            return torch.relu(self.a(x)) + self.b(y)

    model = TwoDevices()
    # Weights of the second branch live on the second device, next to its argument.
    DeviceTensorTrait(1).set(model.b.weight)
    DeviceTensorTrait(1).set(model.b.bias)
    x, y = torch.randn(2, 8), torch.randn(2, 8)
    eo = export(model, args=(x, y), arg_device={0: DeviceAffinity(0), 1: DeviceAffinity(1)})
    text = str(eo.mlir_module)
    assert "stream.affinity = #hal.device.promise<@__device_1>" in text
    flags = R.device_compile_flags(["local-task", "local-task"])
    _assert_work_on_both_devices(text, flags, input_type="torch")
    m = R.load_module(eo, device=["local-task", "local-task"], cache=False)
    assert [s.device for s in m.main.signature.inputs] == ["__device_0", "__device_1"]
    report = R.check_numerics(m.main, model, x, y)
    assert report.ok, str(report)


BF16_MLIR = """
func.func @double_bf16(%x: tensor<?x4xbf16>) -> tensor<?x4xbf16> {
  %r = arith.addf %x, %x : tensor<?x4xbf16>
  return %r : tensor<?x4xbf16>
}
"""

DTYPES_MLIR = """
module @dtypes {
func.func @pass_fp8(%x: tensor<3xf8E4M3FN>) -> tensor<3xf8E4M3FN> {
  return %x : tensor<3xf8E4M3FN>
}
func.func @square_i32(%x: tensor<5xi32>) -> tensor<5xi32> {
  %r = arith.muli %x, %x : tensor<5xi32>
  return %r : tensor<5xi32>
}
}
"""


def test_bf16_on_backend(iree_device):
    """bf16 arithmetic with a dynamic dimension through the runner on --device."""
    if iree_device.name == "vmvx":
        pytest.skip("vmvx has no bf16 arithmetic in IREE 3.13 ('vm.add.f32' on i32 operands)")
    m = R.load_module(
        R.compile_mlir(BF16_MLIR, iree_device.compile_args, cache=False),
        device=iree_device.driver,
    )
    for rows in (1, 3):
        x = torch.randn(rows, 4).to(torch.bfloat16)
        torch.testing.assert_close(m.double_bf16(x), x + x)


def test_dtypes_on_backend(iree_device):
    """fp8 and integer tensors through the runner on --device."""
    vmfb = R.compile_mlir(DTYPES_MLIR, iree_device.compile_args, cache=False)
    m = R.load_module(vmfb, device=iree_device.driver)
    a = torch.tensor([0.5, -1.0, 3.0]).to(torch.float8_e4m3fn)
    assert torch.equal(m.pass_fp8(a).view(torch.uint8), a.view(torch.uint8))
    i = torch.tensor([1, -2, 3, 4, -5], dtype=torch.int32)
    assert torch.equal(m.square_i32(i), i * i)


def test_bundle_on_backend(iree_device, tmp_path):
    """A bundle built for --device loads there with one call."""
    import iree.runtime as rt

    vmfb = R.compile_mlir(PARAM_MLIR, iree_device.compile_args, cache=False)
    w = torch.randn(8, 3)
    rt.save_archive_file({"w": w.numpy()}, str(tmp_path / "w.irpa"))
    R.save_bundle(tmp_path / "b", vmfb, parameters=tmp_path / "w.irpa", device=iree_device.driver)
    m = R.load_bundle(tmp_path / "b")
    x, b = torch.randn(4, 8), torch.randn(3)
    torch.testing.assert_close(m.main(x, b), x @ w + b, atol=1e-4, rtol=1e-4)


_SQUARE = """
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %r = arith.mulf %x, %x : tensor<4xf32>
  return %r : tensor<4xf32>
}
"""


class _LostContext:
    """A VM context whose device is gone: every call fails as IREE's Vulkan driver says."""

    def invoke(self, *args):
        raise RuntimeError(
            "Error invoking function: c/runtime/src/iree/hal/drivers/vulkan/queue.c:6000: "
            "DATA_LOSS; [vkWaitSemaphores] VK_ERROR_DEVICE_LOST; while invoking native "
            "function hal.fence.await"
        )


def test_a_lost_device_is_replaced_at_the_next_load(monkeypatch):
    """Issue 23: IREE's device cache kept handing out a lost device, so every later load on
    that URI failed. After a call reports the device lost, the next load_module creates a new
    device (and later loads share it); an ordinary failure keeps the device."""
    from turbine_aot._runtime import devices

    monkeypatch.setattr(devices, "_replacement_devices", {})
    vmfb = R.compile_mlir(_SQUARE, R.device_compile_flags(["local-task"]), cache=False)
    x = torch.arange(4.0)
    m = R.load_module(vmfb)
    lost = m.devices[0]
    m._context = _LostContext()
    with pytest.raises(
        R.TurbineRuntimeError,
        match=r"VK_ERROR_DEVICE_LOST.*\n.*was lost: this module cannot run any more; load it "
        r"again \(load_module creates a new device\)",
    ):
        m.main(x)
    again = R.load_module(vmfb)
    assert again.devices[0] is not lost
    torch.testing.assert_close(again.main(x), x * x)
    assert R.load_module(vmfb).devices[0] is again.devices[0]

    class _Failing:
        def invoke(self, *args):
            raise RuntimeError("INVALID_ARGUMENT; an ordinary failure")

    again._context = _Failing()
    with pytest.raises(R.TurbineRuntimeError, match=r"an ordinary failure$"):
        again.main(x)
    assert R.load_module(vmfb).devices[0] is again.devices[0]


def test_a_failed_fence_counts_as_a_lost_device(monkeypatch):
    """On Mesa lavapipe IREE 3.13's semaphore race also fails a new device's first call with
    ``DATA_LOSS`` from ``hal.fence.await`` and no Vulkan error in the message (seen in CI): the
    device is forgotten as after ``VK_ERROR_DEVICE_LOST``; other DATA_LOSS errors are not."""
    from turbine_aot._runtime import devices

    monkeypatch.setattr(devices, "_replacement_devices", {})
    fence = (
        "Error invoking function: DATA_LOSS; while invoking native function hal.fence.await; "
        "while calling variadic import"
    )
    assert devices.device_lost(fence)
    assert not devices.device_lost("DATA_LOSS; the archive's bytes are damaged")
    vmfb = R.compile_mlir(_SQUARE, R.device_compile_flags(["local-task"]), cache=False)
    m = R.load_module(vmfb)
    lost = m.devices[0]

    class _FailedFence:
        def invoke(self, *args):
            raise RuntimeError(fence)

    m._context = _FailedFence()
    with pytest.raises(R.TurbineRuntimeError, match=r"hal.fence.await.*\n.*was lost"):
        m.main(torch.arange(4.0))
    assert R.load_module(vmfb).devices[0] is not lost


class _TwoSmallResults(torch.nn.Module):
    """The uint8 program of turbine-fx's test_small_constants_per_dtype_run (issue 23): the one
    that loses Mesa lavapipe's device most often (IREE 3.13's semaphore race)."""

    def forward(self, x):
        c8 = torch.tensor([1, 2, 3, 4, 200, 6, 7, 8], dtype=torch.uint8)
        c3 = torch.tensor([1, 2, 250], dtype=torch.uint8)
        return (x.abs() * 10).to(torch.uint8) + c8, c3 * x.new_ones((), dtype=torch.uint8)[None]


def test_a_real_device_loss_fails_one_call_and_the_next_load_runs(iree_device):
    if iree_device.name != "vulkan-spirv":
        pytest.skip("only Mesa lavapipe loses devices here (IREE 3.13's Vulkan semaphore race)")
    import turbine_aot as aot

    x = torch.randn(4, 8)
    out = aot.export(_TwoSmallResults(), args=(x,))
    m = R.load_module(out, device=iree_device.driver)
    for _ in range(2000):
        try:
            m.main(x)
        except R.TurbineRuntimeError as e:
            assert "was lost" in str(e) and "load it again" in str(e)
            break
    else:
        pytest.skip("the race did not lose the device in 2000 calls this time")
    lost = m.devices[0]
    for _ in range(3):  # a new device can meet the race again: each reload gets a new one
        again = R.load_module(out, device=iree_device.driver)
        assert again.devices[0] is not lost
        try:
            got = again.main(x)
        except R.TurbineRuntimeError as e:
            assert "was lost" in str(e)
            lost = again.devices[0]
            continue
        assert torch.equal(got[1].view(torch.uint8), torch.tensor([1, 2, 250], dtype=torch.uint8))
        return
    pytest.fail("three new devices in a row were lost at their first call")
