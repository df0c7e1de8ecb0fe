"""3x3 stride-1 convolutions in Winograd form on the AVX-512 fp32 path (``_compiler.winograd``,
``_compiler.direct_convs``): the transforms' algebra, when the compile copy uses them, and that
they give eager's values for every geometry they take, with the epilogues and the padded
outputs the direct kernel has."""

from __future__ import annotations

import itertools
import re
from fractions import Fraction

import pytest
import torch
from ir_check import check_ir
from kernel_testing import compile_copy_asm, needs_avx512

from turbine_aot import export
from turbine_aot._compiler import winograd
from turbine_aot._compiler.convs import Conv
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.rewrites import environment_key
from turbine_aot._compiler.winograd import WINOGRAD_ENV, winograd_choice, winograd_matrices
from turbine_aot.runtime import load_module

_AVX512 = ["--turbine-cpu-matmul=avx512"]


@pytest.fixture(autouse=True)
def _default_choices(monkeypatch):
    for name in (
        "TURBINE_CPU_CONV_MATMUL",
        "TURBINE_CPU_MATMUL",
        "TURBINE_CPU_CONV_BLOCKING",
        "TURBINE_CPU_EPILOGUES",
        WINOGRAD_ENV,
    ):
        monkeypatch.delenv(name, raising=False)


def _flags() -> list[str]:
    return [*default_compile_flags("llvm-cpu", use_env=False), *_AVX512]


def _geometry(c=64, f=64, h=28, w=28, padding=1, n=1) -> Conv:
    o = (h + 2 * padding - 3) + 1, (w + 2 * padding - 3) + 1
    return Conv(n, c, h, w, f, 3, 3, (1, 1), (padding, padding), (1, 1), o[0], o[1], False)


# ---------------------------------------------------------------------------------- algebra
@pytest.mark.parametrize("m", [2, 4])
def test_the_transforms_compute_the_correlation_exactly(m):
    """``A^T [(G g) * (B^T d)]`` is the valid correlation of ``d`` with ``g``, in exact
    arithmetic, for basis vectors of both (so for all of them: the form is bilinear)."""
    bt, g, at = winograd_matrices(m)
    a = m + 2
    for di, gi in itertools.product(range(a), range(3)):
        d = [Fraction(int(i == di)) for i in range(a)]
        taps = [Fraction(int(i == gi)) for i in range(3)]
        gg = [sum(g[r][k] * taps[k] for k in range(3)) for r in range(a)]
        bd = [sum(bt[r][k] * d[k] for k in range(a)) for r in range(a)]
        y = [sum(at[i][r] * gg[r] * bd[r] for r in range(a)) for i in range(m)]
        want = [sum(d[i + k] * taps[k] for k in range(3)) for i in range(m)]
        assert y == want, (di, gi)
    with pytest.raises(ValueError, match="F\\(3, 3\\)"):
        winograd_matrices(3)


# ---------------------------------------------------------------------------- when it applies
def test_the_measured_choice_and_the_knob(monkeypatch):
    # F(4, 3) from 28 x 28 outputs, F(2, 3) from 7 x 7, the direct kernel below (Xeon)
    assert winograd_choice(_geometry(h=56, w=56)) == 4
    assert winograd_choice(_geometry(c=128, f=128, h=28, w=28)) == 4
    assert winograd_choice(_geometry(c=256, f=256, h=14, w=14)) == 2
    assert winograd_choice(_geometry(c=512, f=512, h=7, w=7)) == 2
    assert winograd_choice(_geometry(c=512, f=512, h=6, w=6)) == 0
    assert winograd_choice(_geometry(c=32, f=64, h=56, w=56)) == 0  # few channels: direct
    strided = Conv(1, 64, 56, 56, 64, 3, 3, (2, 2), (1, 1), (1, 1), 28, 28, False)
    assert winograd_choice(strided) == 0  # not a Winograd form
    assert winograd_choice(_geometry(c=24)) == 0  # channels not in 16s
    monkeypatch.setenv(WINOGRAD_ENV, "2")
    key = environment_key()
    assert winograd_choice(_geometry(c=16, f=16, h=4, w=4)) == 2  # forced: any size
    assert winograd_choice(strided) == 0
    monkeypatch.setenv(WINOGRAD_ENV, "off")
    assert winograd_choice(_geometry(h=56, w=56)) == 0
    assert environment_key() != key  # the compile cache keys on the choice
    monkeypatch.setenv(WINOGRAD_ENV, "3")
    with pytest.raises(ValueError, match=r"TURBINE_CPU_WINOGRAD='3'.*off, 2 or 4"):
        winograd_choice(_geometry())


