"""Element-wise ops absorbed into the store of turbine's AVX-512 kernels (``_compiler.epilogues``):
which patterns the compile copy fuses, which it leaves, and that the values stay eager's (and
bit for bit those of the unfused module, ``TURBINE_CPU_EPILOGUES=keep``)."""

from __future__ import annotations

import re

import pytest
import torch
from ir_check import check_ir
from kernel_testing import compile_copy_asm, host_flags, needs_avx2

from turbine_aot import export
from turbine_aot._compiler import matmuls
from turbine_aot._compiler.activations import SILU_ENV
from turbine_aot._compiler.epilogues import EPILOGUE_ENV
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.rewrites import environment_key
from turbine_aot.runtime import load_module


@pytest.fixture(autouse=True)
def _default_epilogues(monkeypatch):
    """Every test starts from the default epilogues (``TURBINE_CPU_EPILOGUES`` unset)."""
    monkeypatch.delenv("TURBINE_CPU_EPILOGUES", raising=False)


#: ReLU in a kernel's store, as torch's: ``v < 0 ? 0 : v`` (``_compiler.activations.relu_line``;
#: plain arith, one vmaxps on AVX-512 targets)
_RELU = r"arith.select %\w+, %cst, %\w+ : vector<16xi1>, vector<16xf32>"
#: The kernels blocked for AVX-512, the default on an AVX-512 CPU; on an AVX2 one LLVM splits
#: their vectors (the builds the tests of fused stores compare with eager on any CPU with AVX2).
_AVX512 = ["--turbine-cpu-matmul=avx512"]


def _flags() -> list[str]:
    return [*default_compile_flags("llvm-cpu", use_env=False), "--turbine-cpu-matmul=avx512"]


def _main(asm: str) -> str:
    """The text of the compile copy's public ``main`` (where torch's ops are)."""
    start = asm.index("func.func @main")
    return asm[start : asm.index("\n  }", start)]


class _Mlp(torch.nn.Module):
    """linear + bias + ReLU, linear without bias + ReLU, linear + bias (N 70: padded to 128)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(100, 96)
        self.b = torch.nn.Linear(96, 64, bias=False)
        self.c = torch.nn.Linear(64, 70)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


class _UsedTwice(torch.nn.Module):
    """A linear's output read by its ReLU and by an add: nothing may be absorbed after the
    bias (the add still needs the value before the ReLU)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(64, 64)

    def forward(self, x):
        y = self.a(x)
        return torch.relu(y) + y


# ------------------------------------------------------------------------------------- matmuls
def test_bias_and_relu_are_absorbed_into_the_matmul_kernel(monkeypatch):
    monkeypatch.setattr(matmuls, "host_avx512_missing", lambda: [])
    eo = export(_Mlp(), args=(torch.randn(8, 100),))
    asm = compile_copy_asm(eo, _flags())
    check_ir(
        asm,
        r"stream.executable private @__turbine_avx512_f32_gemm_100x128_4x64x128_128x64_bias_relu",
        r"stream.binding.subspan %arg2\[%c0\] : !stream.binding -> memref<128xf32>$",  # bias
        r"%\w+:16 = scf.if %\w+ -> \(vector<16xf32>",  # the last block's epilogue
        r"arith.addf %\w+#0, %\w+ : vector<16xf32>",  # + bias
        _RELU,
        # (8 rows: each kernel also prefetches the next K block, 2 lines a step: "_pf2")
        r"stream.executable private @__turbine_avx512_f32_gemm_96x64_4x64x128_128x64_relu_pf2",
        # (its C written as [8, 70]: "_n70")
        r"stream.executable private @__turbine_avx512_f32_gemm_64x128_4x64x128_128x64_bias_pf2_n70 ",
    )
    check_ir(asm, r"tensor.pad %arg2 low\[0\] high\[58\]")  # c's bias: N 70 -> 128, zeros
    main = _main(asm)
    assert "torch.aten.relu" not in main and "torch.aten.add.Tensor" not in main
    assert main.count("call @__turbine_avx512_matmul_") == 3
    # TURBINE_CPU_EPILOGUES=keep: the kernels store their sums, the ops stay
    monkeypatch.setenv("TURBINE_CPU_EPILOGUES", "keep")
    kept = compile_copy_asm(eo, _flags())
    assert "_bias" not in kept and "_relu" not in kept and "scf.if %last" not in kept
    assert _main(kept).count("torch.aten.relu") == 2
    assert _main(kept).count("torch.aten.add.Tensor") == 2


