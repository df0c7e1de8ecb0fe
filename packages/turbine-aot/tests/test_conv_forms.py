"""1-D and few-group convolutions on turbine's AVX-512 direct-convolution kernel
(``_compiler.conv_forms``): made 2-D and dense on the compile copy, eager's values, and the
convolutions left to IREE (depthwise, many groups, other choices)."""

from __future__ import annotations

import pytest
import torch
from ir_check import check_ir
from kernel_testing import compile_copy_asm, host_flags, needs_avx2, needs_avx512

from turbine_aot import export
from turbine_aot._compiler.conv_forms import MAX_GROUPS, convs_to_reform
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot.runtime import load_module


@pytest.fixture(autouse=True)
def _default_choices(monkeypatch):
    for name in ("TURBINE_CPU_CONV_MATMUL", "TURBINE_CPU_MATMUL"):
        monkeypatch.delenv(name, raising=False)


def _copy_asm(eo) -> str:
    flags = [*default_compile_flags("llvm-cpu", use_env=False), "--turbine-cpu-matmul=avx512"]
    return compile_copy_asm(eo, flags)


# (name, module, input shape): wav2vec2's positional and feature convolutions among them
CASES = [
    ("1d-4-groups", lambda: torch.nn.Conv1d(64, 64, 16, padding=8, groups=4), (1, 64, 199)),
    ("1d-stride-5", lambda: torch.nn.Conv1d(1, 32, 10, stride=5), (1, 1, 4000)),
    (
        "1d-2-groups-dilated-no-bias",
        lambda: torch.nn.Conv1d(32, 48, 3, padding=2, dilation=2, groups=2, bias=False),
        (2, 32, 50),
    ),
    (
        "2d-4-groups-strided",
        lambda: torch.nn.Conv2d(32, 64, 3, padding=1, stride=2, groups=4),
        (1, 32, 28, 28),
    ),
    (
        "2d-8-groups-rect",
        lambda: torch.nn.Conv2d(16, 24, (1, 3), padding=(0, 1), groups=8),
        (1, 16, 5, 9),
    ),
]


@pytest.mark.parametrize("name,make,shape", CASES, ids=[c[0] for c in CASES])
def test_reformed_convolutions_match_eager(name, make, shape, iree_device):
    torch.manual_seed(0)
    m = make().eval()
    x = torch.randn(*shape)
    eo = export(m, args=(x,))
    exported = str(eo.mlir_module)
    assert len(convs_to_reform(eo.mlir_module)) == 1
    got = load_module(
        eo.compile(save_to=None, target_device=iree_device.spec.target_backend),
        device=iree_device.driver,
    ).main(x)
    torch.testing.assert_close(got, m(x), rtol=1e-5, atol=1e-5)
    assert str(eo.mlir_module) == exported  # the exported module is the reference's


@needs_avx512
def test_the_compile_copy_has_a_dense_2d_convolution_on_the_kernel():
    eo = export(
        torch.nn.Conv1d(64, 64, 16, padding=8, groups=4).eval(), args=(torch.randn(1, 64, 199),)
    )
    asm = _copy_asm(eo)
    check_ir(
        asm,
        # group 1 of 4: 16 filters over channels 16..31 of 64, zeros elsewhere
        r"torch.aten.constant_pad_nd %[\w.]+, %[\w.]+, %[\w.]+ : !torch.vtensor<\[16,16,16\],f32>, "
        r"!torch.list<int>, !torch.float -> !torch.vtensor<\[16,64,16\],f32>",
        r"stream.executable private @__turbine_avx512_f32_conv_n1_c64_h1_w199_f64_k1x16_s1x1_p0x8",
    )
    assert "torch.aten.convolution" not in asm  # the dense convolution is the kernel's call


@needs_avx512
def test_depthwise_many_groups_and_other_choices_keep_irees_code(monkeypatch):
    depthwise = export(torch.nn.Conv1d(32, 32, 3, groups=32).eval(), args=(torch.randn(1, 32, 40),))
    many = export(
        torch.nn.Conv2d(64, 64, 3, groups=MAX_GROUPS * 2).eval(), args=(torch.randn(1, 64, 8, 8),)
    )
    for eo in (depthwise, many):
        assert convs_to_reform(eo.mlir_module) == []
        assert "avx512_f32_conv" not in _copy_asm(eo)
    grouped = export(torch.nn.Conv1d(64, 64, 16, groups=4).eval(), args=(torch.randn(1, 64, 99),))
    monkeypatch.setenv("TURBINE_CPU_CONV_MATMUL", "iree")  # IREE's convolutions: not reformed
    assert "constant_pad_nd" not in _copy_asm(grouped)


