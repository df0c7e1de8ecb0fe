"""fp32 matmuls on turbine's AVX-512 kernel (``_compiler.avx512``, ``_compiler.matmuls``): when the
compile copy uses it, and that it gives eager's values for any rows, reduction and width."""

from __future__ import annotations

import re
import textwrap

import numpy as np
import pytest
import torch
from ir_check import check_ir
from kernel_testing import compile_copy_asm, host_flags, needs_avx512

from turbine_aot import export
from turbine_aot._compiler import matmuls, workgroups
from turbine_aot._compiler.avx512 import Avx512Gemm
from turbine_aot._compiler.cache import compile_mlir
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.isa import host_isa, kernels_for
from turbine_aot._compiler.matmuls import cpu_matmul_kernel
from turbine_aot._compiler.targets import TargetError
from turbine_aot.runtime import load_module


@pytest.fixture(autouse=True)
def _avx512_blocking():
    """These tests are about the kernels' AVX-512 blocking, whatever this CPU has (an AVX2 one
    blocks the same kernels for its 16 registers: test_cpu_kernels_avx2.py)."""
    with kernels_for("avx512"):
        yield


class _Linear2(torch.nn.Module):
    def __init__(self, k: int = 100, hidden: int = 70, n: int = 40):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(k, hidden)
        self.b = torch.nn.Linear(hidden, n, bias=False)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


_copy_asm = compile_copy_asm


# ---------------------------------------------------------------------------- when it applies
def test_the_kernel_is_the_default_for_host_builds_with_avx512(monkeypatch):
    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    host = default_compile_flags("llvm-cpu", use_env=False)
    # AVX-512, else the AVX2 blocking of the same kernels (test_cpu_kernels_avx2.py)
    assert cpu_matmul_kernel(host) == (host_isa() or "iree")
    # portable builds, builds without turbine's fast-matmul defaults: IREE's matmul code
    assert cpu_matmul_kernel(default_compile_flags("llvm-cpu", host=False, use_env=False)) == "iree"
    assert cpu_matmul_kernel(default_compile_flags("llvm-cpu", fast_matmul=False)) == "iree"
    # a compile that fails with the defaults is retried without data tiling + ukernels: then
    # with IREE's matmul code too
    from turbine_aot._compiler.fallback import retry_flags

    retry = retry_flags(host, [])
    assert retry is not None and cpu_matmul_kernel(retry) == "iree"
    # the flag and the environment choose; the flag wins
    assert cpu_matmul_kernel([*host, "--turbine-cpu-matmul=iree"]) == "iree"
    monkeypatch.setenv("TURBINE_CPU_MATMUL", "iree")
    assert cpu_matmul_kernel(host) == "iree"
    assert cpu_matmul_kernel([*host, "--turbine-cpu-matmul=avx512"]) == "avx512"
    with pytest.raises(
        TargetError, match=r"unknown --turbine-cpu-matmul value 'mkl'.*iree, avx512, avx2"
    ):
        cpu_matmul_kernel([*host, "--turbine-cpu-matmul=mkl"])


def test_the_compile_copy_calls_the_kernel_and_the_export_is_unchanged(monkeypatch):
    monkeypatch.setattr(matmuls, "host_avx512_missing", lambda: [])
    eo = export(_Linear2(), args=(torch.randn(8, 100),))
    exported = str(eo.mlir_module)
    asm = _copy_asm(eo, host_flags("--turbine-cpu-matmul=avx512"))
    check_ir(
        asm,
        r"stream.executable private @__turbine_avx512_f32_gemm_100x128_4x64x128_128x64",
        r"vector.fma %\w+, %\w+, %\w+ : vector<16xf32>",
        r"func.func private @__turbine_avx512_matmul_0\(%\w+: tensor<8x100xf32>, %\w+: "
        r"tensor<100x70xf32>, %\w+: tensor<70xf32>\)",  # the bias: added in the kernel
        r"tensor.pad %\w+ low\[0, 0\] high\[0, 58\]",  # the weight: N 70 -> 128, K as it is
        r"linalg.transpose .* permutation = \[1, 0, 2\]",
        # 8 rows: two register blocks, each prefetching 2 lines a step of the next K block
        # C written as [8, 70] (masked stores in the last panel): no slice of a [8, 128] after
        r"flow.dispatch @__turbine_avx512_f32_gemm_100x128_4x64x128_128x64_bias_relu_pf2_n70::"
        r".* -> tensor<\?x70xf32>",
    )
    assert "tensor.extract_slice" not in asm
    assert "arith.truncf" not in asm  # fp32 stays fp32
    assert 'turbine.cpu_requires = "avx512f"' in asm
    assert exported == str(eo.mlir_module)
    # IREE's matmul code when asked for, and for other targets
    assert "flow.dispatch" not in _copy_asm(eo, host_flags("--turbine-cpu-matmul=iree"))
    vmvx = [*default_compile_flags("vmvx", use_env=False), "--turbine-cpu-matmul=avx512"]
    assert "flow.dispatch" not in _copy_asm(eo, vmvx)


