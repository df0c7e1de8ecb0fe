"""runtime.PreparedCall: repeated calls with the arguments kept in device buffers the caller
writes in place, results read as numpy views (docs/running.md, "Prepared calls")."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from turbine_aot import runtime as R

CPU_FLAGS = R.device_compile_flags(["local-task"])

MLIR = """
module @prepared {
util.global private mutable @total = dense<0> : tensor<3xi64>
func.func @step(%x: tensor<3xi64>, %s: tensor<2x2xf32>) -> (tensor<3xi64>, tensor<2x2xf32>) {
  %t = util.global.load @total : tensor<3xi64>
  %n = arith.addi %t, %x : tensor<3xi64>
  util.global.store %n, @total : tensor<3xi64>
  %r = arith.mulf %s, %s : tensor<2x2xf32>
  return %n, %r : tensor<3xi64>, tensor<2x2xf32>
}
func.func @step_neg(%x: tensor<3xi64>, %s: tensor<2x2xf32>) -> (tensor<3xi64>, tensor<2x2xf32>) {
  %z = arith.constant dense<0> : tensor<3xi64>
  %n = arith.subi %z, %x : tensor<3xi64>
  %r = arith.negf %s : tensor<2x2xf32>
  return %n, %r : tensor<3xi64>, tensor<2x2xf32>
}
func.func @rows_bf16(%x: tensor<?x4xbf16>) -> tensor<?x4xbf16> {
  %r = arith.addf %x, %x : tensor<?x4xbf16>
  return %r : tensor<?x4xbf16>
}
func.func @other(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
util.global private mutable @kept = dense<0.0> : tensor<4xf32>
func.func @keep(%x: tensor<4xf32>) -> tensor<4xf32> {
  util.global.store %x, @kept : tensor<4xf32>
  %k = util.global.load @kept : tensor<4xf32>
  return %k : tensor<4xf32>
}
func.func @read_kept(%x: tensor<4xf32>) -> tensor<4xf32> {
  %k = util.global.load @kept : tensor<4xf32>
  return %k : tensor<4xf32>
}
}
"""


@pytest.fixture(scope="module")
def vmfb(tmp_path_factory):
    return R.compile_mlir(MLIR, CPU_FLAGS, cache=R.CompileCache(tmp_path_factory.mktemp("cc")))


@pytest.mark.parametrize("device", ["local-sync", "local-task"])
def test_prepared_calls_match_calls_and_see_inputs_written_in_place(vmfb, device):
    m = R.load_module(vmfb, device=device)
    ref = R.load_module(vmfb, device=device)  # the same calls, through LoadedFunction
    x = np.array([1, -2, 3], np.int64)
    s = np.array([[1.5, -2.0], [0.25, 3.0]], np.float32)
    call = R.PreparedCall([m.step, m.step_neg], [x, s])
    xin, sin = call.inputs
    assert np.array_equal(xin, x) and np.array_equal(sin, s)  # written at preparation
    for i in range(4):
        xin[...] = x * (i + 1)  # new arguments, written in place
        sin[0, 0] = float(i)
        total, sq = call(0)
        want_total, want_sq = ref.step(torch.from_numpy(xin.copy()), torch.from_numpy(sin.copy()))
        assert total.dtype == np.int64 and sq.dtype == np.float32 and sq.shape == (2, 2)
        assert np.array_equal(total, want_total.numpy())  # the module's state moves alike
        assert np.array_equal(sq, want_sq.numpy())
        assert call.result_dtypes == [torch.int64, torch.float32]
    neg_total, neg_sq = call(1)  # the second function, on the same arguments
    assert np.array_equal(neg_total, -xin) and np.array_equal(neg_sq, -sin)


def test_results_of_dynamic_shape_and_bfloat16(vmfb):
    m = R.load_module(vmfb, device="local-sync")
    x = torch.randn(3, 4).to(torch.bfloat16)
    call = R.PreparedCall([m.rows_bf16], [x])
    assert call.inputs[0].dtype == np.uint16  # bfloat16 as its bits
    (out,) = call()
    assert call.result_dtypes == [torch.bfloat16] and out.shape == (3, 4)
    got = torch.from_numpy(out.copy()).view(torch.bfloat16)  # bfloat16 travels as its bits
    assert torch.equal(got, x + x)


def test_arguments_the_functions_do_not_take_are_refused(vmfb):
    m = R.load_module(vmfb, device="local-sync")
    x = np.zeros(3, np.int64)
    s = np.zeros((2, 2), np.float32)
    with pytest.raises(R.CallArgumentValueError, match=r"dtype"):
        R.PreparedCall([m.step], [x.astype(np.int32), s])
    with pytest.raises(R.CallArgumentValueError, match=r"shape|dim"):
        R.PreparedCall([m.step], [np.zeros(4, np.int64), s])
    # every function is checked: @other takes one f32 vector
    with pytest.raises(R.CallArgumentTypeError, match=r"other"):
        R.PreparedCall([m.step, m.other], [x, s])
    with pytest.raises(ValueError, match=r"no function"):
        R.PreparedCall([], [x, s])
    other = R.load_module(vmfb, device="local-sync")
    with pytest.raises(ValueError, match=r"different modules"):
        R.PreparedCall([m.step, other.step_neg], [x, s])


@pytest.mark.parametrize("device", ["local-sync", "local-task"])
def test_an_argument_stored_in_a_global_is_not_changed_by_the_next_writes(vmfb, device):
    """The argument buffers are rewritten between calls: a program that keeps an argument in
    its state must hold a copy, not the buffer (IREE copies what it stores: pinned here), and
    a result that is the argument itself (``@other`` returns it) is the buffer, which the
    docs say is valid until the next call."""
    m = R.load_module(vmfb, device=device)
    call = R.PreparedCall([m.keep, m.read_kept, m.other], [np.arange(4, dtype=np.float32)])
    (first,) = call(0)
    assert np.array_equal(first, [0, 1, 2, 3])
    call.inputs[0][...] = 100.0
    (state,) = call(1)
    assert np.array_equal(state, [0, 1, 2, 3])  # the global kept the first call's values
    (echo,) = call(2)
    call.inputs[0][...] = 7.0
    assert np.array_equal(echo, [7, 7, 7, 7])  # the argument's own buffer
