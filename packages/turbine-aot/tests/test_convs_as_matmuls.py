"""Image stems (few input channels) and 1x1 convolutions compile as im2col + matmul on llvm-cpu
(``_compiler.convs``) and give eager's values; other convolutions and targets are untouched.
(``TURBINE_CPU_CONV_MATMUL=iree`` here: see the fixture.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ir_check import check_ir

from turbine_aot import export
from turbine_aot._compiler.convs import convs_as_matmuls
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.rewrites import module_for_compile
from turbine_aot.runtime import load_module


@pytest.fixture(autouse=True)
def _todays_convolutions(monkeypatch):
    """This file tests the im2col rewrite; where the AVX-512 kernels are the default, every
    static convolution goes to the direct-convolution kernel instead
    (``tests/test_cpu_conv_avx512.py``)."""
    monkeypatch.setenv("TURBINE_CPU_CONV_MATMUL", "iree")


def _copy_asm(out, flags) -> tuple[str, bool]:
    copy, owned = module_for_compile(out.mlir_module, flags)
    try:
        return str(copy), owned
    finally:
        if owned:
            copy.operation.erase()


def _stem(**kw) -> torch.nn.Module:
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 16, 7, stride=2, padding=3, **kw)
    return torch.nn.Sequential(conv, torch.nn.BatchNorm2d(16), torch.nn.ReLU()).eval()


class _Bottleneck(torch.nn.Module):
    """ResNet-50's block: 1x1 -> 3x3 -> 1x1 with a strided 1x1 shortcut (or depthwise 3x3)."""

    def __init__(self, c: int = 16, depthwise: bool = False):
        super().__init__()
        self.reduce = torch.nn.Conv2d(4 * c, c, 1)
        self.mid = torch.nn.Conv2d(c, c, 3, stride=2, padding=1, groups=c if depthwise else 1)
        self.expand = torch.nn.Conv2d(c, 4 * c, 1, bias=False)
        self.shortcut = torch.nn.Conv2d(4 * c, 4 * c, 1, stride=2)

    def forward(self, x):
        y = self.expand(torch.relu(self.mid(torch.relu(self.reduce(x)))))
        return torch.relu(y + self.shortcut(x))


def test_the_compiled_copy_of_a_stem_is_im2col_and_matmul():
    out = export(_stem(), args=(torch.randn(1, 3, 32, 32),))
    exported = str(out.mlir_module)
    asm, owned = _copy_asm(out, default_compile_flags("llvm-cpu", use_env=False))
    assert owned
    check_ir(
        asm,
        # the window of output pixel (oh, ow), kernel tap (ky, kx), channel c
        r"affine_map<\(d0, d1, d2, d3, d4, d5\) -> \(d0, d5, d1 \* 2 \+ d3, d2 \* 2 \+ d4\)>",
        r"%\w+ = (func\.)?call @__turbine_conv_as_matmul_0\(%\w+, %\w+, %\w+\) : "
        r"\(tensor<1x3x32x32xf32>, tensor<16x3x7x7xf32>, tensor<16xf32>\) -> "
        r"tensor<1x16x16x16xf32>",
        r"func.func private @__turbine_conv_as_matmul_0",
        r"tensor.pad %\w+ low\[0, 0, 3, 3\] high\[0, 0, 3, 3\]",
        r"linalg.generic .* ins\(%padded : tensor<1x3x38x38xf32>\)",
        r"tensor.collapse_shape .* into tensor<256x147xf32>",
        r"linalg.matmul ins\(%\w+, %\w+ : tensor<256x147xf32>, tensor<147x16xf32>\)",
    )
    assert "torch.aten.convolution" not in asm and "torch.aten.conv2d" not in asm
    assert str(out.mlir_module) == exported  # the exported module is the reference's


# IREE 3.13 fuses an element-wise producer with two uses into a consumer that reads it through a
# strided map, and computes the producer's own result over the consumer's domain only.
_STRIDED_READ_OF_A_SHARED_PRODUCER = """
func.func @main(%x: tensor<4x8x8xf32>) -> (tensor<4x8x8xf32>, tensor<4x4x4xf32>) {
  %one = arith.constant 1.0 : f32
  %e = tensor.empty() : tensor<4x8x8xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(c, h, w) -> (c, h, w)>,
      affine_map<(c, h, w) -> (c, h, w)>], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%x : tensor<4x8x8xf32>) outs(%e : tensor<4x8x8xf32>) {
  ^bb0(%a: f32, %b: f32):
    %s = arith.addf %a, %one : f32
    linalg.yield %s : f32
  } -> tensor<4x8x8xf32>
  %e2 = tensor.empty() : tensor<4x4x4xf32>
  %sub = linalg.generic {indexing_maps = [affine_map<(c, h, w) -> (c, h * 2, w * 2)>,
      affine_map<(c, h, w) -> (c, h, w)>], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%r : tensor<4x8x8xf32>) outs(%e2 : tensor<4x4x4xf32>) {
  ^bb0(%a: f32, %b: f32):
    linalg.yield %a : f32
  } -> tensor<4x4x4xf32>
  return %r, %sub : tensor<4x8x8xf32>, tensor<4x4x4xf32>
}
"""


