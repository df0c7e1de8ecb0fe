"""Weight-only int4 products of one row on AVX2 (``_compiler.avx2_quant``, ``nibble_masks``):
each nibble taken out of its dword by one ``and``, converted, the factor ``16^t`` undone on the
reordered activations, ``q + 8`` corrected per group by ``(z + 8) sum x``
(docs/quantization.md, "Weight-only int4 on AVX2: nibble masks"). The compile copy is checked
on any CPU; the values against torchao eager where the CPU has AVX2 (an AVX-512 one runs the
AVX2 code too)."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import compile_copy_asm, export_with_archive, needs_avx2

from turbine_aot._compiler.avx2_quant import SLICE_K, masks_support
from turbine_aot._compiler.avx512_quant import Avx512QuantGemm
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.isa import host_isa, kernels_for, target_avx512
from turbine_aot._compiler.matmuls import host_avx512_missing, target_has_avx512
from turbine_aot.runtime import load_module

AVX2 = ["--turbine-cpu-matmul=avx2"]


def _flags() -> list[str]:
    return [*default_compile_flags("llvm-cpu", use_env=False), *AVX2]


def _int4(m: torch.nn.Module, group: int, asymmetric: bool = False) -> torch.nn.Module:
    """``m`` with torchao's weight-only int4 (``IntxWeightOnlyConfig``) in groups of ``group``."""
    tq = pytest.importorskip(
        "torchao.quantization", reason="torchao is a dev requirement (tools/requirements-dev.txt)"
    )
    from torchao.quantization import granularity, quant_primitives

    mapping = quant_primitives.MappingType
    tq.quantize_(
        m,
        tq.IntxWeightOnlyConfig(
            weight_dtype=torch.int4,
            granularity=granularity.PerGroup(group),
            mapping_type=mapping.ASYMMETRIC if asymmetric else mapping.SYMMETRIC,
        ),
    )
    return m


def _mlp(k: int, hidden: int, n: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(k, hidden), torch.nn.SiLU(), torch.nn.Linear(hidden, n, bias=False)
    ).eval()


def _assert_matches_eager(compiled, m: torch.nn.Module, x: torch.Tensor) -> None:
    """The compiled module's ``main(x)`` against torchao eager's ``m(x)``, within ``1e-5``
    relative to the largest output."""
    with torch.no_grad():
        want = m(x)
    torch.testing.assert_close(
        compiled.main(x), want, rtol=1e-5, atol=1e-5 * float(want.abs().max())
    )


def _block(group: int, variant: str = "") -> str:
    """The register block, workgroup and form in the kernel's name (32 columns a workgroup):
    groups of 64s four channels a block in one chain each, groups of 32 (and the A/B variant)
    two channels in two chains."""
    return "1x2_16x32_pf_cvt_nm2" if group == 32 or variant else "1x4_16x32_pf_cvt_nm1"


def test_the_form_takes_one_row_int4_in_groups_of_32_or_64s():
    assert masks_support(2048, 4, 32) and masks_support(2048, 4, 128) and masks_support(256, 4, 256)
    assert masks_support(SLICE_K + 64, 4, 64)  # in two slices
    assert not masks_support(2048, 4, 96)  # a group's loads would straddle groups
    assert not masks_support(2080, 4, 32)  # K not a multiple of 64
    assert not masks_support(2048, 8, 128) and not masks_support(2048, 4, None)
    assert not masks_support(2048, 4, 128, mr=2)
    with kernels_for("avx2"):
        one = Avx512QuantGemm.for_shape(2048, 2048, 4, 128, True, rows=1)
        some = Avx512QuantGemm.for_shape(2048, 2048, 4, 128, True, rows=None)
        first = Avx512QuantGemm.for_shape(2048, 2048, 4, 128, True, "v1", rows=1)
    # groups of 64s: four channels a block, one FMA chain each; groups of 32: two, two chains
    assert one.nibble_masks and one.prepared_row and one.name.endswith("_1x4_16x128_pf_cvt_nm1_pr")
    with kernels_for("avx2"):
        g32 = Avx512QuantGemm.for_shape(2048, 2048, 4, 32, True, rows=1)
    assert g32.name.endswith("_1x2_16x128_pf_cvt_nm2_pr")
    with kernels_for("avx2"):  # the A/B variant: the row reordered by each workgroup
        per_wg = Avx512QuantGemm.for_shape(2048, 2048, 4, 128, True, "rows-per-workgroup", rows=1)
    assert per_wg.nibble_masks and not per_wg.prepared_row and per_wg.name.endswith("_nm2")
    assert one.a_width == 2048 + 2048 // 128 * 8 and per_wg.a_width == 2048
    # the row is reordered per workgroup: the widest workgroups that leave 16 of them
    assert one.cols_per_workgroup == 128
    with kernels_for("avx2"):
        one_worker = Avx512QuantGemm.for_shape(768, 768, 4, 128, True, rows=1, workers=1)
        two_workers = Avx512QuantGemm.for_shape(768, 768, 4, 128, True, rows=1, workers=2)
    assert one_worker.cols_per_workgroup == 32
    # 24 workgroups run 16 on one of two workers: 12 of 64 channels, 6 each (workgroups.py)
    assert two_workers.cols_per_workgroup == 64
    assert not some.nibble_masks and not first.nibble_masks  # v1: the A/B baseline, `_cvt`
    with kernels_for("avx512"):  # AVX-512 has its table lookups
        assert not Avx512QuantGemm.for_shape(2048, 2048, 4, 128, True, rows=1).nibble_masks
    with pytest.raises(ValueError, match="no nibble masks"):
        Avx512QuantGemm(2112, 2048, 4, 96, True, mr=1, nr=2, lookup=False, nibble_masks=True)
    with pytest.raises(ValueError, match="prepared rows"):
        Avx512QuantGemm(2048, 2048, 4, 128, True, mr=1, nr=2, lookup=False, prepared_row=True)


