"""Depthwise convolutions on turbine's AVX-512 depthwise kernel (``_compiler.depthwise``,
``_compiler.direct_convs``): which convolutions it takes, and that it gives eager's values for
the geometries of MobileNet / EfficientNet / ConvNeXt, with and without the epilogue."""

from __future__ import annotations

import pytest
import torch
from ir_check import check_ir
from kernel_testing import compile_copy_asm, needs_avx512

from turbine_aot import export
from turbine_aot._compiler.direct_convs import depthwise_convs, direct_convs
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot.runtime import load_module

_AVX512 = ["--turbine-cpu-matmul=avx512"]


@pytest.fixture(autouse=True)
def _default_choices(monkeypatch):
    for name in ("TURBINE_CPU_CONV_MATMUL", "TURBINE_CPU_MATMUL", "TURBINE_CPU_EPILOGUES"):
        monkeypatch.delenv(name, raising=False)


def _flags() -> list[str]:
    return [*default_compile_flags("llvm-cpu", use_env=False), *_AVX512]


def _dw(c, k=3, stride=1, padding=1, dilation=1, bias=True, tail=True, width=1) -> torch.nn.Module:
    """A depthwise convolution (``width`` > 1: grouped, ``width`` channels a group), then
    (``tail``) an eval-mode batch norm and a ReLU."""
    torch.manual_seed(0)
    groups = c // width
    conv = torch.nn.Conv2d(c, c, k, stride, padding, dilation=dilation, groups=groups, bias=bias)
    if not tail:
        return conv.eval()
    bn = torch.nn.BatchNorm2d(c)
    bn.running_mean.uniform_(-0.5, 0.5)
    bn.running_var.uniform_(0.5, 2.0)
    return torch.nn.Sequential(conv, bn, torch.nn.ReLU()).eval()


def test_the_compile_copy_calls_the_kernel_and_the_export_is_unchanged():
    eo = export(_dw(24), args=(torch.randn(2, 24, 9, 10),))
    exported = str(eo.mlir_module)
    asm = compile_copy_asm(eo, _flags())
    check_ir(
        asm,
        r"stream.executable private @__turbine_avx512_f32_dwconv_n2_c32_h9_w10_k3x3_s1x1_p1x1"
        r"_d1x1_scale_shift_relu",
        # channels-last, zero-padded (rows, columns, and 24 -> 32 channels) in one copy
        r"tensor.pad %\w+ low\[0, 1, 1, 0\] high\[0, 1, 1, 8\]",
        # the weight as [taps, channels], zero-padded to whole vectors
        r"linalg.transpose ins\(%\w+ : tensor<24x1x3x3xf32>\) .* permutation = \[2, 3, 1, 0\]",
        r"flow.dispatch @__turbine_avx512_f32_dwconv_\w+::@\w+\(%\w+, %\w+, %\w+, %\w+\) : "
        r"\(tensor<8448xf32>, tensor<288xf32>, tensor<32xf32>, tensor<32xf32>\) -> "
        r"tensor<180x32xf32>",
    )
    assert "torch.aten.convolution" not in asm and "torch.aten.conv2d" not in asm
    assert str(eo.mlir_module) == exported  # the exported module is the reference's


def test_what_the_kernel_takes():
    def found(model, x) -> tuple[int, int]:
        op = export(model.eval(), args=(x,)).mlir_module.operation
        return len(depthwise_convs(op)), len(direct_convs(op))

    x = torch.randn(1, 16, 8, 8)
    assert found(_dw(16, tail=False), x) == (1, 0)
    multiplier = torch.nn.Conv2d(16, 32, 3, groups=16)  # two filters per channel: IREE's
    assert found(multiplier, x) == (0, 0)
    # grouped, 4 channels a group (the compile path makes convolutions of at most 8 groups
    # dense first: conv_forms; more, the grouped form of this kernel)
    assert found(torch.nn.Conv2d(16, 16, 3, groups=4), x) == (1, 0)
    x96 = torch.randn(1, 96, 8, 8)
    assert found(torch.nn.Conv2d(96, 96, 3, groups=4), x96) == (0, 0)  # 24 a group: IREE's
    assert found(torch.nn.Conv2d(16, 16, 3), x) == (0, 1)  # dense: the direct kernel
    x64 = torch.randn(1, 16, 8, 8, dtype=torch.float64)
    assert found(_dw(16, tail=False).double(), x64) == (0, 0)


_GEOMETRIES = {
    # name: (C, kernel, stride, padding, dilation, bias, batch, H, W, channels a group)
    "mobilenet-3x3": (16, 3, 1, 1, 1, False, 1, 12, 12, 1),
    "mobilenet-5x5-stride2": (72, 5, 2, 2, 1, False, 2, 15, 16, 1),  # 72 -> 80 channels
    "efficientnet-odd-channels": (120, 5, 1, 2, 1, True, 1, 7, 9, 1),  # rows of 9: a tail
    "convnext-7x7": (40, 7, 1, 3, 1, True, 1, 14, 14, 1),
    "dilated": (24, 3, 1, 2, 2, True, 1, 10, 7, 1),  # LR-ASPP's
    "no-padding-one-pixel": (32, 3, 1, 0, 1, True, 1, 3, 3, 1),
    "regnet-groups-of-8": (72, 3, 2, 1, 1, False, 1, 11, 11, 8),  # 9 groups, 72 -> 80
    "groups-of-16": (160, 3, 1, 1, 1, True, 1, 6, 6, 16),
    "groups-of-4": (40, 3, 1, 1, 1, True, 2, 5, 7, 4),
    "groups-of-2": (24, 5, 1, 2, 1, False, 1, 8, 8, 2),
}


@needs_avx512
@pytest.mark.parametrize("tail", [True, False])
@pytest.mark.parametrize("name", sorted(_GEOMETRIES))
def test_the_kernel_matches_eager(name, tail):
    c, k, s, p, d, bias, n, h, w, width = _GEOMETRIES[name]
    model = _dw(c, k, s, p, d, bias, tail, width)
    x = torch.randn(n, c, h, w)
    eo = export(model, args=(x,))
    assert len(depthwise_convs(eo.mlir_module.operation)) == 1
    got = load_module(eo.compile(None, extra_args=_AVX512)).main(x)
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_avx512
def test_with_the_epilogues_kept_apart_the_values_are_the_same(monkeypatch):
    monkeypatch.setenv("TURBINE_CPU_EPILOGUES", "keep")
    model = _dw(40, 5, 1, 2)
    x = torch.randn(1, 40, 9, 9)
    eo = export(model, args=(x,))
    asm = compile_copy_asm(eo, _flags())
    assert "_dwconv_n1_c48_h9_w9_k5x5_s1x1_p2x2_d1x1 " in asm.replace("::", " ")
    got = load_module(eo.compile(None, extra_args=_AVX512)).main(x)
    with torch.no_grad():
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
