"""``precision="bf16"`` convolutions on the AMX convolution kernel (``_compiler.amx_conv``): which
convolutions the compile copy puts on it (everywhere: the rewrite only), and, on a CPU with
AMX-BF16, that it computes the exact bf16 products (f32 accumulation) for every geometry it
takes, alone and inside a ResNet block (batch norm, residual add, ReLU after it)."""

from __future__ import annotations

import copy
import itertools
import re

import numpy as np
import pytest
import torch
from ir_check import check_ir
from kernel_testing import bf16_reference, compile_copy_asm

from turbine_aot import export
from turbine_aot._compiler import amx_conv, bf16, rewrites, workgroups
from turbine_aot._compiler.amx import host_amx_missing
from turbine_aot._compiler.amx_conv import (
    AMX_CONV_ENV,
    AmxConv,
    amx_conv_plan,
    amx_conv_supports,
)
from turbine_aot._compiler.bf16 import PRECISION_FLAG
from turbine_aot._compiler.convs import Conv, conv_geometry
from turbine_aot._compiler.direct_convs import direct_convs
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.rewrites import environment_key
from turbine_aot.runtime import load_module

_MISSING = host_amx_missing()
needs_amx = pytest.mark.skipif(
    bool(_MISSING), reason=f"this CPU cannot run AMX code (lacks {', '.join(_MISSING)})"
)


@pytest.fixture(autouse=True)
def _default_choices(monkeypatch):
    for name in ("TURBINE_CPU_CONV_MATMUL", "TURBINE_CPU_MATMUL", AMX_CONV_ENV):
        monkeypatch.delenv(name, raising=False)
    # the kernels' usual grids (the names below), whatever this host's core count: the rows
    # per workgroup chosen for several workers have a test of their own
    monkeypatch.setattr(workgroups, "default_workers", lambda: 1)


def _as_on_amx(monkeypatch) -> None:
    """The host checks of the rewrite and of ``precision="bf16"`` answered as on a CPU with AMX
    (for the compile copy only: nothing runs)."""
    monkeypatch.setattr(rewrites, "host_avx512_bf16_missing", lambda: [])
    monkeypatch.setattr(rewrites, "bf16_kernel_kind", lambda: "amx")
    monkeypatch.setattr(bf16, "bf16_kernel_kind", lambda: "amx")


def _run_bf16(eo, *args):
    """The exported program compiled with ``precision="bf16"`` (the host's defaults), called."""
    return load_module(eo.compile(save_to=None, precision="bf16")).main(*args)


def _conv_names(asm: str) -> set[str]:
    """The AMX convolution executables of a compile copy's text."""
    return set(re.findall(r"stream.executable private @(__turbine_amx_bf16_conv_\w+) \{", asm))


def _flags() -> list[str]:
    return [
        *default_compile_flags("llvm-cpu", use_env=False),
        "--turbine-cpu-matmul=avx512",
        f"{PRECISION_FLAG}=bf16",
    ]


