"""torchao's int4-weight x int8-activation products (``Int8DynamicActivationIntxWeightConfig(
weight_dtype=torch.int4, weight_granularity=PerGroup(G))``, exported as fake quantization) on
turbine's w4a8 kernel (``_compiler.avx512_w4a8``, ``_compiler.quant_w4a8_matmuls``), in both its
forms: AVX-512 VNNI (``vpdpbusd``) and AVX2 (``vpmaddubsw`` + ``vpmaddwd``, the kernels built for
AVX2: ``--turbine-cpu-matmul=avx2``, the default on AVX2 CPUs). That the compile copy calls the
right form where it should and keeps the weight-only int4 kernel elsewhere, that its code is
those instructions with the weight's ``t`` computed at load, and that the results equal torchao
eager's for groups of 32 to 256, one row and row tails, with and without bias, with weight zero
points, and for shapes the kernel does not take. The AVX2 form runs on AVX-512 CPUs too.

torchao is a dev requirement; without it these tests skip.
"""

from __future__ import annotations

import logging

import pytest
import torch
from kernel_testing import compile_copy_asm, export_with_archive, host_flags

from turbine_aot._compiler import matmuls, rewrites
from turbine_aot._compiler.avx512 import host_avx512_missing
from turbine_aot._compiler.avx512_vnni import host_vnni_missing
from turbine_aot._compiler.avx512_w4a8 import Avx512W4A8Gemm
from turbine_aot._compiler.fallback import retry_flags
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.isa import host_isa
from turbine_aot._compiler.quant_w4a8_matmuls import rewritable_w4a8_matmuls
from turbine_aot.runtime import load_module

tq = pytest.importorskip(
    "torchao.quantization", reason="torchao is a dev requirement (tools/requirements-dev.txt)"
)
granularity = pytest.importorskip("torchao.quantization.granularity")
primitives = pytest.importorskip("torchao.quantization.quant_primitives")

VNNI_MISSING = host_vnni_missing()
_CALL = "func.func private @__turbine_avx512_vnni_w4a8_matmul_"
_AVX2_CALL = "func.func private @__turbine_avx2_w4a8_matmul_"
_INT4 = "func.func private @__turbine_avx512_quant_matmul_"
AVX2 = ["--turbine-cpu-matmul=avx2"]

#: The kernel's forms: (the compile flags that choose it, its kernels' name stem, the
#: instructions of its dot products).
FORMS = {
    "vnni": ([], "avx512_vnni", ("vpdpbusd",)),
    "avx2": (AVX2, "avx2", ("vpmaddubsw", "vpmaddwd")),
}


@pytest.fixture(params=sorted(FORMS))
def form(request):
    """Each form, skipped where this CPU cannot run it."""
    if request.param == "vnni":
        if host_avx512_missing():
            pytest.skip(f"this CPU has no AVX-512 (lacks {', '.join(host_avx512_missing())})")
        if VNNI_MISSING:
            pytest.skip(f"this CPU has no AVX-512 VNNI (lacks {', '.join(VNNI_MISSING)})")
    elif not host_isa():
        pytest.skip("this CPU has neither AVX-512 nor AVX2 with FMA")
    return FORMS[request.param]


@pytest.fixture(autouse=True)
def _defaults(monkeypatch):
    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    monkeypatch.delenv("TURBINE_CPU_INT8_MATMUL", raising=False)
    monkeypatch.delenv("TURBINE_CPU_QUANT_KERNEL", raising=False)


def _model(
    k: int = 256,
    hidden: int | None = 256,
    n: int = 128,
    group: int = 32,
    asymmetric: bool = False,
    bias: bool = True,
) -> torch.nn.Module:
    """Two layers, with a bias and without; one (``bias`` or not) where ``hidden`` is None."""
    torch.manual_seed(0)
    if hidden is None:
        layers = [torch.nn.Linear(k, n, bias=bias)]
    else:
        layers = [
            torch.nn.Linear(k, hidden, bias=True),
            torch.nn.SiLU(),
            torch.nn.Linear(hidden, n, bias=False),
        ]
    m = torch.nn.Sequential(*layers).eval()
    mapping = primitives.MappingType.ASYMMETRIC if asymmetric else primitives.MappingType.SYMMETRIC
    tq.quantize_(
        m,
        tq.Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int4,
            weight_granularity=granularity.PerGroup(group),
            weight_mapping_type=mapping,
        ),
    )
    return m


def _export(m, tmp_path, external: bool = True, rows: int = 4, dynamic: bool = True):
    return export_with_archive(m, tmp_path, "w4a8.irpa", external, rows, dynamic)


def _check(compiled, m, rows_list) -> float:
    """Against eager: the integer sums are exact, only the f32 sums are in another order.
    (Behind another quantized layer a float difference in its output can move one activation
    across an int8 rounding boundary, a whole quantization step: the end-to-end checks are of
    one layer; the LLM test handles such near-ties.)"""
    torch.manual_seed(1)
    k = m[0].in_features
    worst = 0.0
    for rows in rows_list:
        for x in (torch.randn(rows, k), torch.randn(rows, k) * 3):
            with torch.no_grad():
                want = m(x)
            got = torch.as_tensor(compiled.main(x))
            torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)
            worst = max(worst, float((got - want).abs().max()))
    return worst


