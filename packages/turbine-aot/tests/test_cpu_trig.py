"""f32 ``sin`` / ``cos`` on llvm-cpu by turbine's own range reduction (``_compiler.trig``): which
ops the compile copy rewrites, and that the compiled values stay within about 1e-7 of the exact
ones however large the argument (rotary embeddings at long positions), where IREE 3.13's own
code drifts by 2.8e-8 * |x| (pinned)."""

from __future__ import annotations

import pytest
import torch
from ir_check import check_ir
from kernel_testing import compile_copy_asm

from turbine_aot import export
from turbine_aot._compiler import trig
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.rewrites import environment_key
from turbine_aot.runtime import load_module


@pytest.fixture(autouse=True)
def _default_trig(monkeypatch):
    """Every test starts from the default (``TURBINE_CPU_TRIG`` unset)."""
    monkeypatch.delenv(trig.TRIG_ENV, raising=False)


class _SinCos(torch.nn.Module):
    def forward(self, x):
        return torch.sin(x), torch.cos(x)


class _Rotary(torch.nn.Module):
    """Hugging Face Llama's rotary tables: ``cos`` / ``sin`` of positions times ``inv_freq``."""

    def __init__(self, dim: int = 64, base: float = 10000.0):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / base ** (torch.arange(0, dim, 2).float() / dim))

    def forward(self, position_ids):
        freqs = position_ids.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def _max_err(got, x):
    s, c = got
    xd = x.double()
    return max(
        (s.double() - xd.sin()).abs().max().item(), (c.double() - xd.cos()).abs().max().item()
    )


def test_sin_and_cos_are_rewritten(monkeypatch):
    flags = default_compile_flags("llvm-cpu", use_env=False)
    eo = export(_SinCos(), args=(torch.randn(4, 8),))
    asm = compile_copy_asm(eo, flags)
    assert "torch.aten.sin" not in asm and "torch.aten.cos" not in asm
    check_ir(
        asm,
        r"call @__turbine_sin_0\(%\w+\) : \(tensor<4x8xf32>\) -> tensor<4x8xf32>",
        r"call @__turbine_cos_1\(%\w+\) : \(tensor<4x8xf32>\) -> tensor<4x8xf32>",
        r"func.func private @__turbine_sin_0\(%arg0: tensor<4x8xf32>\)",
        r"arith.constant 0.636619746 : f32",  # 2 / pi in three parts
        r"arith.constant 2.5682553E-8 : f32",
        *[r"math.fma %in, %\w+, %\w+ : f32"] * 3,  # p's rounding error, x times the rest
        r"math.floor %\w+ : f32",  # k
        r"math.floor %\w+ : f32",  # k2
        r"arith.select %\w+, %\w+, %\w+ : f32",  # the quadrant's polynomial
        r"arith.xori %\w+, %\w+ : i32",  # and sign
        r"func.func private @__turbine_cos_1",
    )
    assert "math.sin" not in asm and "math.cos" not in asm and "math.roundeven" not in asm
    key = environment_key()
    monkeypatch.setenv(trig.TRIG_ENV, "iree")
    assert environment_key() != key
    assert "torch.aten.sin" in compile_copy_asm(eo, flags)
    monkeypatch.delenv(trig.TRIG_ENV)
    # other dtypes and targets keep IREE's
    half = export(_SinCos(), args=(torch.randn(4, 8, dtype=torch.bfloat16),))
    assert "torch.aten.sin" in compile_copy_asm(half, flags)
    assert "torch.aten.sin" in compile_copy_asm(eo, default_compile_flags("vmvx"))


@pytest.mark.parametrize(
    "lo, hi, tol",
    [(-10.0, 10.0, 1.3e-7), (-1e6, 1e6, 1.3e-7), (1e7, 1e8, 5e-7), (1e8, 3.3e9, 2e-5)],
)
def test_sin_and_cos_are_accurate_for_large_arguments(lo, hi, tol):
    """Within 1.3e-7 of float64 up to |x| = 1e6 (eager: 3.6e-8; IREE's own: 2.8e-2 at 1e6),
    then degrading slowly (the rounding of x times 2 / pi's second part)."""
    if lo > 0:
        x = torch.logspace(torch.tensor(lo).log10().item(), torch.tensor(hi).log10().item(), 50001)
        x = torch.cat([x, -x])
    else:
        x = torch.linspace(lo, hi, 100001)
    compiled = load_module(export(_SinCos(), args=(x,)).compile(save_to=None))
    assert _max_err(compiled.main(x), x) <= tol


