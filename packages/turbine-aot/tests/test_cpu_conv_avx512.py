"""fp32 convolutions on turbine's AVX-512 direct-convolution kernel (``_compiler.avx512_conv``,
``_compiler.direct_convs``):
when the compile copy uses it, and that it gives eager's values for every geometry it accepts;
stems and 1x1 convolutions left to ``_compiler.convs`` call the AVX-512 matmul kernel."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch
from ir_check import check_ir
from kernel_testing import compile_copy_asm, needs_avx512

from turbine_aot import export
from turbine_aot._compiler import avx512_conv
from turbine_aot._compiler.avx512_conv import Avx512Conv, conv_kernel_for, panel_width
from turbine_aot._compiler.convs import conv_geometry
from turbine_aot._compiler.direct_convs import direct_convs
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.isa import host_isa, kernels_for
from turbine_aot._compiler.rewrites import environment_key
from turbine_aot.runtime import load_module


@pytest.fixture(autouse=True)
def _default_choices(monkeypatch):
    for name in (
        "TURBINE_CPU_CONV_MATMUL",
        "TURBINE_CPU_MATMUL",
        "TURBINE_CPU_CONV_BLOCKING",
        "TURBINE_CPU_EPILOGUES",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _avx512_blocking():
    """These tests are about the kernels' AVX-512 blocking, whatever this CPU has (an AVX2 one
    blocks the same kernels for its 16 registers: test_cpu_kernels_avx2.py)."""
    with kernels_for("avx512"):
        yield


def _flags(*extra: str) -> list[str]:
    return [
        *default_compile_flags("llvm-cpu", use_env=False),
        "--turbine-cpu-matmul=avx512",
        *extra,
    ]


_copy_asm = compile_copy_asm


def _conv(c=16, f=70, k=3, stride=1, padding=1, dilation=1, bias=True) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Conv2d(c, f, k, stride=stride, padding=padding, dilation=dilation, bias=bias)


# ---------------------------------------------------------------------------- when it applies
def test_the_compile_copy_calls_the_conv_kernel_and_the_export_is_unchanged():
    eo = export(_conv().eval(), args=(torch.randn(2, 16, 9, 11),))
    exported = str(eo.mlir_module)
    asm = _copy_asm(eo, _flags())
    check_ir(
        asm,
        r"call @__turbine_avx512_conv_0\(%\w+, %\w+, %\w+\) : \(tensor<2x16x9x11xf32>, "
        r"tensor<70x16x3x3xf32>, tensor<70xf32>\) -> tensor<2x70x9x11xf32>",
        # 70 filters: panels of 32, padded to 96 (not 64's 128)
        r"stream.executable private @__turbine_avx512_f32_conv_n2_c16_h9_w11_f96_k3x3",
        r"func.func private @__turbine_avx512_conv_0",
        # channels-last, zero-padded input, read in place by the kernel
        r"linalg.transpose ins\(%\w+ : tensor<2x16x9x11xf32>\) .* permutation = \[0, 2, 3, 1\]",
        r"tensor.pad %\w+ low\[0, 1, 1, 0\] high\[0, 1, 1, 0\]",
        r"tensor.collapse_shape .* into tensor<4576xf32>",
        # the bias, zero-padded to 96, is added by the kernel (its epilogue)
        r"flow.dispatch @__turbine_avx512_f32_conv_\w+_shift::@__turbine_avx512_f32_conv_\w+\(%\w+, "
        r"%\w+, %\w+\) : \(tensor<4576xf32>, tensor<13824xf32>, tensor<96xf32>\) -> "
        r"tensor<198x96xf32>",
    )
    assert "torch.aten.conv2d" not in asm
    # what the kernel needs on the target (this CPU): AVX-512's only where it has AVX-512
    features = "avx512f" if host_isa() == "avx512" else "avx2,fma"
    assert f'turbine.cpu_requires = "{features}"' in asm
    assert str(eo.mlir_module) == exported  # the exported module is the reference's


def test_the_choices_that_keep_todays_convolutions(monkeypatch):
    eo = export(_conv(c=3, f=8, k=7, stride=2, padding=3).eval(), args=(torch.randn(1, 3, 32, 32),))
    assert "avx512_f32_conv" in _copy_asm(eo, _flags())  # a stem: the direct kernel too
    # IREE's matmul code (the flag, a portable build): the stem is im2col + linalg.matmul
    asm = _copy_asm(eo, _flags("--turbine-cpu-matmul=iree"))
    assert "avx512" not in asm and "linalg.matmul" in asm
    assert "avx512" not in _copy_asm(eo, default_compile_flags("llvm-cpu", host=False))
    monkeypatch.setenv("TURBINE_CPU_CONV_MATMUL", "iree")  # today's convolution rewrites
    key = environment_key()
    asm = _copy_asm(eo, _flags())
    assert "avx512_f32_conv" not in asm and "linalg.matmul" in asm
    monkeypatch.setenv("TURBINE_CPU_CONV_MATMUL", "keep")  # no convolution rewrite at all
    assert "torch.aten.conv2d" in _copy_asm(eo, _flags())
    assert environment_key() != key  # the compile cache keys on the choice


def test_what_the_kernel_accepts():
    def accepted(model, x) -> int:
        return len(direct_convs(export(model.eval(), args=(x,)).mlir_module.operation))

    assert accepted(_conv(), torch.randn(1, 16, 8, 8)) == 1
    grouped = torch.nn.Conv2d(16, 16, 3, groups=4)
    assert accepted(grouped, torch.randn(1, 16, 8, 8)) == 0  # groups: IREE's convolution
    transposed = torch.nn.ConvTranspose2d(16, 8, 3)
    assert accepted(transposed, torch.randn(1, 16, 8, 8)) == 0
    assert accepted(torch.nn.Conv1d(16, 8, 3), torch.randn(1, 16, 8)) == 0
    assert accepted(_conv().double(), torch.randn(1, 16, 8, 8, dtype=torch.float64)) == 0


def test_the_reduction_blocks():
    """Segments (kernel rows of KW*C contiguous elements; dilated widths: taps of C) and how
    many fit in a block of kc elements."""
    eo = export(_conv(c=64, f=64).eval(), args=(torch.randn(1, 64, 8, 8),))
    (conv,) = direct_convs(eo.mlir_module.operation)
    g = conv_geometry(conv)
    assert g is not None
    k = Avx512Conv(g)
    assert (k.segments, k.segment_length, k.segments_per_block, k.block_length) == (3, 192, 1, 128)
    eo = export(_conv(c=8, f=16, dilation=2).eval(), args=(torch.randn(1, 8, 9, 9),))
    g = conv_geometry(direct_convs(eo.mlir_module.operation)[0])
    assert g is not None
    k = Avx512Conv(g)
    assert (k.segments, k.segment_length, k.segments_per_block, k.block_length) == (9, 8, 9, 8)


def test_the_blocking_knob(monkeypatch):
    """``TURBINE_CPU_CONV_BLOCKING`` (for measurements): ``fixed`` or fields over it."""
    eo = export(_conv().eval(), args=(torch.randn(2, 16, 9, 11),))
    (conv,) = direct_convs(eo.mlir_module.operation)
    g = conv_geometry(conv)
    assert g is not None
    # the default, measured per CPU vendor (docs/performance.md, section 10), for 128 filters
    wide = replace(g, f=128)
    monkeypatch.setattr(avx512_conv, "cpu_vendor", lambda: "AuthenticAMD")
    assert conv_kernel_for(wide) == Avx512Conv(wide, kc=256)  # reduction blocks of 256
    monkeypatch.setattr(avx512_conv, "cpu_vendor", lambda: "GenuineIntel")
    intel = conv_kernel_for(wide)  # 6 x 64 blocks, 96-row workgroups, blocks of 128, prefetch
    assert intel == Avx512Conv(wide, mr=6, rows_per_workgroup=96, prefetch=1, prefetch_locality=2)
    assert intel.name.endswith("_6x64x128_96x64_pf1l2")
    # this one's 70 filters: panels of 32 (96 columns, not 128) in 12-row register blocks
    narrow = conv_kernel_for(g)
    assert (narrow.nr, narrow.mr, narrow.cols_per_workgroup, narrow.np_) == (32, 12, 32, 96)
    assert narrow.name.endswith("_12x32x128_96x32_pf1l2")
    monkeypatch.setattr(avx512_conv, "cpu_vendor", lambda: "")  # unknown: the AMD choice
    assert conv_kernel_for(wide) == Avx512Conv(wide, kc=256)
    assert conv_kernel_for(g) == Avx512Conv(g, kc=256, nr=32, mr=12, cols_per_workgroup=32)
    key = environment_key()
    monkeypatch.setenv("TURBINE_CPU_CONV_BLOCKING", "fixed")
    assert conv_kernel_for(g) == Avx512Conv(g)  # the matmul kernel's 128
    monkeypatch.setenv("TURBINE_CPU_CONV_BLOCKING", "mr=3, nr=32, kc=40, rows=20, cols=32")
    k = conv_kernel_for(g)
    assert (k.mr, k.nr, k.kc, k.rows_per_workgroup, k.cols_per_workgroup) == (3, 32, 40, 20, 32)
    assert environment_key() != key  # the compile cache keys on it
    assert "f96_k3x3_s1x1_p1x1_d1x1_3x32x40_20x32_pf0" in _copy_asm(eo, _flags())
    for bad in ("rows=lots", "tiles=4", "mr=9"):  # mr=9: 36 accumulators, too many
        monkeypatch.setenv("TURBINE_CPU_CONV_BLOCKING", bad)
        with pytest.raises(
            ValueError, match=r"AVX-512 convolution kernel|TURBINE_CPU_CONV_BLOCKING"
        ):
            conv_kernel_for(g)


def test_the_panel_width_follows_the_output_channels():
    """Few output channels get narrower panels: the share of useful columns times the
    measured rate of each width (64: 1, 32: 0.85, 16: 0.5; docs/performance.md, section 17)."""
    widths = {f: panel_width(f) for f in (3, 16, 24, 32, 40, 64, 70, 80, 112, 120, 160, 184, 960)}
    assert widths == {
        3: 16, 16: 16,  # 64 would compute 4x (and more) the outputs
        24: 32, 32: 32, 70: 32, 80: 32, 160: 32,
        40: 64, 64: 64, 112: 64, 120: 64, 184: 64, 960: 64,
    }  # fmt: skip
    eo = export(_conv(16, 16).eval(), args=(torch.randn(1, 16, 9, 9),))
    g = conv_geometry(direct_convs(eo.mlir_module.operation)[0])
    assert g is not None
    k = conv_kernel_for(g)
    assert (k.nr, k.mr, k.np_) == (16, 12, 16)  # 16 filters: no padded columns at all


@needs_avx512
def test_another_blocking_gives_the_same_values_bit_for_bit(monkeypatch):
    """Each output element's sum runs over the reduction in the same order whatever the
    blocking, so a blocking changes no value."""
    model = _conv(16, 70, 3, 1, 1, 1, True).eval()
    x = torch.randn(2, 16, 9, 11)
    eo = export(model, args=(x,))
    flags = ["--turbine-cpu-matmul=avx512"]
    default = load_module(eo.compile(None, extra_args=flags)).main(x)
    blockings = (
        "kc=256",  # the AMD default
        "mr=6,rows=96,pf=1,pfl=2",  # the Intel default (prefetch: no value changes either)
        "fixed",
        "mr=3,nr=32,kc=40,rows=20,cols=32,pf=2,pfl=3",
    )
    for blocking in blockings:
        monkeypatch.setenv("TURBINE_CPU_CONV_BLOCKING", blocking)
        other = load_module(eo.compile(None, extra_args=flags)).main(x)
        assert torch.equal(default, other), blocking
    with torch.no_grad():
        torch.testing.assert_close(other, model(x), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------- numerics
_GEOMETRIES = {
    # name: (C, F, kernel, stride, padding, dilation, bias, batch, H, W)
    "3x3-tails": (16, 70, 3, 1, 1, 1, True, 2, 9, 11),  # F 70 -> 128, rows 198 = 49 * 4 + 2
    "3x3-stride2": (64, 64, 3, 2, 1, 1, False, 1, 14, 14),
    "1x1-stride2-long-channels": (200, 64, 1, 2, 0, 1, True, 1, 8, 8),  # one block of 200
    "1x1": (64, 256, 1, 1, 0, 1, False, 1, 7, 7),
    "dilated": (8, 16, 3, 1, 2, 2, True, 1, 7, 9),  # per-tap segments
    "rectangular": (32, 48, (3, 5), (2, 1), (1, 2), (2, 1), True, 1, 11, 10),
    "stem": (3, 64, 7, 2, 3, 1, True, 1, 32, 32),  # segments of 21, all seven in one block
    "long-rows": (130, 20, 3, 1, 1, 1, False, 1, 5, 5),  # a segment of 390: 256 + 134
    "no-padding": (24, 40, 3, 1, 0, 1, True, 3, 6, 7),
    "many-rows": (8, 24, 3, 1, 1, 1, True, 1, 23, 23),  # 529 rows: 4 workgroups of 128 + 17
    "16-filters": (3, 16, 3, 2, 1, 1, False, 1, 33, 31),  # panels of 16: MobileNetV3's stem
    "80-filters": (240, 80, 1, 1, 0, 1, True, 2, 5, 7),  # panels of 32, 12-row tails
}


@needs_avx512
@pytest.mark.parametrize("vendor", ["AuthenticAMD", "GenuineIntel"])
@pytest.mark.parametrize("name", sorted(_GEOMETRIES))
def test_the_kernel_matches_eager(name, vendor, monkeypatch):
    """Every geometry under each vendor's blocking (AMD: 4 x 64 blocks, 128-row workgroups;
    Intel: 6 x 64 blocks and their 1-5-row tails, 96-row workgroups, the L2 prefetch clamped
    at the weight's end)."""
    monkeypatch.setattr(avx512_conv, "cpu_vendor", lambda: vendor)
    c, f, k, s, p, d, bias, n, h, w = _GEOMETRIES[name]
    model = _conv(c, f, k, s, p, d, bias).eval()
    x = torch.randn(n, c, h, w)
    eo = export(model, args=(x,))
    assert len(direct_convs(eo.mlir_module.operation)) == 1
    got = load_module(eo.compile(None, extra_args=["--turbine-cpu-matmul=avx512"])).main(x)
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class _SharedInput(torch.nn.Module):
    """A strided convolution whose (element-wise) input is also an output and feeds a second
    convolution: the pattern of the IREE 3.13 miscompile in ``_compiler.convs``."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(8, 16, 3, 2, 1)
        self.b = torch.nn.Conv2d(8, 16, 1, 2)

    def forward(self, x):
        y = torch.relu(x + 1)
        return self.a(y) + self.b(y), y


class _Block(torch.nn.Module):
    """ResNet's basic block with a strided 1x1 shortcut, batch norms in eval mode."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.c1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(cout)
        self.c2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(cout)
        self.short = torch.nn.Sequential(
            torch.nn.Conv2d(cin, cout, 1, stride, bias=False), torch.nn.BatchNorm2d(cout)
        )

    def forward(self, x):
        y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
        return torch.relu(y + self.short(x))