def test_iree_still_miscompiles_a_strided_read_of_a_shared_elementwise_producer(iree_device):
    """Why the im2col copies of strided and windowed convolutions read their input through
    ``util.optimization_barrier`` (``_compiler.convs``). When this test fails, IREE got fixed:
    the barrier can go (keep the ResNet-shaped test below)."""
    x = np.arange(4 * 8 * 8, dtype=np.float32).reshape(4, 8, 8)
    r, sub = iree_device.load(iree_device.compile(_STRIDED_READ_OF_A_SHARED_PRODUCER)).main(x)
    r, sub = np.asarray(r.to_host()), np.asarray(sub.to_host())
    assert np.array_equal(sub, (x + 1)[:, ::2, ::2])  # the strided consumer is right
    assert not np.array_equal(r, x + 1)  # the producer's own result is not
    assert np.array_equal(r[:, ::2, ::2], (x + 1)[:, ::2, ::2])  # only the read positions
    barrier = _STRIDED_READ_OF_A_SHARED_PRODUCER.replace(
        "  %e2 = tensor.empty()",
        "  %rb = util.optimization_barrier %r : tensor<4x8x8xf32>\n  %e2 = tensor.empty()",
    ).replace("ins(%r : tensor<4x8x8xf32>) outs(%e2", "ins(%rb : tensor<4x8x8xf32>) outs(%e2")
    r, sub = iree_device.load(iree_device.compile(barrier)).main(x)
    assert np.array_equal(np.asarray(r.to_host()), x + 1)  # the workaround
    assert np.array_equal(np.asarray(sub.to_host()), (x + 1)[:, ::2, ::2])


class _SharedStemInput(torch.nn.Module):
    """A stem whose (normalized) input is also an output: the pattern of the IREE bug above."""

    def __init__(self, padding: int):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, 2, padding)

    def forward(self, x):
        y = torch.relu(x + 1)
        return self.stem(y), y