class _Mixed(torch.nn.Module):
    """What the AMX kernel takes (any stride, kernel size, padding and channel count; bias or
    none; output channels not a multiple of 32) and what it leaves to the AVX-512 kernel (a
    dilated convolution)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.stem = torch.nn.Conv2d(3, 32, 7, stride=2, padding=3)  # space-to-depth, 3 -> 8 ch
        self.a = torch.nn.Conv2d(32, 64, 3, padding=1)
        self.b = torch.nn.Conv2d(64, 40, 3, padding=1, bias=False)  # F padded to 64
        self.c = torch.nn.Conv2d(40, 64, 1)  # 40 channels padded to 64
        self.d = torch.nn.Conv2d(64, 64, 3, stride=2, padding=1)  # space-to-depth
        self.e = torch.nn.Conv2d(64, 96, 3, padding=2, dilation=2)  # AVX-512: dilated
        self.f = torch.nn.Conv2d(96, 32, 1, stride=2)  # every other row and column

    def forward(self, x):
        x = torch.relu(self.stem(x))
        x = self.c(torch.relu(self.b(torch.relu(self.a(x)))))
        return self.f(torch.relu(self.e(torch.relu(self.d(x)))))


def test_the_compile_copy_puts_undilated_convolutions_on_amx(monkeypatch):
    # the host checks of the rewrite, answered as on a CPU with AMX (no compile here)
    _as_on_amx(monkeypatch)
    eo = export(_Mixed(), args=(torch.randn(1, 3, 32, 32),))
    taken = [amx_conv_supports(conv_geometry(o)) for o in direct_convs(eo.mlir_module)]
    assert taken == [True, True, True, True, True, False, True]
    asm = compile_copy_asm(eo, _flags())
    assert len(re.findall(r"func.func private @__turbine_avx512_conv_amx_\d+\(", asm)) == 6
    assert len(re.findall(r"stream.executable private @__turbine_avx512_bf16_conv_", asm)) == 1
    check_ir(
        asm,
        # each convolution: its kernel's executable, then the function calling it
        # the stem: 4 channels (3 padded) x 2 x 2 phases = 16, a 4x4 kernel (each tile row two
        # neighbouring taps); 16 + 4 rows of a grid 16 + 3 wide; its bias and the ReLU after it in the kernel's epilogue, which also
        # writes the result in bf16 as a's kernel reads its input (19 x 18, the pixels at 1, 1),
        # and only so (a is its one reader)
        r"stream.executable private "
        r"@__turbine_amx_bf16_conv_1x20x19x16_k4x4_f32_ss_relu_to19x18p1x1_nof32_128x32",
        # the workgroups of the first row block write the zeros around the pixels
        r"scf.if ",
        r"vector.store %\w+, %\w+\[%\w+\] : memref<10944xbf16>, vector<16xbf16>",
        # the reduction over the rows of taps and pairs of taps, A tiles read in place (rows 32
        # bytes apart)
        r"scf.for ",
        r"scf.for %\w+ = %\w+ to %\w+ step %c2",
        r"tileloadd",
        r"tdpbf16ps",
        r"tilestored",  # to the scratch block on the stack
        r"vector.load %\w+\[%\w+, %\w+\] : memref<32x48xf32>, vector<16xf32>",
        r"vector.fma",  # the epilogue, over each stored block's pixels
        # ReLU as v < 0 ? 0 : v (NaN and -0.0 kept; one vmaxps on AVX-512)
        r"arith.select %\w+, %\w+, %\w+ : vector<16xi1>, vector<16xf32>",
        r"(arith.truncf %\w+ : vector<16xf32> to vector<16xbf16>|vcvtneps2bf16)",
        r"vector.store %\w+, %\w+\[%\w+\] : memref<10944xbf16>, vector<16xbf16>",
        # the stem's input: zero-padded (channels 3 -> 4), then in space-to-depth order; it
        # returns the NCHW output (for any other reader) and a's input
        r"func.func private @__turbine_avx512_conv_amx_0\(%\w+: tensor<1x3x32x32xf32>.*\) -> "
        r"\(tensor<1x32x16x16xf32>, tensor<10944xbf16>\)",
        r"tensor.pad %\w+ low\[0, 3, 3, 0\] high\[0, 5, 3, 1\]",
        r"permutation = \[0, 1, 3, 2, 4, 5\]",
        r"arith.truncf %\w+ : f32 to bf16",
        # its weight: 7x7 padded to 8x8, taps regrouped (a, b, py, px, c), in AMX's tile order
        r"tensor.pad %\w+ low\[0, 0, 0, 0\] high\[0, 1, 1, 1\]",
        r"permutation = \[2, 4, 3, 5, 1, 0\]",
        r"permutation = \[3, 0, 1, 4, 2\]",
        # a: 16x16 input padded by 1 (one more zero row at the bottom): 19 x 18 x 32 per image,
        # taken as the stem's kernel wrote it (no padding, no conversion); b's input likewise
        r"stream.executable private "
        r"@__turbine_amx_bf16_conv_1x19x18x32_k3x3_f64_ss_relu_to19x18p1x1_nof32_128x64",
        r"func.func private @__turbine_avx512_conv_amx_1\(%\w+: tensor<10944xbf16>, "
        r"%\w+: tensor<64x32x3x3xf32>, %\w+: tensor<64xf32>\) -> "
        r"\(tensor<1x64x16x16xf32>, tensor<21888xbf16>\)",
        r"flow.dispatch @__turbine_amx_bf16_conv_1x19x18x32_k3x3_f64_ss_relu_to19x18p1x1_nof32_",
        # the kernel's 18-wide output grid cut to the 16 real columns
        r"tensor.extract_slice %\w+\[0, 0, 0, 0\] \[1, 16, 16, 64\]",
        # b: 40 filters (padded to 64): not whole panels, so c pads and converts its input
        r"func.func private @__turbine_avx512_conv_amx_2\(%\w+: tensor<21888xbf16>, ",
        r"func.func private @__turbine_avx512_conv_amx_3\(%\w+: tensor<1x40x16x16xf32>, ",
        r"tensor.pad %\w+ low\[0, 0, 0, 0\] high\[0, 1, 0, 24\]",
        # f: every other row and column of its input, as a 1x1 of stride 1
        r"tensor.extract_slice %\w+\[0, 0, 0, 0\] \[1, 5, 4, 96\] \[1, 2, 2, 1\]",
    )
    assert 'turbine.cpu_requires = "avx512f,avx512_bf16,amx_tile,amx_bf16"' in asm


def test_the_amx_convolutions_can_be_turned_off_and_the_cache_keys_on_it(monkeypatch):
    _as_on_amx(monkeypatch)
    eo = export(_Mixed(), args=(torch.randn(1, 3, 32, 32),))
    before = environment_key()
    monkeypatch.setenv(AMX_CONV_ENV, "off")
    assert environment_key() != before
    asm = compile_copy_asm(eo, _flags())
    assert "amx_bf16_conv" not in asm
    assert len(re.findall(r"stream.executable private @__turbine_avx512_bf16_conv_", asm)) == 7


@pytest.mark.parametrize(
    "c, k, s",
    [
        (64, 3, 2),  # a ResNet's strided 3x3: 9 of the 2x2 taps' 16 phase blocks
        (512, 3, 2),
        (16, 3, 2),  # a block holds two phases: left out only where both are zero
        (40, 3, 2),  # 160 channels: blocks across phase boundaries
        (16, 5, 3),  # stride 3: 32 channels (16 padded) a phase
    ],
)
def test_a_strided_convolution_runs_only_the_nonzero_blocks_of_its_space_to_depth_weight(c, k, s):
    oh = (14 + 2 * (k // 2) - k) // s + 1
    g = Conv(1, c, 14, 14, 32, k, k, (s, s), (k // 2, k // 2), (1, 1), oh, oh, False)
    plan, kernel = amx_conv_plan(g)
    assert kernel.s2d == (s, s, k, k)
    # the space-to-depth weight of a weight without zeros: w2[(py, px, c), a, b] = w[c, s a + py,
    # s b + px], zero past the kernel's edge and for the padded channels
    w2 = np.zeros((s, s, plan.c_pad, plan.kh2, plan.kw2))
    for py, px, a, b in itertools.product(range(s), range(s), range(plan.kh2), range(plan.kw2)):
        if s * a + py < k and s * b + px < k:
            w2[py, px, :c, a, b] = 1.0
    w2 = w2.reshape(s * s * plan.c_pad, plan.kh2, plan.kw2)
    blocks = range(kernel.c // 32)
    nonzero = {
        (a, b, blk)
        for a, b, blk in itertools.product(range(plan.kh2), range(plan.kw2), blocks)
        if w2[32 * blk : 32 * blk + 32, a, b].any()
    }
    runs = kernel.k_runs()
    assert {(ky, kx, b0 + i) for ky, kx, b0, n in runs for i in range(n)} == nonzero
    # in B's order (tap by tap, blocks ascending), each run's blocks consecutive
    assert runs == sorted(runs) and all(n > 0 for *_, n in runs)
    if (c, k, s) == (64, 3, 2):
        assert sum(n for *_, n in runs) == 18  # of 2 x 2 taps x 8 blocks: 9 taps of 2 blocks
    # a stride-1 convolution runs every block of every tap
    g1 = Conv(1, c, 14, 14, 32, 3, 3, (1, 1), (1, 1), (1, 1), 14, 14, False)
    assert amx_conv_plan(g1)[1].s2d is None


def test_the_strided_kernel_reads_its_runs_from_constant_tables(monkeypatch):
    _as_on_amx(monkeypatch)
    eo = export(_Mixed(), args=(torch.randn(1, 3, 32, 32),))
    asm = compile_copy_asm(eo, _flags())
    check_ir(
        asm,
        # d: 3x3 stride 2 over 64 channels, in space-to-depth form: 256 channels, 2x2 taps
        r"stream.executable private @__turbine_amx_bf16_conv_1x10x9x256_k2x2_f64\w*_s2x2of3x3_",
        # five runs: all eight blocks of tap (0, 0), phases (0, 0) and (1, 0) of tap (0, 1),
        # (0, 0) and (0, 1) of tap (1, 0), (0, 0) of tap (1, 1); A's offsets in bytes (a pixel
        # is 512, a row of the 9-wide grid 4608, a block 64), B's (1024 a block, 8 a tap)
        r"arith.constant dense<\[0, 512, 768, 4608, 5120\]> : vector<5xindex>",
        r"arith.constant dense<\[0, 8192, 12288, 16384, 24576\]> : vector<5xindex>",
        r"arith.constant dense<\[8, 2, 2, 4, 2\]> : vector<5xindex>",
        r"vector.extract %\w+\[%\w+\] : index from vector<5xindex>",
        r"tileloadd",
        r"tdpbf16ps",
    )


def test_the_kernel_refuses_what_it_cannot_read():
    # 4 x 4 taps of 40 channels: a reduction of 640 (32k) whose taps are not whole tile rows
    with pytest.raises(ValueError, match="channels must be a multiple of 32"):
        AmxConv(4 * 4 * 40, 64, c=40, kh=4, kw=4, oh=8, wp=11, n=1)


def _exact_bf16(conv: torch.nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """The convolution of bf16-rounded input and weight, accumulated in float64."""
    with torch.no_grad():
        bias = None if conv.bias is None else conv.bias.double()
        return torch.nn.functional.conv2d(
            x.bfloat16().double(),
            conv.weight.bfloat16().double(),
            bias,
            stride=conv.stride,
            padding=conv.padding,
        ).float()


@needs_amx
@pytest.mark.parametrize(
    "n, c, h, w, f, k, pad, stride, bias",
    [
        (1, 32, 9, 11, 32, 3, 1, 1, True),
        (2, 64, 14, 14, 40, 3, 1, 1, False),  # batch 2; F padded to 64
        (1, 96, 7, 7, 100, 1, 0, 1, True),  # a 1x1, F padded to 128 (32-column workgroups)
        (1, 32, 20, 17, 64, 5, 2, 1, True),
        (3, 32, 5, 6, 32, 3, 0, 1, True),  # no padding: the extra row alone
        (1, 32, 24, 24, 64, 3, 1, 1, False),  # 576 rows a workgroup's 128 do not divide
        (2, 40, 9, 9, 32, 3, 1, 1, True),  # 40 channels padded to 64
        (1, 3, 32, 30, 64, 7, 3, 2, True),  # an RGB stem: space-to-depth, 3 -> 8 channels
        (1, 64, 14, 15, 128, 3, 1, 2, False),  # a ResNet's strided 3x3
        (1, 64, 15, 13, 128, 1, 0, 2, True),  # its strided 1x1 (downsample)
        (1, 32, 8, 9, 32, 1, 1, 2, True),  # a strided 1x1 with padding
        (1, 16, 11, 12, 32, 5, 1, 3, True),  # stride 3
        # 16 channels and an even kernel width: tile rows of two taps
        (1, 16, 9, 10, 32, 4, 1, 1, True),
        (2, 5, 12, 12, 64, 2, 0, 1, False),  # 5 channels padded to 16
        (1, 3, 15, 17, 32, 3, 1, 2, True),  # stride 2 over RGB: 4 x 2 x 2 channels, 2x2 taps
        # space-to-depth blocks of two phases: a block is left out only where both are zero
        (1, 16, 13, 12, 32, 3, 1, 2, True),
        # a reduction of 1152: the weight tiles prefetched four steps ahead
        (1, 128, 9, 10, 64, 3, 1, 1, True),
    ],
)
def test_the_kernel_gives_the_exact_bf16_products(n, c, h, w, f, k, pad, stride, bias):
    torch.manual_seed(n * 1000 + c + h + f)
    conv = torch.nn.Conv2d(c, f, k, padding=pad, stride=stride, bias=bias).eval()
    x = torch.randn(n, c, h, w)
    got = _run_bf16(export(conv, args=(x,)), x)
    want = _exact_bf16(conv, x)
    # exact products, f32 sums: within a few f32 roundings of the float64 result
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class _Block(torch.nn.Module):
    """A ResNet basic block: conv-BN-ReLU, conv-BN, + the input, ReLU; twice."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        layers = []
        for _ in range(2):
            layers += [torch.nn.Conv2d(64, 64, 3, padding=1, bias=False), torch.nn.BatchNorm2d(64)]
        self.layers = torch.nn.ModuleList(layers)
        for bn in self.layers[1::2]:
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)

    #: The reference's choice: the second block's residual, the first block's output, rounded
    #: to bf16 as the AMX kernels keep it (read by a convolution and a residual add only).
    round_residual = False

    def forward(self, x):
        for b in range(2):
            y = torch.relu(self.layers[1](self.layers[0](x)))
            r = x.bfloat16().float() if self.round_residual and b else x
            x = torch.relu(self.layers[3](self.layers[2](y)) + r)
        return x