def test_special_values():
    x = torch.tensor([0.0, -0.0, 1e-30, -1e-30, float("inf"), float("-inf"), float("nan"), 1e20])
    s, c = load_module(export(_SinCos(), args=(x,)).compile(save_to=None)).main(x)
    torch.testing.assert_close(s[:4], torch.sin(x[:4]), atol=0, rtol=1e-7)
    torch.testing.assert_close(c[:4], torch.cos(x[:4]), atol=0, rtol=0)
    assert s[4:7].isnan().all() and c[4:7].isnan().all()
    assert s[7].abs() <= 1 and c[7].abs() <= 1  # beyond 2^31 pi / 2: bounded, not right


def test_rotary_tables_at_long_positions_match_float64(monkeypatch):
    """Llama's rotary tables at positions 30000 .. 30063: turbine's within 2e-7 of float64's
    ``cos`` / ``sin`` of the same f32 angles (eager's too); IREE's own ``sin`` / ``cos`` are off
    by more than 1e-4 there. When that assertion fails,
    IREE's range reduction got exact: measure whether ``_compiler.trig`` still pays
    (docs/performance.md, section 27)."""
    module = _Rotary()
    positions = torch.arange(30000, 30064)
    eo = export(module, args=(positions,))
    freqs = positions.float()[:, None] * module.inv_freq[None, :]  # the f32 angles
    emb = torch.cat((freqs, freqs), dim=-1).double()
    cos, sin = load_module(eo.compile(save_to=None)).main(positions)
    err = max((cos.double() - emb.cos()).abs().max().item(), (sin.double() - emb.sin()).abs().max())
    assert err < 2e-7
    monkeypatch.setenv(trig.TRIG_ENV, "iree")
    cos, sin = load_module(eo.compile(save_to=None)).main(positions)
    err = max((cos.double() - emb.cos()).abs().max().item(), (sin.double() - emb.sin()).abs().max())
    assert err > 1e-4


def test_dynamic_shapes():
    """A dynamic dimension (the frame's ``tensor.dim``) beside the body's own constants."""
    batch = torch.export.Dim("batch", min=1, max=64)
    x = torch.randn(5, 8)
    eo = export(_SinCos(), args=(x,), dynamic_shapes={"x": {0: batch}})
    compiled = load_module(eo.compile(save_to=None))
    for rows in (1, 7):
        x = torch.randn(rows, 8) * 1000
        assert _max_err(compiled.main(x), x) <= 1.3e-7


def test_a_scalar_tensor():
    """A 0-d tensor: the frame's ``linalg.generic`` over no loops."""
    x = torch.tensor(12345.678)
    s, c = load_module(export(_SinCos(), args=(x,)).compile(save_to=None)).main(x)
    assert abs(s.item() - torch.sin(x.double()).item()) < 1.3e-7
    assert abs(c.item() - torch.cos(x.double()).item()) < 1.3e-7


class _Tan(torch.nn.Module):
    def forward(self, x):
        return torch.tan(x)


def _rel_err(got, want):
    """Largest relative error of ``got`` against float64 values ``want``, over the results that
    are normal f32 numbers or zero (IREE's CPU code flushes subnormal results)."""
    normal = (want.abs() >= torch.finfo(torch.float32).tiny) | (want == 0)
    return ((got.double() - want).abs() / want.abs().clamp_min(1e-38))[normal].max().item()


def _tan_rel_err(got, x):
    """:func:`_rel_err` against float64's ``tan`` of the same f32 arguments."""
    return _rel_err(got, x.double().tan())


