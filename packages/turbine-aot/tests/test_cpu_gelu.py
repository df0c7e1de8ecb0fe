"""torch's exact GELU on llvm-cpu by turbine's rational ``erf`` (``_compiler.gelu``): which GELUs
the compile copy rewrites, the IR it hands IREE, and that the compiled values are as close to
the exact GELU as eager's, over the whole f32 range, static and dynamic shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from ir_check import check_ir
from kernel_testing import compile_copy_asm, host_flags

from turbine_aot import export
from turbine_aot._compiler import gelu
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.rewrites import environment_key
from turbine_aot.runtime import load_module


@pytest.fixture(autouse=True)
def _default_gelu(monkeypatch):
    """Every test starts from the default (``TURBINE_CPU_GELU`` unset)."""
    monkeypatch.delenv(gelu.GELU_ENV, raising=False)


class _Gelu(torch.nn.Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate=self.approximate)


class _Mlp(torch.nn.Module):
    """A transformer's MLP: linear, GELU, linear, and a second GELU of another shape."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up = torch.nn.Linear(32, 128)
        self.down = torch.nn.Linear(128, 32)

    def forward(self, x):
        return torch.nn.functional.gelu(self.down(torch.nn.functional.gelu(self.up(x))))


def _exact(x: np.ndarray) -> np.ndarray:
    """GELU in float64 (``x Phi(x)`` through ``erfc``: no cancellation for negative ``x``)."""
    return np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x.astype(np.float64)])


def test_erf_gelus_are_rewritten_and_the_tanh_form_is_not(monkeypatch):
    flags = default_compile_flags("llvm-cpu", use_env=False)
    eo = export(_Mlp(), args=(torch.randn(4, 32),))
    asm = compile_copy_asm(eo, flags)
    assert "torch.aten.gelu" not in asm
    check_ir(
        asm,
        r"call @__turbine_gelu_0\(%\w+\) : \(tensor<4x128xf32>\) -> tensor<4x128xf32>",
        r"call @__turbine_gelu_1\(%\w+\) : \(tensor<4x32xf32>\) -> tensor<4x32xf32>",
        r"func.func private @__turbine_gelu_0\(%arg0: tensor<4x128xf32>\) -> tensor<4x128xf32>",
        r"linalg.generic",
        r"arith.constant -5.41789532 : f32",  # x clamped to [-c, c]
        r"arith.cmpf ogt, %\w+, %in : f32",
        r"arith.cmpf olt, %\w+, %\w+ : f32",
        r"= arith.mulf (%\w+), \1 : f32",  # t = x^2
        *[r"math.fma %\w+, %\w+, %\w+ : f32"] * 10,  # P(t), Q(t)
        r"arith.divf %\w+, %\w+ : f32",  # r = x P / Q
        r"arith.mulf %in, %\w+ : f32",  # h = x / 2
        r"math.fma (%\w+), %\w+, \1 : f32",  # h (1 + r)
        r"func.func private @__turbine_gelu_1\(%arg0: tensor<4x32xf32>\)",
    )
    assert "math.erf" not in asm
    # the A/B baseline leaves them to IREE; the compile cache keys on the choice
    key = environment_key()
    monkeypatch.setenv(gelu.GELU_ENV, "iree")
    assert environment_key() != key
    assert "__turbine_gelu" not in compile_copy_asm(eo, flags)
    monkeypatch.delenv(gelu.GELU_ENV)
    tanh = export(_Gelu("tanh"), args=(torch.randn(4, 32),))
    assert "torch.aten.gelu" in compile_copy_asm(tanh, flags)
    # other targets keep torch-mlir's lowering
    assert "__turbine_gelu" not in compile_copy_asm(eo, default_compile_flags("vmvx"))


def test_the_clamp_is_where_r_is_exactly_one():
    """The module doc's promise, in the f32 arithmetic the function uses (FMAs emulated in
    float64, exact for these products): ``r(CLAMP)`` is 1.0, so ``|x| >= CLAMP`` gives ``x``
    and 0; and ``x`` is the exact GELU of ``CLAMP`` rounded to f32 (above it, the exact value
    is closer still)."""
    c = np.float32(gelu.CLAMP)
    assert float(c) == gelu.CLAMP
    t = c * c

    def horner(coeffs):
        acc = np.float32(coeffs[-1])
        for k in coeffs[-2::-1]:
            acc = np.float32(float(acc) * float(t) + float(np.float32(k)))
        return acc

    assert (c * horner(gelu.P)) / horner(gelu.Q) == np.float32(1.0)
    assert np.float32(_exact(np.array([c]))[0]) == c


def test_gelu_is_accurate_over_the_whole_range():
    """-12 .. 12 in steps of 1e-4, the clamp's neighbours, huge values, infinities and NaN: for
    ``x >= 0`` within 2e-7 relative of the exact GELU (eager's is 5.2e-7); everywhere within
    2 ulp of ``max(|x|, 1)`` (``1 + erf`` cancels for negative ``x``, in eager too); beyond the
    clamp exactly ``x`` or 0; NaN and infinities as eager."""
    c = np.float32(gelu.CLAMP)
    special = [c, -c, np.nextafter(c, np.float32(0)), -np.nextafter(c, np.float32(0)), 1e-30]
    special += [-1e-30, 0.0, 100.0, -100.0, 1e4, -1e4, 3e38, -3e38]
    x = np.concatenate([np.linspace(-12, 12, 240001), special]).astype(np.float32)
    module = _Gelu()
    eo = export(module, args=(torch.from_numpy(x),))
    assert "__turbine_gelu" in compile_copy_asm(eo, host_flags())
    compiled = load_module(eo.compile(save_to=None))
    got = compiled.main(torch.from_numpy(x)).numpy().astype(np.float64)
    exact = _exact(x)
    err = np.abs(got - exact)
    positive = x >= 0
    assert (err[positive] <= 2e-7 * np.abs(exact[positive]) + 1e-45).all()
    assert (err <= 2.4e-7 * np.maximum(np.abs(x), 1)).all()
    beyond = np.abs(x) >= c
    assert (got[beyond & positive] == x[beyond & positive]).all()
    assert (got[beyond & ~positive] == 0).all()
    # as accurate as eager (its own erf) by the same measures, within a factor of two
    eager = module(torch.from_numpy(x)).numpy().astype(np.float64)
    assert err.max() <= 2.5 * np.abs(eager - exact).max()
    odd = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, 0.0, 0.0, 0.0, 0.0])
    eo = export(module, args=(odd,))
    got_odd = load_module(eo.compile(save_to=None)).main(odd)
    torch.testing.assert_close(got_odd, module(odd), equal_nan=True)


def test_a_dynamic_batch_mlp_matches_eager():
    module = _Mlp().eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    x = torch.randn(5, 32)
    eo = export(module, args=(x,), dynamic_shapes={"x": {0: batch}})
    asm = compile_copy_asm(eo, host_flags())
    check_ir(asm, r"func.func private @__turbine_gelu_0\(%arg0: tensor<\?x128xf32>\)")
    compiled = load_module(eo.compile(save_to=None))
    for rows in (1, 5, 33):
        x = torch.randn(rows, 32) * 3
        torch.testing.assert_close(compiled.main(x), module(x), rtol=1e-5, atol=2e-6)