class _Downsample(torch.nn.Module):
    """A ResNet block that halves the image: a 3x3 stride-2 convolution (space-to-depth) and a
    strided 1x1 shortcut (every other row and column) read the same ReLU output, which the
    residual add reads too: the pattern IREE 3.13's elementwise fusion miscompiles when a
    consumer reads a multi-use producer through a strided map (``_compiler/convs.py``)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.pre = torch.nn.Conv2d(32, 64, 3, padding=1)
        self.a = torch.nn.Conv2d(64, 128, 3, stride=2, padding=1, bias=False)
        self.bn_a = torch.nn.BatchNorm2d(128)
        self.b = torch.nn.Conv2d(128, 128, 3, padding=1, bias=False)
        self.bn_b = torch.nn.BatchNorm2d(128)
        self.down = torch.nn.Conv2d(64, 128, 1, stride=2, bias=False)
        self.bn_d = torch.nn.BatchNorm2d(128)
        for bn in (self.bn_a, self.bn_b, self.bn_d):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        x = torch.relu(self.pre(x))
        y = self.bn_b(self.b(torch.relu(self.bn_a(self.a(x)))))
        return torch.relu(y + self.bn_d(self.down(x))) + x.mean()


@needs_amx
@pytest.mark.parametrize("model_class", [_Block, _Downsample])
def test_resnet_blocks_on_amx_match_the_bf16_reference_and_eager(model_class):
    model = model_class().eval()
    x = torch.randn(2, 32 if model_class is _Downsample else 64, 14, 14)
    got = _run_bf16(export(model, args=(x,)), x)
    want = bf16_reference(_rounding_residuals(model), x, layer=torch.nn.Conv2d)
    with torch.no_grad():
        eager = model(x)
    # the same bf16 roundings as the reference (measured within 5e-7): a position the fusion
    # left unwritten or a wrong tap would be far outside
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # against fp32 eager: the error bf16 operands make
    assert (got - eager).abs().max().item() < 0.05 * eager.abs().max().item()


class _Epilogues(torch.nn.Module):
    """What the kernel's epilogue takes after a convolution: a ReLU alone (no bias), the bias and
    a ReLU, a per-channel multiply and add (a batch norm as torch.export may decompose it)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(6)
        self.a = torch.nn.Conv2d(32, 64, 3, padding=1, bias=False)
        self.b = torch.nn.Conv2d(64, 48, 1)
        self.c = torch.nn.Conv2d(48, 64, 3, padding=1)
        self.scale = torch.nn.Parameter(torch.rand(1, 64, 1, 1) + 0.5)
        self.shift = torch.nn.Parameter(torch.randn(1, 64, 1, 1))

    def forward(self, x):
        y = torch.relu(self.b(torch.relu(self.a(x))))
        return self.c(y) * self.scale + self.shift