def test_tan_is_accurate_near_its_poles_where_iree_s_is_not(monkeypatch):
    """``tan`` over -100 .. 100 (its poles included): within 2.5e-7 relative of float64 (eager
    8.4e-8). IREE 3.13's ``tan`` is its ``sin`` over its ``cos``, with their drift divided by a
    small ``cos`` near the poles: more than 1e-2 off in relative terms. When that assertion
    fails, IREE's ``tan`` got right: measure whether ``_compiler.trig`` still pays for it."""
    x = torch.linspace(-100.0, 100.0, 200001)
    eo = export(_Tan(), args=(x,))
    flags = default_compile_flags("llvm-cpu", use_env=False)
    asm = compile_copy_asm(eo, flags)
    assert "torch.aten.tan" not in asm and "math.tan" not in asm
    check_ir(asm, r"call @__turbine_tan_0\(", r"arith.divf %\w+, %\w+ : f32")
    assert _tan_rel_err(load_module(eo.compile(save_to=None)).main(x), x) <= 2.5e-7
    near = torch.tensor([1.5707963, -1.5707963, 3.1415925, 98.96017, 30.0, 1e4, 0.0, -0.0])
    got = load_module(export(_Tan(), args=(near,)).compile(save_to=None)).main(near)
    assert _tan_rel_err(got, near) <= 2.5e-7
    assert torch.equal(got[6:].sign(), torch.tensor([0.0, -0.0]).sign())
    special = torch.tensor([float("inf"), float("-inf"), float("nan")])
    assert (
        load_module(export(_Tan(), args=(special,)).compile(save_to=None))
        .main(special)
        .isnan()
        .all()
    )
    monkeypatch.setenv(trig.TRIG_ENV, "iree")
    assert _tan_rel_err(load_module(eo.compile(save_to=None)).main(x), x) > 1e-2


class _Atan(torch.nn.Module):
    def forward(self, x):
        return torch.atan(x)


def test_atan_is_accurate_where_iree_s_polynomial_is_not(monkeypatch):
    """``atan`` within 1.3e-7 relative of float64 from 1e-30 to 1e30 in magnitude, both signs
    (eager 7.8e-8); IREE 3.13's polynomial is more than 1e-6 off. When that assertion fails,
    IREE's ``atan`` got accurate: measure whether ``_compiler.trig`` still pays for it."""
    mags = torch.cat([torch.logspace(-30, 30, 20001), torch.linspace(0, 100, 100001)])
    x = torch.cat([mags, -mags])
    eo = export(_Atan(), args=(x,))
    asm = compile_copy_asm(eo, default_compile_flags("llvm-cpu", use_env=False))
    assert "torch.aten.atan" not in asm
    check_ir(asm, r"call @__turbine_atan_0\(", r"arith.divf %\w+, %\w+ : f32", r"math.copysign")

    want = x.double().atan()

    def rel(got):
        return _rel_err(got, want)

    assert rel(load_module(eo.compile(save_to=None)).main(x)) <= 1.3e-7
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, -0.0])
    got = load_module(export(_Atan(), args=(special,)).compile(save_to=None)).main(special)
    torch.testing.assert_close(got[:2], torch.atan(special[:2]), rtol=0, atol=0)
    assert got[2].isnan() and got[3:].tolist() == [0.0, 0.0]
    assert got[4].sign().item() == 0 and torch.signbit(got[4]) and not torch.signbit(got[3])
    monkeypatch.setenv(trig.TRIG_ENV, "iree")
    assert rel(load_module(eo.compile(save_to=None)).main(x)) > 1e-6


class _Atan2(torch.nn.Module):
    def forward(self, y, x):
        return torch.atan2(y, x)