def _small_resnet() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 7, 2, 3, bias=False),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(3, 2, 1),
        _Block(16, 16, 1),
        _Block(16, 32, 2),
        _Block(32, 64, 2),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 10),
    )
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
    return model.eval()


@needs_avx512
def test_a_shared_elementwise_input_matches_eager():
    torch.manual_seed(0)
    model = _SharedInput().eval()
    x = torch.randn(1, 8, 12, 12)
    eo = export(model, args=(x,))
    assert len(direct_convs(eo.mlir_module.operation)) == 2
    compiled = load_module(eo.compile(None, extra_args=["--turbine-cpu-matmul=avx512"]))
    with torch.no_grad():
        for got, want in zip(compiled.main(x), model(x)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_avx512
def test_a_resnet_matches_eager():
    model = _small_resnet()
    x = torch.randn(2, 3, 64, 64)
    eo = export(model, args=(x,))
    assert len(direct_convs(eo.mlir_module.operation)) == 10  # every convolution
    got = load_module(eo.compile(None, extra_args=["--turbine-cpu-matmul=avx512"])).main(x)
    with torch.no_grad():
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)


@needs_avx512
def test_a_dynamic_batch_keeps_its_1x1_convolutions_as_kernel_matmuls():
    """Dynamic batches are not the direct kernel's (static rows): a 1x1 convolution goes the
    im2col (transpose) + matmul way of ``_compiler.convs``, its matmul on the AVX-512 matmul
    kernel; its 3x3 convolution stays IREE's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(16, 32, 1), torch.nn.ReLU(), torch.nn.Conv2d(32, 8, 3, padding=1)
    ).eval()
    x = torch.randn(2, 16, 8, 8)
    batch = torch.export.Dim("batch", min=1, max=8)
    eo = export(model, args=(x,), dynamic_shapes={"input": {0: batch}})
    asm = _copy_asm(eo, _flags())
    check_ir(
        asm,
        r"func.func private @__turbine_conv_as_matmul_0_mm",
        r"flow.dispatch @__turbine_avx512_f32_gemm_16x32_8x32x128",  # 32 columns: one panel
        r"func.func private @__turbine_conv_as_matmul_0\(",
        r"call @__turbine_conv_as_matmul_0_mm\(%\w+, %\w+\) : \(tensor<\?x16xf32>, "
        r"tensor<16x32xf32>\) -> tensor<\?x32xf32>",
    )
    assert "avx512_f32_conv" not in asm and "torch.aten.conv2d" in asm
    compiled = load_module(eo.compile(None, extra_args=["--turbine-cpu-matmul=avx512"]))
    for n in (1, 3):
        xn = torch.randn(n, 16, 8, 8)
        with torch.no_grad():
            torch.testing.assert_close(compiled.main(xn), model(xn), rtol=1e-5, atol=1e-5)


class _ConvAndLinear(torch.nn.Module):
    """A 1x1 convolution (16 -> 32 channels) and a Linear(16, 32) over the same dynamic batch:
    the conv rewrite and the matmul rewrite both call the 16x32 matmul kernel."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 32, 1)
        self.fc = torch.nn.Linear(16, 32)

    def forward(self, x, v):
        return self.conv(x).mean(dim=(2, 3)) + self.fc(v)


