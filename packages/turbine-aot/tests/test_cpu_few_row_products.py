"""Products of two activations with few rows per batch entry (a decode step's attention) read
their operands in place (``_compiler.few_row_products``): ``q @ k^T`` on the dot-product
kernel reading ``k`` as it is, ``p @ v`` on the dynamic-size kernel reading ``v`` as it is,
no per-call pack of either; weights and longer products keep the packed kernel; the values
are eager's at sizes that cover the kernel's loops."""

from __future__ import annotations

import re

import pytest
import torch
from kernel_testing import compile_copy_asm, host_flags, needs_avx2

from turbine_aot import export
from turbine_aot._compiler.few_row_products import (
    MAX_ROWS,
    F32DotGemm,
    rewritable_few_row_products,
)
from turbine_aot.runtime import load_module


class _Attention(torch.nn.Module):
    """``softmax(q k^T) v`` over given ``q``, ``k``, ``v`` (the KV cache's part of a step)."""

    def forward(self, q, k, v):
        return torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * 0.125, -1) @ v


def _qkv(batch: tuple[int, ...], m: int, s: int, e: int, ev: int | None = None):
    torch.manual_seed(0)
    return (
        torch.randn(*batch, m, e),
        torch.randn(*batch, s, e),
        torch.randn(*batch, s, e if ev is None else ev),
    )


def test_the_kernel_takes_multiples_of_eight_only():
    g = F32DotGemm(m=3, k=64, n=48, batch=4)
    assert g.name == "__turbine_f32_dot_gemm_4x3x48x64"
    assert g.types() == ("tensor<12x64xf32>", "tensor<192x64xf32>", "tensor<12x48xf32>")
    for bad in ({"k": 60}, {"n": 20}, {"m": 0}):
        with pytest.raises(ValueError, match="bad sizes"):
            F32DotGemm(**{"m": 3, "k": 64, "n": 48, "batch": 4, **bad})


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_a_decode_steps_products_read_k_and_v_in_place(isa):
    eo = export(_Attention(), args=_qkv((1, 4), 3, 48, 64))
    assert len(rewritable_few_row_products(eo.mlir_module)) == 2
    asm = compile_copy_asm(eo, host_flags(f"--turbine-cpu-matmul={isa}"))
    mr = 6 if isa == "avx2" else 12
    assert "flow.dispatch @__turbine_f32_dot_gemm_4x3x48x64" in asm  # q @ k^T, k as it is
    assert f"flow.dispatch @__turbine_f32_dyn_gemm_k48_{mr}x16x512_96" in asm  # p @ v
    # neither right operand is transposed or packed per call (the packed kernel's pack is a
    # linalg.transpose; k's transpose is gone with the product)
    assert "torch.aten.transpose.int" not in asm and "linalg.transpose" not in asm
    assert "__turbine_avx512_f32_gemm" not in asm and "torch.aten.matmul" not in asm


#: The packed kernel of a K = 64, N = 48 product: N padded to the host's column block (48 on
#: AVX2, 64 on AVX-512).
_PACKED_64x48 = r"__turbine_avx512_f32_gemm_64x(48|64)_bb"


def test_weights_and_longer_products_keep_the_packed_kernel():
    class _WithWeight(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 64, 48))

        def forward(self, x):
            return torch.matmul(x, self.w)  # its pack hoisted: done once

    eo = export(_WithWeight(), args=(torch.randn(4, 3, 64),))
    assert not rewritable_few_row_products(eo.mlir_module)
    assert re.search(_PACKED_64x48, compile_copy_asm(eo, host_flags()))
    longer = export(_Attention(), args=_qkv((1, 4), MAX_ROWS + 1, 48, 64))
    assert not rewritable_few_row_products(longer.mlir_module)
    asm = compile_copy_asm(longer, host_flags())
    assert "__turbine_avx512_f32_gemm_" in asm and "dot_gemm" not in asm


def test_the_packed_path_where_asked_for_and_iree_where_its_matmuls_are(monkeypatch):
    eo = export(_Attention(), args=_qkv((1, 4), 3, 48, 64))
    assert "dot_gemm" not in compile_copy_asm(eo, host_flags("--turbine-cpu-matmul=iree"))
    monkeypatch.setenv("TURBINE_CPU_FEW_ROW_PRODUCTS", "packed")
    asm = compile_copy_asm(eo, host_flags())
    assert "dot_gemm" not in asm and re.search(_PACKED_64x48, asm)


@needs_avx2
@pytest.mark.parametrize(
    ("batch", "m", "s", "e", "ev"),
    [
        ((1, 4), 3, 48, 64, None),  # the 110M Llama's grouped decode step
        ((2,), 1, 8, 8, 24),  # one row, one block of 8 keys and of 8 lanes; p @ v's N not 16s
        ((3,), MAX_ROWS, 136, 72, 40),  # the most rows, 17 blocks of keys, K of 9 steps
        ((2, 2), 5, 20, 64, None),  # 20 keys: q @ k^T keeps k^T (not 8s), p @ v in place
    ],
)
def test_the_products_match_eager(batch, m, s, e, ev):
    model = _Attention()
    args = _qkv(batch, m, s, e, ev)
    eo = export(model, args=args)
    asm = compile_copy_asm(eo, host_flags())
    assert ("dot_gemm" in asm) == (s % 8 == 0)
    compiled = load_module(eo.compile(None))
    torch.testing.assert_close(compiled.main(*args), model(*args), rtol=1e-4, atol=1e-4)
    other = tuple(3.0 * torch.randn_like(a) for a in args)  # the same module, other values
    torch.testing.assert_close(compiled.main(*other), model(*other), rtol=1e-4, atol=1e-4)
