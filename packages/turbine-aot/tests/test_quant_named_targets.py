"""torchao-quantized products in builds for a named CPU (``--iree-llvmcpu-target-cpu=x86-64-v3``,
a fleet build): turbine's AVX2 quantized kernels by default where the named CPU has AVX2 and FMA
(IREE's own dequantize + matmul decoded a 110M Llama in int4 15x slower there), IREE's fp32
matmuls kept, and the user's ``--turbine-cpu-matmul`` still the last word
(``_compiler.matmuls.cpu_quant_kernel``; docs/quantization.md, "Builds for a named CPU")."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import compile_copy_asm, export_with_archive

from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.isa import host_isa
from turbine_aot._compiler.matmuls import (
    AVX2_FMA_CPUS,
    cpu_matmul_kernel,
    cpu_quant_kernel,
    target_has_avx2_fma,
)
from turbine_aot.runtime import load_module

tq = pytest.importorskip(
    "torchao.quantization", reason="torchao is a dev requirement (tools/requirements-dev.txt)"
)
from torchao.quantization.granularity import PerGroup  # noqa: E402


def _named(cpu: str, *extra: str) -> list[str]:
    """turbine's default llvm-cpu flags with the target CPU ``cpu`` (as a user overrides it)."""
    host = default_compile_flags("llvm-cpu", use_env=False)
    kept = [f for f in host if not f.startswith("--iree-llvmcpu-target-cpu=")]
    return [*kept, *extra, f"--iree-llvmcpu-target-cpu={cpu}"]


def _mlp(config) -> torch.nn.Module:
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.SiLU(), torch.nn.Linear(512, 128, bias=False)
    ).eval()
    tq.quantize_(m, config)
    return m


def test_the_kernel_choice_for_named_cpus(monkeypatch):
    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    fleet = _named("x86-64-v3")
    assert target_has_avx2_fma(fleet) and cpu_matmul_kernel(fleet) == "iree"
    assert cpu_quant_kernel(fleet) == "avx2"
    assert {"x86-64-v3", "znver3", "haswell", "sapphirerapids"} <= AVX2_FMA_CPUS
    for cpu in ("x86-64", "x86-64-v2", "nehalem", "generic", "no-such-cpu"):
        assert cpu_quant_kernel(_named(cpu)) == "iree", cpu
    # explicit features decide over the name
    with_features = _named("x86-64", "--iree-llvmcpu-target-cpu-features=+avx2,+fma")
    assert cpu_quant_kernel(with_features) == "avx2"
    assert not target_has_avx2_fma(_named("znver3", "--iree-llvmcpu-target-cpu-features=+sse4.2"))
    # the user's choice wins, by flag or environment
    assert cpu_quant_kernel([*fleet, "--turbine-cpu-matmul=iree"]) == "iree"
    monkeypatch.setenv("TURBINE_CPU_MATMUL", "iree")
    assert cpu_quant_kernel(fleet) == "iree"
    monkeypatch.delenv("TURBINE_CPU_MATMUL")
    # without turbine's fast-matmul defaults (the compile fallback's last retry) neither
    no_ukernels = [f for f in fleet if not f.startswith("--iree-llvmcpu-enable-ukernels")]
    assert cpu_quant_kernel(no_ukernels) == "iree"


@pytest.mark.parametrize(
    ("name", "config", "kernel"),
    [
        (
            "int4-g128",
            tq.IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(128)),
            "i4_gemm_256x512_g128z_1x4_16x32_pf_cvt_nm1_pr",  # one row: nibble masks
        ),
        ("int8", tq.Int8WeightOnlyConfig(), "i8_gemm_256x512_4x1_16x32_pf_ch4"),
    ],
)
def test_a_fleet_build_runs_quantized_products_on_turbine_kernels(
    tmp_path, monkeypatch, name, config, kernel
):
    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    m = _mlp(config)
    eo, parameters = export_with_archive(m, tmp_path, "q.irpa", rows=1, dynamic=False)
    fleet = _named("x86-64-v3")
    asm = compile_copy_asm(eo, fleet)
    assert f"@__turbine_avx512_{kernel}" in asm
    assert 'turbine.cpu_requires = "avx2,fma"' in asm  # checked by the runtime at load
    assert "permvar" not in asm  # no AVX-512 instruction in a build for an AVX2 CPU
    # the user's choice: IREE's own products
    assert "__turbine_avx512_i" not in compile_copy_asm(eo, [*fleet, "--turbine-cpu-matmul=iree"])
    # a named CPU without AVX2: IREE's
    assert "__turbine_avx512_i" not in compile_copy_asm(eo, _named("x86-64-v2"))
    if not host_isa():
        pytest.skip("this CPU has neither AVX-512 nor AVX2 with FMA: the module cannot run here")
    extra = [f for f in fleet if f.startswith("--iree-llvmcpu-target-cpu")]
    vmfb = eo.compile(save_to=None, extra_args=extra)
    assert f"__turbine_avx512_{kernel}".encode() in bytes(vmfb.map_memory())  # what ran
    compiled = load_module(vmfb, parameters=parameters)
    x = torch.randn(1, 256)
    with torch.no_grad():
        want = m(x)
    torch.testing.assert_close(
        compiled.main(x), want, rtol=1e-5, atol=1e-5 * float(want.abs().max())
    )


def test_fp32_matmuls_of_a_fleet_build_stay_iree_s(monkeypatch):
    """Measured as fast there (docs/quantization.md, "Builds for a named CPU"): unchanged."""
    import turbine_aot as aot

    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 128)).eval()
    eo = aot.export(m, args=(torch.randn(1, 256),))
    assert "@__turbine_avx512_f32_gemm" in compile_copy_asm(
        eo, _named("x86-64-v3", "--turbine-cpu-matmul=avx2")
    )
    assert "__turbine_avx512" not in compile_copy_asm(eo, _named("x86-64-v3"))
