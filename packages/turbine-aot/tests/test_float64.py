"""float64 programs compute in float64 on the CPU targets, and are refused where IREE demotes them.

IREE demotes float64 to float32 by default (``--iree-input-demote-f64-to-f32``): a program that
computes in float64 silently ran in float32, and one that returns a float64 tensor failed at the
call with IREE's "buffer view byte length 256 exceeds backing buffer byte length 128". On llvm-cpu,
which computes float64 natively, turbine keeps float64 for programs that have it (a program
trait); elsewhere (vmvx cannot compile float64 -> float32 casts) a float64 input, output or
weight is refused before compiling.
"""

from __future__ import annotations

import pytest
import torch

from turbine_aot import export
from turbine_aot._compiler.flags import KEEP_FLOAT64_FLAG, default_compile_flags
from turbine_aot._compiler.targets import TargetError
from turbine_aot._compiler.traits import program_traits, uses_float64
from turbine_aot.runtime import load_module


class F64Boundary(torch.nn.Module):
    """Takes and returns float64 beside float32."""

    def forward(self, x, y):
        return x.double() * 2 + y, torch.softmax(y, -1), x + 1


class F64Inside(torch.nn.Module):
    """A float32 program that sums in float64 (where float32 loses the small terms)."""

    def forward(self, x):
        return (x.double() * 1e-9 + 1.0).sum(-1).sub(x.shape[-1]).mul(1e9).float()


def _inputs():
    torch.manual_seed(0)
    return torch.randn(4, 8), torch.randn(4, 8, dtype=torch.float64)


def test_float64_is_a_program_trait():
    x, y = _inputs()
    assert program_traits(export(F64Boundary(), args=(x, y))).float64
    assert uses_float64(export(F64Inside(), args=(x,)))  # in the body only
    assert not program_traits(export(torch.nn.Linear(8, 4), args=(x,))).float64


def test_llvm_cpu_keeps_float64_and_other_targets_do_not():
    assert KEEP_FLOAT64_FLAG in default_compile_flags("llvm-cpu", float64=True, use_env=False)
    assert KEEP_FLOAT64_FLAG in default_compile_flags(
        "llvm-cpu", host=False, float64=True, use_env=False
    )
    assert KEEP_FLOAT64_FLAG not in default_compile_flags("llvm-cpu", use_env=False)
    for target in ("vmvx", "vulkan-spirv", "cuda", "rocm"):
        assert KEEP_FLOAT64_FLAG not in default_compile_flags(target, float64=True, use_env=False)


def test_float64_programs_match_eager_in_float64(iree_device):
    x, y = _inputs()
    boundary, inside = export(F64Boundary(), args=(x, y)), export(F64Inside(), args=(x,))
    target = iree_device.spec.target_backend
    if target != "llvm-cpu":
        # IREE demotes float64 there: a float64 input or result is refused before compiling...
        with pytest.raises(TargetError, match=r"float64.*float32 at the boundary"):
            boundary.compile(save_to=None, target_device=target)
        # ...a program computing in float64 inside float32 boundaries is the reference's
        # (demoted) computation; it is not what this test is about.
        pytest.skip(f"{target} demotes float64 to float32 (refused at the boundary, above)")
    got = load_module(
        boundary.compile(save_to=None, target_device=target), device=iree_device.driver
    ).main(x, y)
    for g, w in zip(got, F64Boundary()(x, y)):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    m = load_module(inside.compile(save_to=None, target_device=target), device=iree_device.driver)
    want = F64Inside()(x)
    # In float32, 1 + x * 1e-9 is 1: the result would be 0 instead of sum(x).
    assert want.abs().max() > 0.5
    torch.testing.assert_close(m.main(x), want, rtol=1e-6, atol=1e-6)


def test_a_demoting_flag_given_by_hand_is_refused_for_a_float64_boundary():
    x, y = _inputs()
    with pytest.raises(TargetError, match=KEEP_FLOAT64_FLAG):
        export(F64Boundary(), args=(x, y)).compile(
            save_to=None, extra_args=["--iree-input-demote-f64-to-f32=true"]
        )
