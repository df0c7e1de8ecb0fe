"""torchao's int8 x int8 products (``Int8DynamicActivationInt8WeightConfig``) on turbine's AVX-512
VNNI kernel (``_compiler.avx512_vnni``, ``_compiler.quant_int8_matmuls``): that the compile copy
calls it for both of torchao's forms of the product (u8 x s8 with a correction, exported on a
VNNI CPU without AMX, and s8 x s8 elsewhere), that its code is ``vpdpbusd``, that the results
equal torchao eager's for one row and row tails, with and without bias, weights from an archive
and inline, and that IREE's code is kept where the kernel does not apply.

torchao is a dev requirement; without it these tests skip.
"""

from __future__ import annotations

import logging

import pytest
import torch
from kernel_testing import compile_copy_asm, export_with_archive, host_flags, needs_avx512

from turbine_aot import export
from turbine_aot._compiler import matmuls, rewrites
from turbine_aot._compiler.avx512_vnni import Avx512VnniGemm, host_vnni_missing
from turbine_aot._compiler.fallback import retry_flags
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.quant_int8_matmuls import rewritable_int8_matmuls
from turbine_aot.runtime import load_module

tq = pytest.importorskip(
    "torchao.quantization", reason="torchao is a dev requirement (tools/requirements-dev.txt)"
)
intmm = pytest.importorskip("torchao.kernel.intmm", reason="torchao's integer matmul module")

VNNI_MISSING = host_vnni_missing()
needs_vnni = pytest.mark.skipif(
    bool(VNNI_MISSING), reason=f"this CPU has no AVX-512 VNNI (lacks {', '.join(VNNI_MISSING)})"
)
_CALL = "func.func private @__turbine_avx512_vnni_int8_matmul_"


