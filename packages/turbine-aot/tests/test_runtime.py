"""The runner: load compiled modules with parameters on devices, call them with torch tensors."""

from __future__ import annotations

import pytest
import torch

from turbine_aot import runtime as R

CPU_FLAGS = R.device_compile_flags(["local-task"])

STATEFUL_MLIR = """
module @stateful {
util.global private mutable @counter = dense<0.0> : tensor<4xf32>
util.global private @w = #flow.parameter.named<"model"::"w"> : tensor<4xf32>
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %c = util.global.load @counter : tensor<4xf32>
  %w = util.global.load @w : tensor<4xf32>
  %s = arith.addf %c, %x : tensor<4xf32>
  %r = arith.mulf %s, %w : tensor<4xf32>
  util.global.store %s, @counter : tensor<4xf32>
  return %r : tensor<4xf32>
}
func.func @get_counter() -> tensor<4xf32> {
  %c = util.global.load @counter : tensor<4xf32>
  return %c : tensor<4xf32>
}
}
"""

DTYPES_MLIR = """
module @dtypes {
func.func @double_bf16(%x: tensor<?x4xbf16>) -> tensor<?x4xbf16> {
  %r = arith.addf %x, %x : tensor<?x4xbf16>
  return %r : tensor<?x4xbf16>
}
func.func @pass_fp8(%x: tensor<3xf8E4M3FN>, %y: tensor<2xf8E5M2>) -> (tensor<3xf8E4M3FN>, tensor<2xf8E5M2>) {
  return %x, %y : tensor<3xf8E4M3FN>, tensor<2xf8E5M2>
}
func.func @ints(%x: tensor<5xi64>, %b: tensor<5xi8>) -> (tensor<5xi64>, tensor<5xi8>) {
  %r = arith.muli %x, %x : tensor<5xi64>
  return %r, %b : tensor<5xi64>, tensor<5xi8>
}
func.func @f16(%x: tensor<2x2xf16>) -> tensor<2x2xf16> {
  %r = arith.mulf %x, %x : tensor<2x2xf16>
  return %r : tensor<2x2xf16>
}
}
"""