# ------------------------------------------------------------------------------ the kernel alone
def _kernel_module(g: Avx512Gemm, batch_b: bool) -> str:
    be = "?" if batch_b else str(g.packed_b_size)
    bdims = "{%bel}" if batch_b else ""
    call = g.dispatch("%a2", "%b", "%m", "%batch", "%rows", be).replace(
        "tensor<?xf32>,", "tensor<?xf32>" + bdims + ","
    )
    k, np_ = g.k, g.c_cols
    return g.executable() + textwrap.dedent(
        f"""
        func.func @main(%a: tensor<?x?x{k}xf32>, %b: tensor<{be}xf32>) -> tensor<?x?x{np_}xf32> {{
          %c0 = arith.constant 0 : index
          %c1 = arith.constant 1 : index
          %batch = tensor.dim %a, %c0 : tensor<?x?x{k}xf32>
          %m = tensor.dim %a, %c1 : tensor<?x?x{k}xf32>
          %rows = arith.muli %batch, %m : index
          %bel = tensor.dim %b, %c0 : tensor<{be}xf32>
          %a2 = tensor.collapse_shape %a [[0, 1], [2]] : tensor<?x?x{k}xf32> into tensor<?x{k}xf32>
          %r = {call}
          %o = tensor.expand_shape %r [[0, 1], [2]] output_shape [%batch, %m, {np_}] : tensor<?x{np_}xf32> into tensor<?x?x{np_}xf32>
          return %o : tensor<?x?x{np_}xf32>
        }}"""
    )