@pytest.fixture(params=["u8s8", "s8s8"])
def form(request, monkeypatch):
    """Which of torchao's two forms the export traces: torchao picks by the exporting CPU
    (``_int_scaled_matmul_cpu``: u8 x s8 on a VNNI CPU without AMX, s8 x s8 otherwise)."""
    monkeypatch.setattr(intmm, "_cpu_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(intmm, "_cpu_is_vnni_supported", lambda: request.param == "u8s8")
    return request.param


def _model(k: int = 256, hidden: int = 256, n: int = 128) -> torch.nn.Module:
    """Two layers: with a bias and without."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(k, hidden, bias=True),
        torch.nn.SiLU(),
        torch.nn.Linear(hidden, n, bias=False),
    ).eval()
    tq.quantize_(m, tq.Int8DynamicActivationInt8WeightConfig())
    return m


def _export(m, tmp_path, external: bool = True, rows: int = 4, dynamic: bool = True):
    return export_with_archive(m, tmp_path, "w8a8.irpa", external, rows, dynamic)


def _check(compiled, m, rows_list) -> float:
    torch.manual_seed(1)
    k = next(m.parameters()).shape[1]
    worst = 0.0
    for rows in rows_list:
        for x in (torch.randn(rows, k), torch.randn(rows, k) * 3):
            with torch.no_grad():
                want = m(x)
            got = compiled.main(x)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            worst = max(worst, float((got - want).abs().max()))
    return worst


# ---------------------------------------------------------------------------- when it applies
def test_the_compile_copy_calls_the_vnni_kernel_for_both_forms(monkeypatch, tmp_path, form):
    monkeypatch.setattr(matmuls, "host_avx512_missing", lambda: [])
    monkeypatch.setattr(rewrites, "host_vnni_missing", lambda: [])
    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    monkeypatch.delenv("TURBINE_CPU_INT8_MATMUL", raising=False)
    eo, _ = _export(_model(), tmp_path)
    exported = str(eo.mlir_module)
    assert ("torch.aten.add.Scalar" in exported) == (form == "u8s8")  # the form traced
    assert len(rewritable_int8_matmuls(eo.mlir_module)) == 2
    asm = compile_copy_asm(eo, host_flags())
    assert exported == str(eo.mlir_module)  # the export is unchanged
    assert asm.count(_CALL) == 2
    assert "@__turbine_avx512_vnni_i8i8_gemm_256x256_" in asm
    assert "@__turbine_avx512_vnni_i8i8_gemm_256x128_" in asm
    # the integer product and its u8 / correction terms are gone; the rescale stays
    for gone in ("torch.aten._int_mm", "torch.aten.sum.dim_IntList", "torch.aten.add.Scalar"):
        assert gone not in asm
    assert "torch.aten.amax" in asm and "torch.aten.mul.Tensor" in asm
    assert 'turbine.cpu_requires = "avx512f,avx512_vnni"' in asm
    # IREE's code when asked for, for kernels built for AVX2 (a module meant for a CPU without
    # VNNI), for portable builds, other targets, the retry without turbine's fast-matmul
    # defaults, and on a CPU without VNNI
    for flags in (
        host_flags("--turbine-cpu-matmul=iree"),
        host_flags("--turbine-cpu-matmul=avx2"),
        default_compile_flags("llvm-cpu", host=False, use_env=False),
        default_compile_flags("vmvx", use_env=False),
        retry_flags(host_flags(), []),
        # a target without AVX-512, whatever the blocking (the VNNI instruction is AVX-512's)
        host_flags("--iree-llvmcpu-target-cpu-features=+avx2,+fma"),
    ):
        assert flags is not None
        assert _CALL not in compile_copy_asm(eo, flags)
    monkeypatch.setenv("TURBINE_CPU_INT8_MATMUL", "iree")
    assert _CALL not in compile_copy_asm(eo, host_flags())
    monkeypatch.delenv("TURBINE_CPU_INT8_MATMUL")
    monkeypatch.setattr(rewrites, "host_vnni_missing", lambda: ["avx512_vnni"])
    assert _CALL not in compile_copy_asm(eo, host_flags())


def test_shapes_the_kernel_does_not_take_are_not_rewritten():
    assert Avx512VnniGemm.supports(2048, 2048) and Avx512VnniGemm.supports(64, 4)
    assert not Avx512VnniGemm.supports(96, 256)  # K not a multiple of 64
    assert not Avx512VnniGemm.supports(256, 6)  # N not a multiple of 4
    torch.manual_seed(0)
    eo = export(torch.nn.Linear(64, 32), args=(torch.randn(2, 64),))
    assert rewritable_int8_matmuls(eo.mlir_module) == []  # fp32: no integer product


# ---------------------------------------------------------------------------------- end to end
@needs_avx512
@needs_vnni
@pytest.mark.parametrize("external", [True, False], ids=["irpa", "inline"])
def test_int8_dynamic_activation_layers_on_the_kernel_match_torchao_eager(
    tmp_path, caplog, monkeypatch, form, external
):
    """Rows 1, 5 and 33 (dynamic): the kernels of fewer rows for the last rows, and more than
    one workgroup of rows (16 each). The integer sums are exact, so the results are eager's
    float rescale of the same integers."""
    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    monkeypatch.delenv("TURBINE_CPU_INT8_MATMUL", raising=False)
    m = _model()
    eo, parameters = _export(m, tmp_path, external)
    assert compile_copy_asm(eo, host_flags()).count(_CALL) == 2
    with caplog.at_level(logging.WARNING, logger="turbine.aot"):
        vmfb = eo.compile(save_to=None)
    assert "failed" not in caplog.text  # compiled with the kernel, no fallback
    compiled = load_module(vmfb, parameters=parameters)
    worst = _check(compiled, m, (1, 5, 33))
    print(f"int8 dynamic activation ({form}, {'irpa' if external else 'inline'}): {worst:.1e}")


@needs_avx512
@needs_vnni
def test_static_one_row_and_odd_widths(tmp_path, monkeypatch, form):
    """One static row (decode); K = 320, hidden 192 and N = 36: multiples of 64 and 4 that are
    not of the kernel's unroll (128) nor its workgroup columns (32)."""
    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    m = _model(320, 192, 36)
    eo, parameters = _export(m, tmp_path, rows=1, dynamic=False)
    asm = compile_copy_asm(eo, host_flags())
    assert "@__turbine_avx512_vnni_i8i8_gemm_320x192_4x1_u1_16x32" in asm
    assert "@__turbine_avx512_vnni_i8i8_gemm_192x36_4x1_u1_16x4" in asm
    compiled = load_module(eo.compile(save_to=None), parameters=parameters)
    _check(compiled, m, (1,))


def test_a_shape_the_kernel_does_not_take_stays_irees_and_matches(tmp_path, monkeypatch):
    """K = 96 (not a multiple of 64) and N = 6: IREE's integer matmul, still eager's results."""
    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    m = _model(96, 96, 6)
    eo, parameters = _export(m, tmp_path)
    assert rewritable_int8_matmuls(eo.mlir_module) == []
    asm = compile_copy_asm(eo, host_flags())
    assert _CALL not in asm and "torch.aten._int_mm" in asm
    compiled = load_module(eo.compile(save_to=None), parameters=parameters)
    _check(compiled, m, (1, 5))


@needs_avx512
@needs_vnni
def test_the_kernel_is_vpdpbusd_and_its_correction_is_computed_at_load(tmp_path, monkeypatch):
    """The kernel's inner loop is ``vpdpbusd`` (64 int8 multiply-adds per instruction), and the
    weight's correction ``128 * sum_k Q`` runs in an initializer (once, at load), not per call."""
    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    m = _model()
    eo, parameters = _export(m, tmp_path, dynamic=False)
    dump = tmp_path / "dump"
    vmfb = eo.compile(
        save_to=None,
        extra_args=[
            f"--iree-hal-dump-executable-files-to={dump}",
            f"--iree-hal-dump-executable-sources-to={dump / 'sources'}",
        ],
    )
    text = "".join(p.read_text() for p in dump.glob("*.s"))
    assert text.count("vpdpbusd") >= 2  # unroll 2, per kernel of rows
    sources = {p.name: p.read_text() for p in (dump / "sources").glob("*.mlir")}
    correction = [name for name, text in sources.items() if "reduction_256x256_i8xi32" in text]
    assert correction and all("initializer" in name for name in correction), sorted(sources)
    _check(load_module(vmfb, parameters=parameters), m, (4,))
