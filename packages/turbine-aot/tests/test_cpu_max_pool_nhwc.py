"""Max poolings computed channels-last beside turbine's AVX-512 direct-convolution kernel
(``_compiler.pools``): when the compile copy uses them, and that they give eager's values."""

from __future__ import annotations

import pytest
import torch
from ir_check import check_ir
from kernel_testing import compile_copy_asm, needs_avx512

from turbine_aot import export
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.pools import (
    MaxPool,
    max_pool_bf16_function,
    max_pool_function,
    max_pool_geometry,
    max_pools,
)
from turbine_aot._compiler.rewrites import environment_key
from turbine_aot.runtime import load_module


@pytest.fixture(autouse=True)
def _default_choices(monkeypatch):
    for name in ("TURBINE_CPU_CONV_MATMUL", "TURBINE_CPU_MATMUL", "TURBINE_CPU_POOLS"):
        monkeypatch.delenv(name, raising=False)


def _flags(*extra: str) -> list[str]:
    return [
        *default_compile_flags("llvm-cpu", use_env=False),
        "--turbine-cpu-matmul=avx512",
        *extra,
    ]


_copy_asm = compile_copy_asm


class _ConvPool(torch.nn.Module):
    """A convolution, a batch norm and a ReLU, the max pooling, a second convolution, with the
    pooled tensor also an output (a second use, as ResNet's first residual) and shifted negative
    (so that a padding of zeros instead of -inf would show)."""

    def __init__(self, pool: torch.nn.Module, relu: bool = True):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 16, 3, 2, 1, bias=False)
        self.bn = torch.nn.BatchNorm2d(16)
        self.relu = relu
        self.pool = pool
        self.conv2 = torch.nn.Conv2d(16, 8, 3, 1, 1)

    def forward(self, x):
        y = self.bn(self.conv(x))
        y = torch.relu(y) if self.relu else y - 3.0
        p = self.pool(y)
        return self.conv2(p), p


def _model(pool: torch.nn.Module, relu: bool = True) -> torch.nn.Module:
    model = _ConvPool(pool, relu)
    model.bn.running_mean.uniform_(-0.5, 0.5)
    model.bn.running_var.uniform_(0.5, 2.0)
    return model.eval()


# ---------------------------------------------------------------------------- when it applies
def test_the_compile_copy_pools_channels_last_and_the_export_is_unchanged(monkeypatch):
    # no ReLU before the pooling: it reads the NCHW result through a transpose and a pad
    eo = export(_model(torch.nn.MaxPool2d(3, 2, 1), relu=False), args=(torch.randn(1, 3, 32, 32),))
    exported = str(eo.mlir_module)
    asm = _copy_asm(eo, _flags())
    check_ir(
        asm,
        r"call @__turbine_max_pool_nhwc_0\(%\w+\) : \(tensor<1x16x16x16xf32>\) -> "
        r"tensor<1x16x8x8xf32>",
        r"func.func private @__turbine_max_pool_nhwc_0",
        r"linalg.transpose ins\(%\w+ : tensor<1x16x16x16xf32>\) .* permutation = \[0, 2, 3, 1\]",
        r"tensor.pad %\w+ low\[0, 1, 1, 0\] high\[0, 1, 1, 0\]",
        r"tensor.yield %\w+ : f32",
        r"util.optimization_barrier %\w+ : tensor<1x18x18x16xf32>",
        # the nine taps: strided slices of the padded NHWC input, their maximum element-wise
        r"tensor.extract_slice %\w+\[0, 0, 0, 0\] \[1, 8, 8, 16\] \[1, 2, 2, 1\]",
        r"tensor.extract_slice %\w+\[0, 2, 2, 0\] \[1, 8, 8, 16\] \[1, 2, 2, 1\]",
        r"linalg.generic .* ins\((%\w+, ){8}%\w+ : (tensor<1x8x8x16xf32>, ){8}"
        r"tensor<1x8x8x16xf32>\)",
        r"arith.maximumf",
        r"linalg.transpose ins\(%\w+ : tensor<1x8x8x16xf32>\) .* permutation = \[0, 3, 1, 2\]",
    )
    assert "torch.aten.max_pool2d" not in asm and "0xFF800000" in asm  # -inf padding
    assert str(eo.mlir_module) == exported  # the exported module is the reference's
    key = environment_key()
    monkeypatch.setenv("TURBINE_CPU_POOLS", "keep")
    assert environment_key() != key  # the compile cache keys on the choice
    asm = _copy_asm(eo, _flags())
    assert "torch.aten.max_pool2d" in asm and "__turbine_max_pool_nhwc" not in asm
    assert "avx512_f32_conv" in asm  # the convolutions stay on the kernel


def test_after_a_relu_the_pooling_reads_the_kernels_padded_result():
    """After a ReLU (never below zero) the convolution kernel writes its result zero-padded as
    the pooling reads it: no transpose, pad or barrier of IREE's between (ResNet's stem)."""
    eo = export(_model(torch.nn.MaxPool2d(3, 2, 1)), args=(torch.randn(1, 3, 32, 32),))
    asm = _copy_asm(eo, _flags())
    check_ir(
        asm,
        r"call @__turbine_max_pool_nhwc_0\(%[\w#]+\) : \(tensor<5184xf32>\) -> "
        r"tensor<1x16x8x8xf32>",
        r"func.func private @__turbine_max_pool_nhwc_0\(%\w+: tensor<5184xf32>\)",
        r"tensor.expand_shape %\w+ \[\[0, 1, 2, 3\]\] output_shape \[1, 18, 18, 16\]",
    )
    pool = asm[asm.index("func.func private @__turbine_max_pool_nhwc_0") :]
    pool = pool[: pool.index("\n  }")]
    assert "util.optimization_barrier" not in pool and "tensor.pad" not in pool
    assert "opad1x1" in asm  # the kernel writes the one-pixel zero border