@needs_amx
def test_the_epilogue_forms_match_the_bf16_reference(monkeypatch):
    model = _Epilogues().eval()
    x = torch.randn(1, 32, 10, 12)
    eo = export(model, args=(x,))
    asm = compile_copy_asm(eo, _flags())
    # a: ReLU only; b: bias and ReLU; c: bias, multiply and add folded into a scale and shift
    assert re.search(r"stream.executable private @__turbine_amx_bf16_conv_\w+_f64_relu_", asm)
    assert re.search(r"stream.executable private @__turbine_amx_bf16_conv_\w+_f64_ss_relu_", asm)
    assert re.search(r"stream.executable private @__turbine_amx_bf16_conv_\w+_f64_ss_128", asm)
    got = _run_bf16(eo, x)
    want = bf16_reference(model, x, layer=torch.nn.Conv2d)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the same module with the epilogues left to IREE gives the same values
    monkeypatch.setenv("TURBINE_CPU_EPILOGUES", "keep")
    assert "_ss_" not in compile_copy_asm(eo, _flags())
    kept = _run_bf16(eo, x)
    torch.testing.assert_close(got, kept, rtol=1e-6, atol=1e-6)


class _Bottleneck(torch.nn.Module):
    """Two ResNet-50 bottleneck blocks (1x1, 3x3, 1x1 and the residual add): each kernel writes
    its result in bf16 as the next one reads it (1x1 -> 3x3: zero-padded by one; 3x3 -> 1x1 and
    the first block's output -> the second's 1x1: one zero row below), the last 1x1 of each
    block adds the residual in its epilogue, and the first block's output is read twice (the
    next 1x1 and the residual)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        layers = []
        for _ in range(2):
            layers += [
                torch.nn.Conv2d(128, 32, 1, bias=False),
                torch.nn.BatchNorm2d(32),
                torch.nn.Conv2d(32, 32, 3, padding=1, bias=False),
                torch.nn.BatchNorm2d(32),
                torch.nn.Conv2d(32, 128, 1),  # a bias: folded into the shift before the add
                torch.nn.BatchNorm2d(128),
            ]
        self.layers = torch.nn.ModuleList(layers)
        for bn in self.layers[1::2]:
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)

    round_residual = False  # as _Block's

    def forward(self, x):
        for b in range(2):
            conv1, bn1, conv2, bn2, conv3, bn3 = self.layers[6 * b : 6 * b + 6]
            y = torch.relu(bn1(conv1(x)))
            y = torch.relu(bn2(conv2(y)))
            r = x.bfloat16().float() if self.round_residual and b else x
            x = torch.relu(bn3(conv3(y)) + r)
        return x


@needs_amx
def test_bottleneck_blocks_hand_their_inputs_over_in_bf16(monkeypatch):
    model = _Bottleneck().eval()
    x = torch.randn(2, 128, 9, 13)  # two images: the kernels' writes per batch entry
    eo = export(model, args=(x,))
    asm = compile_copy_asm(eo, _flags())
    names = _conv_names(asm)
    # 1x1 -> 3x3 (grid 9 + 3 rows, 13 + 2 wide: the pixels at 1, 1); 3x3 -> 1x1 and the first
    # block's output -> the next 1x1 (9 + 1 rows, 13 wide: at 0, 0); the residual in the
    # 1x1's epilogue, the second block's read in bf16 from the first block's bf16 result,
    # which is all the first block writes; only the second block's output is written in f32
    assert names == {
        "__turbine_amx_bf16_conv_2x10x13x128_k1x1_f32_ss_relu_to12x15p1x1_nof32_128x32",
        "__turbine_amx_bf16_conv_2x12x15x32_k3x3_f32_ss_relu_to10x13p0x0_nof32_128x32",
        "__turbine_amx_bf16_conv_2x10x13x32_k1x1_f128_ss_res_relu_to10x13p0x0_nof32_128x64",
        "__turbine_amx_bf16_conv_2x10x13x32_k1x1_f128_ss_resb10x13p0x0_relu_128x64",
    }
    # every convolution but the first takes its input as the previous kernel wrote it
    taken = r"func.func private @__turbine_avx512_conv_amx_\d+\(%\w+: tensor<\d+xbf16>"
    assert len(re.findall(taken, asm)) == 5
    got = _run_bf16(eo, x)
    want = bf16_reference(_rounding_residuals(model), x, layer=torch.nn.Conv2d)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the residual kept in bf16 is what the f32 one rounds to: the same result within the
    # error bf16 operands make anyway
    monkeypatch.setenv("TURBINE_CPU_EPILOGUES", "nopad")
    f32_residuals = _run_bf16(eo, x)
    torch.testing.assert_close(f32_residuals, bf16_reference(model, x, layer=torch.nn.Conv2d))
    assert (got - f32_residuals).abs().max().item() < 1e-2 * f32_residuals.abs().max().item()


@pytest.mark.parametrize("native", [True, False], ids=["avx512-bf16", "no-avx512-bf16"])
def test_the_stores_round_to_bf16_and_apply_relu_in_one_instruction_each(monkeypatch, native):
    # a kernel writing the next one's bf16 input: vcvtneps2bf16 where the CPU has it (IREE
    # expands arith.truncf to bf16 into seven integer instructions), ReLU as v < 0 ? 0 : v
    # (NaN kept as by arith.maximumf, and -0.0; LLVM makes it one vmaxps), and
    # the weight tiles prefetched where the reduction is at least 1024 long (here 32 x 9 and
    # 128 x 9)
    _as_on_amx(monkeypatch)
    monkeypatch.setattr(amx_conv, "cpu_flags", lambda: {"avx512_bf16"} if native else set())
    model = torch.nn.Sequential(
        torch.nn.Conv2d(32, 128, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(128, 32, 3, padding=1),
    ).eval()
    x = torch.randn(1, 32, 8, 8)
    asm = compile_copy_asm(export(model, args=(x,)), _flags())
    bodies = []
    for name in ("1x11x10x32_k3x3_f128_", "1x11x10x128_k3x3_f32_"):
        start = asm.index(f"stream.executable private @__turbine_amx_bf16_conv_{name}")
        indent = start - asm.rindex("\n", 0, start) - 1
        bodies.append(asm[start : asm.index("\n" + " " * indent + "}\n", start)])  # its end
    assert "_relu_to" in bodies[0].splitlines()[0]
    assert ("vcvtneps2bf16" in bodies[0]) == native
    assert ("arith.truncf" in bodies[0]) != native
    assert "arith.cmpf olt" in bodies[0] and "vector<16xi1>, vector<16xf32>" in bodies[0]
    assert "arith.maximumf" not in bodies[0]
    assert "prefetcht0" not in bodies[0] and "prefetcht0" in bodies[1]


@needs_amx
def test_nan_goes_through_the_bf16_hand_offs_and_relu_as_in_eager():
    # a NaN pixel: the 1x1 makes it NaN in every channel, ReLU and the rounding to bf16 of each
    # kernel's store keep it, the 3x3 spreads it to its neighbours
    model = _Bottleneck().eval()
    x = torch.randn(1, 128, 9, 13)
    x[0, :, 4, 6] = float("nan")
    with torch.no_grad():
        eager = model(x)
    got = _run_bf16(export(model, args=(x,)), x)
    assert torch.isnan(eager).any() and not torch.isnan(eager).all()
    assert torch.equal(torch.isnan(got), torch.isnan(eager))


def _rounding_residuals(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose blocks round the residuals turbine keeps in bf16."""
    ref = copy.deepcopy(model)
    ref.round_residual = True
    return ref