def _pack(b: torch.Tensor, g: Avx512Gemm) -> torch.Tensor:
    """B [K, N] -> the kernel's panels (as documented in _compiler.avx512)."""
    k, n = b.shape
    bp = torch.zeros(k, g.np_)
    bp[:, :n] = b
    return bp.reshape(k, g.np_ // g.nr, g.nr).permute(1, 0, 2).reshape(-1)


@pytest.mark.parametrize(
    ("k", "n", "batch_b", "mr", "prefetch", "cols", "unpadded"),
    [
        (100, 70, False, 4, 0, 64, False),
        (300, 128, True, 4, 0, 64, False),
        (64, 64, False, 1, 0, 64, False),
        (300, 200, False, 4, 4, 64, False),  # one-row products' prefetch, clamped at B's end
        (300, 128, False, 4, 1, 64, False),
        (300, 128, False, 6, 0, 64, False),  # many rows on Intel: 6 x 64 register blocks
        (300, 380, False, 4, 0, 128, False),  # workgroups of 2 and 3 panels (balanced)
        (100, 380, True, 4, 0, 192, False),
        # C written as [rows, n]: masked stores in the last panel, and masked loads of the
        # partial sums of the blocks after the first (K = 300: three blocks)
        (300, 199, True, 4, 0, 64, True),
        (300, 70, False, 4, 2, 128, True),
        (100, 1000, False, 3, 0, 64, True),
    ],
)
def test_the_kernel_matches_fp32_for_any_rows_and_reduction(
    k, n, batch_b, mr, prefetch, cols, unpadded
):
    # K = 100 / 300: blocks of 128 with a remainder; rows 1..130: the 1-3 row kernels too
    np_ = -(-n // 64) * 64
    g = Avx512Gemm(
        k,
        np_,
        batch_b,
        mr=mr,
        prefetch=prefetch,
        cols_per_workgroup=cols,
        n_out=n if unpadded else 0,
    )
    assert g.c_cols == (n if unpadded else np_)
    vmfb = compile_mlir(_kernel_module(g, batch_b), host_flags(), cache=False)
    import iree.runtime as rt

    ctx = rt.SystemContext(config=rt.Config("local-task"))
    ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
    torch.manual_seed(0)
    for batch in (1, 3):
        for m in (1, 2, 3, 5, 17, 130):
            a = torch.randn(batch, m, k)
            b = torch.randn(batch if batch_b else 1, k, n)
            packed = torch.cat([_pack(b[i], g) for i in range(b.shape[0])])
            out = ctx.modules.module.main(a.numpy(), packed.numpy())
            got = torch.from_numpy(np.asarray(out.to_host()))[..., :n]
            torch.testing.assert_close(got, a @ b, rtol=1e-5, atol=1e-4)


@needs_avx512
@pytest.mark.parametrize(
    ("k", "n", "batch_b"), [(199, 16, True), (40, 5, False), (100, 32, True), (300, 20, False)]
)
def test_products_of_at_most_32_columns_take_one_narrow_panel(k, n, batch_b):
    # attention's p @ v over heads of 16 (wav2vec2's) computed 64 columns, 48 of them zeros
    with kernels_for("avx512"):
        g = Avx512Gemm.for_shape(k, n, batch_b=batch_b)
    want_block = (16, 12, 16, 96) if n <= 16 else (32, 8, 32, 128)
    assert (g.np_, g.mr, g.nr, g.rows_per_workgroup) == want_block and g.cols_per_workgroup == g.nr
    vmfb = compile_mlir(_kernel_module(g, batch_b), host_flags(), cache=False)
    import iree.runtime as rt

    ctx = rt.SystemContext(config=rt.Config("local-task"))
    ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
    torch.manual_seed(1)
    for batch in (1, 4):
        for m in (1, 11, 12, 13, 97, 199):  # the 1-11 row blocks, one and more workgroups
            a = torch.randn(batch, m, k)
            b = torch.randn(batch if batch_b else 1, k, n)
            packed = torch.cat([_pack(b[i], g) for i in range(b.shape[0])])
            out = ctx.modules.module.main(a.numpy(), packed.numpy())
            got = torch.from_numpy(np.asarray(out.to_host()))[..., :n]
            want = (a.double() @ b.double()).float()
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_few_rows_prefetch_the_next_block_once_between_them():
    """``for_rows``: with at most 8 register blocks of static rows the blocks together prefetch
    the next K block's four lines a step; more rows, unknown rows or B per batch entry: none."""
    g = Avx512Gemm.for_shape(2048, 2048)
    assert [g.for_rows(m).prefetch for m in (1, 4, 5, 8, 9, 16, 17, 32)] == [4, 4, 2, 2, 2, 1, 1, 1]
    assert [g.for_rows(m).prefetch for m in (33, 128, None)] == [0, 0, 0]
    assert Avx512Gemm.for_shape(64, 64, batch_b=True).for_rows(1).prefetch == 0
    assert g.for_rows(1).name.endswith("_pf4") and "_pf" not in g.for_rows(128).name


def test_many_rows_take_6x64_register_blocks_on_intel(monkeypatch):
    """``for_rows``: from ``MANY_ROWS`` static rows, fp32 products on Intel CPUs take 6 x 64
    register blocks (docs/performance.md, section 36); few or unknown rows, the bf16 form and
    other vendors keep 4 x 64."""
    from turbine_aot._compiler import avx512

    monkeypatch.setattr(avx512, "cpu_vendor", lambda: "GenuineIntel")
    g = Avx512Gemm.for_shape(2048, 512)
    assert [g.for_rows(m).mr for m in (1, 8, avx512.MANY_ROWS - 1, None)] == [4, 4, 4, 4]
    assert [g.for_rows(m).mr for m in (avx512.MANY_ROWS, 128, 4096)] == [6, 6, 6]
    assert g.for_rows(128).prefetch == 0 and "_6x64x128_" in g.for_rows(128).name
    assert Avx512Gemm.for_shape(2048, 512, bf16=True).for_rows(128).mr == 4
    monkeypatch.setattr(avx512, "cpu_vendor", lambda: "AuthenticAMD")
    assert g.for_rows(128).mr == 4


@needs_avx512
def test_the_rewrite_prefetches_for_few_static_rows():
    """The compile copy's kernels per linear: one row (a decode step) prefetches 4 lines a step,
    eight rows 2, 128 rows none, and a dynamic row count none."""
    model = _Linear2().eval()
    for rows, suffix in ((1, "_pf4"), (8, "_pf2"), (128, "")):
        asm = compile_copy_asm(export(model, args=(torch.randn(rows, 100),)), host_flags())
        names = set(re.findall(r"@(__turbine_avx512_f32_gemm_\w+)", asm))
        assert len(names) == 2, names  # the two linears' kernels
        names = {re.sub(r"_n\d+$", "", n) for n in names}  # C's columns: 70 and 40
        if suffix:
            assert all(n.endswith(suffix) for n in names), (rows, names)
        else:
            assert not any("_pf" in n for n in names), (rows, names)
    dyn = export(
        model,
        args=(torch.randn(4, 100),),
        dynamic_shapes={"x": {0: torch.export.Dim("rows")}},
    )
    names = set(
        re.findall(r"@(__turbine_avx512_f32_gemm_\w+)", compile_copy_asm(dyn, host_flags()))
    )
    assert names and not any("_pf" in n for n in names), names


def test_the_workgroup_grid_is_shared_evenly_by_the_hosts_workers():
    """``balanced``: GPT-2's ``Linear(512, 1536)`` at 128 rows is 24 workgroups of 64 columns,
    which IREE shares 16 / 8 between two workers: 12 of 128 columns instead. Shapes that share
    evenly, one worker, four workers and unknown rows keep 64."""
    qkv = Avx512Gemm.for_shape(512, 1536)
    assert qkv.balanced(128, workers=2).cols_per_workgroup == 128
    assert [qkv.balanced(128, workers=w).cols_per_workgroup for w in (1, 4)] == [64, 64]
    assert qkv.balanced(None, workers=2) is qkv
    for n in (512, 768, 1024, 2048, 8192):
        g = Avx512Gemm.for_shape(512, n)
        assert g.balanced(128, workers=2) is g, n
    # 40 workgroups (24 / 16) -> 10 of 256 columns (5 / 5); a batch multiplies the row blocks
    assert Avx512Gemm.for_shape(512, 2560).balanced(128, workers=2).cols_per_workgroup == 256
    assert qkv.balanced(128, batch=2, workers=2) is qkv  # 48 workgroups: 24 / 24


@needs_avx512
def test_the_rewrite_cuts_the_grid_for_the_hosts_worker_count(monkeypatch):
    monkeypatch.setattr(workgroups, "default_workers", lambda: 2)
    model = torch.nn.Linear(512, 1536).eval()
    asm = compile_copy_asm(export(model, args=(torch.randn(128, 512),)), host_flags())
    assert re.findall(r"@(__turbine_avx512_f32_gemm_\w+)", asm)[0].endswith("_128x128_bias")


# ---------------------------------------------------------------------------------- end to end
@needs_avx512
@pytest.mark.parametrize("rows", [1, 7, 128])
def test_linears_match_eager(rows):
    model = _Linear2().eval()
    x = torch.randn(rows, 100)
    eo = export(model, args=(x,))
    got = load_module(eo.compile(save_to=None, extra_args=["--turbine-cpu-matmul=avx512"])).main(x)
    torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)


@needs_avx512
def test_dynamic_batch_and_attention_match_eager():
    class Block(torch.nn.Module):
        def __init__(self, d: int = 64, heads: int = 2):
            super().__init__()
            torch.manual_seed(0)
            self.qkv, self.out, self.heads = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d), heads

        def forward(self, x):
            b, s, d = x.shape
            q, k, v = self.qkv(x).split(d, dim=-1)
            q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v))
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(y.transpose(1, 2).reshape(b, s, d))

    model = Block().eval()
    batch = torch.export.Dim("batch", min=1, max=16)
    eo = export(model, args=(torch.randn(2, 24, 64),), dynamic_shapes={"x": {0: batch}})
    asm = _copy_asm(eo, host_flags("--turbine-cpu-matmul=avx512"))
    # the two linears; attention's products have a dynamic batch (left to IREE)
    assert asm.count("func.func private @__turbine_avx512_matmul_") == 2
    m = load_module(eo.compile(save_to=None, extra_args=["--turbine-cpu-matmul=avx512"]))
    for b in (1, 5):
        x = torch.randn(b, 24, 64)
        torch.testing.assert_close(m.main(x), model(x), rtol=1e-5, atol=1e-5)


def test_the_compile_cache_keys_on_the_kernel_choice(monkeypatch):
    from turbine_aot._compiler.cache import CompileCache

    monkeypatch.delenv("TURBINE_CPU_MATMUL", raising=False)
    monkeypatch.delenv("TURBINE_CPU_ATTENTION", raising=False)
    keys = [CompileCache.key(b"module", host_flags())]
    monkeypatch.setenv("TURBINE_CPU_MATMUL", "iree")  # another module: never served for the first
    keys.append(CompileCache.key(b"module", host_flags()))
    monkeypatch.setenv("TURBINE_CPU_ATTENTION", "keep")
    keys.append(CompileCache.key(b"module", host_flags()))
    assert len(set(keys)) == 3