@needs_avx512
def test_two_rewrites_calling_the_same_kernel_share_its_one_executable():
    torch.manual_seed(0)
    model = _ConvAndLinear().eval()
    x, v = torch.randn(2, 16, 4, 4), torch.randn(2, 16)
    batch = torch.export.Dim("batch", min=1, max=8)
    eo = export(model, args=(x, v), dynamic_shapes={"x": {0: batch}, "v": {0: batch}})
    asm = _copy_asm(eo, _flags())
    executables = re.findall(r"stream.executable private @(\w+)", asm)
    assert any(e.startswith("__turbine_avx512_f32_gemm_16x") for e in executables), executables
    assert len(executables) == len(set(executables)), executables  # each kernel once
    assert "call @__turbine_conv_as_matmul_0_mm" in asm and "torch.aten.linear" not in asm
    compiled = load_module(eo.compile(None, extra_args=["--turbine-cpu-matmul=avx512"]))
    for n in (1, 3):
        xn, vn = torch.randn(n, 16, 4, 4), torch.randn(n, 16)
        with torch.no_grad():
            torch.testing.assert_close(compiled.main(xn, vn), model(xn, vn), rtol=1e-5, atol=1e-5)


def test_with_precision_bf16_the_convolutions_run_in_bf16_on_the_kernel():
    """``precision="bf16"`` puts the matmuls on a bf16 kernel (AMX, else AVX512-BF16) and the
    convolutions on AMX's (test_cpu_conv_amx.py), else on the direct-convolution kernel's bf16
    form."""
    from turbine_aot._compiler.bf16 import bf16_kernel_kind

    kind = bf16_kernel_kind()
    if kind is None:
        pytest.skip("this CPU has neither AMX-BF16 nor AVX512-BF16")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(8, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(16 * 6 * 6, 10),
    ).eval()
    x = torch.randn(1, 8, 6, 6)
    eo = export(model, args=(x,))
    asm = _copy_asm(eo, _flags("--turbine-precision=bf16"))
    assert ("amx_bf16_conv" if kind == "amx" else "avx512_bf16_conv") in asm
    assert "avx512_f32_conv" not in asm
    assert ("amx_bf16_gemm" if kind == "amx" else "avx512_bf16_gemm") in asm
    got = load_module(eo.compile(None, precision="bf16")).main(x)
    with torch.no_grad():
        torch.testing.assert_close(got, model(x), rtol=0.0, atol=5e-2)