def test_a_value_used_twice_is_not_absorbed(monkeypatch):
    monkeypatch.setattr(matmuls, "host_avx512_missing", lambda: [])
    eo = export(_UsedTwice(), args=(torch.randn(8, 64),))
    main = _main(compile_copy_asm(eo, _flags()))
    # the bias add is the mm's one use and absorbed; its result has two uses: the ReLU stays
    assert "torch.aten.relu" in main
    assert main.count("torch.aten.add.Tensor") == 1  # relu(y) + y
    assert "call @__turbine_avx512_matmul_0(" in main


@needs_avx2
@pytest.mark.parametrize("model", [_Mlp, _UsedTwice])
@pytest.mark.parametrize("rows", [1, 7, 130])
def test_fused_matmuls_match_eager_and_the_unfused_module(model, rows, monkeypatch):
    module = model().eval()
    k = 100 if model is _Mlp else 64
    x = torch.randn(rows, k)
    eo = export(module, args=(x,))
    fused = load_module(eo.compile(save_to=None, extra_args=_AVX512)).main(x)
    monkeypatch.setenv("TURBINE_CPU_EPILOGUES", "keep")
    kept = load_module(eo.compile(save_to=None, extra_args=_AVX512)).main(x)
    torch.testing.assert_close(fused, module(x), rtol=1e-5, atol=1e-5)
    assert torch.equal(fused, kept)  # the same additions, in the same order


@needs_avx2
@pytest.mark.parametrize("blocking", ["avx2", "avx512"])
def test_relu_in_the_stores_keeps_nan_as_eager(blocking):
    # ReLU in the matmul and convolution kernels' stores is v < 0 ? 0 : v
    # (_compiler.activations.relu_line): a NaN stays NaN, as in eager. Either blocking on any
    # CPU with AVX2: the AVX-512 one built for a CPU without AVX-512 once gave wrong values
    # (its ReLU was an AVX-512 instruction in inline assembly)
    flags = [f"--turbine-cpu-matmul={blocking}"]
    x = torch.randn(5, 100)
    x[3, 7] = float("nan")  # row 3 is NaN through every linear
    mlp = _Mlp().eval()
    got = load_module(export(mlp, args=(x,)).compile(save_to=None, extra_args=flags)).main(x)
    with torch.no_grad():
        want = mlp(x)
    assert torch.isnan(want[3]).all() and not torch.isnan(want[[0, 1, 2, 4]]).any()
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    torch.testing.assert_close(got[[0, 1, 2, 4]], want[[0, 1, 2, 4]], rtol=1e-5, atol=1e-5)
    block = _Block().eval()
    xi = torch.randn(1, 64, 9, 9)
    xi[0, 5, 4, 4] = float("nan")  # spreads to its 3x3 and 5x5 neighbourhoods
    eo = export(block, args=(xi,))
    got = load_module(eo.compile(save_to=None, extra_args=flags)).main(xi)
    with torch.no_grad():
        want = block(xi)
    assert torch.isnan(want).any() and not torch.isnan(want).all()
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    finite = ~torch.isnan(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-4, atol=1e-4)


# -------------------------------------------------------------------------------- convolutions
def _bn(f: int) -> torch.nn.BatchNorm2d:
    bn = torch.nn.BatchNorm2d(f)
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    bn.weight.data.uniform_(0.5, 1.5)
    bn.bias.data.uniform_(-1, 1)
    return bn


class _Block(torch.nn.Module):
    """A ResNet basic block: conv + bn + ReLU, conv + bn + residual add + ReLU (``f`` 70: the
    channels padded to 128, so the residual add stays IREE's), a strided 1x1 downsample (conv +
    bn alone) when ``stride`` is 2."""

    def __init__(self, c: int = 64, f: int = 64, stride: int = 1, bias: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.c1 = torch.nn.Conv2d(c, f, 3, stride=stride, padding=1, bias=bias)
        self.b1 = _bn(f)
        self.c2 = torch.nn.Conv2d(f, f, 3, padding=1, bias=bias)
        self.b2 = _bn(f)
        self.down = None
        if stride != 1 or c != f:
            self.down = torch.nn.Sequential(torch.nn.Conv2d(c, f, 1, stride=stride), _bn(f))

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + identity)