def test_a_kernels_result_is_pooled_without_a_barrier():
    """The barrier (against IREE's fusion of a windowed read into a producer with another use)
    only where IREE ops build the padded input; a kernel's result, which IREE cannot fuse, is
    read directly: a barrier there made IREE wait for it on the host, a second submission a
    call (docs/performance.md, section 18)."""
    g = MaxPool(1, 64, 112, 112, (3, 3), (2, 2), (1, 1), 56, 56)
    assert "util.optimization_barrier" in max_pool_function("p0", g)
    assert "util.optimization_barrier" not in max_pool_function("p1", g, padded_input=True)
    assert "util.optimization_barrier" not in max_pool_bf16_function("p2", g)


def test_only_beside_the_conv_kernel():
    """Without a convolution on the AVX-512 kernel (none in the program, a portable build,
    today's convolution rewrites) the max pooling stays torch-mlir's."""
    x = torch.randn(1, 8, 16, 16)
    eo = export(torch.nn.MaxPool2d(2).eval(), args=(x,))
    assert len(max_pools(eo.mlir_module.operation)) == 1
    assert "__turbine_max_pool_nhwc" not in _copy_asm(eo, _flags())  # no convolution
    eo = export(_model(torch.nn.MaxPool2d(2)), args=(torch.randn(1, 3, 32, 32),))
    assert "__turbine_max_pool_nhwc" not in _copy_asm(
        eo, default_compile_flags("llvm-cpu", host=False)
    )
    assert "__turbine_max_pool_nhwc" not in _copy_asm(eo, _flags("--turbine-cpu-matmul=iree"))


def test_what_the_rewrite_accepts():
    def geometry(pool: torch.nn.Module, h: int = 15, w: int = 16):
        eo = export(pool.eval(), args=(torch.randn(2, 4, h, w),))
        ops = [
            o for o in _walk(eo.mlir_module.operation) if o.name.startswith("torch.aten.max_pool2d")
        ]
        assert len(ops) == 1
        return max_pool_geometry(ops[0])

    g = geometry(torch.nn.MaxPool2d(3, 2, 1))
    assert g is not None
    assert (g.n, g.c, g.h, g.w, g.kernel, g.stride, g.padding, g.oh, g.ow) == (
        2, 4, 15, 16, (3, 3), (2, 2), (1, 1), 8, 8,
    )  # fmt: skip
    g = geometry(torch.nn.MaxPool2d(2))  # stride: the kernel's
    assert g is not None and g.stride == (2, 2) and (g.oh, g.ow) == (7, 8)
    g = geometry(torch.nn.MaxPool2d((2, 3), (1, 2), (1, 0)))
    assert g is not None and (g.oh, g.ow) == (16, 7)
    g = geometry(torch.nn.MaxPool2d(3, 2, ceil_mode=True), w=17)  # the same size: accepted
    assert g is not None and (g.oh, g.ow) == (7, 8)
    assert geometry(torch.nn.MaxPool2d(3, 2, ceil_mode=True)) is None  # a larger output
    assert geometry(torch.nn.MaxPool2d(3, 1, dilation=2)) is None
    assert geometry(torch.nn.MaxPool2d(2, return_indices=True)) is None


def _walk(op):
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                yield child.operation
                yield from _walk(child.operation)


# ---------------------------------------------------------------------------------- numerics
_POOLS = {
    # name: (the pooling, ReLU before it (else shifted negative), input H, W)
    "resnet-stem": (torch.nn.MaxPool2d(3, 2, 1), True, 32, 32),
    "negative-padded": (torch.nn.MaxPool2d(3, 2, 1), False, 30, 26),
    "2x2": (torch.nn.MaxPool2d(2), False, 32, 34),
    "rectangular": (torch.nn.MaxPool2d((2, 3), (1, 2), (1, 0)), False, 20, 22),
    "ceil-mode-same-size": (torch.nn.MaxPool2d(3, 2, ceil_mode=True), False, 30, 30),
}


@needs_avx512
@pytest.mark.parametrize("name", sorted(_POOLS))
def test_the_pooling_matches_eager_and_torch_mlirs_pooling_exactly(name, monkeypatch):
    pool, relu, h, w = _POOLS[name]
    model = _model(pool, relu)
    x = torch.randn(2, 3, h, w)
    eo = export(model, args=(x,))
    assert "__turbine_max_pool_nhwc" in _copy_asm(eo, _flags())
    got = load_module(eo.compile(None, extra_args=["--turbine-cpu-matmul=avx512"])).main(x)
    with torch.no_grad():
        want = model(x)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    # the same convolutions with torch-mlir's NCHW pooling: bit for bit the same values
    monkeypatch.setenv("TURBINE_CPU_POOLS", "keep")
    before = load_module(eo.compile(None, extra_args=["--turbine-cpu-matmul=avx512"])).main(x)
    for g, b in zip(got, before):
        assert torch.equal(g, b)