def test_atan2_is_accurate_and_gives_the_special_values(monkeypatch):
    """``atan2`` of two f32 tensors of one shape: within 2e-7 relative of float64 (eager
    6.9e-8) over random points and magnitudes from 1e-30 to 1e30 (results below f32's smallest
    normal left out: IREE's CPU code flushes subnormals), and C's special values (signed zeros,
    infinities, NaN) as float64's rounded to f32. IREE 3.13's own is 4e-6 off and gives NaN for
    ``atan2(0, 0)`` (eager: 0): both pinned; when they fail, IREE's ``atan2`` got right."""
    g = torch.Generator().manual_seed(0)
    mags = torch.logspace(-30, 30, 4001)
    y = torch.cat([torch.randn(100000, generator=g) * 10, mags, -mags])
    x = torch.cat([torch.randn(100000, generator=g) * 10, mags.flip(0), mags])
    values = [0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan")]
    sy = torch.tensor([a for a in values for _ in values])
    sx = torch.tensor([b for _ in values for b in values])
    eo = export(_Atan2(), args=(y, x))
    asm = compile_copy_asm(eo, default_compile_flags("llvm-cpu", use_env=False))
    assert "torch.aten.atan2" not in asm
    check_ir(
        asm, r"call @__turbine_atan2_0\(%\w+, %\w+\) : \(tensor<108002xf32>, tensor<108002xf32>\)"
    )

    want = torch.atan2(y.double(), x.double())

    def rel(got):
        return _rel_err(got, want)

    assert rel(load_module(eo.compile(save_to=None)).main(y, x)) <= 2e-7
    special = load_module(export(_Atan2(), args=(sy, sx)).compile(save_to=None))
    got, exact = special.main(sy, sx), torch.atan2(sy.double(), sx.double()).float()
    assert torch.equal(got.isnan(), exact.isnan())
    assert torch.equal(got.nan_to_num(), exact.nan_to_num())
    assert torch.equal(got.signbit()[~exact.isnan()], exact.signbit()[~exact.isnan()])
    monkeypatch.setenv(trig.TRIG_ENV, "iree")
    assert rel(load_module(eo.compile(save_to=None)).main(y, x)) > 1e-6
    zero = torch.zeros(4)
    raw = load_module(export(_Atan2(), args=(zero, zero)).compile(save_to=None))
    assert raw.main(zero, zero).isnan().all()


class _Inverse(torch.nn.Module):
    def forward(self, y, x, z):
        return torch.atan(y), torch.atan2(y, x), torch.asin(z)


def test_atan_atan2_and_asin_on_each_backend(iree_device, monkeypatch):
    """``atan`` / ``atan2`` / ``asin`` within 2.5e-7 relative of float64 and ``atan2(0, 0)`` 0 on
    every backend this run has: turbine's own on llvm-cpu and Vulkan (where IREE's are 4.1e-6
    off, ``atan2(0, 0)`` NaN, ``asin`` 5e-7; ``asin`` as ``atan2(x, sqrt((1 - x)(1 + x)))``);
    on vmvx IREE's ``atan`` / ``atan2`` (accurate there) and ``asin`` in that form (vmvx cannot
    compile ``math.asin``). IREE's ``asin`` pinned on llvm-cpu."""
    g = torch.Generator().manual_seed(1)
    mags = torch.logspace(-30, 30, 2001)
    y = torch.cat([torch.randn(50000, generator=g) * 10, mags, -mags, torch.zeros(2)])
    x = torch.cat([torch.randn(50000, generator=g) * 10, mags.flip(0), mags, torch.zeros(2)])
    z = torch.cat([torch.linspace(-1, 1, 50001), torch.logspace(-30, 0, 2001), torch.zeros(1)])
    z = torch.cat([z, -z[-2002:]])  # -1e-30 .. -1, -0
    eo = export(_Inverse(), args=(y, x, z))
    vmfb = eo.compile(None, target_backends=None, extra_args=iree_device.compile_args)
    a, b, c = load_module(vmfb, device=iree_device.driver).main(y, x, z)

    wants = (y.double().atan(), torch.atan2(y.double(), x.double()), z.double().asin())
    for got, want in zip((a, b, c), wants):
        assert _rel_err(got, want) <= 2.5e-7, f"{iree_device.name}: {_rel_err(got, want):.3g}"
    assert b[-2:].tolist() == [0.0, 0.0]
    assert torch.equal(c[-1:].signbit(), torch.tensor([True]))  # asin(-0) is -0
    if iree_device.spec.target_backend == "llvm-cpu":
        monkeypatch.setenv(trig.TRIG_ENV, "iree")
        raw = eo.compile(None, target_backends=None, extra_args=iree_device.compile_args)
        c = load_module(raw, device=iree_device.driver).main(y, x, z)[2]
        assert _rel_err(c, wants[2]) > 3e-7
