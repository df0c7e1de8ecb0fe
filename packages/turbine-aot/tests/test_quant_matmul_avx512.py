"""torchao weight-only int8 / int4 matmuls on turbine's AVX-512 quantized kernel
(``_compiler.avx512_quant``, ``_compiler.quant_matmuls``): when the compile copy uses it, that the
kernel reads the integer weights (no f32 copy of a weight), and that the results equal torchao
eager's for every config, with and without bias, for one row and a tail of rows, weights from an
archive and inline, on llvm-cpu's sync and task drivers.

torchao is a dev requirement; without it these tests skip.
"""

from __future__ import annotations

import logging
import re

import pytest
import torch
from kernel_testing import compile_copy_asm, host_flags, needs_avx512

from turbine_aot import export
from turbine_aot._compiler import matmuls, quant_matmuls
from turbine_aot._compiler.avx512_quant import Avx512QuantGemm
from turbine_aot._compiler.fallback import retry_flags
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.isa import kernels_for
from turbine_aot._compiler.quant_matmuls import rewritable_quant_matmuls
from turbine_aot.runtime import load_module
from turbine_params import externalize_module_parameters, save_module_parameters

tq = pytest.importorskip(
    "torchao.quantization", reason="torchao is a dev requirement (tools/requirements-dev.txt)"
)
from torchao.quantization.granularity import PerGroup  # noqa: E402


@pytest.fixture(autouse=True)
def _avx512_kernel_even_where_there_is_amx(monkeypatch):
    """These tests are the AVX-512 kernel's: on a CPU with AMX-INT8 its one-row products would
    go to the AMX kernel (test_quant_matmul_amx.py), so that is turned off here."""
    monkeypatch.setenv("TURBINE_CPU_QUANT_AMX", "off")


@pytest.fixture(autouse=True)
def _avx512_form():
    """These tests are about the kernel's AVX-512 form, whatever this CPU has (an AVX2 one gets
    the form without table lookups: test_cpu_kernels_avx2.py)."""
    with kernels_for("avx512"):
        yield


def _int4(group: int):
    return lambda: tq.IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(group))


CONFIGS = {
    "int8": lambda: tq.Int8WeightOnlyConfig(),
    "int4-g32": _int4(32),
    "int4-g64": _int4(64),
    "int4-g128": _int4(128),
    "int8-g64": lambda: tq.IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerGroup(64)),
}
#: The kernel each config's matmuls run on (inline int4 is int8 data: IREE cannot embed i4).
KERNEL = {
    ("int8", True): "i8_gemm_256x256_",
    ("int4-g32", True): "i4_gemm_256x256_g32z",
    ("int4-g64", True): "i4_gemm_256x256_g64z",
    ("int4-g128", True): "i4_gemm_256x256_g128z",
    ("int8-g64", True): "i8_gemm_256x256_g64z",
}


