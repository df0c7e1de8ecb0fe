"""turbine's fp32 CPU kernels blocked for AVX2 (``_compiler.isa``): the default on a CPU with AVX2
and FMA but no AVX-512, what the compile copy calls, and that the values are eager's and, bit for
bit, those of the AVX-512 blocking (each output's sum runs over the reduction in the same order
whatever the blocking). Runs on any CPU with AVX2 (an AVX-512 one runs the AVX2 blocking too)."""

from __future__ import annotations

import re

import pytest
import torch
from kernel_testing import compile_copy_asm, export_with_archive, host_flags, needs_avx2

from turbine_aot import export
from turbine_aot._compiler import isa, matmuls
from turbine_aot._compiler.avx512 import MATMUL_ROWS_ENV, Avx512Gemm, avx2_row_block
from turbine_aot._compiler.avx512_conv import conv_kernel_for
from turbine_aot._compiler.avx512_quant import Avx512QuantGemm
from turbine_aot._compiler.convs import conv_geometry
from turbine_aot._compiler.direct_convs import direct_convs
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.isa import host_isa, kernel_isa, kernels_for
from turbine_aot._compiler.matmuls import cpu_matmul_kernel
from turbine_aot.runtime import load_module

AVX2 = ["--turbine-cpu-matmul=avx2"]


def test_avx2_is_the_default_where_the_cpu_has_avx2_and_fma_but_no_avx512(monkeypatch):
    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    host = default_compile_flags("llvm-cpu", use_env=False)
    monkeypatch.setattr(matmuls, "host_avx512_missing", lambda: ["avx512f"])
    monkeypatch.setattr(isa, "cpu_flags", lambda: {"sse4_2", "avx", "avx2", "fma"})
    assert cpu_matmul_kernel(host) == "avx2"
    monkeypatch.setattr(isa, "cpu_flags", lambda: {"sse4_2", "avx", "avx2"})  # no FMA
    assert cpu_matmul_kernel(host) == "iree"
    monkeypatch.setattr(matmuls, "host_avx512_missing", lambda: [])
    assert cpu_matmul_kernel(host) == "avx512"
    # a portable build keeps IREE's code; the flag chooses either blocking anywhere
    assert cpu_matmul_kernel(default_compile_flags("llvm-cpu", host=False, use_env=False)) == "iree"
    assert cpu_matmul_kernel([*host, *AVX2]) == "avx2"


def test_the_blocking_follows_the_kernel_instruction_set():
    """AVX2: 6 x 16 accumulators (12 of the 16 ymm registers; a ``vector<16xf32>`` is two),
    one 16-column panel per workgroup, reduction blocks of 512; AVX-512: 4 x 64."""
    with kernels_for("avx2"):
        assert kernel_isa() == "avx2"
        g = Avx512Gemm.for_shape(512, 100)
        assert (g.mr, g.nr, g.kc, g.np_, g.rows_per_workgroup, g.cols_per_workgroup) == (
            6, 16, 512, 112, 96, 16,
        )  # fmt: skip
        assert g.for_rows(8).prefetch == 1  # few rows: the next block into L2, one line a step
        assert g.for_rows(1).mr == g.for_rows(12).mr == g.for_rows(None).mr == 6
        with kernels_for("avx512"):
            assert Avx512Gemm.for_shape(512, 100).for_rows(8).mr == 4  # AVX-512's own 4 x 64
        assert g.for_rows(1).prefetch == 0  # but not one row (a decode step) on AVX2
        with kernels_for("avx512"):  # nested: the inner one
            assert Avx512Gemm.for_shape(512, 100).nr == 64
        assert Avx512Gemm.for_shape(512, 100, bf16=True).nr == 64  # bf16 is AVX-512's only
    with pytest.raises(ValueError, match="no kernel instruction set 'sse'"), kernels_for("sse"):
        pass


