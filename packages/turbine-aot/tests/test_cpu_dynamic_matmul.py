"""Products of two activations with a dynamic reduction or width (attention over a dynamic
sequence) on turbine's dynamic-size kernel (``_compiler.dynamic_matmuls``,
``_compiler.avx512_dynamic``), and attention masks over dynamic sizes computed once
(``_compiler.attention``): what the compile copy calls, and that the values are eager's at
sizes that cover every tail (rows past a register block and a workgroup, columns past a
16-wide panel, reductions past a block)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_testing import compile_copy_asm, host_flags, needs_avx2

from turbine_aot import export
from turbine_aot._compiler.avx512_dynamic import Avx512DynamicGemm
from turbine_aot._compiler.dynamic_matmuls import rewritable_dynamic_matmuls
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.isa import host_isa, kernels_for
from turbine_aot.runtime import load_module


class _SelfAttention(torch.nn.Module):
    """``softmax(x x^T / 4) x``: ``x x^T`` has a dynamic width (the sequence), the second
    product a dynamic reduction."""

    def forward(self, x):
        return torch.softmax(x @ x.transpose(-1, -2) / 4.0, -1) @ x


def _export_self_attention(e: int):
    seq = torch.export.Dim("seq", min=2, max=1024)
    return export(
        _SelfAttention(), args=(torch.randn(2, 3, 24, e),), dynamic_shapes={"x": {2: seq}}
    )


def test_the_blocking_follows_the_kernel_instruction_set():
    with kernels_for("avx2"):
        g = Avx512DynamicGemm.for_product(None, None)
        assert (g.mr, g.kc, g.rows_per_workgroup) == (6, 512, 96)  # 12 ymm accumulators
        assert g.masked and g.name == "__turbine_f32_dyn_gemm_kD_6x16x512_96_m"
        assert not Avx512DynamicGemm.for_product(None, 64).masked  # whole panels: no masks
    with kernels_for("avx512"):
        assert Avx512DynamicGemm.for_product(64, None).mr == 12  # 12 of 32 zmm registers
    with pytest.raises(ValueError, match="bad blocking"):
        Avx512DynamicGemm(None, mr=5, rows_per_workgroup=96)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_the_compile_copy_calls_the_kernel_for_both_products(isa):
    eo = _export_self_attention(40)
    assert len(rewritable_dynamic_matmuls(eo.mlir_module)) == 2
    asm = compile_copy_asm(eo, host_flags(f"--turbine-cpu-matmul={isa}"))
    mr = 6 if isa == "avx2" else 12
    # x @ x^T: K = E, N the sequence (a partial last panel: masked); p @ x: K the sequence,
    # N = 40 (two whole panels and a masked one)
    assert f"@__turbine_f32_dyn_gemm_k40_{mr}x16x512_96_m" in asm
    assert f"@__turbine_f32_dyn_gemm_kD_{mr}x16x512_96_m" in asm
    assert "tensor.pad" not in asm and "tensor.extract_slice" not in asm  # no padded copies
    whole = compile_copy_asm(_export_self_attention(32), host_flags(f"--turbine-cpu-matmul={isa}"))
    assert f"@__turbine_f32_dyn_gemm_kD_{mr}x16x512_96 " in whole  # N = 32: whole panels
    assert "torch.aten.matmul" not in asm
    # the softmax between them, whose only use is the kernel's product, in the reciprocal form:
    # right on both instruction sets (docs/performance.md, section 20)
    assert "torch.aten.reciprocal" in asm and "softmax" not in asm
    # what the kernels need on the target (this CPU): AVX-512's only where it has AVX-512
    features = "avx512f" if isa == "avx512" and host_isa() == "avx512" else "avx2,fma"
    assert f'turbine.cpu_requires = "{features}"' in asm


def test_iree_keeps_them_where_asked_for_and_in_portable_builds(monkeypatch):
    eo = _export_self_attention(32)
    portable = [*default_compile_flags("llvm-cpu", host=False, use_env=False)]
    for flags in (portable, host_flags("--turbine-cpu-matmul=iree")):
        assert "dyn_gemm" not in compile_copy_asm(eo, flags)
    monkeypatch.setenv("TURBINE_CPU_DYNAMIC_MATMUL", "iree")
    asm = compile_copy_asm(eo, host_flags())
    assert "dyn_gemm" not in asm and asm.count("torch.aten.matmul") == 2
    # IREE's own products: its softmax op stays (the form fused into them is miscompiled)
    assert "torch.aten.softmax.int" in asm and "torch.aten.reciprocal" not in asm


@needs_avx2
@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("e", [32, 40])
def test_self_attention_over_a_dynamic_sequence_matches_eager(isa, e):
    """Sequences 2-700: register-block and workgroup row tails (6 / 12 rows, 96 a workgroup),
    widths past a panel (17, 40 -> 48), reductions of more than one 512-step block (700). The
    AVX-512 blocking runs on an AVX2 CPU too (LLVM splits its vectors)."""
    model = _SelfAttention()
    compiled = load_module(
        _export_self_attention(e).compile(None, extra_args=[f"--turbine-cpu-matmul={isa}"])
    )
    torch.manual_seed(0)
    for t in (2, 7, 17, 100, 700):
        x = torch.randn(2, 3, t, e)
        torch.testing.assert_close(compiled.main(x), model(x), rtol=1e-4, atol=1e-4)


class _Products(torch.nn.Module):
    """2-D products with a dynamic width, and a dynamic reduction."""

    def forward(self, a, b):
        return a @ b, b @ b.transpose(0, 1)


@needs_avx2
def test_two_dimensional_products_with_dynamic_sizes_match_eager():
    n = torch.export.Dim("n", min=1, max=512)
    eo = export(
        _Products(),
        args=(torch.randn(5, 24), torch.randn(24, 20)),
        dynamic_shapes={"a": None, "b": {1: n}},
    )
    assert len(rewritable_dynamic_matmuls(eo.mlir_module)) == 2  # N dynamic; K dynamic
    compiled = load_module(eo.compile(None))
    for cols in (1, 16, 33):
        a, b = torch.randn(5, 24), torch.randn(24, cols)
        for got, want in zip(compiled.main(a, b), _Products()(a, b)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


class _BatchAttention(torch.nn.Module):
    """Causal attention over a dynamic batch (the products' batch dynamic, M, K and N static)."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_attention_over_a_dynamic_batch_is_on_the_kernel_and_right(isa):
    """Over a dynamic batch both products are IREE's ``batch_matmul`` with a dynamic batch
    without the rewrite (the static kernel needs a static batch); on the dynamic-size kernel the
    batch is a dispatch operand, the softmax between them in the reciprocal form."""
    batch = torch.export.Dim("batch", min=1, max=16)
    args = tuple(torch.randn(2, 4, 24, 32) for _ in range(3))
    eo = export(_BatchAttention(), args=args, dynamic_shapes={n: {0: batch} for n in "qkv"})
    asm = compile_copy_asm(eo, host_flags(f"--turbine-cpu-matmul={isa}"))
    mr = 6 if isa == "avx2" else 12
    assert f"@__turbine_f32_dyn_gemm_k32_{mr}x16x512_96_m" in asm  # q @ k^T: N = 24
    assert f"@__turbine_f32_dyn_gemm_k24_{mr}x16x512_96 " in asm  # p @ v: N = 32, whole
    assert "torch.aten.matmul" not in asm and "softmax" not in asm
    if not host_isa():
        pytest.skip("this CPU has neither AVX-512 nor AVX2 with FMA")
    compiled = load_module(eo.compile(None, extra_args=[f"--turbine-cpu-matmul={isa}"]))
    torch.manual_seed(0)
    for b in (1, 5, 16):
        q, k, v = (torch.randn(b, 4, 24, 32) for _ in range(3))
        torch.testing.assert_close(
            compiled.main(q, k, v), _BatchAttention()(q, k, v), rtol=1e-4, atol=1e-4
        )


class _MaskedLayers(torch.nn.Module):
    """Two attention layers sharing one bool padding mask built from an ``attention_mask`` over
    a dynamic sequence by a gather (as Hugging Face builds ``[B, 1, L, S]``)."""

    def forward(self, x, attention_mask):
        seq = x.shape[2]
        keep = attention_mask.bool()[:, None, None, torch.arange(seq)]  # [B, 1, 1, S]
        keep = keep & (torch.arange(seq)[:, None] >= 0)  # [B, 1, L, S]
        y = F.scaled_dot_product_attention(x, x, x, attn_mask=keep)
        return F.scaled_dot_product_attention(y, y, y, attn_mask=keep)


def test_a_mask_over_dynamic_sizes_is_computed_once_and_right():
    """IREE fuses a mask built from indices and gathers into every layer's masked scores, and
    recomputes it per element; the rewrite computes it once (one function for both layers)."""
    seq = torch.export.Dim("seq", min=2, max=128)
    x, mask = torch.randn(2, 4, 16, 32), torch.ones(2, 16, dtype=torch.int64)
    eo = export(
        _MaskedLayers(),
        args=(x, mask),
        dynamic_shapes={"x": {2: seq}, "attention_mask": {1: seq}},
    )
    asm = compile_copy_asm(eo, host_flags())
    assert asm.count("util.optimization_barrier") == 1
    assert asm.count("call @__turbine_materialized_mask") == 1
    if not host_isa():
        pytest.skip("this CPU has neither AVX-512 nor AVX2 with FMA")
    compiled = load_module(eo.compile(None))
    torch.manual_seed(0)
    for t, pad in ((19, 4), (32, 0), (50, 13)):
        x, mask = torch.randn(2, 4, t, 32), torch.ones(2, t, dtype=torch.int64)
        mask[1, t - pad :] = 0
        torch.testing.assert_close(
            compiled.main(x, mask), _MaskedLayers()(x, mask), rtol=1e-4, atol=1e-4
        )


def test_static_masks_are_left_to_iree():
    x, keep = torch.randn(2, 4, 16, 32), torch.rand(2, 1, 16, 16) > 0.2
    keep[..., 0] = True
    eo = export(_MaskedStatic(), args=(x, keep))
    assert "util.optimization_barrier" not in compile_copy_asm(eo, host_flags())


class _MaskedStatic(torch.nn.Module):
    def forward(self, x, keep):
        return F.scaled_dot_product_attention(x, x, x, attn_mask=keep)


@pytest.mark.parametrize(
    ("x", "w", "k", "n"),
    [
        ([2, 4, None, None], [2, 4, 32, None], 32, None),  # K static on one side only
        ([2, 4, None, 32], [2, 4, None, None], 32, None),
        ([5, None], [None, 20], None, 20),  # 2-D, N not a multiple of 16
        ([None, 16], [16, None], 16, None),
        ([None, 4, 24, 32], [None, 4, 32, 24], 32, 24),  # a dynamic batch, the rest static
        ([None, 4, None, 32], [None, 4, 32, None], 32, None),  # ... and a dynamic sequence
        ([3, None, 24, None], [3, None, None, 32], None, 32),
    ],
)
def test_the_private_function_verifies_for_every_mix_of_static_and_dynamic_sizes(x, w, k, n):
    """The reshapes and casts around the dispatch, whatever sizes torch-mlir left static."""
    from turbine_aot._compiler.dynamic_matmuls import _function, _Product
    from turbine_aot._compiler.torch_ir import TensorType
    from turbine_ir import ir

    batch = tuple(x[:-2])
    out = [*batch, x[-2], w[-1]]
    g = _Product(TensorType(x, "f32"), TensorType(w, "f32"), TensorType(out, "f32"), batch, k, n)
    kernel = Avx512DynamicGemm.for_product(k, n)
    assert kernel.masked == (n is None or n % 16 != 0)
    with ir.Context():
        module = ir.Module.parse(kernel.executable() + "\n" + _function("f", g, kernel))
        assert module.operation.verify()