class _Conv2dShortLists(torch.nn.Module):
    """``aten.conv2d`` written with one-element lists (``[2]`` for ``(2, 2)``), as torch allows."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 8, 3, 3))

    def forward(self, x):
        return torch.ops.aten.conv2d(x, self.w, None, [2], [1], [1], 4)


def test_conv2d_with_one_element_lists_is_reformed_right():
    torch.manual_seed(0)
    m, x = _Conv2dShortLists(), torch.randn(1, 32, 16, 16)
    eo = export(m, args=(x,))
    assert len(convs_to_reform(eo.mlir_module)) == 1
    got = load_module(eo.compile(save_to=None), device="local-task").main(x)
    torch.testing.assert_close(got, m(x), rtol=1e-5, atol=1e-5)


# ------------------------------------- AVX2: few groups the depthwise kernel takes stay grouped
def _avx2_asm(eo) -> str:
    return compile_copy_asm(eo, host_flags("--turbine-cpu-matmul=avx2"))


def test_on_avx2_few_groups_the_depthwise_kernel_takes_stay_grouped():
    """RegNetY's grouped convolutions (groups of 8 channels, 3 or 7 of them) and wav2vec2's
    positional one (4 groups of 16, 1-D): where the kernels are built for AVX2 the depthwise
    kernel's grouped form takes them (2-4x faster there than the dense form, docs/performance.md
    section 24); built for AVX-512 they are made dense as before."""
    regnet = export(
        torch.nn.Conv2d(56, 56, 3, stride=2, padding=1, groups=7).eval(),
        args=(torch.randn(1, 56, 24, 24),),
    )
    assert convs_to_reform(regnet.mlir_module, "avx2") == []
    assert len(convs_to_reform(regnet.mlir_module, "avx512")) == 1
    asm = _avx2_asm(regnet)
    assert "@__turbine_avx512_f32_dwconv_n1_c64_h24_w24_k3x3_s2x2_p1x1_d1x1_gw8" in asm
    assert "constant_pad_nd" not in asm and "_f32_conv_n1" not in asm
    wav2vec2 = export(
        torch.nn.Conv1d(64, 64, 16, padding=8, groups=4).eval(), args=(torch.randn(1, 64, 199),)
    )
    assert len(convs_to_reform(wav2vec2.mlir_module, "avx2")) == 1  # made 2-D, still grouped
    asm = _avx2_asm(wav2vec2)
    assert "@__turbine_avx512_f32_dwconv_n1_c64_h1_w199_k1x16_s1x1_p0x8_d1x1_gw16" in asm
    assert "constant_pad_nd" not in asm
    # more filters than channels: not the depthwise kernel's, made dense as before
    wide = export(
        torch.nn.Conv2d(32, 64, 3, padding=1, groups=4).eval(), args=(torch.randn(1, 32, 8, 8),)
    )
    assert len(convs_to_reform(wide.mlir_module, "avx2")) == 1
    assert "constant_pad_nd" in _avx2_asm(wide)


@needs_avx2
@pytest.mark.parametrize(
    ("make", "shape"),
    [
        (lambda: torch.nn.Conv2d(56, 56, 3, stride=2, padding=1, groups=7), (1, 56, 24, 24)),
        (lambda: torch.nn.Conv2d(24, 24, 3, padding=1, groups=3, bias=False), (2, 24, 9, 11)),
        (lambda: torch.nn.Conv1d(64, 64, 16, padding=8, groups=4), (1, 64, 199)),
    ],
    ids=["regnety-7-groups", "3-groups", "wav2vec2-1d"],
)
def test_grouped_on_the_depthwise_kernel_match_eager(make, shape):
    torch.manual_seed(0)
    m = make().eval()
    x = torch.randn(*shape)
    flags = host_flags("--turbine-cpu-matmul=avx2")
    got = load_module(export(m, args=(x,)).compile(save_to=None, extra_args=flags)).main(x)
    torch.testing.assert_close(got, m(x), rtol=1e-5, atol=1e-5)


def test_turbine_cpu_grouped_dense_keeps_the_dense_form(monkeypatch):
    eo = export(
        torch.nn.Conv2d(56, 56, 3, padding=1, groups=7).eval(), args=(torch.randn(1, 56, 6, 6),)
    )
    monkeypatch.setenv("TURBINE_CPU_GROUPED", "dense")
    assert len(convs_to_reform(eo.mlir_module, "avx2")) == 1
    assert "constant_pad_nd" in _avx2_asm(eo)