@pytest.mark.parametrize("padding", [0, 1])
def test_a_stem_whose_input_has_another_use_matches_eager(padding):
    torch.manual_seed(0)
    model = _SharedStemInput(padding).eval()
    x = torch.randn(1, 3, 16, 16)
    out = export(model, args=(x,))
    assert len(convs_as_matmuls(out.mlir_module.operation)) == 1
    asm, _ = _copy_asm(out, default_compile_flags("llvm-cpu", use_env=False))
    assert "util.optimization_barrier" in asm
    compiled = load_module(out.compile(None))
    with torch.no_grad():
        for got, want in zip(compiled.main(x), model(x)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_bottleneck_keeps_its_3x3_convolution_and_has_its_1x1_ones_as_matmuls():
    out = export(_Bottleneck().eval(), args=(torch.randn(1, 64, 8, 8),))
    asm, _ = _copy_asm(out, default_compile_flags("llvm-cpu", use_env=False))
    assert asm.count("func.func private @__turbine_conv_as_matmul_") == 2  # reduce, expand
    check_ir(
        asm,
        # the 1x1 copy is the NCHW -> NHWC transpose
        r"affine_map<\(d0, d1, d2, d3, d4, d5\) -> \(d0, d5, d1 \+ d3, d2 \+ d4\)>",
        r"torch.aten.conv2d .* !torch.vtensor<\[16,16,3,3\],f32>",  # the 3x3 stays
        r"torch.aten.conv2d .* !torch.vtensor<\[64,64,1,1\],f32>",  # so does the strided 1x1
        r"linalg.matmul ins\(%\w+, %\w+ : tensor<64x64xf32>, tensor<64x16xf32>\)",  # reduce
    )


@pytest.mark.parametrize("target", ["vmvx", "vulkan-spirv", "cuda"], ids=lambda t: f"not-on-{t}")
def test_other_targets_keep_the_convolution(target):
    out = export(_stem(), args=(torch.randn(1, 3, 32, 32),))
    asm, _ = _copy_asm(out, default_compile_flags(target, use_env=False))
    assert "__turbine_conv_as_matmul" not in asm


def test_only_stems_and_unpadded_1x1_fp32_convolutions_are_rewritten():
    x = torch.randn(1, 3, 16, 16)
    kept = {
        "3x3 over 16 channels": (torch.nn.Conv2d(16, 8, 3), torch.randn(1, 16, 16, 16)),
        "padded 1x1": (torch.nn.Conv2d(8, 8, 1, padding=1), torch.randn(1, 8, 16, 16)),
        "grouped": (torch.nn.Conv2d(4, 8, 3, groups=2), torch.randn(1, 4, 16, 16)),
        "grouped 1x1": (torch.nn.Conv2d(4, 8, 1, groups=2), torch.randn(1, 4, 16, 16)),
        # a strided 1x1 needs a barrier (module doc) on an NCHW tensor that other consumers
        # want in NHWC: IREE 3.13 then writes both layouts from one dispatch and exceeds its
        # stack limit (ResNet-50, RegNetY), so it stays a convolution
        "strided 1x1": (torch.nn.Conv2d(8, 8, 1, stride=2), torch.randn(1, 8, 16, 16)),
        "transposed": (torch.nn.ConvTranspose2d(3, 8, 3), x),
        "conv1d": (torch.nn.Conv1d(3, 8, 3), torch.randn(1, 3, 16)),
    }
    for what, (conv, inp) in kept.items():
        out = export(torch.nn.Sequential(conv).eval(), args=(inp,))
        assert not convs_as_matmuls(out.mlir_module.operation), what
    batch = torch.export.Dim("batch", min=1, max=8)
    dyn = export(_stem(), args=(torch.randn(2, 3, 16, 16),), dynamic_shapes={"input": {0: batch}})
    assert not convs_as_matmuls(dyn.mlir_module.operation)  # a dynamic stem needs the barrier
    half = export(_stem().half(), args=(x.half(),))
    assert not convs_as_matmuls(half.mlir_module.operation)
    assert len(convs_as_matmuls(export(_stem(), args=(x,)).mlir_module.operation)) == 1
    one = export(torch.nn.Conv2d(32, 8, 1).eval(), args=(torch.randn(1, 32, 5, 5),))
    assert len(convs_as_matmuls(one.mlir_module.operation)) == 1


@pytest.mark.parametrize(
    "cin,cout,kernel,stride,padding,dilation,bias,shape",
    [
        (3, 64, 7, 2, 3, 1, False, (1, 3, 64, 64)),  # ResNet's stem
        (3, 16, 3, 2, 1, 1, True, (2, 3, 33, 31)),  # MobileNet's, odd sizes, batch 2
        (1, 8, (3, 5), (1, 2), (2, 1), (2, 1), True, (1, 1, 20, 21)),  # grayscale, dilated
        (4, 12, 3, 1, 0, 1, True, (1, 4, 9, 9)),  # no padding
        (24, 40, 1, 1, 0, 1, True, (2, 24, 7, 9)),  # pointwise
    ],
)
def test_rewritten_convolutions_match_eager(
    cin, cout, kernel, stride, padding, dilation, bias, shape
):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(cin, cout, kernel, stride, padding, dilation, bias=bias)
    model = torch.nn.Sequential(conv, torch.nn.ReLU(), torch.nn.Conv2d(cout, 8, 3)).eval()
    x = torch.randn(*shape)
    out = export(model, args=(x,))
    assert len(convs_as_matmuls(out.mlir_module.operation)) == 1  # the 3x3 after it stays
    compiled = load_module(out.compile(None))
    with torch.no_grad():
        torch.testing.assert_close(compiled.main(x), model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("depthwise", [False, True], ids=["bottleneck", "depthwise-bottleneck"])
def test_bottlenecks_with_a_dynamic_batch_match_eager(depthwise):
    torch.manual_seed(0)
    model = _Bottleneck(depthwise=depthwise).eval()
    batch = torch.export.Dim("batch", min=1, max=8)
    out = export(model, args=(torch.randn(2, 64, 12, 12),), dynamic_shapes={"x": {0: batch}})
    assert len(convs_as_matmuls(out.mlir_module.operation)) == 2  # reduce and expand
    compiled = load_module(out.compile(None))
    with torch.no_grad():
        for n in (1, 3):
            x = torch.randn(n, 64, 12, 12)
            torch.testing.assert_close(compiled.main(x), model(x), rtol=1e-4, atol=1e-4)


def test_stem_with_external_weights_matches_eager(tmp_path):
    import turbine_aot

    model = _stem()
    x = torch.randn(1, 3, 32, 32)
    turbine_aot.externalize_module_parameters(model)
    turbine_aot.save_module_parameters(tmp_path / "w.irpa", model)
    out = export(model, args=(x,))
    compiled = load_module(out.compile(None), parameters=tmp_path / "w.irpa")
    with torch.no_grad():
        torch.testing.assert_close(compiled.main(x), model(x), rtol=1e-4, atol=1e-4)