def _quantized(config: str) -> torch.nn.Module:
    """Two layers: with a bias (torchao adds it after the matmul) and without."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(256, 256, bias=True),
        torch.nn.SiLU(),
        torch.nn.Linear(256, 128, bias=False),
    ).eval()
    tq.quantize_(m, CONFIGS[config]())
    return m


_copy_asm = compile_copy_asm


def _export(config: str, external: bool, tmp_path, rows: int = 1, dynamic: bool = False):
    m = _quantized(config)
    parameters = None
    if external:
        externalize_module_parameters(m)
        parameters = tmp_path / "q.irpa"
        save_module_parameters(parameters, m)
    shapes = {"input": {0: torch.export.Dim("rows", min=1, max=64)}} if dynamic else None
    eo = export(m, args=(torch.randn(rows, 256),), dynamic_shapes=shapes)
    return m, eo, parameters


# ---------------------------------------------------------------------------- when it applies
@pytest.mark.parametrize("config", ["int8", "int4-g32"])
def test_the_compile_copy_calls_the_kernel_on_the_integer_weights(monkeypatch, tmp_path, config):
    monkeypatch.setattr(matmuls, "host_avx512_missing", lambda: [])
    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    _, eo, _ = _export(config, True, tmp_path)
    exported = str(eo.mlir_module)
    assert len(rewritable_quant_matmuls(eo.mlir_module)) == 2
    asm = _copy_asm(eo, host_flags())
    assert exported == str(eo.mlir_module)  # the export is unchanged
    assert asm.count("func.func private @__turbine_avx512_quant_matmul_") == 2
    assert "torch.aten.mm" not in asm  # no matmul left for IREE (nor the fp32 kernel)
    assert "__turbine_avx512_f32_gemm" not in asm
    assert 'turbine.cpu_requires = "avx512f"' in asm
    if config == "int4-g32":
        # the i4 global read as its bytes; its dequantization to f32 is gone
        assert re.search(
            r"flow.tensor.bitcast %\w+ : tensor<256x256xi4> -> tensor<256x128xi8>", asm
        )
        assert "arith.extsi" not in asm
        assert "torch.aten.sub.Tensor" not in asm
    else:
        assert "tensor<256x256xi8>" in asm
        assert "torch.aten.mul.Tensor" in asm  # the per-channel scale stays the program's
    assert "torch.aten._to_copy" not in asm  # no f32 copy of a weight
    # IREE's code when asked for, for portable builds, for other targets, and in the retry
    # without turbine's fast-matmul defaults
    for flags in (
        host_flags("--turbine-cpu-matmul=iree"),
        default_compile_flags("llvm-cpu", host=False, use_env=False),
        default_compile_flags("vmvx", use_env=False),
        retry_flags(host_flags(), []),
    ):
        assert flags is not None
        assert "__turbine_avx512_quant_matmul_" not in _copy_asm(eo, flags)
    monkeypatch.setenv("TURBINE_CPU_MATMUL", "iree")
    assert "__turbine_avx512_quant_matmul_" not in _copy_asm(eo, host_flags())


def test_a_plain_fp32_model_is_not_a_quantized_matmul():
    torch.manual_seed(0)
    eo = export(torch.nn.Linear(64, 32), args=(torch.randn(2, 64),))
    assert rewritable_quant_matmuls(eo.mlir_module) == []


# ---------------------------------------------------------------------------------- end to end
def _check(compiled, m, rows: int) -> None:
    torch.manual_seed(1)
    for x in (torch.randn(rows, 256), torch.randn(rows, 256) * 3):
        with torch.no_grad():
            want = m(x)
        got = compiled.main(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_avx512
@pytest.mark.parametrize("driver", ["local-sync", "local-task"])
@pytest.mark.parametrize("external", [True, False], ids=["irpa", "inline"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_quantized_linears_on_the_kernel_match_torchao_eager(
    tmp_path, caplog, monkeypatch, config, external, driver
):
    if not external and config in ("int4-g64", "int4-g128") and driver == "local-task":
        pytest.skip("inline int4 is int8 data whatever the group: the local-sync run covers it")
    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    m, eo, parameters = _export(config, external, tmp_path)
    asm = _copy_asm(eo, host_flags())
    assert asm.count("func.func private @__turbine_avx512_quant_matmul_") == 2
    want = KERNEL.get((config, external), "i8_gemm_256x256_")
    assert f"@__turbine_avx512_{want}" in asm
    if want.startswith("i4_"):  # one row (decode): int4 in blocks of 2 channels; groups of
        # 128s index the tables with the weight bytes shifted in place (nibble_shifts)
        form = "_1x2_16x32_pf_ns" if config == "int4-g128" else "_2x2_"
        assert re.search(rf"@__turbine_avx512_{want}{form}", asm)
    with caplog.at_level(logging.WARNING, logger="turbine.aot"):
        vmfb = eo.compile(save_to=None)
    assert "failed" not in caplog.text  # compiled with the kernel, no fallback
    compiled = load_module(vmfb, device=driver, parameters=parameters)
    _check(compiled, m, 1)


@needs_avx512
@pytest.mark.parametrize("config", ["int8", "int4-g32", "int4-g128"])
def test_dynamic_rows_and_row_tails_match_torchao_eager(tmp_path, monkeypatch, config):
    """Rows 1..33: the kernels of fewer rows for the last rows, and more than one workgroup of
    rows (16 each)."""
    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    m, eo, parameters = _export(config, True, tmp_path, rows=4, dynamic=True)
    assert (
        _copy_asm(eo, host_flags()).count("func.func private @__turbine_avx512_quant_matmul_") == 2
    )
    compiled = load_module(eo.compile(save_to=None), parameters=parameters)
    for rows in (1, 2, 3, 5, 17, 33):
        _check(compiled, m, rows)


@needs_avx512
def test_the_issue_stack_reads_int4_weights_without_an_f32_copy(tmp_path, monkeypatch):
    """Eight Linear(2048, 2048), int4 groups of 32: the kernel's module holds no f32 weight
    (IREE hoists nothing: the operands are the archive's globals), and it matches eager."""
    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048, bias=False) for _ in range(8)]).eval()
    tq.quantize_(m, _int4(32)())
    externalize_module_parameters(m)
    save_module_parameters(tmp_path / "int4.irpa", m)
    x = torch.randn(1, 2048)
    eo = export(m, args=(x,))
    asm = _copy_asm(eo, host_flags())
    assert asm.count("func.func private @__turbine_avx512_quant_matmul_") == 8
    vmfb = eo.compile(save_to=None)
    data = bytes(vmfb.map_memory())
    assert b"__turbine_avx512_i4_gemm_2048x2048_g32z" in data
    assert b"__hoisted" not in data  # no initializer computes a dequantized weight
    got = load_module(vmfb, parameters=tmp_path / "int4.irpa").main(x)
    with torch.no_grad():
        torch.testing.assert_close(got, m(x), rtol=1e-5, atol=1e-5)