class _ConvUsedTwice(torch.nn.Module):
    """A convolution's output read by its batch norm and by an add: nothing is absorbed."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c = torch.nn.Conv2d(16, 64, 3, padding=1, bias=False)
        self.b = _bn(64)

    def forward(self, x):
        y = self.c(x)
        return torch.relu(self.b(y)) + y


class _Affine(torch.nn.Module):
    """Per-channel ``[F, 1, 1]`` steps after convolutions, as ``torch.export`` writes a batch
    norm it decomposes (torchvision's ResNet-50 here): ``(y - mean) * invstd * weight + bias``,
    then a scale and a shift alone."""

    def __init__(self, bias: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.c1 = torch.nn.Conv2d(32, 64, 3, padding=1, bias=bias)
        self.c2 = torch.nn.Conv2d(64, 64, 3, padding=1, bias=bias)
        for name in ("mean", "invstd", "weight", "shift"):
            self.register_buffer(name, torch.rand(64, 1, 1) + 0.5)

    def forward(self, x):
        y = torch.relu((self.c1(x) - self.mean) * self.invstd * self.weight + self.shift)
        return self.c2(y) * self.invstd + self.shift


class _Activated(torch.nn.Module):
    """MobileNetV3's (hardswish) or EfficientNet's (SiLU) activations: a strided convolution +
    batch norm + activation read only by a padded strided 3x3 convolution + batch norm +
    activation (not Winograd's), then a depthwise one + batch norm + activation, then a 1x1
    projection (no activation)."""

    def __init__(self, act: str = "hardswish"):
        super().__init__()
        torch.manual_seed(0)
        self.act = getattr(torch.nn.functional, act)
        self.c1, self.b1 = torch.nn.Conv2d(16, 64, 3, 2, 1, bias=False), _bn(64)
        self.c2, self.b2 = torch.nn.Conv2d(64, 64, 3, 2, 1, bias=False), _bn(64)
        self.dw, self.b3 = torch.nn.Conv2d(64, 64, 3, 1, 1, groups=64, bias=False), _bn(64)
        self.proj = torch.nn.Conv2d(64, 24, 1)

    def forward(self, x):
        y = self.act(self.b2(self.c2(self.act(self.b1(self.c1(x))))))
        return self.proj(self.act(self.b3(self.dw(y))))


def test_hardswish_is_absorbed_into_the_direct_and_depthwise_kernels(monkeypatch):
    monkeypatch.setattr(matmuls, "host_avx512_missing", lambda: [])
    eo = export(_Activated().eval(), args=(torch.randn(1, 16, 16, 16),))
    asm = compile_copy_asm(eo, _flags())
    check_ir(
        asm,
        # c1: its output read only by c2 (padding 1), so written padded, hardswish'd
        r"stream.executable private @__turbine_avx512_f32_conv_n1_c16_h16_w16_f64_k3x3_\w+"
        r"_scale_shift_hardswish_opad1x1 ",
        # torch's hardswish in the order IREE computes it: min(max(x + 3, 0), 6) / 6 * x
        r"arith.addf %\w+, %\w+ : vector<16xf32>",
        r"arith.maximumf %\w+, %\w+ : vector<16xf32>",
        r"arith.minimumf %\w+, %\w+ : vector<16xf32>",
        r"arith.divf %\w+, %\w+ : vector<16xf32>",
        r"arith.mulf %\w+, %\w+ : vector<16xf32>",
        # c2: read only by the depthwise convolution (padding 1): written padded for it too
        r"stream.executable private @__turbine_avx512_f32_conv_n1_c64_h8_w8_f64_k3x3_\w+"
        r"_scale_shift_hardswish_opad1x1 ",
    )
    assert (
        "@__turbine_avx512_f32_dwconv_n1_c64_h4_w4_k3x3_s1x1_p1x1_d1x1_scale_shift_hardswish" in asm
    )
    main = _main(asm)
    assert "torch.aten.hardswish" not in main and "torch.aten.batch_norm" not in main
    monkeypatch.setenv("TURBINE_CPU_EPILOGUES", "keep")
    assert _main(compile_copy_asm(eo, _flags())).count("torch.aten.hardswish") == 3
    # the Winograd form takes no hardswish: it stays IREE's after that kernel
    monkeypatch.delenv("TURBINE_CPU_EPILOGUES")
    wide = torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3, 1, 1), torch.nn.Hardswish()).eval()
    main = _main(compile_copy_asm(export(wide, args=(torch.randn(1, 64, 14, 14),)), _flags()))
    assert "call @__turbine_avx512_conv_0(" in main and "torch.aten.hardswish" in main


def test_silu_is_absorbed_with_turbines_exp(monkeypatch):
    monkeypatch.setattr(matmuls, "host_avx512_missing", lambda: [])
    eo = export(_Activated("silu").eval(), args=(torch.randn(1, 16, 16, 16),))
    asm = compile_copy_asm(eo, _flags())
    check_ir(
        asm,
        r"stream.executable private @__turbine_avx512_f32_conv_n1_c16_h16_w16_f64_k3x3_\w+"
        r"_scale_shift_silu_opad1x1 ",
        # 1 / (1 + exp(-x)) * x, exp(-x) as 2^n exp(r): exp(r) a polynomial, 2^n added into
        # the exponent's bits
        r"arith.negf %\w+ : vector<16xf32>",
        r"arith.cmpf ogt, %\w+, %\w+ : vector<16xf32>",  # the clamp
        r"arith.cmpf olt, %\w+, %\w+ : vector<16xf32>",
        r"(%\w+) = vector.fma %\w+, %\w+, %\w+ : vector<16xf32>",  # n, rounded
        *[r"vector.fma %\w+, %\w+, %\w+ : vector<16xf32>"] * 8,  # r; the polynomial
        r"arith.shli %\w+, %\w+ : vector<16xi32>",
        r"arith.addi %\w+, %\w+ : vector<16xi32>",
        r"arith.addf %\w+, %\w+ : vector<16xf32>",
        r"arith.divf %\w+, %\w+ : vector<16xf32>",
        r"arith.mulf %\w+, %\w+ : vector<16xf32>",
    )
    assert "math.exp" not in asm
    assert "_dwconv_n1_c64_h4_w4_k3x3_s1x1_p1x1_d1x1_scale_shift_silu" in asm
    assert "torch.aten.silu" not in _main(asm)
    # the A/B baseline: IREE's math.exp, as IREE compiles torch-mlir's SiLU; the compile cache
    # keys on the choice
    key = environment_key()
    monkeypatch.setenv(SILU_ENV, "iree")
    assert environment_key() != key
    check_ir(
        compile_copy_asm(eo, _flags()),
        r"_scale_shift_silu_opad1x1 ",
        r"arith.negf %\w+ : vector<16xf32>",
        r"math.exp %\w+ : vector<16xf32>",
        r"arith.divf %\w+, %\w+ : vector<16xf32>",
    )


class _Identity(torch.nn.Module):
    """A 1x1 convolution (``depthwise``: a 3x3 depthwise one) whose weights copy each channel
    (a sum of the input times 1 and zeros: exact), then SiLU, in turbine's direct (depthwise)
    kernel: its output is SiLU of the input itself."""

    def __init__(self, depthwise: bool):
        super().__init__()
        if depthwise:
            self.conv = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False)
            w = torch.zeros(16, 1, 3, 3)
            w[:, :, 1, 1] = 1
        else:
            self.conv = torch.nn.Conv2d(16, 16, 1, bias=False)
            w = torch.eye(16).reshape(16, 16, 1, 1)
        self.conv.weight.data.copy_(w)

    def forward(self, x):
        return torch.nn.functional.silu(self.conv(x))


@needs_avx2
@pytest.mark.parametrize("depthwise", [False, True], ids=["direct", "depthwise"])
def test_silu_is_accurate_over_its_whole_range(depthwise):
    """SiLU of -100 .. 100 (past both ends of exp's clamp: [-86.5, 88] in -x, so [-88, 86.5] in
    x) and a NaN, in the direct and the depthwise kernels: within 2.5e-7 (2 ulp) of the exact
    value (float64), as close as eager's (its own exp); beyond the clamp, where the exact value
    is below 1e-36, off by at most 1e-35; NaN stays NaN."""
    x = torch.cat([torch.linspace(-100, 100, 16 * 12 * 12 - 3), torch.tensor([-1e-30, 0.0, 5e-8])])
    x = x[torch.randperm(x.numel(), generator=torch.Generator().manual_seed(0))]
    x = x.reshape(1, 16, 12, 12).contiguous()
    x[0, 3, 5, 7] = float("nan")  # the 1x1 kernel sums 0 * NaN: that pixel is NaN throughout
    module = _Identity(depthwise).eval()
    eo = export(module, args=(x,))
    asm = compile_copy_asm(eo, host_flags())
    assert ("_dwconv_" if depthwise else "_conv_") in asm and "_silu" in asm
    got = load_module(eo.compile(save_to=None)).main(x)
    eager = module(x)
    assert torch.equal(got.isnan(), eager.isnan()) and got.isnan().any()
    exact = torch.nn.functional.silu(module.conv.double()(x.double()))
    ok = ~exact.isnan()
    got, exact, eager = got[ok].double(), exact[ok], eager[ok].double()
    torch.testing.assert_close(got, exact, rtol=2.5e-7, atol=1e-35)
    torch.testing.assert_close(eager, exact, rtol=2.5e-7, atol=1e-35)


def test_a_decomposed_batch_norm_is_absorbed(monkeypatch):
    monkeypatch.setattr(matmuls, "host_avx512_missing", lambda: [])
    monkeypatch.setenv("TURBINE_CPU_WINOGRAD", "off")  # c2 on the direct kernel
    eo = export(_Affine().eval(), args=(torch.randn(1, 32, 9, 9),))
    asm = compile_copy_asm(eo, _flags())
    main = _main(asm)
    for op in ("sub.Tensor", "mul.Tensor", "add.Tensor", "relu"):
        assert f"torch.aten.{op}" not in main
    check_ir(asm, r"@__turbine_avx512_f32_conv_\w+_scale_shift_relu_opad1x1 ")
    check_ir(asm, r"@__turbine_avx512_f32_conv_\w+_pf\w*_scale_shift ")
    monkeypatch.delenv("TURBINE_CPU_WINOGRAD")  # c2 in Winograd form: the same epilogue
    asm = compile_copy_asm(eo, _flags())
    check_ir(asm, r"@__turbine_avx512_f32_conv_\w+_scale_shift_relu_opad1x1 ")
    check_ir(asm, r"@__turbine_winograd_f2x3_n1_c64_h9_w9_f64_p1x1_scale_shift ")


def test_batch_norm_residual_and_relu_are_absorbed_into_the_conv_kernel(monkeypatch):
    """The direct kernel's epilogues (its 64-channel 3x3 convolutions would be Winograd's by
    default: ``test_cpu_conv_winograd.py`` checks the same absorption there)."""
    monkeypatch.setattr(matmuls, "host_avx512_missing", lambda: [])
    monkeypatch.setenv("TURBINE_CPU_WINOGRAD", "off")
    eo = export(_Block().eval(), args=(torch.randn(1, 64, 10, 10),))
    asm = compile_copy_asm(eo, _flags())
    check_ir(
        asm,
        # conv1's output is read only by conv2 (padding 1): written zero-padded, 12 x 12
        r"stream.executable private @__turbine_avx512_f32_conv_n1_c64_h10_w10_f64_k3x3_\w+"
        r"_scale_shift_relu_opad1x1 ",
        r"vector.store %cst, %\w+\[%\w+, %\w+\] : memref<144x64xf32>",  # the zero border
        r"arith.mulf %\w+#0, %\w+ : vector<16xf32>",  # * scale
        r"arith.addf %\w+, %\w+ : vector<16xf32>",  # + shift
        _RELU,
        r"stream.executable private @__turbine_avx512_f32_conv_n1_c64_h10_w10_f64_k3x3_\w+"
        r"_scale_shift_residual_relu ",
        r"vector.load %\w+\[%\w+, %\w+\] : memref<100x64xf32>, vector<16xf32>",  # the residual
    )
    # the batch norm folded from its parameters (a constant expression: hoisted by IREE)
    check_ir(asm, r"math.sqrt %\w+ : f32", r"arith.divf %\w+, %\w+ : f32")
    main = _main(asm)
    # conv2 reads conv1's padded C as it is: no padding of its input (only x's, for conv1)
    check_ir(
        main,
        r"%(\w+):2 = call @__turbine_avx512_conv_0\(",
        r"call @__turbine_avx512_conv_1\(%\w+#1, ",
    )
    assert asm.count("tensor.pad %") == 1
    for op in ("batch_norm", "relu", "add.Tensor"):
        assert f"torch.aten.{op}" not in main
    assert main.count("call @__turbine_avx512_conv_") == 2
    # =nopad: the ops absorbed, conv2 pads conv1's output itself (IREE's copy between them)
    monkeypatch.setenv("TURBINE_CPU_EPILOGUES", "nopad")
    nopad = compile_copy_asm(eo, _flags())
    assert "_opad" not in nopad and nopad.count("tensor.pad %") == 2
    assert "torch.aten.batch_norm" not in _main(nopad)
    monkeypatch.setenv("TURBINE_CPU_EPILOGUES", "keep")
    kept = _main(compile_copy_asm(eo, _flags()))
    assert kept.count("torch.aten.batch_norm") == 2 and kept.count("torch.aten.relu") == 2


def test_a_conv_output_used_twice_is_not_absorbed(monkeypatch):
    monkeypatch.setattr(matmuls, "host_avx512_missing", lambda: [])
    eo = export(_ConvUsedTwice().eval(), args=(torch.randn(1, 16, 8, 8),))
    main = _main(compile_copy_asm(eo, _flags()))
    assert "torch.aten.batch_norm" in main and "torch.aten.relu" in main
    assert "call @__turbine_avx512_conv_0(" in main


@needs_avx2
@pytest.mark.parametrize(
    ("model", "x"),
    [
        (lambda: _Block(), (1, 64, 10, 10)),  # bn + ReLU; bn + residual + ReLU
        (lambda: _Block(bias=True), (2, 64, 7, 9)),  # the convolutions' biases folded too
        (lambda: _Block(32, 64, stride=2), (1, 32, 12, 12)),  # a downsample: conv + bn alone
        (lambda: _Block(64, 70), (1, 64, 6, 6)),  # 70 channels: the residual add stays apart
        (lambda: _Block(16, 16), (1, 16, 10, 10)),  # panels of 16: padded output, residual
        (lambda: _Block(32, 32, stride=2), (2, 32, 9, 9)),  # panels of 32
        (_ConvUsedTwice, (1, 16, 8, 8)),  # nothing absorbed
        (_Affine, (1, 32, 9, 9)),  # a decomposed batch norm, a scale and shift alone
        (lambda: _Affine(bias=True), (2, 32, 5, 7)),
        (_Activated, (1, 16, 16, 16)),  # hardswish in the direct and depthwise kernels
        (_Activated, (2, 16, 11, 9)),
        (lambda: _Activated("silu"), (1, 16, 16, 16)),  # SiLU
        (lambda: _Activated("silu"), (2, 16, 11, 9)),
    ],
    ids=[
        "block",
        "bias",
        "downsample",
        "padded-channels",
        "narrow-16",
        "narrow-32",
        "used-twice",
        "affine",
        "affine-bias",
        "hardswish",
        "hardswish-odd",
        "silu",
        "silu-odd",
    ],
)
def test_fused_convolutions_match_eager(model, x, monkeypatch):
    module = model().eval()
    torch.manual_seed(1)
    inp = torch.randn(*x)
    eo = export(module, args=(inp,))
    fused = load_module(eo.compile(save_to=None, extra_args=_AVX512)).main(inp)
    monkeypatch.setenv("TURBINE_CPU_EPILOGUES", "nopad")
    nopad = load_module(eo.compile(save_to=None, extra_args=_AVX512)).main(inp)
    monkeypatch.setenv("TURBINE_CPU_EPILOGUES", "keep")
    kept = load_module(eo.compile(save_to=None, extra_args=_AVX512)).main(inp)
    expected = module(inp)
    assert torch.equal(fused, nopad)  # a padded output holds the same values
    # the batch norm folded into a scale and a shift rounds differently from torch-mlir's
    # (x - mean) / sqrt(var + eps) * weight + bias: equal within fp32 tolerance, not bit for bit
    torch.testing.assert_close(fused, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kept, expected, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------ an expansion written padded for its depthwise
class _Expansion(torch.nn.Module):
    """An inverted residual block as EfficientNet and MobileNetV3 have it: a 1x1 expansion +
    batch norm + activation read only by a depthwise ``k`` x ``k`` convolution (padding
    ``k // 2``) + batch norm + activation, then a 1x1 projection (and the residual add at
    stride 1)."""

    def __init__(self, c: int, e: int, k: int = 3, stride: int = 1, act: str = "silu"):
        super().__init__()
        torch.manual_seed(0)
        self.act = getattr(torch.nn.functional, act)
        self.stride = stride
        self.expand, self.b1 = torch.nn.Conv2d(c, e, 1, bias=False), _bn(e)
        self.dw = torch.nn.Conv2d(e, e, k, stride, k // 2, groups=e, bias=False)
        self.b2 = _bn(e)
        self.proj = torch.nn.Conv2d(e, c, 1)

    def forward(self, x):
        y = self.act(self.b2(self.dw(self.act(self.b1(self.expand(x))))))
        y = self.proj(y)
        return y + x if self.stride == 1 else y


def _private(asm: str, name: str) -> str:
    """The text of the compile copy's private function ``name``."""
    start = asm.index(f"func.func private @{name}(")
    return asm[start : asm.index("\n  }", start)]


@pytest.mark.parametrize(("c", "e"), [(16, 96), (24, 72)])
def test_an_expansion_is_written_padded_for_the_depthwise_convolution_after_it(c, e, monkeypatch):
    """The 1x1 kernel writes its C zero-padded as the depthwise kernel reads it, all of its
    panels' columns (72 channels: 80, the zero columns being the channels the depthwise kernel
    pads with), so IREE copies nothing between the two (EfficientNet-B0: 16 copies, 126 us of
    a 5 ms call, on the Zen 3 of docs/performance.md section 24)."""
    flags = host_flags("--turbine-cpu-matmul=avx2")
    eo = export(_Expansion(c, e).eval(), args=(torch.randn(1, c, 12, 12),))
    asm = compile_copy_asm(eo, flags)
    np_ = -(-e // 16) * 16
    check_ir(
        asm,
        rf"stream.executable private @__turbine_avx512_f32_conv_n1_c{c}_h12_w12_f{np_}_k1x1_\w+"
        r"_scale_shift_silu_opad1x1 ",
        # 14 x 14 rows: the 12 x 12 pixels and their zero border
        rf"flow.dispatch @__turbine_avx512_f32_conv_n1_c{c}_h12_w12_f{np_}_\w+::.* -> "
        rf"tensor<196x{np_}xf32>$",
    )
    dw = _private(asm, "__turbine_avx512_conv_depthwise_0")
    # the depthwise kernel reads that C as it is (no transpose to channels-last, no padding)
    assert dw.startswith(
        f"func.func private @__turbine_avx512_conv_depthwise_0(%arg0: tensor<{196 * np_}xf32>"
    )
    assert "linalg.transpose ins(%arg0" not in dw
    conv = re.search(r"%(\w+):2 = call @__turbine_avx512_conv_0\(", _main(asm))
    assert conv is not None
    assert f"call @__turbine_avx512_conv_depthwise_0(%{conv[1]}#1, " in _main(asm)
    # TURBINE_CPU_EPILOGUES=nopad (or no-depthwise-pad): the depthwise function pads its
    # input itself again
    for setting in ("nopad", "no-depthwise-pad"):
        monkeypatch.setenv(EPILOGUE_ENV, setting)
        nopad = compile_copy_asm(eo, flags)
        assert "_opad" not in nopad, setting
        dw = _private(nopad, "__turbine_avx512_conv_depthwise_0")
        assert "linalg.transpose ins(%arg0" in dw, setting


def _built_both_ways(module, x, monkeypatch, setting: str):
    """``(the default build's result, the result with TURBINE_CPU_EPILOGUES=setting)`` of
    ``module`` on a ``randn(*x)``, the first checked against eager."""
    torch.manual_seed(1)
    inp = torch.randn(*x)
    eo = export(module, args=(inp,))
    fused = load_module(eo.compile(save_to=None)).main(inp)
    torch.testing.assert_close(fused, module(inp), rtol=1e-5, atol=1e-5)
    monkeypatch.setenv(EPILOGUE_ENV, setting)
    return fused, load_module(eo.compile(save_to=None)).main(inp)


@needs_avx2
@pytest.mark.parametrize(
    ("c", "e", "k", "stride", "x"),
    [
        (16, 96, 3, 1, (1, 16, 12, 12)),
        (24, 72, 5, 2, (2, 24, 11, 9)),  # 72 channels: the panels' zero columns are read
        (24, 72, 3, 1, (1, 24, 7, 7)),
        (40, 240, 5, 1, (1, 40, 6, 6)),
    ],
    ids=["96", "72-k5-s2", "72", "240-k5"],
)
def test_expansions_written_padded_match_eager(c, e, k, stride, x, monkeypatch):
    fused, nopad = _built_both_ways(_Expansion(c, e, k, stride).eval(), x, monkeypatch, "nopad")
    assert torch.equal(fused, nopad)  # the padded C holds the values the copy held


# ------------------------------------------------------------- a squeeze-excitation's gate
class _SqueezeExcite(torch.nn.Module):
    """EfficientNet's (SiLU, sigmoid gate), RegNetY's (ReLU, sigmoid) or MobileNetV3's (ReLU,
    hardsigmoid) squeeze-excitation, as torchvision's ``SqueezeExcitation`` computes it, after
    a convolution + batch norm + SiLU and before a 1x1 projection."""

    def __init__(self, c: int = 32, squeeze: int = 8, act: str = "silu", gate: str = "sigmoid"):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.bn = torch.nn.Conv2d(16, c, 3, padding=1, bias=False), _bn(c)
        self.se = torchvision_se(c, squeeze, act, gate)
        self.proj = torch.nn.Conv2d(c, 16, 1)

    def forward(self, x):
        y = torch.nn.functional.silu(self.bn(self.conv(x)))
        return self.proj(self.se(y))


def torchvision_se(c: int, squeeze: int, act: str, gate: str) -> torch.nn.Module:
    """``torchvision.ops.SqueezeExcitation`` without torchvision: an average pooling, two 1x1
    convolutions with ``act`` between them, then ``gate`` scaling the input."""

    class SqueezeExcitation(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Conv2d(c, squeeze, 1)
            self.fc2 = torch.nn.Conv2d(squeeze, c, 1)
            self.act = {"relu": torch.nn.ReLU(), "silu": torch.nn.SiLU()}[act]
            self.gate = {"sigmoid": torch.nn.Sigmoid(), "hardsigmoid": torch.nn.Hardsigmoid()}[gate]

        def forward(self, x):
            s = torch.nn.functional.adaptive_avg_pool2d(x, 1)
            return self.gate(self.fc2(self.act(self.fc1(s)))) * x

    return SqueezeExcitation()


@pytest.mark.parametrize("gate", ["sigmoid", "hardsigmoid"])
def test_the_gate_of_a_squeeze_excitation_is_absorbed(gate, monkeypatch):
    """IREE would fuse the gate into the product it scales and compute it again for every
    element of that product (an ``exp`` and a division per element for a sigmoid); in the
    store of the second 1x1 convolution it is computed once per channel, as IREE computes it:
    sigmoid ``1 / (1 + exp(-x))``, hardsigmoid ``max(min((x + 3) / 6, 1), 0)``."""
    flags = host_flags("--turbine-cpu-matmul=avx2")
    eo = export(_SqueezeExcite(gate=gate).eval(), args=(torch.randn(1, 16, 12, 12),))
    asm = compile_copy_asm(eo, flags)
    body = (
        [r"arith.negf %\w+ : vector<16xf32>", r"math.exp %\w+ : vector<16xf32>"]
        if gate == "sigmoid"
        else [r"arith.divf %\w+, %\w+ : vector<16xf32>", r"arith.minimumf %\w+, %\w+"]
    )
    check_ir(
        asm,
        rf"stream.executable private @__turbine_avx512_f32_conv_n1_c8_h1_w1_f32_k1x1_\w+_shift_{gate} ",
        *body,
        r"arith.maximumf %\w+, %\w+ : vector<16xf32>" if gate == "hardsigmoid" else "arith.divf",
    )
    main = _main(asm)
    assert f"torch.aten.{gate}" not in main and "torch.aten.mul.Tensor" in main
    for setting in ("keep", "no-gates", "nopad,no-gates"):  # the gate left to IREE
        monkeypatch.setenv(EPILOGUE_ENV, setting)
        assert f"torch.aten.{gate}" in _main(compile_copy_asm(eo, flags)), setting


@needs_avx2
@pytest.mark.parametrize(
    ("act", "gate", "x"),
    [
        ("silu", "sigmoid", (1, 16, 12, 12)),
        ("relu", "sigmoid", (2, 16, 7, 9)),
        ("relu", "hardsigmoid", (1, 16, 12, 12)),
    ],
    ids=["efficientnet", "regnety", "mobilenet-v3"],
)
def test_absorbed_gates_match_eager(act, gate, x, monkeypatch):
    module = _SqueezeExcite(40, 10, act, gate).eval()
    fused, kept = _built_both_ways(module, x, monkeypatch, "keep")
    torch.testing.assert_close(fused, kept, rtol=1e-6, atol=1e-6)