class _Transitions(torch.nn.Module):
    """The two ways a ResNet halves its image. ResNet-50's: a 1x1 whose one reader is the
    block's strided 3x3; ResNet-18's: a block output read by the next block's strided 3x3 and
    its strided 1x1 shortcut. Each strided 3x3's input is written by the kernel before it, in
    the space-to-depth form it reads (``out_next_s2d``), and so is the strided 1x1's: every
    other pixel of every other row, in bf16 (``out_strided``)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(8)
        conv = torch.nn.Conv2d
        self.c1 = conv(64, 64, 1, bias=False)  # ResNet-50: 1x1 -> strided 3x3
        self.s1 = conv(64, 64, 3, stride=2, padding=1)
        self.c2 = conv(64, 64, 3, padding=1)  # ResNet-18: block output -> strided 3x3 + 1x1
        self.s2 = conv(64, 96, 3, stride=2, padding=1, bias=False)
        self.d2 = conv(64, 96, 1, stride=2, bias=False)

    def forward(self, x):
        y = torch.relu(self.s1(torch.relu(self.c1(x))))
        z = torch.relu(self.c2(y))
        return torch.relu(self.s2(z)) + self.d2(z)


def test_strided_convolutions_take_their_space_to_depth_input_from_the_kernel_before(monkeypatch):
    _as_on_amx(monkeypatch)
    # two images, odd sizes: the zeros around the pixels
    eo = export(_Transitions().eval(), args=(torch.randn(2, 64, 11, 13),))
    asm = compile_copy_asm(eo, _flags())
    names = _conv_names(asm)
    # c1 writes s1's input: 11 x 13 pixels at (1, 1) of the padded input (16 x 16: 6 output
    # rows + 2, 7 columns + 1, twice), in the 2x2 space-to-depth form (8 x 8 pixels of 4 x 64
    # channels), and nothing else; s1 (its reader at stride 1) c2's padded input (9 x 9); c2
    # s2's space-to-depth input (5 x 5 pixels) and the strided 1x1 d2's (its 6 x 7 pixels'
    # 3 x 4 at even rows and columns, and one zero row: 4 x 4), and no f32 result
    assert names == {
        "__turbine_amx_bf16_conv_2x12x13x64_k1x1_f64_relu_to8x8p1x1s2x2_nof32_128x64",
        "__turbine_amx_bf16_conv_2x8x8x256_k2x2_f64_ss_relu_to9x9p1x1_nof32_s2x2of3x3_128x64",
        "__turbine_amx_bf16_conv_2x9x9x64_k3x3_f64_ss_relu_to5x5p1x1s2x2_sub4x4s2x2_nof32_128x64",
        "__turbine_amx_bf16_conv_2x5x5x256_k2x2_f96_relu_s2x2of3x3_128x32",
        "__turbine_amx_bf16_conv_2x4x4x64_k1x1_f96_128x32",
    }, names
    taken = r"func.func private @__turbine_avx512_conv_amx_\d+\(%\w+: tensor<\d+xbf16>"
    assert len(re.findall(taken, asm)) == 4


@needs_amx
@pytest.mark.parametrize("size, tol", [((11, 13), 1e-5), ((12, 16), 1e-3)], ids=["odd", "even"])
def test_the_space_to_depth_hand_offs_match_the_bf16_reference(monkeypatch, size, tol):
    # c2's result is 6 x 7 (the strided 1x1 reads its last column) or 6 x 8 (neither its last
    # row nor its last column)
    model = _Transitions().eval()
    x = torch.randn(2, 64, *size)
    eo = export(model, args=(x,))
    got = _run_bf16(eo, x)
    # the same bits as the kernels without hand-offs (each input written by IREE's passes)
    monkeypatch.setenv("TURBINE_CPU_EPILOGUES", "nopad")
    assert torch.equal(got, _run_bf16(eo, x))
    # the reference sums in another order: an intermediate may round to the neighbouring bf16
    # value (with the even input, a few outputs differ by ~1e-4 with or without hand-offs)
    want = bf16_reference(model, x, layer=torch.nn.Conv2d)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_the_kernel_refuses_an_output_that_does_not_fit_the_next_input():
    # 8 x 9 pixels (a 3x3 over a grid 11 wide) cannot sit at (1, 1) of an input 8 rows high
    with pytest.raises(ValueError, match="does not fit"):
        AmxConv(288, 32, False, 128, 32, c=32, kh=3, kw=3, oh=8, wp=11, n=1, out_next=(8, 11, 1, 1))
    # a strided 1x1's input of 5 x 5 pixels (4 rows and a zero row) holds every other pixel of
    # 7 x 9, not of 9 x 9
    AmxConv(288, 32, False, 128, 32, c=32, kh=3, kw=3, oh=7, wp=11, n=1, out_strided=(5, 5, 2, 2))
    with pytest.raises(ValueError, match="strided result does not fit"):
        AmxConv(
            288, 32, False, 128, 32, c=32, kh=3, kw=3, oh=9, wp=11, n=1, out_strided=(4, 5, 2, 2)
        )
    # nor in a space-to-depth form of 4 x 6 pixels (8 x 12 of the padded input)
    with pytest.raises(ValueError, match="does not fit"):
        AmxConv(
            288, 32, False, 128, 32, c=32, kh=3, kw=3, oh=8, wp=11, n=1,
            out_next=(4, 6, 1, 1), out_next_s2d=(2, 2),
        )  # fmt: skip


class _StemAndPool(torch.nn.Module):
    """A ResNet stem: 7x7 stride-2 convolution, batch norm, ReLU, then a 3x3 stride-2 max
    pooling padded by one, and a basic block after it (two 3x3 convolutions, the pooled result
    added back before the last ReLU)."""

    #: The reference's choice: the residual (the pooled result) rounded to bf16, as turbine
    #: keeps it when only AMX kernels read it.
    round_residual = False

    def __init__(self):
        super().__init__()
        torch.manual_seed(8)
        self.stem = torch.nn.Conv2d(3, 32, 7, stride=2, padding=3, bias=False)
        self.bn = torch.nn.BatchNorm2d(32)
        self.bn.running_mean.uniform_(-0.5, 0.5)
        self.conv = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(32, 32, 3, padding=1)

    def pooled(self, x):
        return torch.nn.functional.max_pool2d(torch.relu(self.bn(self.stem(x))), 3, 2, 1)

    def block(self, y):
        r = y.bfloat16().float() if self.round_residual else y
        return torch.relu(self.conv2(torch.relu(self.conv(y))) + r)

    def forward(self, x):
        return self.block(self.pooled(x))


class _PooledToo(_StemAndPool):
    """The same, returning the pooled result too."""

    def forward(self, x):
        y = self.pooled(x)
        return self.block(y), y


@needs_amx
def test_a_max_pooling_after_an_amx_convolution_runs_in_bf16_between_the_kernels(monkeypatch):
    model = _StemAndPool().eval()
    x = torch.randn(2, 3, 30, 34)
    eo = export(model, args=(x,))
    asm = compile_copy_asm(eo, _flags())
    # the stem's kernel writes its ReLU'd result in bf16, zero-padded by one as the pooling
    # reads it (15 x 17 pixels in 17 x 19), and nothing else; the pooling takes it as it is,
    # computes in bf16 (maxima of the bit patterns: the values are a ReLU's) and writes the
    # first convolution's input (8 x 9 pixels at 1, 1 of 11 x 11 rows) and its result
    # channels-last for the residual add, which the block's second kernel reads in place
    # (8 x 9 at 0, 0)
    check_ir(
        asm,
        r"= call @__turbine_max_pool_nhwc_amx_0\(%\w+#1\) : \(tensor<20672xbf16>\) -> "
        r"\(tensor<2x32x8x9xf32>, tensor<4608xbf16>, tensor<7744xbf16>\)",
        r"= call @__turbine_avx512_conv_amx_1\(%\w+#2, ",
        r"= call @__turbine_avx512_conv_amx_2\(.*, %\w+#1\) : \(.*, tensor<4608xbf16>\)",
        r"stream.executable private @__turbine_amx_bf16_conv_2x\w+_f32_ss_relu_to17x19p1x1_nof32"
        r"_128x32",
        r"vector.store %\w+, %\w+\[%\w+\] : memref<20672xbf16>, vector<16xbf16>",
        r"func.func private @__turbine_max_pool_nhwc_amx_0\(%\w+: tensor<20672xbf16>\)",
        r"tensor.expand_shape %\w+ \[\[0, 1, 2, 3\]\] output_shape \[2, 17, 19, 32\]",
        r"arith.maxui %\w+, %\w+ : i16",
        r"tensor.pad %\w+ low\[0, 1, 1, 0\] high\[0, 2, 1, 0\]",
        r"stream.executable private @__turbine_amx_bf16_conv_2x\w+_resb8x9p0x0_relu_128x32",
    )
    got = _run_bf16(eo, x)
    want = bf16_reference(_rounding_residuals(model), x, layer=torch.nn.Conv2d)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the pooling's integer maxima: the pooled values themselves (the bf16 reference's, rounded
    # to bf16: within one bf16 rounding where the stem's f32 sums differ in their last bits),
    # and a window with a NaN gives a NaN, as eager's float maxima do
    both = _PooledToo().eval()
    module = load_module(export(both, args=(x,)).compile(save_to=None, precision="bf16"))
    _, pooled = module.main(x)
    _, pooled_ref = bf16_reference(both, x, layer=torch.nn.Conv2d)
    torch.testing.assert_close(pooled, pooled_ref.bfloat16().float(), rtol=8e-3, atol=1e-5)
    xn = x.clone()
    xn[1, :, 9, 11] = float("nan")
    xn[0, :, 20, 5] = -float("nan")
    with torch.no_grad():
        _, eager_nan = both(xn)
    _, pooled_nan = module.main(xn)
    assert torch.isnan(eager_nan).any() and not torch.isnan(eager_nan).all()
    assert torch.equal(torch.isnan(pooled_nan), torch.isnan(eager_nan))
    # TURBINE_CPU_POOLS=f32: the pooling in f32 over the stem's f32 result (what turbine did
    # before), its result read by the next kernels in f32; the residual then unrounded
    monkeypatch.setenv("TURBINE_CPU_POOLS", "f32")
    asm = compile_copy_asm(eo, _flags())
    check_ir(
        asm,
        r"func.func private @__turbine_max_pool_nhwc_amx_0\(%\w+: tensor<20672xf32>\) -> "
        r"tensor<2x32x8x9xf32>",
    )
    assert "_relu_to17x19p1x1f32_nof32" in asm
    assert "tensor.pad" not in asm.split("@__turbine_max_pool_nhwc_amx_0")[2].split("func.func")[0]
    f32_pool = _run_bf16(eo, x)
    torch.testing.assert_close(f32_pool, bf16_reference(model, x, layer=torch.nn.Conv2d))
    assert (got - f32_pool).abs().max().item() < 1e-2 * f32_pool.abs().max().item()
    # with the poolings left to torch-mlir the stem's kernel writes its plain result
    monkeypatch.setenv("TURBINE_CPU_POOLS", "keep")
    check_ir(
        compile_copy_asm(eo, _flags()),
        r"stream.executable private @__turbine_amx_bf16_conv_2x19x20x16_k4x4_f32_ss_relu_128x32 ",
    )
    kept = _run_bf16(eo, x)
    torch.testing.assert_close(f32_pool, kept, rtol=1e-5, atol=1e-5)


class _StemPoolTwoConvs(_StemAndPool):
    """A ResNet-50 stem: after the pooling, its first 1x1 convolution and the shortcut's 1x1
    convolution both read the pooled result (at stride 1: the same input layout)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(32, 32, 1, bias=False)
        self.b = torch.nn.Conv2d(32, 64, 1, bias=False)

    def forward(self, x):
        y = self.pooled(x)
        return torch.relu(self.a(y)).mean() + self.b(y)