@needs_avx512
@pytest.mark.parametrize(
    "variant, config, suffix",
    [
        ("v1", "int4-g32", "g32z_2x4_16x32"),  # the first version: no zero-point buffer
        ("v1", "int8", "256x256_4x4_16x32"),  # nor the software prefetch
    ],
)
def test_the_first_kernel_for_ab_measurements_matches_torchao_eager(
    tmp_path, monkeypatch, variant, config, suffix
):
    """``TURBINE_CPU_QUANT_KERNEL=v1`` (quant_bench.py --ab): the first version of the kernel,
    and it gives eager's results, over row tails too."""
    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    monkeypatch.setenv("TURBINE_CPU_QUANT_KERNEL", variant)
    m, eo, parameters = _export(config, True, tmp_path, rows=4, dynamic=True)
    asm = _copy_asm(eo, host_flags())
    assert re.search(r"@__turbine_avx512_i[48]_gemm_\w*" + re.escape(suffix) + r"\b", asm)
    compiled = load_module(eo.compile(save_to=None), parameters=parameters)
    for rows in (1, 2, 5, 17):
        _check(compiled, m, rows)


def test_nibble_shifts_are_chosen_for_one_row_and_groups_of_128s():
    """The shifted-nibble form needs one row (decode), int4 in groups of a multiple of 128 and
    ``K`` <= 4096 (its reordered activations live on the stack); anything else keeps the
    widening form, and asking for it where it cannot apply is refused."""
    for k, group, rows, want in [
        (4096, 128, 1, True),
        (768, 256, 1, True),
        (4224, 128, 1, False),  # 16.5 KiB of reordered activations: over the stack budget
        (256, 64, 1, False),
        (256, 128, None, False),  # rows not statically 1
        (256, 128, 4, False),
    ]:
        kernel = Avx512QuantGemm.for_shape(k, 256, 4, group, True, rows=rows)
        assert kernel.nibble_shifts is want, (k, group, rows)
        assert kernel.name.endswith("_ns") is want
    assert not Avx512QuantGemm.for_shape(256, 256, 4, 128, True, "v1", rows=1).nibble_shifts
    with pytest.raises(ValueError, match="no nibble shifts"):
        Avx512QuantGemm(256, 256, 4, 64, True, mr=1, nr=2, nibble_shifts=True)


@pytest.mark.parametrize("value", ["arith", "nr8", "no-such-kernel"])
def test_an_unknown_kernel_variant_warns_and_builds_the_current_kernel(
    monkeypatch, tmp_path, caplog, value
):
    """The variants that lost were removed: naming one (or any unknown value) warns, naming the
    known ones, and builds the current kernel rather than silently something else."""
    monkeypatch.setattr(matmuls, "host_avx512_missing", lambda: [])
    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    monkeypatch.setattr(quant_matmuls, "_warned", set())
    _, eo, _ = _export("int4-g32", True, tmp_path)
    monkeypatch.delenv("TURBINE_CPU_QUANT_KERNEL", raising=False)
    current = _copy_asm(eo, host_flags())
    assert "_g32z_2x2_16x32_zb_pf" in current  # one row: blocks of 2 channels
    monkeypatch.setenv("TURBINE_CPU_QUANT_KERNEL", value)
    with caplog.at_level(logging.WARNING, logger="turbine.aot"):
        assert _copy_asm(eo, host_flags()) == current
    assert f"TURBINE_CPU_QUANT_KERNEL={value!r} is not a quantized kernel variant" in caplog.text
    assert "'v1'" in caplog.text
    with pytest.raises(ValueError, match="unknown variant"):
        Avx512QuantGemm.for_shape(256, 256, 4, 32, True, value)


@needs_avx512
@pytest.mark.parametrize("driver", ["local-sync", "local-task"])
def test_one_group_per_channel_is_rewritten_and_matches_torchao_eager(tmp_path, driver):
    """A group as wide as ``K`` (``PerGroup(K)``): torchao then has no group axis (its scales
    and zero points are ``[N, 1]``); both products go to the kernel, with eager's results."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 128, bias=False), torch.nn.Linear(128, 64)).eval()
    tq.quantize_(m[0], _int4(256)())
    tq.quantize_(m[1], _int4(128)())
    externalize_module_parameters(m)
    save_module_parameters(tmp_path / "q.irpa", m)
    x = torch.randn(1, 256)
    eo = export(m, args=(x,))
    asm = _copy_asm(eo, host_flags())
    assert asm.count("func.func private @__turbine_avx512_quant_matmul_") == 2
    assert "torch.aten._to_copy" not in asm  # no f32 copy of a weight
    compiled = load_module(eo.compile(save_to=None), device=driver, parameters=tmp_path / "q.irpa")
    for xx in (x, torch.randn(1, 256) * 3):
        with torch.no_grad():
            want = m(xx)
        torch.testing.assert_close(compiled.main(xx), want, rtol=1e-5, atol=1e-5)