def test_a_target_without_avx512_has_no_table_lookups_whatever_the_blocking():
    # the blocking is not the target: --turbine-cpu-matmul=avx512 builds the AVX-512 blocking
    # for a CPU without AVX-512 too (isa.py), where the lookup's vpermps does not exist
    host = default_compile_flags("llvm-cpu", use_env=False)
    assert target_has_avx512(host) == (not host_avx512_missing())
    assert target_has_avx512([*host, "--iree-llvmcpu-target-cpu-features=+avx2,+avx512f,+fma"])
    assert not target_has_avx512([*host, "--iree-llvmcpu-target-cpu-features=+avx2,+fma"])
    assert not target_has_avx512(["--iree-llvmcpu-target-cpu=znver4"])  # named: unknown
    with kernels_for("avx512"):
        assert target_avx512()  # unsaid: the blocking's
        with kernels_for("avx512", target_avx512=False):
            assert not target_avx512()
            one = Avx512QuantGemm.for_shape(2048, 2048, 4, 128, True, rows=1)
            some = Avx512QuantGemm.for_shape(2048, 2048, 4, 128, True, rows=None)
            with kernels_for("avx512"):  # nested: the enclosing target
                assert not target_avx512()
    assert one.nibble_masks and not one.lookup and not some.lookup


@needs_avx2
def test_the_avx512_blocking_for_this_cpu_matches_torchao_eager(tmp_path):
    # on an AVX2 CPU its int4 products take the AVX2 forms (before: the lookup's AVX-512
    # intrinsic, on which LLVM aborted, and a retry in process ended the caller's process)
    m = _int4(_mlp(512, 256, 128), 32)
    eo, parameters = export_with_archive(m, tmp_path, "q.irpa", rows=1, dynamic=False)
    avx512 = ["--turbine-cpu-matmul=avx512"]
    flags = [*default_compile_flags("llvm-cpu", use_env=False), *avx512]
    asm = compile_copy_asm(eo, flags)
    assert ("permvar" in asm) == target_has_avx512(flags)
    assert ("_nm2_pr" in asm) == (not target_has_avx512(flags))
    compiled = load_module(eo.compile(save_to=None, extra_args=avx512), parameters=parameters)
    x = torch.randn(1, 512)
    _assert_matches_eager(compiled, m, x)


@pytest.mark.parametrize(
    ("group", "asymmetric"), [(32, False), (64, True), (128, False), (128, True), (256, False)]
)
def test_decode_products_take_the_form_and_match_torchao_eager(group, asymmetric, tmp_path):
    m = _int4(_mlp(512, 256, 128), group, asymmetric)
    eo, parameters = export_with_archive(m, tmp_path, "q.irpa", rows=1, dynamic=False)
    asm = compile_copy_asm(eo, _flags())
    for k, n in ((512, 256), (256, 128)):
        zero = "z"  # torchao stores zero points for both mappings
        assert f"@__turbine_avx512_i4_gemm_{k}x{n}_g{group}{zero}_{_block(group)}_pr" in asm
        # the row put in the kernel's order once, by its own dispatch
        assert f"flow.dispatch @__turbine_avx2_i4_row_{k}_c{max(group, 64)}::" in asm
    assert "permvar" not in asm and 'turbine.cpu_requires = "avx2,fma"' in asm
    if not host_isa():
        pytest.skip("this CPU has neither AVX-512 nor AVX2 with FMA")
    compiled = load_module(eo.compile(save_to=None, extra_args=AVX2), parameters=parameters)
    for scale in (1.0, 30.0):  # and activations far from 1: the 16^-t factors are exact
        x = scale * torch.randn(1, 512)
        _assert_matches_eager(compiled, m, x)