# ---------------------------------------------------------------------------- when it applies
def test_the_compile_copy_calls_the_w4a8_kernel_where_it_should(monkeypatch, tmp_path):
    monkeypatch.setattr(matmuls, "host_avx512_missing", lambda: [])
    monkeypatch.setattr(rewrites, "host_vnni_missing", lambda: [])
    eo, _ = _export(_model(), tmp_path)
    exported = str(eo.mlir_module)
    assert len(rewritable_w4a8_matmuls(eo.mlir_module)) == 2
    asm = compile_copy_asm(eo, host_flags())
    assert exported == str(eo.mlir_module)  # the export is unchanged
    assert asm.count(_CALL) == 2 and _INT4 not in asm
    assert "@__turbine_avx512_vnni_i4i8_gemm_256x256_g32z_" in asm
    assert "@__turbine_avx512_vnni_i4i8_gemm_256x128_g32z_" in asm
    assert "torch.aten.mm" not in asm  # the f32 products and their dequantizations are gone
    assert 'turbine.cpu_requires = "avx512f,avx512_vnni"' in asm
    # TURBINE_CPU_INT8_MATMUL=iree and a CPU without VNNI: the weight-only int4 kernel, as before
    monkeypatch.setenv("TURBINE_CPU_INT8_MATMUL", "iree")
    asm = compile_copy_asm(eo, host_flags())
    assert _CALL not in asm and asm.count(_INT4) == 2
    monkeypatch.delenv("TURBINE_CPU_INT8_MATMUL")
    monkeypatch.setattr(rewrites, "host_vnni_missing", lambda: ["avx512_vnni"])
    asm = compile_copy_asm(eo, host_flags())
    assert _CALL not in asm and asm.count(_INT4) == 2
    monkeypatch.setattr(rewrites, "host_vnni_missing", lambda: [])
    # kernels built for AVX2 (the default on AVX2 CPUs): the AVX2 form, even where the host
    # has VNNI (the module may be meant for another CPU); TURBINE_CPU_INT8_MATMUL=iree as above
    asm = compile_copy_asm(eo, host_flags(*AVX2))
    assert asm.count(_AVX2_CALL) == 2 and _CALL not in asm and _INT4 not in asm
    assert "@__turbine_avx2_i4i8_gemm_256x256_g32z_" in asm
    assert 'turbine.cpu_requires = "avx2,fma"' in asm and "vpdpbusd" not in asm
    monkeypatch.setenv("TURBINE_CPU_INT8_MATMUL", "iree")
    asm = compile_copy_asm(eo, host_flags(*AVX2))
    assert _AVX2_CALL not in asm and asm.count(_INT4) == 2
    monkeypatch.delenv("TURBINE_CPU_INT8_MATMUL")
    # IREE's code for portable builds, other targets, --turbine-cpu-matmul=iree and the retry
    for flags in (
        host_flags("--turbine-cpu-matmul=iree"),
        default_compile_flags("llvm-cpu", host=False, use_env=False),
        default_compile_flags("vmvx", use_env=False),
        retry_flags(host_flags(), []),
    ):
        assert flags is not None
        asm = compile_copy_asm(eo, flags)
        assert _CALL not in asm and _AVX2_CALL not in asm


def test_shapes_the_kernel_does_not_take():
    assert Avx512W4A8Gemm.supports(2048, 2048, 32) and Avx512W4A8Gemm.supports(128, 4, 128)
    assert Avx512W4A8Gemm.supports(512, 8, 256)
    assert not Avx512W4A8Gemm.supports(192, 64, 64)  # K not a multiple of 128
    assert not Avx512W4A8Gemm.supports(256, 6, 32)  # N not a multiple of 4
    assert not Avx512W4A8Gemm.supports(384, 8, 192)  # a group across steps, not a multiple
    assert not Avx512W4A8Gemm.supports(256, 8, 16)  # groups smaller than 32
    # a row block's prepared data (1.5 K bytes a row) stays within IREE's 32 KiB of stack
    assert [Avx512W4A8Gemm.for_shape(k, 64, 32, True).mr for k in (4096, 8192, 16384)] == [4, 2, 1]
    assert not Avx512W4A8Gemm.supports(16384 + 128, 64, 32)
    assert Avx512W4A8Gemm.for_shape(256, 64, 32, True, "avx2").name.startswith("__turbine_avx2_")
    with pytest.raises(ValueError, match="no form for 'sse'"):
        Avx512W4A8Gemm.for_shape(256, 64, 32, True, "sse")