class _Net(torch.nn.Module):
    """A stem, a max pooling, 3x3 convolutions (Winograd's and the direct kernel's), a residual,
    a strided one with a 1x1 shortcut, a depthwise one, a global average pooling and linears."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        c = torch.nn.Conv2d
        self.stem = torch.nn.Sequential(
            c(3, 32, 7, 2, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1)
        )
        self.a, self.b = c(32, 32, 3, 1, 1), c(32, 32, 3, 1, 1, bias=False)
        self.down, self.short = c(32, 70, 3, 2, 1), c(32, 70, 1, 2)
        self.dw = c(70, 70, 3, 1, 1, groups=70)
        self.fc1, self.fc2 = torch.nn.Linear(70, 100), torch.nn.Linear(100, 10)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(self.b(torch.relu(self.a(x))) + x)
        x = torch.relu(self.down(x) + self.short(x))
        x = torch.relu(self.dw(x)).mean((2, 3))
        return self.fc2(torch.relu(self.fc1(x)))


def test_few_rows_spread_evenly_over_the_register_blocks_on_avx2(monkeypatch):
    """6 + 2 rows leave the block of two waiting on its four FMA chains (10 cycles a step of
    ``K`` against 8 for 4 + 4): the rows are spread evenly over the same number of blocks where
    that takes fewer cycles, never over more (32 rows stay in blocks of 6); a convolution's
    pixels too. ``TURBINE_CPU_MATMUL_ROWS=fixed``: 6 rows for every ``M``, the A/B baseline."""
    monkeypatch.delenv(MATMUL_ROWS_ENV, raising=False)
    changed = {m: avx2_row_block(m, 6, 96) for m in range(1, 200) if avx2_row_block(m, 6, 96) != 6}
    assert changed == {7: 4, 8: 4, 9: 5, 13: 5, 14: 5, 15: 5, 19: 5, 20: 5, 25: 5}
    with kernels_for("avx2"):
        g = Avx512Gemm.for_shape(1024, 1024)
        assert g.for_rows(8).mr == 4 and g.for_rows(8).name.endswith("_4x16x512_96x16_pf1")
        assert g.for_rows(9).mr == 5 and g.for_rows(32).mr == 6
        eo = export(_Pointwise(), args=(torch.randn(1, 64, 3, 3),))  # kept: its ops are read
        tiny = conv_geometry(direct_convs(eo.mlir_module.operation)[0])
        assert tiny is not None and conv_kernel_for(tiny).mr == 5  # 9 pixels: 5 + 4
        monkeypatch.setenv(MATMUL_ROWS_ENV, "fixed")
        assert g.for_rows(8).mr == 6 and conv_kernel_for(tiny).mr == 6


class _Pointwise(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(64, 64, 1)

    def forward(self, x):
        return torch.relu(self.conv(x))


class _SmallMap(torch.nn.Module):
    """A 3 x 3 convolution and a pointwise one over a map of a few pixels (the last stage of
    a mobile CNN), then a linear over the batch's rows."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Conv2d(24, 40, 3, 1, 1), torch.nn.Conv2d(40, 40, 1)
        self.fc = torch.nn.Linear(40, 24)

    def forward(self, x):
        y = self.b(torch.relu(self.a(x))) + torch.relu(self.a(x))
        return self.fc(y.mean((2, 3)))


@needs_avx2
@pytest.mark.parametrize(("batch", "h", "w"), [(1, 3, 3), (1, 2, 4), (9, 1, 1), (1, 3, 5)])
def test_few_rows_in_even_blocks_match_eager_and_the_avx512_blocking_bit_for_bit(batch, h, w):
    """9, 8 and 15 pixels (blocks of 5 + 4, 4 + 4, 5 + 5 + 5) and 9 rows of a linear."""
    model = _SmallMap().eval()
    x = torch.randn(batch, 24, h, w)
    eo = export(model, args=(x,))
    asm = compile_copy_asm(eo, host_flags(*AVX2))
    assert "_5x16x" in asm or "_4x16x" in asm
    got = load_module(eo.compile(None, extra_args=AVX2)).main(x)
    with torch.no_grad():
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)
    other = load_module(eo.compile(None, extra_args=["--turbine-cpu-matmul=avx512"])).main(x)
    assert torch.equal(got, other)


def test_the_compile_copy_calls_the_avx2_blocking_and_records_what_it_needs():
    eo = export(_Net().eval(), args=(torch.randn(1, 3, 48, 40),))
    asm = compile_copy_asm(eo, host_flags(*AVX2))
    assert "__turbine_avx512_f32_gemm_70x112_6x16x512_96x16" in asm  # fc1 (N 100 -> 112)
    assert "_6x16x256_128x16" in asm  # a direct convolution: 70 filters -> 80, 16 a workgroup
    assert "_6x16x256_128x32" in asm  # 32 filters: 32-column workgroups
    assert 'turbine.cpu_requires = "avx2,fma"' in asm
    assert "x64x128" not in asm  # no AVX-512 blocking anywhere
    g = conv_geometry(direct_convs(eo.mlir_module.operation)[1])  # 32 -> 32 channels
    assert g is not None and g.c == 32
    with kernels_for("avx2"):
        assert conv_kernel_for(g, bf16=True).nr == 64  # the bf16 form keeps AVX-512's


@needs_avx2
@pytest.mark.parametrize("rows", [1, 5, 8, 13])
def test_a_convolutional_network_matches_eager_and_the_avx512_blocking_bit_for_bit(rows):
    """Batches of 1, 5, 8 and 13 images (row blocks of 6 and their 1-5-row tails; 8: the
    linears in blocks of 4) through every kernel kind; the AVX-512 blocking runs on an AVX2 CPU
    too (LLVM splits its vectors)."""
    model = _Net().eval()
    x = torch.randn(rows, 3, 48, 40)
    eo = export(model, args=(x,))
    got = load_module(eo.compile(None, extra_args=AVX2)).main(x)
    with torch.no_grad():
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)
    other = load_module(eo.compile(None, extra_args=["--turbine-cpu-matmul=avx512"])).main(x)
    assert torch.equal(got, other)


