"""torchao weight-only int8 / int4 products of one row on turbine's AMX-INT8 kernel
(``_compiler.amx_quant``): which products the compile copy puts there (one row, int8 per channel
or int4 in groups of 128s, on a CPU with AMX-INT8, int4 where its weights fit the cache,
unless ``TURBINE_CPU_QUANT_AMX=off``), the
kernel's numerics against float64 (the activations as three int8 pieces: NaN and infinity rows,
zero rows, scales from 1e-3 to 100), and torchao eager's results end to end on both drivers.

The rewrite is checked on any machine (the host checks patched); running needs AMX-INT8 (an
Intel Xeon of the Sapphire Rapids generation or later): elsewhere those tests skip and say so.
torchao is a dev requirement; without it the end-to-end tests skip.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from kernel_testing import compile_copy_asm, host_flags

from turbine_aot import export
from turbine_aot._compiler import amx_quant, matmuls, rewrites
from turbine_aot._compiler.amx import request_amx_permission
from turbine_aot._compiler.amx_quant import QUANT_AMX_ENV, AmxQuantGemm, host_amx_int8_missing
from turbine_aot._compiler.quant_matmuls import rewritable_quant_matmuls
from turbine_aot.runtime import load_module
from turbine_params import externalize_module_parameters, save_module_parameters

_MISSING = host_amx_int8_missing()
needs_amx_int8 = pytest.mark.skipif(
    bool(_MISSING),
    reason=f"the AMX-INT8 kernel needs a CPU with {', '.join(_MISSING)} (this one lacks them)",
)


# ------------------------------------------------------------------------------ the kernel alone
def _kernel_module(kernel: AmxQuantGemm) -> str:
    k, n = kernel.k, kernel.n
    names = ["%q", "%s", "%z"][: len(kernel.operand_types())]
    params = ", ".join(f"{a}: {t}" for a, t in zip(names, kernel.operand_types()))
    return "\n".join(
        [
            "module {",
            kernel.executable(),
            f"func.func @main(%x: tensor<?x{k}xf32>, {params}) -> tensor<?x{n}xf32> {{",
            "  %c0 = arith.constant 0 : index",
            f"  %m = tensor.dim %x, %c0 : tensor<?x{k}xf32>",
            "  %r = " + kernel.dispatch("%x", names, "%m"),
            f"  return %r : tensor<?x{n}xf32>",
            "}",
            "}",
        ]
    )


def _weights(rng, kernel: AmxQuantGemm):
    """(host operands, the dequantized f64 weight [N, K])."""
    n, k = kernel.n, kernel.k
    if kernel.bits == 8:
        q = rng.integers(-128, 128, size=(n, k), dtype=np.int8)
        return [q], q.astype(np.float64)
    g = kernel.groups
    q = rng.integers(-8, 8, size=(n, k)).astype(np.int8)
    s = rng.uniform(0.01, 0.05, size=(n, g)).astype(np.float32)
    z = rng.integers(-8, 8, size=(n, g)).astype(np.int8)
    if not kernel.zero_point:
        z[:] = 0
    deq = (q.astype(np.float64) - np.repeat(z, kernel.group, 1)) * np.repeat(s, kernel.group, 1)
    u = (q & 0xF).astype(np.uint8)
    packed = (u[:, 0::2] | (u[:, 1::2] << 4)).view(np.int8)  # IREE's i4 layout
    return [packed, s, *([z] if kernel.zero_point else [])], deq


def _run_kernel(kernel: AmxQuantGemm, rows: list[np.ndarray], seed: int = 0):
    import iree.compiler as ic
    import iree.runtime as rt

    request_amx_permission()
    vmfb = ic.compile_str(
        _kernel_module(kernel),
        target_backends=["llvm-cpu"],
        extra_args=["--iree-llvmcpu-target-cpu=host"],
    )
    ops, deq = _weights(np.random.default_rng(seed), kernel)
    ctx = rt.SystemContext(config=rt.Config("local-sync"))
    ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
    main = ctx.modules.module["main"]
    out = []
    for x in rows:
        result = main(x[None, :], *ops)
        # copied while ``result`` holds the buffer (a view of a freed buffer reads whatever the
        # allocator wrote there since)
        out.append((np.array(result.to_host()[0], copy=True), x.astype(np.float64) @ deq.T))
        del result
    return out


@needs_amx_int8
@pytest.mark.parametrize(
    "bits, group, zero_point, k, n",
    [
        (8, None, False, 256, 64),
        (8, None, False, 768, 192),
        (8, None, False, 2048, 96),
        (4, 128, True, 768, 192),
        (4, 128, False, 512, 64),
        (4, 256, True, 1024, 128),
        (4, 128, True, 2048, 32),
    ],
)
def test_the_kernel_matches_float64_within_f32_rounding(bits, group, zero_point, k, n):
    """The three pieces carry 22 bits of each row's range: the results are within a few f32
    roundings of the float64 product, at every scale."""
    kernel = AmxQuantGemm.for_shape(k, n, bits, group, zero_point)
    rng = np.random.default_rng(k + n + bits)
    rows = [rng.standard_normal(k).astype(np.float32) * scale for scale in (1e-3, 1.0, 100.0)]
    spiky = rng.standard_normal(k).astype(np.float32)
    spiky[::97] *= 1e3  # a few large values: the small ones ride on the last pieces
    for got, want in _run_kernel(kernel, [*rows, spiky]):
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())


@needs_amx_int8
@pytest.mark.parametrize("bits, group", [(8, None), (4, 128)])
def test_a_row_of_zeros_gives_zeros_and_nan_or_infinity_gives_nan(bits, group):
    kernel = AmxQuantGemm.for_shape(256, 64, bits, group, group is not None)
    zeros = np.zeros(256, np.float32)
    nan, inf = zeros.copy(), np.ones(256, np.float32)
    nan[3] = np.nan
    inf[200] = -np.inf
    rng = np.random.default_rng(5)
    small = (rng.standard_normal(256) * 1e-30).astype(np.float32)
    tiny = (rng.standard_normal(256) * 1e-38).astype(np.float32)  # 127 / max overflows
    (z, _), (a, _), (b, _), (sg, sw), (tg, _) = _run_kernel(kernel, [zeros, nan, inf, small, tiny])
    assert np.all(z == 0)
    assert np.all(np.isnan(a)) and np.all(np.isnan(b))
    np.testing.assert_allclose(sg, sw, rtol=0, atol=2e-6 * np.abs(sw).max())
    assert np.all(tg == 0)  # documented: zeros, an absolute error below 1e-33


def test_shapes_the_kernel_takes():
    assert AmxQuantGemm.supports(768, 2048, 8, None)
    assert AmxQuantGemm.supports(2048, 768, 4, 128)
    assert AmxQuantGemm.supports(768, 32000, 4, 256)
    assert not AmxQuantGemm.supports(768, 2048, 4, 32)  # groups below 128: the AVX-512 kernel
    assert not AmxQuantGemm.supports(768, 2048, 8, 64)  # int8 in groups
    assert not AmxQuantGemm.supports(760, 2048, 8, None)  # K not a multiple of 64
    assert not AmxQuantGemm.supports(768, 2040, 8, None)  # N not a multiple of 32
    assert not AmxQuantGemm.supports(16384, 64, 8, None)  # the pieces outgrow the stack
    assert not AmxQuantGemm.supports(8192, 64, 4, 128)  # and int4's A tiles too
    # workgroups: the widest multiple of 32 channels leaving at least two
    assert AmxQuantGemm.for_shape(768, 768, 8, None, False).cols_per_workgroup == 384
    assert AmxQuantGemm.for_shape(768, 32000, 4, 128, True).cols_per_workgroup == 16000
    assert AmxQuantGemm.for_shape(768, 96, 8, None, False).cols_per_workgroup == 32
    with pytest.raises(ValueError, match="unsupported shape"):
        AmxQuantGemm(768, 2048, 4, 64)


# ------------------------------------------------------------------------ where the rewrite puts it
tq = pytest.importorskip(
    "torchao.quantization", reason="torchao is a dev requirement (tools/requirements-dev.txt)"
)
from torchao.quantization.granularity import PerGroup  # noqa: E402

CONFIGS = {
    "int8": lambda: tq.Int8WeightOnlyConfig(),
    "int4-g128": lambda: tq.IntxWeightOnlyConfig(
        weight_dtype=torch.int4, granularity=PerGroup(128)
    ),
    "int4-g256": lambda: tq.IntxWeightOnlyConfig(  # one group per channel at K = 256
        weight_dtype=torch.int4, granularity=PerGroup(256)
    ),
    "int4-g32": lambda: tq.IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
}


def _export(config: str, tmp_path, rows: int = 1, external: bool = True):
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(256, 256, bias=True), torch.nn.SiLU(), torch.nn.Linear(256, 128)
    ).eval()
    tq.quantize_(m, CONFIGS[config]())
    parameters = None
    if external:
        externalize_module_parameters(m)
        parameters = tmp_path / "q.irpa"
        save_module_parameters(parameters, m)
    return m, export(m, args=(torch.randn(rows, 256),)), parameters


@pytest.fixture
def amx_host(monkeypatch):
    """The rewrite as on a host with AVX-512, AMX-INT8 and 64 MiB of L3 (whatever this one
    has)."""
    monkeypatch.setattr(matmuls, "host_avx512_missing", lambda: [])
    monkeypatch.setattr(amx_quant, "host_amx_int8_missing", lambda: [])
    monkeypatch.setattr(amx_quant, "host_l3_bytes", lambda: 64 << 20)
    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    monkeypatch.delenv(QUANT_AMX_ENV, raising=False)


@pytest.mark.parametrize("config", ["int8", "int4-g128"])
def test_one_row_products_go_to_the_amx_kernel(amx_host, tmp_path, config):
    _, eo, _ = _export(config, tmp_path)
    asm = compile_copy_asm(eo, host_flags())
    assert asm.count("func.func private @__turbine_amx_quant_matmul_") == 2
    assert "__turbine_avx512_quant_matmul_" not in asm
    bits = "i8" if config == "int8" else "i4"
    group = "" if config == "int8" else "_g128z"
    assert f"stream.executable private @__turbine_amx_{bits}_gemv_256x256{group}_128 " in asm
    assert f"stream.executable private @__turbine_amx_{bits}_gemv_256x128{group}_64 " in asm
    assert 'turbine.cpu_requires = "avx512f,amx_tile,amx_int8"' in asm
    assert "torch.aten._to_copy" not in asm  # no f32 copy of a weight


def test_more_rows_small_groups_and_the_switch_keep_the_avx512_kernel(
    amx_host, tmp_path, monkeypatch
):
    _, eo4, _ = _export("int8", tmp_path, rows=4)  # prefill-like: four rows
    asm = compile_copy_asm(eo4, host_flags())
    assert (
        "__turbine_amx_" not in asm
        and asm.count("func.func private @__turbine_avx512_quant_matmul_") == 2
    )
    _, eo32, _ = _export("int4-g32", tmp_path)  # groups of 32: the AVX-512 kernel's
    assert "__turbine_amx_" not in compile_copy_asm(eo32, host_flags())
    _, eo, _ = _export("int8", tmp_path)
    key = rewrites.environment_key()
    monkeypatch.setenv(QUANT_AMX_ENV, "off")
    assert rewrites.environment_key() != key  # the compile cache keys on the choice
    asm = compile_copy_asm(eo, host_flags())
    assert (
        "__turbine_amx_" not in asm
        and asm.count("func.func private @__turbine_avx512_quant_matmul_") == 2
    )
    monkeypatch.setattr(amx_quant, "host_amx_int8_missing", lambda: ["amx_int8"])
    monkeypatch.delenv(QUANT_AMX_ENV)
    assert "__turbine_amx_" not in compile_copy_asm(eo, host_flags())  # a CPU without AMX


def test_int4_goes_to_amx_only_where_its_weights_fit_the_cache(amx_host, tmp_path, monkeypatch):
    """Streamed from memory the AMX int4 kernel reads slower than the AVX-512 one: int4 goes to
    AMX when the module's int4 weights (here 48 KiB) fit in half the L3, or when asked for;
    int8 goes to AMX whatever the cache."""
    _, eo4, _ = _export("int4-g128", tmp_path)
    assert "@__turbine_amx_quant_matmul_" in compile_copy_asm(eo4, host_flags())
    for l3 in (64 << 10, 0):  # 32 KiB of room, and a host whose L3 is unknown
        monkeypatch.setattr(amx_quant, "host_l3_bytes", lambda l3=l3: l3)
        asm = compile_copy_asm(eo4, host_flags())
        assert "__turbine_amx_" not in asm
        assert asm.count("func.func private @__turbine_avx512_quant_matmul_") == 2
        monkeypatch.setenv(QUANT_AMX_ENV, "on")
        assert "@__turbine_amx_quant_matmul_" in compile_copy_asm(eo4, host_flags())
        monkeypatch.delenv(QUANT_AMX_ENV)
    _, eo8, _ = _export("int8", tmp_path)
    assert compile_copy_asm(eo8, host_flags()).count("func.func private @__turbine_amx_quant_") == 2
    monkeypatch.setattr(amx_quant, "host_l3_bytes", lambda: 64 << 10)
    assert amx_quant.int4_fits_cache(32 << 10) and not amx_quant.int4_fits_cache((32 << 10) + 1)


@needs_amx_int8
@pytest.mark.parametrize("driver", ["local-sync", "local-task"])
@pytest.mark.parametrize("config", ["int8", "int4-g128", "int4-g256"])
def test_one_row_on_amx_matches_torchao_eager(tmp_path, monkeypatch, config, driver):
    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    monkeypatch.setenv(QUANT_AMX_ENV, "on")  # int4 on AMX whatever this host's cache
    m, eo, parameters = _export(config, tmp_path)
    assert "@__turbine_amx_quant_matmul_" in compile_copy_asm(eo, host_flags())
    compiled = load_module(eo.compile(save_to=None), device=driver, parameters=parameters)
    torch.manual_seed(1)
    for x in (torch.randn(1, 256), torch.randn(1, 256) * 30, torch.randn(1, 256) * 1e-2):
        with torch.no_grad():
            want = m(x)
        torch.testing.assert_close(compiled.main(x), want, rtol=1e-5, atol=1e-5 * want.abs().max())


@needs_amx_int8
def test_the_int4_module_holds_no_f32_weight(tmp_path, monkeypatch):
    """Four Linear(2048, 2048), int4 in groups of 128, one row: nothing hoisted (the kernel
    reads the archive's packed bytes), and eager's results."""
    monkeypatch.setenv(QUANT_AMX_ENV, "on")
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048, bias=False) for _ in range(4)]).eval()
    tq.quantize_(m, CONFIGS["int4-g128"]())
    externalize_module_parameters(m)
    save_module_parameters(tmp_path / "int4.irpa", m)
    x = torch.randn(1, 2048)
    vmfb = export(m, args=(x,)).compile(save_to=None)
    data = bytes(vmfb.map_memory())
    assert b"__turbine_amx_i4_gemv_2048x2048_g128z" in data
    assert b"__hoisted" not in data
    got = load_module(vmfb, parameters=tmp_path / "int4.irpa").main(x)
    with torch.no_grad():
        want = m(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max())


def test_names_of_the_kernels_in_a_module_are_recognisable():
    """The executables' names say AMX, bits, shape, group and workgroup width (what a profile
    of a module shows)."""
    name = AmxQuantGemm.for_shape(768, 2048, 4, 128, True).name
    assert re.fullmatch(r"__turbine_amx_i4_gemv_768x2048_g128z_1024", name)
    assert AmxQuantGemm(768, 2048, 8, prefetch=0, cols_per_workgroup=64).name.endswith("_64_pf0")


def test_an_llm_counts_each_int4_weight_once():
    """The prefill and decode functions of an exported LLM load the same globals: the cache
    rule counts each weight once, not once per function."""
    transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")
    from turbine_aot import llm
    from turbine_aot._compiler.quant_matmuls import _int4_weight_bytes, _spec

    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=256,  # two groups of 128 in every K
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    eo = llm.export_causal_lm(model, max_seq_len=32, quantize="int4", group_size=128)
    found = rewritable_quant_matmuls(eo.mlir_module)
    sites = sum(s.n * s.k // 2 for s in map(_spec, found) if s is not None and s.bits == 4)
    distinct = _int4_weight_bytes(found)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert distinct == sum(m.out_features * m.in_features // 2 for m in linears)
    assert sites >= 2 * distinct  # every weight read by more than one function