# ---------------------------------------------------------------------------------- end to end
@pytest.mark.parametrize(
    ("group", "asymmetric", "bias"),
    [
        (32, False, True),
        (64, True, False),
        (128, False, False),
        (128, True, True),
        (256, True, True),
    ],
)
def test_w4a8_layers_on_the_kernel_match_torchao_eager(
    tmp_path, caplog, group, asymmetric, bias, request, form
):
    """Rows 1, 5 and 33 (dynamic): the kernels of fewer rows for the last rows, and more than
    one workgroup of rows (16 each); asymmetric weights have nonzero zero points. (A group as
    wide as the layer, one per channel, is torchao's per-channel form: neither this kernel's
    pattern nor the weight-only one's.)"""
    m = _model(1024, None, 256, group, asymmetric, bias)
    assert bool((m[0].weight.zero_point != 0).any()) == asymmetric
    eo, parameters = _export(m, tmp_path)
    flags, stem, _ = form
    assert (
        compile_copy_asm(eo, host_flags(*flags)).count(
            f"func.func private @__turbine_{stem}_w4a8_matmul_"
        )
        == 1
    )
    with caplog.at_level(logging.WARNING, logger="turbine.aot"):
        vmfb = eo.compile(save_to=None, extra_args=flags)
    assert "failed" not in caplog.text  # compiled with the kernel, no fallback
    worst = _check(load_module(vmfb, parameters=parameters), m, (1, 5, 33))
    print(f"{request.node.name}: {worst:.1e}")


def test_static_one_row_and_odd_widths(tmp_path, form):
    """One static row (decode); K = 384 (a step of 128 without the unroll's 256), hidden 96 and
    N = 36 (not multiples of the workgroup columns)."""
    m = _model(384, None, 36, 32)
    eo, parameters = _export(m, tmp_path, rows=1, dynamic=False)
    flags, stem, _ = form
    asm = compile_copy_asm(eo, host_flags(*flags))
    assert asm.count(f"func.func private @__turbine_{stem}_w4a8_matmul_") == 1
    assert f"@__turbine_{stem}_i4i8_gemm_384x36_g32z_4x1_u1_16x4" in asm
    compiled = load_module(eo.compile(save_to=None, extra_args=flags), parameters=parameters)
    _check(compiled, m, (1,))


@pytest.mark.parametrize(("k", "rows"), [(8192, 2), (16384, 1)])
def test_long_rows_are_prepared_in_smaller_blocks(tmp_path, k, rows, form):
    """K = 8192 / 16384: 2 / 1 rows per prepared block (the stack limit), rows 1, 5, 33."""
    m = _model(k, None, 32, 128 if k > 8192 else 32, asymmetric=True)
    eo, parameters = _export(m, tmp_path)
    flags, stem, _ = form
    asm = compile_copy_asm(eo, host_flags(*flags))
    assert f"@__turbine_{stem}_i4i8_gemm_{k}x32_" in asm and f"_{rows}x1_u2_" in asm
    vmfb = eo.compile(save_to=None, extra_args=flags)
    _check(load_module(vmfb, parameters=parameters), m, (1, 5, 33))


def test_inline_weights_and_other_shapes_stay_and_match(tmp_path):
    """Weights inline (one byte per int4 value, not the archive's packed i4) and K = 96: not
    rewritten; the results are still eager's."""
    m = _model(96, None, 8, 32)
    eo, parameters = _export(m, tmp_path)
    assert rewritable_w4a8_matmuls(eo.mlir_module) == []
    compiled = load_module(eo.compile(save_to=None), parameters=parameters)
    _check(compiled, m, (1, 5))
    m = _model(256, None, 8, 32)
    eo, parameters = _export(m, tmp_path, external=False)
    assert rewritable_w4a8_matmuls(eo.mlir_module) == []
    compiled = load_module(eo.compile(save_to=None), parameters=parameters)
    _check(compiled, m, (1, 5))


def test_the_kernel_is_its_forms_instructions_and_t_is_computed_at_load(tmp_path, form):
    """The kernel's inner loop is ``vpdpbusd`` (VNNI) or ``vpmaddubsw`` + ``vpmaddwd`` (AVX2),
    and the weight's ``t = sum_g s sum Q`` runs in an initializer (once, at load), not per
    call."""
    flags, _, instructions = form
    m = _model(256, None, 128)
    eo, parameters = _export(m, tmp_path, dynamic=False)
    dump = tmp_path / "dump"
    vmfb = eo.compile(
        save_to=None,
        extra_args=[
            *flags,
            f"--iree-hal-dump-executable-files-to={dump}",
            f"--iree-hal-dump-executable-sources-to={dump / 'sources'}",
        ],
    )
    text = "".join(p.read_text() for p in dump.glob("*.s"))
    for instruction in instructions:  # two (VNNI) / four and two (AVX2) per step, unroll 2
        assert text.count(instruction) >= 4, instruction
    other = {"vpdpbusd", "vpmaddubsw"} - set(instructions)
    assert not any(i in text for i in other)  # (no other kernel of this module has them)
    sources = {p.name: p.read_text() for p in (dump / "sources").glob("*.mlir")}
    # sum Q per group reads the weight's bytes with the nibbles' shifts (arith.shrsi)
    per_group = [name for name, text in sources.items() if "arith.shrsi" in text]
    assert per_group and all("initializer" in name for name in per_group), sorted(sources)
    _check(load_module(vmfb, parameters=parameters), m, (4,))