MATMUL_MLIR = """
func.func @main(%x: tensor<4x8xf32>, %w: tensor<8x3xf32>) -> tensor<4x3xf32> {
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<4x3xf32>
  %fill = linalg.fill ins(%zero : f32) outs(%init : tensor<4x3xf32>) -> tensor<4x3xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<4x8xf32>, tensor<8x3xf32>)
                      outs(%fill : tensor<4x3xf32>) -> tensor<4x3xf32>
  return %mm : tensor<4x3xf32>
}
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return R.CompileCache(tmp_path_factory.mktemp("cc"))


@pytest.fixture(scope="module")
def stateful_vmfb(cache):
    return R.compile_mlir(STATEFUL_MLIR, CPU_FLAGS, cache=cache)


@pytest.fixture(scope="module")
def dtypes_module(cache):
    return R.load_module(R.compile_mlir(DTYPES_MLIR, CPU_FLAGS, cache=cache))


def test_state_persists_across_calls_with_in_memory_parameters(stateful_vmfb):
    w = torch.tensor([1.0, 2.0, 3.0, 4.0])
    m = R.load_module(stateful_vmfb, parameters={"model": {"w": w}})
    x = torch.tensor([1.0, -1.0, 0.5, 2.0])
    first = m.main(x)
    second = m.main(x)
    torch.testing.assert_close(first, x * w)
    torch.testing.assert_close(second, 2 * x * w)
    torch.testing.assert_close(m.get_counter(), 2 * x)
    # A fresh load starts from the initial state.
    m2 = R.load_module(stateful_vmfb, parameters={"model": {"w": w}})
    torch.testing.assert_close(m2.main(x), x * w)


def test_results_do_not_alias_mutable_state(stateful_vmfb):
    m = R.load_module(stateful_vmfb, parameters={"model": {"w": torch.ones(4)}})
    m.main(torch.ones(4))
    counter = m.get_counter()
    snapshot = counter.clone()
    m.main(torch.ones(4))
    torch.testing.assert_close(counter, snapshot)  # the earlier result is not overwritten
    torch.testing.assert_close(m.get_counter(), 2 * torch.ones(4))


@pytest.mark.parametrize("fmt", ["irpa", "safetensors", "vmfb-file"])
def test_parameters_from_files(stateful_vmfb, tmp_path, fmt):
    import iree.runtime as rt
    import numpy as np

    w = np.array([2.0, 3.0, 4.0, 5.0], dtype=np.float32)
    if fmt == "safetensors":
        from safetensors.numpy import save_file

        path = tmp_path / "w.safetensors"
        save_file({"w": w}, str(path))
    else:
        path = tmp_path / "w.irpa"
        rt.save_archive_file({"w": w}, str(path))
    module: object = stateful_vmfb
    if fmt == "vmfb-file":
        module = tmp_path / "m.vmfb"
        module.write_bytes(stateful_vmfb)
    # A bare path binds scope "model".
    m = R.load_module(module, parameters=path)
    torch.testing.assert_close(m.main(torch.ones(4)), torch.from_numpy(w))


def test_signatures_from_abi_reflection(dtypes_module, stateful_vmfb):
    sigs = dtypes_module.signatures()
    assert set(sigs) == {"double_bf16", "pass_fp8", "ints", "f16"}
    bf = sigs["double_bf16"]
    assert bf.inputs[0].shape == (None, 4) and bf.inputs[0].dtype == "bf16"
    assert bf.inputs[0].torch_dtype == torch.bfloat16
    assert str(bf.outputs[0]) == "tensor<?x4xbf16>"
    assert [s.dtype for s in sigs["pass_fp8"].outputs] == ["f8E4M3FN", "f8E5M2"]
    m = R.load_module(stateful_vmfb, parameters={"model": {"w": torch.ones(4)}})
    assert m.signatures()["get_counter"].inputs == ()


def test_bf16_dynamic_dims(dtypes_module):
    for rows in (1, 3, 7):
        x = torch.randn(rows, 4).to(torch.bfloat16)
        y = dtypes_module.double_bf16(x)
        assert y.dtype == torch.bfloat16 and y.shape == (rows, 4)
        torch.testing.assert_close(y, x + x)


def test_fp8_round_trip_bit_exact(dtypes_module):
    a = torch.tensor([0.5, -1.0, 3.0]).to(torch.float8_e4m3fn)
    b = torch.tensor([2.0, -0.25]).to(torch.float8_e5m2)
    ra, rb = dtypes_module.pass_fp8(a, b)
    assert ra.dtype == torch.float8_e4m3fn and rb.dtype == torch.float8_e5m2
    assert torch.equal(ra.view(torch.uint8), a.view(torch.uint8))
    assert torch.equal(rb.view(torch.uint8), b.view(torch.uint8))


def test_integer_and_f16(dtypes_module):
    x = torch.tensor([1, -2, 3, 2**31, -5], dtype=torch.int64)
    b = torch.tensor([1, 2, -3, 4, 5], dtype=torch.int8)
    r, rb = dtypes_module.ints(x, b)
    assert r.dtype == torch.int64 and rb.dtype == torch.int8
    assert torch.equal(r, x * x) and torch.equal(rb, b)
    h = torch.randn(2, 2, dtype=torch.float16)
    torch.testing.assert_close(dtypes_module.f16(h), h * h)


def test_numpy_input_and_non_contiguous(dtypes_module):
    import numpy as np

    x = torch.randn(6, 4).to(torch.bfloat16)[::2]  # non-contiguous view
    assert not x.is_contiguous()
    torch.testing.assert_close(dtypes_module.double_bf16(x), x + x)
    h = np.array([[1.0, 2.0], [3.0, -4.0]], dtype=np.float16)
    torch.testing.assert_close(dtypes_module.f16(h), torch.from_numpy(h * h))


def test_bad_calls_raise_clear_errors(dtypes_module, stateful_vmfb):
    # A module without recorded call signatures: flat arguments, checked against its ABI.
    with pytest.raises(TypeError, match=r"dtypes.double_bf16\(\) takes 1 argument"):
        dtypes_module.double_bf16(torch.ones(2, 4), torch.ones(2, 4))
    with pytest.raises(
        ValueError,
        match=r"double_bf16\(\): argument 0 expects dtype bfloat16 \(tensor<\?x4xbf16>\); got "
        r"a float32 tensor of shape \[2, 4\]",
    ):
        dtypes_module.double_bf16(torch.ones(2, 4))
    with pytest.raises(R.TurbineRuntimeError, match=r"argument 0 expects dimension 1 to be 4"):
        dtypes_module.double_bf16(torch.ones(2, 5, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"keyword argument\(s\) 'x'.*records no argument names"):
        dtypes_module.double_bf16(x=torch.ones(2, 4, dtype=torch.bfloat16))
    with pytest.raises(R.TurbineRuntimeError, match=r"no function 'nope'.*double_bf16"):
        dtypes_module.nope  # noqa: B018
    with pytest.raises(R.TurbineRuntimeError, match=r"pass the parameter archives"):
        R.load_module(stateful_vmfb)


def test_missing_function_is_an_attribute_error(dtypes_module):
    """hasattr/getattr-with-default answer on a loaded module (duck-typing probes such as
    ``hasattr(obj, "mlir_module")`` raised), and m["x"] still names the choices."""
    assert not hasattr(dtypes_module, "mlir_module")
    assert getattr(dtypes_module, "nope", None) is None
    assert hasattr(dtypes_module, "double_bf16")
    with pytest.raises(R.TurbineRuntimeError, match=r"no function 'nope'.*double_bf16"):
        dtypes_module["nope"]


def test_load_errors(tmp_path, stateful_vmfb):
    with pytest.raises(R.TurbineRuntimeError, match=r"does not exist"):
        R.load_module(tmp_path / "missing.vmfb")
    with pytest.raises(R.TurbineRuntimeError, match=r"unknown or unavailable IREE device 'tpu'"):
        R.load_module(stateful_vmfb, device="tpu")
    with pytest.raises(R.TurbineRuntimeError, match=r"not a loadable IREE module"):
        R.load_module(b"not a vmfb at all, just bytes" * 4)
    with pytest.raises(R.TurbineRuntimeError, match=r"parameter archive .* does not exist"):
        R.load_module(stateful_vmfb, parameters={"model": tmp_path / "nope.irpa"})


def test_local_sync_driver(stateful_vmfb):
    m = R.load_module(
        stateful_vmfb, device="local-sync", parameters={"model": {"w": torch.ones(4)}}
    )
    torch.testing.assert_close(m.main(torch.full((4,), 3.0)), torch.full((4,), 3.0))


def test_check_numerics_against_eager(cache):
    m = R.load_module(R.compile_mlir(MATMUL_MLIR, CPU_FLAGS, cache=cache))
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    report = R.check_numerics(m.main, torch.matmul, x, w, repeat=3)
    assert report.ok, str(report)
    assert report.outputs[0].max_abs_error < 1e-4 and report.outputs[0].shape == (4, 3)
    assert "ok" in str(report) and report.compiled_seconds > 0
    # A wrong reference is reported, with the errors.
    bad = R.check_numerics(m.main, lambda a, b: torch.matmul(a, b) + 1.0, x, w)
    assert not bad.ok and bad.outputs[0].max_abs_error == pytest.approx(1.0, abs=1e-4)
    with pytest.raises(R.NumericsError, match="FAIL"):
        bad.raise_if_failed()


def test_default_tolerances_by_dtype():
    assert R.default_tolerance(torch.int32) == (0.0, 0.0)
    assert R.default_tolerance(torch.bfloat16)[0] > R.default_tolerance(torch.float32)[0]


def test_zero_copy_inputs_on_local_drivers(cache):
    m = R.load_module(R.compile_mlir(MATMUL_MLIR, CPU_FLAGS, cache=cache), zero_copy_inputs=True)
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    torch.testing.assert_close(m.main(x, w), x @ w)
    # Non-contiguous inputs are copied, still correct.
    xt = torch.randn(8, 4).t()
    torch.testing.assert_close(m.main(xt, w), xt @ w)
    # The imported memory is read at call time: a later call sees the caller's new values.
    x.mul_(2)
    torch.testing.assert_close(m.main(x, w), x @ w)


def test_zero_copy_result_aliasing_an_input_stays_valid(cache):
    import gc

    m = R.load_module(R.compile_mlir(DTYPES_MLIR, CPU_FLAGS, cache=cache), zero_copy_inputs=True)
    a = torch.tensor([0.5, -1.0, 3.0]).to(torch.float8_e4m3fn)
    b = torch.tensor([2.0, -0.25]).to(torch.float8_e5m2)
    want_a, want_b = a.clone(), b.clone()
    ra, rb = m.pass_fp8(a, b)
    del a, b
    gc.collect()
    torch.empty(1 << 20).fill_(7.0)  # reuse freed memory, if any was freed
    assert torch.equal(ra.view(torch.uint8), want_a.view(torch.uint8))
    assert torch.equal(rb.view(torch.uint8), want_b.view(torch.uint8))
