"""``compile(precision="bf16")``: fp32 matmuls on a bf16 kernel, AMX (``_compiler.amx``) or
AVX512-BF16 (``_compiler.avx512``), chosen by ``_compiler.bf16``. The rewrite and the refusals
are checked everywhere; compiling and running needs a CPU with either (the end-to-end tests run
on whichever this machine has; each kernel's own tests are skipped elsewhere, with the
reason)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from ir_check import check_ir
from kernel_testing import bf16_reference

from turbine_aot import export
from turbine_aot._compiler import amx, bf16
from turbine_aot._compiler.amx import AmxGemm, host_amx_missing, padded
from turbine_aot._compiler.avx512 import Avx512Gemm, host_avx512_bf16_missing
from turbine_aot._compiler.bf16 import (
    AVX512_BF16_FEATURES,
    PRECISION_FLAG,
    bf16_kernel_kind,
    bf16_matmuls,
    check_precision,
    precision_flags,
    precision_of,
    rewrite_matmuls_bf16,
    strip_precision_flags,
)
from turbine_aot._compiler.cache import compile_mlir
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.rewrites import module_for_compile
from turbine_aot._compiler.targets import TargetError
from turbine_aot.runtime import TurbineRuntimeError, load_module

_MISSING = host_amx_missing()
needs_amx = pytest.mark.skipif(
    bool(_MISSING), reason=f"this CPU cannot run AMX code (lacks {', '.join(_MISSING)})"
)
_KIND = bf16_kernel_kind()
needs_bf16 = pytest.mark.skipif(
    _KIND is None,
    reason=f"this CPU has neither AMX-BF16 nor AVX512-BF16 (lacks {', '.join(_MISSING)}, "
    f"{', '.join(host_avx512_bf16_missing())})",
)
needs_avx512_bf16 = pytest.mark.skipif(
    bool(host_avx512_bf16_missing()),
    reason=f"this CPU cannot run AVX512-BF16 code (needs {', '.join(AVX512_BF16_FEATURES)})",
)
_BF16 = [f"{PRECISION_FLAG}=bf16"]


def _flags() -> list[str]:
    return [*default_compile_flags("llvm-cpu", use_env=False), *_BF16]


class _Linear2(torch.nn.Module):
    """Two linears with sizes that are not multiples of 32 (K and N remainders)."""

    def __init__(self, k: int = 100, hidden: int = 70, n: int = 40):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(k, hidden)
        self.b = torch.nn.Linear(hidden, n, bias=False)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class _Attention(torch.nn.Module):
    def __init__(self, d: int = 64, heads: int = 2):
        super().__init__()
        torch.manual_seed(0)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.heads = heads

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(b, s, d)


# ------------------------------------------------------------------------------- flags, refusals
def test_precision_flags_round_trip():
    assert precision_flags("fp32") == []
    assert precision_flags("BF16") == _BF16
    flags = ["--iree-opt-data-tiling=true", *_BF16]
    assert precision_of(flags) == "bf16"
    assert precision_of(flags[:1]) == "fp32"
    assert strip_precision_flags(flags) == flags[:1]
    with pytest.raises(TargetError, match=r"unknown precision .fp8.*fp32, bf16"):
        precision_flags("fp8")


def test_bf16_is_refused_for_other_targets_and_portable_builds():
    with pytest.raises(TargetError, match=r"llvm-cpu target only.*vmvx"):
        check_precision([*default_compile_flags("vmvx", use_env=False), *_BF16])
    with pytest.raises(TargetError, match=r"this machine.s CPU.*.generic.*precision=.fp32."):
        check_precision([*default_compile_flags("llvm-cpu", host=False, use_env=False), *_BF16])


def test_bf16_on_a_cpu_without_amx_or_avx512_bf16_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(bf16, "host_amx_missing", lambda: ["amx_tile", "amx_bf16"])
    monkeypatch.setattr(bf16, "host_avx512_bf16_missing", lambda: ["avx512_bf16"])
    eo = export(_Linear2(), args=(torch.randn(4, 100),))
    with pytest.raises(
        TargetError,
        match=r"AVX512-BF16.*lacks amx_tile, amx_bf16, avx512_bf16\. Use precision='fp32'",
    ):
        eo.compile(save_to=None, precision="bf16")
    with pytest.raises(TargetError, match="unknown precision"):
        eo.compile(save_to=None, precision="int4")


def test_runtime_refuses_an_amx_module_where_amx_is_unavailable(monkeypatch, tmp_path):
    monkeypatch.setattr(amx, "host_amx_missing", lambda: ["amx_bf16"])
    # a module carrying the marker (compiled for vmvx: only the reflection matters here)
    src = textwrap.dedent(
        f"""
        func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> attributes {{
            iree.reflection = {{"{amx.CPU_REQUIRES_KEY}" = "amx_tile,amx_bf16"}}}} {{
          return %x : tensor<4xf32>
        }}"""
    )
    vmfb = compile_mlir(src, default_compile_flags("vmvx", use_env=False), cache=False)
    with pytest.raises(TurbineRuntimeError, match=r"precision='bf16'.*lacks amx_bf16.*fp32"):
        load_module(vmfb, device="local-sync")


# ------------------------------------------------------------------------------------ the rewrite
def test_the_compile_copy_calls_the_amx_kernel_and_the_export_stays_fp32():
    eo = export(_Linear2(), args=(torch.randn(8, 100),))
    exported = str(eo.mlir_module)
    assert len(bf16_matmuls(eo.mlir_module)) == 2
    copy, owned = module_for_compile(eo.mlir_module, _flags()) if not _MISSING else (None, False)
    if copy is None:  # no AMX here: the rewrite itself, with the AMX kernel asked for
        copy = eo.mlir_module.operation.clone()
        rewrite_matmuls_bf16(copy, "amx")
        owned = True
    try:
        asm = str(copy)
    finally:
        if owned:
            copy.operation.erase()
    check_ir(
        asm,
        # K = 100 -> 128, N = 70 -> 96: activations cast and padded per call
        r"stream.executable private @__turbine_amx_bf16_gemm_128x96_128x32",
        r"tdpbf16ps %tmm6, %tmm4, %tmm0",
        r"func.func private @__turbine_bf16_matmul_0\(%\w+: tensor<8x100xf32>, %\w+: tensor<100x70xf32>\)",
        r"arith.truncf %\w+ : f32 to bf16",
        r"tensor.pad %\w+ low\[0, 0\] high\[0, 28\]",  # K: 100 -> 128
        r"tensor.pad %\w+ low\[0, 0\] high\[28, 26\]",  # the weight: 100 x 70 -> 128 x 96
        r"linalg.transpose .* permutation = \[3, 0, 1, 4, 2\]",
        r"flow.dispatch @__turbine_amx_bf16_gemm_128x96_128x32::@__turbine_amx_bf16_gemm_128x96_128x32",
        r"tensor.extract_slice %\w+\[0, 0\] \[%\w+, 70\]",
    )
    assert 'turbine.cpu_requires = "amx_tile,amx_bf16"' in asm
    assert exported == str(eo.mlir_module)  # the exported IR is left as it was
    assert "flow.dispatch" not in exported


def test_the_avx512_bf16_kernel_reads_pairs_along_k():
    eo = export(_Linear2(), args=(torch.randn(8, 100),))
    copy = eo.mlir_module.operation.clone()
    try:
        assert rewrite_matmuls_bf16(copy, "avx512") == 2
        asm = str(copy)
    finally:
        copy.erase()
    check_ir(
        asm,
        # K = 100 (even: no padding), N = 70 -> 128 (panels of 64 columns)
        r"stream.executable private @__turbine_avx512_bf16_gemm_100x128_4x64x128_128x64",
        r'llvm.inline_asm "vdpbf16ps \$2, \$1, \$0", "=v,v,v,0"',
        # the bias, a third argument: the kernel adds it (its epilogue, below)
        r"func.func private @__turbine_bf16_matmul_0\(%\w+: tensor<8x100xf32>, %\w+: tensor<100x70xf32>, %\w+: tensor<70xf32>\)",
        r"arith.truncf %\w+ : f32 to bf16",
        r"tensor.pad %\w+ low\[0, 0\] high\[0, 58\]",  # the weight [K, N]: 70 -> 128 columns
        r"linalg.transpose .* permutation = \[2, 0, 3, 1\]",  # [K/2, 2, p, nr] -> [p, K/2, nr, 2]
        # C written as [rows, 70]: masked stores in the last panel, no slice after it
        r"flow.dispatch @__turbine_avx512_bf16_gemm_100x128_\w+_n70::.* -> tensor<\?x70xf32>",
    )
    assert 'turbine.cpu_requires = "avx512f,avx512_bf16"' in asm
    # the second linear's K = 70 is even too; an odd K is padded by one zero (the last test)
    assert "__turbine_avx512_bf16_gemm_70x64_" in asm
    # the first linear's bias and the ReLU after it in the kernel's store (its epilogue)
    assert "@__turbine_avx512_bf16_gemm_100x128_4x64x128_128x64_bias_relu" in asm
    assert "torch.aten.relu" not in asm


def test_what_is_not_rewritten():
    class Odd(torch.nn.Module):
        def forward(self, x, y, i):
            return x @ y, (i @ i.T).float(), x.double() @ y.double()

    eo = export(
        Odd(), args=(torch.randn(4, 8), torch.randn(8, 3), torch.ones(3, 3, dtype=torch.int64))
    )
    # fp32 x fp32 is rewritten; integer and float64 matmuls are not
    assert len(bf16_matmuls(eo.mlir_module)) == 1


# ----------------------------------------------------------------------------- the kernel alone
def _kernel_module(k: int, n: int, batch_b: bool) -> tuple[AmxGemm, str]:
    kp, np_ = padded(k), padded(n)
    g = AmxGemm.for_shape(kp, np_, batch_b=batch_b)
    return g, _kernel_main(g)


def _kernel_main(g: AmxGemm | Avx512Gemm) -> str:
    """The kernel's executable and a ``@main(a [batch, M, Kp] bf16, packed b)`` calling it
    (either bf16 kernel: they share the dispatch's operands)."""
    kp, np_ = g.kp, g.np_
    be = "?" if g.batch_b else str(g.packed_b_size)
    call = g.dispatch("%a2", "%b", "%m", "%batch", "%rows", be).replace(
        "tensor<?xbf16>", "tensor<?xbf16>" + ("{%bel}" if g.batch_b else "")
    )
    return g.executable() + textwrap.dedent(
        f"""
        func.func @main(%a: tensor<?x?x{kp}xbf16>, %b: tensor<{be}xbf16>) -> tensor<?x?x{np_}xf32> {{
          %c0 = arith.constant 0 : index
          %c1 = arith.constant 1 : index
          %batch = tensor.dim %a, %c0 : tensor<?x?x{kp}xbf16>
          %m = tensor.dim %a, %c1 : tensor<?x?x{kp}xbf16>
          %rows = arith.muli %batch, %m : index
          %bel = tensor.dim %b, %c0 : tensor<{be}xbf16>
          %a2 = tensor.collapse_shape %a [[0, 1], [2]] : tensor<?x?x{kp}xbf16> into tensor<?x{kp}xbf16>
          %r = {call}
          %o = tensor.expand_shape %r [[0, 1], [2]] output_shape [%batch, %m, {np_}] : tensor<?x{np_}xf32> into tensor<?x?x{np_}xf32>
          return %o : tensor<?x?x{np_}xf32>
        }}"""
    )


def _pack(b: torch.Tensor) -> torch.Tensor:
    """B [K, N] -> the kernel's packed layout (as documented in _compiler.amx)."""
    k, n = b.shape
    kp, np_ = padded(k), padded(n)
    bp = torch.zeros(kp, np_, dtype=torch.bfloat16)
    bp[:k, :n] = b
    return bp.reshape(kp // 32, 16, 2, np_ // 16, 16).permute(3, 0, 1, 4, 2).reshape(-1)


def _bf16_np(t: torch.Tensor) -> np.ndarray:
    import ml_dtypes

    return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)


@needs_amx
@pytest.mark.parametrize(("k", "n", "batch_b"), [(64, 64, False), (96, 160, True)])
def test_the_kernel_gives_the_exact_bf16_products_for_any_rows(k, n, batch_b):
    g, src = _kernel_module(k, n, batch_b)
    vmfb = compile_mlir(src, default_compile_flags("llvm-cpu", use_env=False), cache=False)
    import iree.runtime as rt

    amx.request_amx_permission()
    ctx = rt.SystemContext(config=rt.Config("local-task"))
    ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
    torch.manual_seed(0)
    for batch in (1, 3):
        for m in (1, 17, 32, 33, 130):  # M tails of <= 16 and > 16 rows, several workgroups
            a = torch.randn(batch, m, g.kp).bfloat16()
            b = torch.randn(batch if batch_b else 1, g.kp, g.np_).bfloat16()
            packed = torch.cat([_pack(b[i]) for i in range(b.shape[0])])
            out = ctx.modules.module.main(_bf16_np(a), _bf16_np(packed))
            got = torch.from_numpy(np.asarray(out.to_host()))
            torch.testing.assert_close(got, a.float() @ b.float(), rtol=1e-5, atol=1e-4)


def _avx512_pack(b: torch.Tensor, g: Avx512Gemm) -> torch.Tensor:
    """B [K, N] -> the AVX512-BF16 kernel's layout (as documented in _compiler.avx512)."""
    k, n = b.shape
    bp = torch.zeros(g.kp, g.np_, dtype=torch.bfloat16)
    bp[:k, :n] = b
    return bp.reshape(g.kp // 2, 2, g.np_ // g.nr, g.nr).permute(2, 0, 3, 1).reshape(-1)


@needs_avx512_bf16
@pytest.mark.parametrize(("k", "n", "batch_b"), [(64, 64, False), (300, 192, True)])
def test_the_avx512_bf16_kernel_gives_the_exact_bf16_products_for_any_rows(k, n, batch_b):
    g = Avx512Gemm.for_shape(k, n, batch_b=batch_b, bf16=True)
    kp, np_ = g.kp, g.np_
    src = _kernel_main(g)
    vmfb = compile_mlir(src, default_compile_flags("llvm-cpu", use_env=False), cache=False)
    import iree.runtime as rt

    ctx = rt.SystemContext(config=rt.Config("local-task"))
    ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
    torch.manual_seed(0)
    for batch in (1, 3):
        for m in (1, 3, 4, 5, 130):  # register-block tails (4 rows) and several workgroups
            a = torch.randn(batch, m, kp).bfloat16()
            b = torch.randn(batch if batch_b else 1, kp, np_).bfloat16()
            packed = torch.cat([_avx512_pack(b[i], g) for i in range(b.shape[0])])
            out = ctx.modules.module.main(_bf16_np(a), _bf16_np(packed))
            got = torch.from_numpy(np.asarray(out.to_host()))
            torch.testing.assert_close(got, a.float() @ b.float(), rtol=1e-5, atol=1e-4)


# ------------------------------------------------------------------------------ end to end
@needs_bf16
@pytest.mark.parametrize("rows", [1, 8, 17, 128])
def test_linears_with_remainders_match_the_bf16_reference(rows):
    model = _Linear2().eval()
    x = torch.randn(rows, 100)
    eo = export(model, args=(x,))
    got = load_module(eo.compile(save_to=None, precision="bf16")).main(x)
    # exactly the bf16-rounded operands with f32 accumulation (up to summation order) ...
    torch.testing.assert_close(got, bf16_reference(model, x), rtol=1e-4, atol=1e-4)
    # ... which is within bf16's rounding of fp32 eager
    torch.testing.assert_close(got, model(x), rtol=0.0, atol=2e-2)


@needs_bf16
def test_a_dynamic_batch_of_3d_inputs():
    model = _Linear2().eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    eo = export(model, args=(torch.randn(2, 5, 100),), dynamic_shapes={"x": {0: batch}})
    m = load_module(eo.compile(save_to=None, precision="bf16"))
    for b in (1, 7):
        x = torch.randn(b, 5, 100)
        torch.testing.assert_close(m.main(x), bf16_reference(model, x), rtol=1e-4, atol=1e-4)


@needs_bf16
def test_attention_matmuls_of_two_activations():
    model = _Attention().eval()
    x = torch.randn(1, 48, 64)
    eo = export(model, args=(x,))
    flags = _flags()
    copy, owned = module_for_compile(eo.mlir_module, flags)
    try:
        asm = str(copy)
    finally:
        if owned:
            copy.operation.erase()
    # the QKV linear and attention's two batched products (per head: K and N static)
    assert asm.count("func.func private @__turbine_bf16_matmul_") == 3
    assert "_bb_" in asm  # a batched right operand, packed per call
    got = load_module(eo.compile(save_to=None, precision="bf16")).main(x)
    torch.testing.assert_close(got, model(x), rtol=0.0, atol=3e-2)


@needs_amx
def test_amx_products_in_wider_workgroups_match_the_reference(monkeypatch):
    """On two workers the QKV shape of GPT-2 (``Linear(512, 1536)``, 128 rows) runs in 12
    workgroups of 128 columns, not 24 of 64 (``AmxGemm.balanced``, docs/performance.md section
    28): the same products, one worker's run of two 64-column blocks."""
    from turbine_aot._compiler import workgroups

    monkeypatch.setattr(workgroups, "default_workers", lambda: 2)
    torch.manual_seed(3)
    model = torch.nn.Linear(512, 1536).eval()
    x = torch.randn(128, 512)
    eo = export(model, args=(x,))
    copy, owned = module_for_compile(eo.mlir_module, _flags())
    try:
        assert "@__turbine_amx_bf16_gemm_512x1536_128x128" in str(copy)
    finally:
        if owned:
            copy.operation.erase()
    got = load_module(eo, compile_flags=_BF16, cache=False, device="local-task").main(x)
    torch.testing.assert_close(got, bf16_reference(model, x), rtol=1e-4, atol=1e-4)


@needs_amx
def test_load_module_with_the_flag_and_a_plain_iree_runtime(tmp_path):
    model = _Linear2().eval()
    x = torch.randn(16, 100)
    eo = export(model, args=(x,))
    m = load_module(eo, compile_flags=_BF16, cache=False)
    torch.testing.assert_close(m.main(x), bf16_reference(model, x), rtol=1e-4, atol=1e-4)
    path = tmp_path / "m.vmfb"
    eo.compile(save_to=path, precision="bf16")
    # a process that never asked Linux for the tile state: the kernel asks itself
    script = textwrap.dedent(
        f"""
        import numpy as np, iree.runtime as rt
        ctx = rt.SystemContext(config=rt.Config("local-task"))
        ctx.add_vm_module(rt.VmModule.mmap(ctx.instance, {str(path)!r}))
        print(np.asarray(ctx.modules.module.main(np.ones((16, 100), np.float32)).to_host()).sum())
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    expected = bf16_reference(model, torch.ones(16, 100)).sum().item()
    assert abs(float(proc.stdout.split()[-1]) - expected) < 1e-3 * max(1.0, abs(expected))


@needs_amx
def test_without_the_permission_amx_code_dies_of_sigill(tmp_path):
    """Why the kernel makes the arch_prctl call: the same kernel without it kills a process
    that did not ask (SIGILL), and runs in one that did."""
    g = AmxGemm(64, 64, request_permission=False)
    src = g.executable() + textwrap.dedent(
        f"""
        func.func @main(%a: tensor<16x64xbf16>, %b: tensor<{g.packed_b_size}xbf16>) -> tensor<16x64xf32> {{
          %c1 = arith.constant 1 : index
          %c16 = arith.constant 16 : index
          %ad = tensor.cast %a : tensor<16x64xbf16> to tensor<?x64xbf16>
          %r = {g.dispatch("%ad", "%b", "%c16", "%c1", "%c16", g.packed_b_size)}
          %o = tensor.cast %r : tensor<?x64xf32> to tensor<16x64xf32>
          return %o : tensor<16x64xf32>
        }}"""
    )
    path = tmp_path / "k.vmfb"
    path.write_bytes(
        compile_mlir(src, default_compile_flags("llvm-cpu", use_env=False), cache=False)
    )
    script = textwrap.dedent(
        f"""
        import sys, numpy as np, ml_dtypes, iree.runtime as rt
        if sys.argv[1] == "ask":
            from turbine_aot._compiler.amx import request_amx_permission
            request_amx_permission()
        ctx = rt.SystemContext(config=rt.Config("local-sync"))
        ctx.add_vm_module(rt.VmModule.mmap(ctx.instance, {str(path)!r}))
        a = np.ones((16, 64), ml_dtypes.bfloat16)
        b = np.ones(({g.packed_b_size},), ml_dtypes.bfloat16)
        print(np.asarray(ctx.modules.module.main(a, b).to_host())[0, 0])
        """
    )
    for how, rc in (("ask", 0), ("do-not-ask", -4)):  # -4: SIGILL
        proc = subprocess.run([sys.executable, "-c", script, how], capture_output=True, text=True)
        assert proc.returncode == rc, (how, proc.returncode, proc.stderr[-2000:])
        if rc == 0:
            assert float(proc.stdout.split()[-1]) == 64.0


@needs_bf16
def test_external_parameters_are_packed_when_the_module_loads(tmp_path):
    from turbine_aot import externalize_module_parameters, save_module_parameters

    model = _Linear2().eval()
    x = torch.randn(8, 100)
    externalize_module_parameters(model)
    save_module_parameters(tmp_path / "w.irpa", model)
    eo = export(model, args=(x,))
    vmfb = bytes(eo.compile(save_to=None, precision="bf16").map_memory())
    m = load_module(vmfb, parameters=tmp_path / "w.irpa")
    torch.testing.assert_close(m.main(x), bf16_reference(model, x), rtol=1e-4, atol=1e-4)
    # other weights, same module: the packing runs at load time, from the archive
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-0.5)
    save_module_parameters(tmp_path / "w2.irpa", model)
    m2 = load_module(vmfb, parameters=tmp_path / "w2.irpa")
    torch.testing.assert_close(m2.main(x), bf16_reference(model, x), rtol=1e-4, atol=1e-4)


@needs_bf16
def test_an_odd_reduction_is_padded_with_one_zero():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(1)
            self.a = torch.nn.Linear(7, 33)

        def forward(self, x):
            return self.a(x)

    model = Odd().eval()
    x = torch.randn(3, 7)
    got = load_module(export(model, args=(x,)).compile(save_to=None, precision="bf16")).main(x)
    torch.testing.assert_close(got, bf16_reference(model, x), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------- convolutions in bf16
class _Convs(torch.nn.Module):
    """A 3-channel stem (odd input channels: one zero channel added for the bf16 kernel's
    pairs), then convolutions with padding, stride, dilation, no bias, a 1x1."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.stem = torch.nn.Conv2d(3, 16, 7, stride=2, padding=3)
        self.a = torch.nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.b = torch.nn.Conv2d(32, 40, 3, stride=2, padding=2, dilation=2)
        self.c = torch.nn.Conv2d(40, 64, 1)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def test_convolutions_get_the_bf16_kernel_odd_channels_padded(monkeypatch):
    from turbine_aot._compiler import rewrites

    # the host checks of the rewrite, answered as on a CPU with AVX512-BF16 and no AMX (no
    # compile here; with AMX, test_cpu_conv_amx.py)
    monkeypatch.setattr(rewrites, "host_avx512_bf16_missing", lambda: [])
    monkeypatch.setattr(rewrites, "bf16_kernel_kind", lambda: "avx512")
    monkeypatch.setattr(bf16, "bf16_kernel_kind", lambda: "avx512")
    eo = export(_Convs(), args=(torch.randn(1, 3, 32, 32),))
    copy, owned = module_for_compile(eo.mlir_module, _flags())
    try:
        asm = str(copy)
    finally:
        if owned:
            copy.operation.erase()
    assert asm.count("stream.executable private @__turbine_avx512_bf16_conv_") == 4
    assert "avx512_f32_conv" not in asm
    check_ir(
        asm,
        # the 3-channel stem: a zero channel on the weight and the padded input (pairs)
        r"stream.executable private @__turbine_avx512_bf16_conv_n1_c4_h32_w32_f64_k7x7",
        r"func.func private @__turbine_avx512_conv_0\(%\w+: tensor<1x3x32x32xf32>, %\w+: tensor<16x3x7x7xf32>",
        r"tensor.pad %\w+ low\[0, 0, 0, 0\] high\[0, 1, 0, 0\]",
        r"tensor.pad %\w+ low\[0, 3, 3, 0\] high\[0, 3, 3, 1\]",
        r"func.func private @__turbine_avx512_conv_\d+\(%\w+: tensor<1x16x16x16xf32>",
        r"arith.truncf %\w+ : f32 to bf16",  # the padded input, as the kernel reads it
        r"permutation = \[2, 0, 3, 1\]",  # the weight in panels of pairs
        r"arith.truncf %\w+ : f32 to bf16",
        r"flow.dispatch @__turbine_avx512_bf16_conv_.*tensor<\d+xbf16>, tensor<\d+xbf16>",
    )
    assert 'turbine.cpu_requires = "avx512f,avx512_bf16"' in asm


@needs_avx512_bf16
def test_bf16_convolutions_match_the_bf16_reference():
    model = _Convs().eval()
    x = torch.randn(2, 3, 40, 36)
    got = load_module(export(model, args=(x,)).compile(save_to=None, precision="bf16")).main(x)
    torch.testing.assert_close(
        got, bf16_reference(model, x, layer=torch.nn.Conv2d), rtol=1e-4, atol=1e-5
    )
    torch.testing.assert_close(got, model(x), rtol=0.0, atol=5e-3)