class _Block(torch.nn.Module):
    """A transformer block's products: q / k / v and output projections, the attention's two
    batched matmuls (their right operands packed per call), an MLP."""

    def __init__(self, d: int = 96, heads: int = 3):
        super().__init__()
        torch.manual_seed(0)
        self.heads = heads
        self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, -1) @ v
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(torch.relu(self.up(x)))


@needs_avx2
def test_a_transformer_block_with_a_dynamic_sequence_matches_eager():
    model = _Block().eval()
    seq = torch.export.Dim("seq", min=1, max=256)
    eo = export(model, args=(torch.randn(1, 16, 96),), dynamic_shapes={"x": {1: seq}})
    assert "6x16x512" in compile_copy_asm(eo, host_flags(*AVX2))
    compiled = load_module(eo.compile(None, extra_args=AVX2))
    for t in (1, 7, 100, 203):  # row tails of every length
        x = torch.randn(1, t, 96)
        with torch.no_grad():
            torch.testing.assert_close(compiled.main(x), model(x), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------- torchao weight-only products
def _quantize(m: torch.nn.Module, config: str) -> None:
    """torchao's ``config`` (``int8`` per channel, ``int4-g<G>`` / ``int8-g<G>`` per group)
    applied to ``m`` in place."""
    tq = pytest.importorskip(
        "torchao.quantization", reason="torchao is a dev requirement (tools/requirements-dev.txt)"
    )
    from torchao.quantization.granularity import PerGroup

    if config == "int8":
        tq.quantize_(m, tq.Int8WeightOnlyConfig())
        return
    bits, group = config.split("-g")
    dtype = torch.int4 if bits == "int4" else torch.int8
    tq.quantize_(m, tq.IntxWeightOnlyConfig(weight_dtype=dtype, granularity=PerGroup(int(group))))


def test_int8_products_of_few_rows_accumulate_in_more_fma_chains():
    """Per channel, one FMA chain per row was bound by the FMA's latency (docs/quantization.md,
    "Weight-only int8 on AVX2: four FMA chains"): the row blocks of 1, 2, 3 and 4 rows now keep
    4, 4, 3 and 4 accumulators (chains of one row: 4, 2, 1, 1); v1, the A/B baseline, one a row."""
    with kernels_for("avx2"):
        current = Avx512QuantGemm.for_shape(2048, 2048, 8, None, False, rows=1)
        first = Avx512QuantGemm.for_shape(2048, 2048, 8, None, False, "v1", rows=1)
        odd = Avx512QuantGemm.for_shape(2064, 256, 8, None, False, rows=1)
    accumulators = re.compile(r"%res:(\d+) = scf\.for")
    assert current.name.endswith("_4x1_16x32_pf_ch4")
    assert accumulators.findall(current.executable()) == ["4", "4", "3", "4"]
    assert accumulators.findall(first.executable()) == ["1", "2", "3", "4"]
    # K not a multiple of 64: no unrolled steps to take turns, one chain
    assert accumulators.findall(odd.executable()) == ["1", "2", "3", "4"]


@pytest.mark.parametrize(
    ("config", "kernel"),
    [
        # per channel: 4 rows x 1 channel, fewer rows in more FMA chains (one row: four)
        ("int8", "i8_gemm_256x256_4x1_16x32_pf_ch4"),
        ("int4-g32", "i4_gemm_256x256_g32z_1x2_16x32_zb_pf_cvt"),  # 1 x 2, no lookups
        ("int4-g128", "i4_gemm_256x256_g128z_1x2_16x32_zb_pf_cvt"),
        ("int8-g64", "i8_gemm_256x256_g64z_1x2_16x32_pf"),
    ],
)
def test_quantized_weights_take_the_avx2_form_and_match_torchao_eager(config, kernel, tmp_path):
    """On AVX2 the weight-only kernel keeps its structure but not the AVX-512 table lookups
    (a 16-entry ``vpermps``): int4 nibbles are sign-extended and converted, ``q - z`` exact,
    and each group's sum is scaled at its end, as int8's is."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.SiLU(), torch.nn.Linear(256, 128, bias=False)
    ).eval()
    _quantize(m, config)
    eo, parameters = export_with_archive(m, tmp_path, "q.irpa")
    asm = compile_copy_asm(eo, host_flags(*AVX2))
    assert f"@__turbine_avx512_{kernel}" in asm
    assert "permvar" not in asm and 'turbine.cpu_requires = "avx2,fma"' in asm
    if not host_isa():
        pytest.skip("this CPU has neither AVX-512 nor AVX2 with FMA")
    compiled = load_module(eo.compile(save_to=None, extra_args=AVX2), parameters=parameters)
    for rows in (1, 2, 3, 17):  # one row (decode) and row tails
        x = torch.randn(rows, 256)
        with torch.no_grad():
            torch.testing.assert_close(compiled.main(x), m(x), rtol=1e-5, atol=1e-5)