def test_the_compile_copy_has_the_three_dispatches_and_the_weight_initializer(monkeypatch):
    monkeypatch.setenv(WINOGRAD_ENV, "2")
    torch.manual_seed(0)
    eo = export(torch.nn.Conv2d(16, 48, 3, padding=1).eval(), args=(torch.randn(1, 16, 9, 8),))
    exported = str(eo.mlir_module)
    asm = compile_copy_asm(eo, _flags())
    check_ir(
        asm,
        # the transformed weight: computed once, at load, from the weight's global
        r"util.global private @__turbine_avx512_conv_winograd_weight_0 : tensor<16384xf32>",
        r"util.initializer \{",
        r"util.global.load @__auto.weight : tensor<48x16x3x3xf32>",
        r"util.global.store %\w+, @__turbine_avx512_conv_winograd_weight_0",
        # input transform: 5 x 4 tiles of 2 x 2 outputs, 16 positions
        r"flow.dispatch @__turbine_winograd_f2x3_in_n1_c16_h9_w8_p1x1::\S+\(%\w+\) : "
        r"\(tensor<1760xf32>\) -> tensor<320x16xf32>",
        # the 16 matmuls: the AVX-512 kernel, a weight per position
        r"flow.dispatch @__turbine_avx512_f32_gemm_16x64_bb_\S+\[%c20, %c16\]",
        # output transform with the bias in its store
        r"flow.dispatch @__turbine_winograd_f2x3_n1_c16_h9_w8_f48_p1x1_shift::\S+\(%\w+, %\w+\)"
        r" : \(tensor<320x64xf32>, tensor<48xf32>\) -> tensor<72x48xf32>",
    )
    assert "avx512_f32_conv" not in asm and "torch.aten.conv2d" not in asm
    assert str(eo.mlir_module) == exported  # the exported module is the reference's
    monkeypatch.setenv(WINOGRAD_ENV, "off")
    asm = compile_copy_asm(eo, _flags())
    assert "winograd" not in asm and "avx512_f32_conv" in asm