def test_grids_cut_for_two_workers_match_torchao_eager(tmp_path):
    """The products of 768 channels (a 110M Llama's q / o) in the grid IREE's two workers share
    evenly, 12 workgroups of 64 channels instead of 24 of 32, on a host with two cores (its
    default workers); any host checks the compile copy names the grid its workers get, and the
    values against eager where it has AVX2."""
    from turbine_aot._compiler.workgroups import default_workers

    m = _int4(_mlp(768, 768, 1536), 128)
    eo, parameters = export_with_archive(m, tmp_path, "q.irpa", rows=1, dynamic=False)
    asm = compile_copy_asm(eo, _flags())
    with kernels_for("avx2"):
        for k, n in ((768, 768), (768, 1536)):
            kernel = Avx512QuantGemm.for_shape(k, n, 4, 128, True, rows=1)
            assert f"@{kernel.name}" in asm
            if default_workers() == 2:
                assert n // kernel.cols_per_workgroup == 12
    if not host_isa():
        pytest.skip("this CPU has neither AVX-512 nor AVX2 with FMA")
    compiled = load_module(eo.compile(save_to=None, extra_args=AVX2), parameters=parameters)
    x = torch.randn(1, 768)
    _assert_matches_eager(compiled, m, x)


@needs_avx2
@pytest.mark.parametrize("variant", ["", "rows-per-workgroup"])
@pytest.mark.parametrize(("k", "group"), [(SLICE_K + 2112, 32), (2 * SLICE_K, 128)])
def test_reductions_longer_than_a_slice_match_torchao_eager(
    k, group, variant, tmp_path, monkeypatch
):
    """A prepared row is read in one pass whatever ``K``; the variant reordering the row in each
    workgroup runs ``K`` above :data:`SLICE_K` in slices (full ones, then the rest), each adding
    its sums into ``C``; asymmetric groups: the corrections ``(z + 8) sum x`` per slice."""
    monkeypatch.setenv("TURBINE_CPU_QUANT_KERNEL", variant)
    torch.manual_seed(1)
    m = _int4(torch.nn.Sequential(torch.nn.Linear(k, 64)).eval(), group, asymmetric=True)
    eo, parameters = export_with_archive(m, tmp_path, "q.irpa", rows=1, dynamic=False)
    asm = compile_copy_asm(eo, _flags())
    pr = "" if variant else "_pr"
    assert f"i4_gemm_{k}x64_g{group}z_{_block(group, variant)}{pr}" in asm
    assert ("memref.alloca() : memref<4096xf32>" in asm) == bool(variant)  # a slice's buffer
    compiled = load_module(eo.compile(save_to=None, extra_args=AVX2), parameters=parameters)
    x = torch.randn(1, k)
    _assert_matches_eager(compiled, m, x)


def test_other_shapes_and_the_v1_variant_keep_the_general_form(tmp_path, monkeypatch):
    m = _int4(_mlp(96, 64, 64), 32)  # K not a multiple of 64; then 64 x 64 takes the form
    eo, _ = export_with_archive(m, tmp_path, "q.irpa", rows=1, dynamic=False)
    asm = compile_copy_asm(eo, _flags())
    assert "i4_gemm_96x64_g32z_1x2_16x32_zb_pf_cvt " in asm.replace("(", " ")
    assert "i4_gemm_64x64_g32z_1x2_16x32_pf_cvt_nm2" in asm
    eo, _ = export_with_archive(_int4(_mlp(256, 64, 64), 32), tmp_path, "d.irpa")
    assert "_nm2" not in compile_copy_asm(eo, _flags())  # dynamic rows
    monkeypatch.setenv("TURBINE_CPU_QUANT_KERNEL", "v1")
    eo, _ = export_with_archive(
        _int4(_mlp(256, 64, 64), 32), tmp_path, "v.irpa", rows=1, dynamic=False
    )
    asm = compile_copy_asm(eo, _flags())
    assert "_cvt" in asm and "_nm2" not in asm