@needs_amx
def test_the_bf16_pooling_writes_the_input_of_every_amx_convolution_reading_it():
    model = _StemPoolTwoConvs().eval()
    x = torch.randn(1, 3, 30, 34)
    eo = export(model, args=(x,))
    asm = compile_copy_asm(eo, _flags())
    # both 1x1 convolutions read 8 x 9 pixels in 9 rows (a zero row below) of 9: one input
    check_ir(
        asm,
        r"= call @__turbine_max_pool_nhwc_amx_0\(%\w+#1\) : \(tensor<\d+xbf16>\) -> "
        r"\(tensor<1x32x8x9xf32>, tensor<2304xbf16>, tensor<2592xbf16>\)",
        r"= call @__turbine_avx512_conv_amx_1\(%\w+#2, ",
        r"= call @__turbine_avx512_conv_amx_2\(%\w+#2, ",
    )
    got = _run_bf16(eo, x)
    want = bf16_reference(model, x, layer=torch.nn.Conv2d)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class _PooledReadInF32(_StemAndPool):
    """The same, with the pooled result also read by an op that is not an AMX kernel."""

    def forward(self, x):
        y = self.pooled(x)
        return self.block(y) + y.mean()


@needs_amx
def test_a_pooled_result_read_in_f32_keeps_the_pooling_in_f32():
    model = _PooledReadInF32().eval()
    x = torch.randn(2, 3, 30, 34)
    eo = export(model, args=(x,))
    # the mean would see the pooled values rounded to bf16: the pooling stays f32
    check_ir(
        compile_copy_asm(eo, _flags()),
        r"func.func private @__turbine_max_pool_nhwc_amx_0\(%\w+: tensor<20672xf32>\) -> "
        r"tensor<2x32x8x9xf32>",
    )
    got = _run_bf16(eo, x)
    torch.testing.assert_close(got, bf16_reference(model, x, layer=torch.nn.Conv2d))