class _ComputedWeight(torch.nn.Module):
    """A convolution whose weight is computed in the program, not a global."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 16, 3, 3))

    def forward(self, x):
        return torch.nn.functional.conv2d(x, self.w * 2, padding=1)


class _SharedWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)

    def forward(self, x):
        return self.conv(torch.relu(self.conv(x)))


@needs_avx512
def test_a_weight_that_is_not_a_global_stays_on_the_direct_kernel(monkeypatch):
    """The transformed weight is computed at load from the weight's global; a weight the
    program computes would need it per call, so that convolution keeps the direct kernel."""
    monkeypatch.setenv(WINOGRAD_ENV, "2")
    torch.manual_seed(0)
    model = _ComputedWeight().eval()
    x = torch.randn(1, 16, 8, 8)
    eo = export(model, args=(x,))
    asm = compile_copy_asm(eo, _flags())
    assert "winograd" not in asm and "avx512_f32_conv" in asm
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(load_module(eo.compile(None, extra_args=_AVX512)).main(x), want)


@needs_avx512
def test_two_convolutions_of_one_weight_share_its_transformed_copy(monkeypatch):
    monkeypatch.setenv(WINOGRAD_ENV, "4")
    torch.manual_seed(0)
    model = _SharedWeight().eval()
    x = torch.randn(1, 16, 8, 8)
    eo = export(model, args=(x,))
    asm = compile_copy_asm(eo, _flags())
    assert asm.count("util.initializer") == 1
    assert asm.count("flow.dispatch @__turbine_winograd_f4x3_in") == 2
    with torch.no_grad():
        want = model(x)
    got = load_module(eo.compile(None, extra_args=_AVX512)).main(x)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


@needs_avx512
def test_weights_from_an_archive(monkeypatch, tmp_path):
    """Weights externalized into an ``.irpa``: the initializer reads the parameter at load, and
    the archive's values (not the export's) are what the module computes with."""
    from turbine_params import externalize_module_parameters, save_module_parameters

    monkeypatch.setenv(WINOGRAD_ENV, "4")
    model = _block(16)
    x = torch.randn(1, 16, 9, 9)
    externalize_module_parameters(model)
    archive = tmp_path / "block.irpa"
    save_module_parameters(archive, model)
    eo = export(model, args=(x,))
    vmfb = tmp_path / "block.vmfb"
    eo.compile(save_to=vmfb, extra_args=_AVX512)
    with torch.no_grad():  # other weights in the archive than at export
        for p in model.parameters():
            p.mul_(0.5)
        save_module_parameters(archive, model)
        want = model(x)
    got = load_module(vmfb, parameters=archive).main(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


_GLOBAL_AFTER_ITS_USE = """
module {
  util.global private @p = #flow.parameter.named<"model"::"w"> : tensor<16xf32>
  %(function)s
  util.global private @g : tensor<16xf32>
  util.initializer {
    %%w = util.global.load @p : tensor<16xf32>
    %%w2 = arith.mulf %%w, %%w : tensor<16xf32>
    util.global.store %%w2, @g : tensor<16xf32>
    util.return
  }
  %(after)s
}
"""
_USE = """func.func @main(%x: tensor<16xf32>) -> tensor<16xf32> {
    %g = util.global.load @g : tensor<16xf32>
    %r = arith.addf %x, %g : tensor<16xf32>
    return %r : tensor<16xf32>
  }"""


def test_iree_fails_a_global_an_initializer_stores_where_a_function_using_it_comes_first():
    """Pins the IREE 3.13 bug that the transformed weights' placement works around (before
    the module's functions: ``TopLevel.append(before_functions=True)``): this test fails once
    IREE compiles the first order, and the workaround can go."""
    from iree.compiler import CompilerToolError, compile_str

    flags = dict(target_backends=["llvm-cpu"])
    with pytest.raises(CompilerToolError, match="failed to legalize unresolved target"):
        compile_str(_GLOBAL_AFTER_ITS_USE % {"function": _USE, "after": ""}, **flags)
    assert compile_str(_GLOBAL_AFTER_ITS_USE % {"function": "", "after": _USE}, **flags)


# ---------------------------------------------------------------------------------- numerics
_GEOMETRIES = {
    # name: (C, F, padding, bias, batch, H, W)
    "even": (16, 32, 1, True, 1, 8, 8),
    "odd-sides": (32, 48, 1, False, 2, 7, 9),  # last tiles overhang: reads and writes masked
    "no-padding": (16, 16, 0, True, 1, 9, 6),
    "wide-panels": (64, 80, 1, True, 1, 5, 11),  # F 80 -> matmul panels of 128
    "one-tile": (16, 16, 1, False, 1, 2, 2),
}


@needs_avx512
@pytest.mark.parametrize("tile", ["2", "4"])
@pytest.mark.parametrize("name", sorted(_GEOMETRIES))
def test_the_transforms_match_eager(name, tile, monkeypatch):
    monkeypatch.setenv(WINOGRAD_ENV, tile)
    c, f, p, bias, n, h, w = _GEOMETRIES[name]
    torch.manual_seed(0)
    model = torch.nn.Conv2d(c, f, 3, padding=p, bias=bias).eval()
    x = torch.randn(n, c, h, w)
    eo = export(model, args=(x,))
    assert f"winograd_f{tile}x3" in compile_copy_asm(eo, _flags())
    got = load_module(eo.compile(None, extra_args=_AVX512)).main(x)
    with torch.no_grad():
        want = model(x)
    # F(4, 3)'s transforms add rounding (coefficients 1/6, 1/12, 1/24 and larger sums)
    tol = 1e-5 if tile == "2" else 5e-5
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


class _Block(torch.nn.Module):
    """conv -> BN -> ReLU -> conv -> BN -> + x -> ReLU (ResNet's basic block): the first
    output written zero-padded for the second, the second's batch norm, residual and ReLU in
    its output transform."""

    def __init__(self, c: int):
        super().__init__()
        self.c1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(c)
        self.c2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(c)

    def forward(self, x):
        y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
        return torch.relu(y + x)


def _block(c: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(c, c, 3, padding=1), _Block(c), _Block(c))
    for mod in model.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
            mod.weight.data.uniform_(0.5, 1.5)
    return model.eval()


@needs_avx512
@pytest.mark.parametrize("vendor", ["AuthenticAMD", "GenuineIntel"])
@pytest.mark.parametrize("tile", ["2", "4"])
def test_resnet_blocks_with_epilogues_and_padded_outputs_match_eager(tile, vendor, monkeypatch):
    """Under each vendor's matmul blocking (Intel: 6 x 64 blocks, 96 rows, the next block
    prefetched, clamped to each position's weight)."""
    monkeypatch.setattr(winograd, "cpu_vendor", lambda: vendor)
    monkeypatch.setenv(WINOGRAD_ENV, tile)
    model = _block(32)
    x = torch.randn(2, 32, 11, 10)
    eo = export(model, args=(x,))
    asm = compile_copy_asm(eo, _flags())
    assert asm.count(f"flow.dispatch @__turbine_winograd_f{tile}x3_in") == 5
    assert "_scale_shift_residual_relu" in asm  # the block's end, in the output transform
    assert "_opad1x1" in asm  # outputs written as the next convolution reads them
    got = load_module(eo.compile(None, extra_args=_AVX512)).main(x)
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@needs_avx512
def test_with_the_epilogues_kept_apart_the_values_are_the_same(monkeypatch):
    """``TURBINE_CPU_EPILOGUES=keep``: bias, batch norms, residual and ReLU as IREE's own
    dispatches around the Winograd convolutions."""
    monkeypatch.setenv(WINOGRAD_ENV, "2")
    monkeypatch.setenv("TURBINE_CPU_EPILOGUES", "keep")
    model = _block(16)
    x = torch.randn(1, 16, 6, 6)
    eo = export(model, args=(x,))
    asm = compile_copy_asm(eo, _flags())
    assert "winograd_f2x3" in asm
    assert not re.search(r"winograd_f2x3_n\S*_(scale|shift|residual|relu)", asm)
    got = load_module(eo.compile(None, extra_args=_AVX512)).main(x)
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