class _TwoReaders(torch.nn.Module):
    """A result read by the next convolution and by an add no kernel absorbs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(9)
        self.a = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.b = torch.nn.Conv2d(32, 32, 3, padding=1)

    def forward(self, x, z):
        y = torch.relu(self.a(x))
        return self.b(y), y + z


def test_a_result_left_unwritten_in_f32_cannot_be_read(monkeypatch):
    _as_on_amx(monkeypatch)
    x, z = torch.randn(1, 32, 8, 8), torch.randn(1, 32, 8, 8)
    eo = export(_TwoReaders(), args=(x, z))
    # the add reads the f32 result: a writes it (and b's input)
    names = re.findall(
        r"stream.executable private @(__turbine_amx_\w+) \{", compile_copy_asm(eo, _flags())
    )
    assert any("_to11x10p1x1_128" in n for n in names) and not any("nof32" in n for n in names)
    # a wrong claim that a kernel absorbs that add would leave it reading memory no kernel
    # wrote: the rewrite refuses instead of computing garbage
    from turbine_aot._compiler import direct_convs

    def claims(value, *args):
        return [u.owner.operation for u in value.uses if u.owner.name == "torch.aten.add.Tensor"]

    monkeypatch.setattr(direct_convs, "_residual_readers", claims)
    with pytest.raises(Exception, match="left unwritten"):
        compile_copy_asm(eo, _flags())


@needs_amx
def test_rows_per_workgroup_chosen_for_two_workers_match_the_bf16_reference(monkeypatch):
    # ResNet's first stage: a 3x3 over 56 x 56 pixels is an output grid of 56 x 58 rows; 26
    # workgroups of 128 rows run 16 on one of two workers, 15 of 224 run 8 and 7
    monkeypatch.setattr(workgroups, "default_workers", lambda: 2)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(64, 64, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, padding=1),
    ).eval()
    x = torch.randn(1, 64, 56, 56)
    eo = export(model, args=(x,))
    names = _conv_names(compile_copy_asm(eo, _flags()))
    assert names and all(n.endswith("_224x64") for n in names), names
    got = _run_bf16(eo, x)
    # the same bits as the usual grid (each output's sum runs in the same order)
    monkeypatch.setattr(workgroups, "default_workers", lambda: 1)
    assert torch.equal(got, _run_bf16(eo, x))
    # the reference sums in another order: the first convolution's output may round to the
    # neighbouring bf16 value before the second reads it (0.5 % of outputs differ by ~1e-4)
    want = bf16_reference(model, x, layer=torch.nn.Conv2d)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
