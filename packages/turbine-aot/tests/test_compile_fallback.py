"""A speed-only default never turns a working compile into a failure (``_compiler.fallback``
``compile_with_fallback``): every compile path retries, first without IREE's data tiling only
(turbine's kernel choice kept), then without every speed-only group, and warns.

The forced cases make the compiler fail whenever a speed-only flag is present (the retry is a real
compile); the real case is a program IREE 3.13 fails to compile with turbine's defaults only.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import turbine_aot
from turbine_aot import runtime
from turbine_aot._compiler import invoke
from turbine_aot._compiler.fallback import (
    CRASHED,
    compile_with_fallback,
    compiling_out_of_process,
    fallback_flags,
    fallback_stages,
    out_of_process,
)
from turbine_aot._compiler.flags import (
    COMPILE_FLAGS_ENV,
    DATA_TILING_GROUP,
    SPEED_ONLY_GROUPS,
    default_compile_flags,
)
from turbine_aot._compiler.isa import host_isa
from turbine_aot._compiler.matmuls import cpu_matmul_kernel
from turbine_aot._errors import Diagnostic

DATA_TILING = "--iree-opt-data-tiling=true"
SPLIT_K = "--iree-dispatch-creation-split-matmul-reduction=32"


@pytest.fixture(autouse=True)
def _no_env_flags(monkeypatch):
    monkeypatch.delenv(COMPILE_FLAGS_ENV, raising=False)


def _speed_only(flags) -> list[str]:
    return [f for g in SPEED_ONLY_GROUPS for f in g.flags if f in flags]


def test_fallback_flags_drop_every_speed_only_group_per_target():
    cpu = default_compile_flags("llvm-cpu", dynamic_shapes=True, use_env=False)
    retry, dropped = fallback_flags(cpu)
    assert [g.name for g in dropped] == [
        "data tiling + ukernels",
        "channels-last convolutions",
        "peeled vector loops",
    ]
    assert _speed_only(retry) == []
    # Target selection stays: the device and the host CPU.
    assert retry == [
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=llvm-cpu",
        "--iree-llvmcpu-target-cpu=host",
    ]
    # The user's own flags are never dropped (by flag name).
    retry, dropped = fallback_flags(cpu, [DATA_TILING])
    assert DATA_TILING in retry and "data tiling + ukernels" in [g.name for g in dropped]
    # CUDA: split-K is speed only; channels-last is needed for correct fp16 convolutions.
    cuda = default_compile_flags("cuda", fp32_only=True, use_env=False)
    retry, dropped = fallback_flags(cuda)
    assert [g.name for g in dropped] == ["split-K fp32 matmuls"]
    assert SPLIT_K not in retry and any("channels-last" in f for f in retry)
    # Nothing speed-only: nothing to retry.
    assert fallback_flags(default_compile_flags("vmvx", use_env=False)) is None
    assert fallback_flags(default_compile_flags("cuda", use_env=False)) is None


def test_the_first_retry_drops_data_tiling_only_and_keeps_the_kernel_choice():
    cpu = default_compile_flags("llvm-cpu", dynamic_shapes=True, use_env=False)
    (first, dropped), (last, dropped_all) = fallback_stages(cpu)
    assert dropped == [DATA_TILING_GROUP] and len(dropped_all) == 3
    assert not set(DATA_TILING_GROUP.flags) & set(first)
    others = [f for g in SPEED_ONLY_GROUPS[1:] for f in g.flags if f in cpu]
    assert others and all(f in first for f in others)  # peeling, channels-last stay
    # turbine's kernel as the first compile chose it: its default follows the ukernel flag
    # dropped with data tiling, so the retry names it
    assert cpu_matmul_kernel(first) == cpu_matmul_kernel(cpu)
    pinned = [f for f in first if f.startswith("--turbine-cpu-matmul=")]
    assert pinned == ([f"--turbine-cpu-matmul={host_isa()}"] if host_isa() else [])
    assert last == fallback_flags(cpu)[0]  # type: ignore[index]
    # a kernel the user chose is kept as it is
    iree = [*cpu, "--turbine-cpu-matmul=iree"]
    assert cpu_matmul_kernel(fallback_stages(iree)[0][0]) == "iree"
    # the user's data tiling flag stays in the first retry as in the last
    (first, _), (last, _) = fallback_stages(cpu, [DATA_TILING])
    assert DATA_TILING in first and DATA_TILING in last
    # only data tiling to drop, no kernel to pin: one retry
    portable = default_compile_flags("llvm-cpu", host=False, use_env=False)
    assert len(fallback_stages(portable)) == 1
    cuda = default_compile_flags("cuda", fp32_only=True, use_env=False)
    assert [[g.name for g in d] for _, d in fallback_stages(cuda)] == [["split-K fp32 matmuls"]]
    assert fallback_stages(default_compile_flags("vmvx", use_env=False)) == []


def test_compile_with_fallback_warns_and_raises_the_first_error(caplog):
    flags = default_compile_flags("llvm-cpu", use_env=False)
    calls: list[list[str]] = []

    def fails_with_tiling(f):
        calls.append(f)
        if DATA_TILING in f:
            raise RuntimeError("error: 'func.func' op exceeded stack allocation limit")
        return "vmfb"

    with caplog.at_level(logging.WARNING, logger="turbine.aot"):
        result, used = compile_with_fallback(fails_with_tiling, flags)
    assert result == "vmfb" and used == calls[1] and DATA_TILING not in used
    assert _speed_only(used)  # the first retry: channels-last stays
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "speed-only defaults data tiling + ukernels (" in record.getMessage()
    assert "exceeded stack allocation limit" in record.getMessage()

    def fails_with_any(f):
        calls.append(f)
        if _speed_only(f):
            raise RuntimeError(f"error: failed with {len(f)} flags")
        return "vmfb"

    calls.clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="turbine.aot"):
        result, used = compile_with_fallback(fails_with_any, flags)
    assert len(calls) == 3 and used == calls[2] and _speed_only(used) == []
    first, second = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "kept" in first and "data tiling + ukernels, channels-last convolutions" in second
    assert f"failed with {len(calls[1])} flags" in second  # each warning: the last failure

    def always_fails(f):
        raise RuntimeError(f"error: failed with {len(f)} flags")

    with pytest.raises(RuntimeError, match=f"failed with {len(flags)} flags"):
        compile_with_fallback(always_fails, flags)
    with pytest.raises(RuntimeError, match="error: failed"):  # nothing to drop: no retry
        compile_with_fallback(always_fails, default_compile_flags("vmvx", use_env=False))


def _crash(flags) -> turbine_aot.CompileError:
    """The error of an ``iree-compile`` tool killed by a signal (``invoke.compile_with_tool``'s)."""
    report = f"{CRASHED} 6); this is a compiler bug, not a problem in your program. Its report:"
    return turbine_aot.CompileError(
        "compile (iree-compile tool)",
        [Diagnostic("error", report + "\nLLVM ERROR: Do not know how to split")],
        flags=list(flags),
    )


def test_after_a_crash_the_retries_run_the_tool_not_the_callers_process():
    # an LLVM fatal error aborts the process it runs in: once the tool crashed, a retry in
    # process would end the caller's process instead of raising (seen with a kernel LLVM could
    # not select for the target)
    flags = default_compile_flags("llvm-cpu", use_env=False)
    seen: list[bool] = []

    def crashes(f):
        seen.append(compiling_out_of_process())
        if _speed_only(f):
            raise _crash(f)
        return "vmfb"

    result, used = compile_with_fallback(crashes, flags)
    assert result == "vmfb" and seen == [False, True, True] and not _speed_only(used)
    assert not compiling_out_of_process()  # only the retries

    def fails(f):  # an ordinary error: the retries stay in process
        seen.append(compiling_out_of_process())
        if _speed_only(f):
            raise turbine_aot.CompileError("compile", [Diagnostic("error", "no")])
        return "vmfb"

    seen.clear()
    compile_with_fallback(fails, flags)
    assert seen == [False, False, False]


def test_out_of_process_compiles_with_the_tool(monkeypatch):
    real, used = invoke.compile_with_tool, []

    def tool(module_op, flags, *args):
        used.append(list(flags))
        return real(module_op, flags, *args)

    monkeypatch.setattr(invoke, "compile_with_tool", tool)
    model, x, eo = _export()
    with out_of_process():
        vmfb = eo.compile(save_to=None, target_backends=["llvm-cpu"])
    assert len(used) == 1
    with torch.no_grad():
        torch.testing.assert_close(
            runtime.load_module(vmfb).main(x), model(x), rtol=1e-5, atol=1e-5
        )


class _Forced:
    """Makes ``ExportOutput._compile`` fail while a speed-only flag is present."""

    def __init__(self, monkeypatch):
        from turbine_aot._export.output import ExportOutput

        real = ExportOutput._compile
        self.seen: list[list[str]] = []

        def _compile(eo, flags, *args):
            self.seen.append(list(flags))
            if _speed_only(flags):
                raise turbine_aot.CompileError("compile (forced)", [], flags=list(flags))
            return real(eo, flags, *args)

        monkeypatch.setattr(ExportOutput, "_compile", _compile)


def _export():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    return model, x, turbine_aot.export(model, args=(x,))


def test_export_output_compile_falls_back(monkeypatch, caplog, tmp_path):
    forced = _Forced(monkeypatch)
    model, x, eo = _export()
    with caplog.at_level(logging.WARNING, logger="turbine.aot"):
        eo.compile(save_to=tmp_path / "m.vmfb")
    assert len(forced.seen) == 3 and _speed_only(forced.seen[2]) == []
    assert eo._last_compile_flags == forced.seen[2]
    assert any("speed-only defaults" in r.getMessage() for r in caplog.records)
    m = runtime.load_module(tmp_path / "m.vmfb")
    torch.testing.assert_close(m.main(x), model(x), rtol=1e-4, atol=1e-4)


def test_user_flags_are_kept_in_the_retry(monkeypatch):
    forced = _Forced(monkeypatch)
    _, _, eo = _export()
    with pytest.raises(turbine_aot.CompileError):  # the user asked for data tiling: it stays
        eo.compile(save_to=None, extra_args=[DATA_TILING])
    assert len(forced.seen) == 3 and all(DATA_TILING in f for f in forced.seen)


def test_compile_cache_and_bundle_fall_back(monkeypatch, tmp_path):
    forced = _Forced(monkeypatch)
    model, x, eo = _export()
    cache = runtime.CompileCache(tmp_path / "cache")
    vmfb = runtime.compile_export_output(eo, cache=cache)
    assert len(forced.seen) == 3
    m = runtime.load_module(vmfb)
    torch.testing.assert_close(m.main(x), model(x), rtol=1e-4, atol=1e-4)
    # The bundle records the flags it was compiled with.
    bundle = runtime.save_bundle(tmp_path / "b", eo, cache=False)
    assert _speed_only(bundle.manifest["compile_flags"]) == []
    torch.testing.assert_close(runtime.load_bundle(tmp_path / "b").main(x), model(x))


def test_cli_compile_falls_back(monkeypatch, tmp_path, capsys, caplog):
    from turbine_aot._cli import commands
    from turbine_aot._cli.main import main

    _, _, eo = _export()
    src = tmp_path / "m.mlir"
    eo.save_mlir(src)
    seen: list[list[str]] = []
    real = commands.compile_mlir

    def compile_mlir(data, flags, **kw):
        seen.append(list(flags))
        if _speed_only(flags):
            raise turbine_aot.CompileError("compile (forced)", [], flags=list(flags))
        return real(data, flags, **kw)

    monkeypatch.setattr(commands, "compile_mlir", compile_mlir)
    out = tmp_path / "m.vmfb"
    with caplog.at_level(logging.WARNING, logger="turbine.aot"):
        rc = main(["compile", str(src), "-o", str(out), "--input-type", "torch", "--no-cache"])
    assert rc == 0 and out.is_file()
    assert len(seen) == 3 and _speed_only(seen[2]) == []
    assert any("speed-only defaults" in r.getMessage() for r in caplog.records)


class _LrasppHead(nn.Module):
    """The end of torchvision's LR-ASPP MobileNetV3 segmentation model (backbone.16 and the
    head): a 1×1 conv 160 -> 960 + BatchNorm + hardswish whose output feeds a 1×1 conv branch
    and a global-pool gate, multiplied."""

    def __init__(self):
        super().__init__()
        self.last = nn.Sequential(
            nn.Conv2d(160, 960, 1, bias=False), nn.BatchNorm2d(960), nn.Hardswish()
        )
        self.cbr = nn.Sequential(nn.Conv2d(960, 128, 1, bias=False), nn.BatchNorm2d(128), nn.ReLU())
        self.scale = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Conv2d(960, 128, 1, bias=False), nn.Sigmoid()
        )

    def forward(self, x):
        y = self.last(x)
        return self.cbr(y) * self.scale(y)


def test_real_failure_of_the_defaults_falls_back(caplog, tmp_path, monkeypatch):
    # IREE 3.13 compiles this with channels-last convolutions alone and with data tiling alone,
    # but not with both (turbine's llvm-cpu flags) when its 1x1 convolutions reach IREE as
    # convolutions: "'func.func' op exceeded stack allocation limit of 32768 bytes for
    # function. Got 51200 bytes". turbine's compile copy has them as matmuls
    # (_compiler.convs), which compiles with the defaults (next test); without that rewrite
    # the failure is real and the fallback takes it. (And with torch-mlir's adaptive pooling:
    # written as a mean, _compiler.pools, the gate no longer joins that dispatch.)
    monkeypatch.setenv("TURBINE_CPU_CONV_MATMUL", "keep")
    monkeypatch.setenv("TURBINE_CPU_POOLS", "keep")
    torch.manual_seed(0)
    model = _LrasppHead().eval()
    x = torch.randn(1, 160, 8, 8)
    eo = turbine_aot.export(model, args=(x,))
    with caplog.at_level(logging.WARNING, logger="turbine.aot"):
        eo.compile(save_to=tmp_path / "head.vmfb")
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "exceeded stack allocation limit" in warning
    assert "speed-only defaults data tiling + ukernels (" in warning  # the first retry compiles
    assert _speed_only(eo._last_compile_flags) == [
        f
        for f in _speed_only(default_compile_flags("llvm-cpu", use_env=False))
        if f not in DATA_TILING_GROUP.flags
    ]
    m = runtime.load_module(tmp_path / "head.vmfb")
    torch.testing.assert_close(m.main(x), model(x), rtol=1e-4, atol=1e-4)


def test_the_lraspp_head_compiles_with_the_defaults_once_its_1x1_convs_are_matmuls(caplog):
    torch.manual_seed(0)
    model = _LrasppHead().eval()
    x = torch.randn(1, 160, 8, 8)
    eo = turbine_aot.export(model, args=(x,))
    with caplog.at_level(logging.WARNING, logger="turbine.aot"):
        vmfb = eo.compile(save_to=None)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    assert DATA_TILING in eo._last_compile_flags  # no fallback
    torch.testing.assert_close(runtime.load_module(vmfb).main(x), model(x), rtol=1e-4, atol=1e-4)


class _DynamicAttention(nn.Module):
    """Attention as transformers' BERT writes it (separate q / k / v projections viewed as
    heads and transposed, an additive padding mask, ``scaled_dot_product_attention``)."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(128, 128) for _ in range(3))

    def forward(self, x, mask):
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, 4, 32).transpose(1, 2) for p in (self.q, self.k, self.v))
        m = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        y = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)
        return y.transpose(1, 2).reshape(b, t, 128)


def _inputs(t: int):
    x = torch.randn(2, t, 128)
    mask = torch.ones(2, t, dtype=torch.int64)
    mask[1, t - 3 :] = 0
    return x, mask


def _compile_dynamic_attention(caplog, tmp_path) -> tuple[list[str], list[str]]:
    """``_DynamicAttention`` exported over a dynamic sequence and compiled with the defaults:
    the warnings logged and the flags used, after checking the module against eager at
    sequences 12, 19 and 64."""
    torch.manual_seed(0)
    model = _DynamicAttention().eval()
    seq = torch.export.Dim("seq", min=2, max=512)
    eo = turbine_aot.export(model, args=_inputs(12), dynamic_shapes=({1: seq}, {1: seq}))
    with caplog.at_level(logging.WARNING, logger="turbine.aot"):
        eo.compile(save_to=tmp_path / "attn.vmfb")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    m = runtime.load_module(tmp_path / "attn.vmfb")
    for t in (12, 19, 64):
        x, mask = _inputs(t)
        torch.testing.assert_close(m.main(x, mask), model(x, mask), rtol=1e-4, atol=1e-5)
    return warnings, eo._last_compile_flags


def test_dynamic_attention_keeps_the_kernels_and_peeling_when_data_tiling_fails(
    caplog, tmp_path, monkeypatch
):
    # IREE 3.13 fails the defaults on attention over a dynamic sequence when its own code
    # computes the products (TURBINE_CPU_DYNAMIC_MATMUL=iree; by default they are turbine's
    # dynamic-size kernel's, test below): data tiling the transposed K of the scores' batch
    # matmul gives "'affine.delinearize_index' op no basis element may be statically
    # non-positive" (basis 8, 0, 1). The first retry drops data tiling only: the projections
    # stay on turbine's kernel and the loops peeled (the whole fallback made the zoo's
    # bert-dyn-seq 2.6x slower). The warning's text pins the IREE failure: this fails once
    # IREE compiles it.
    monkeypatch.setenv("TURBINE_CPU_DYNAMIC_MATMUL", "iree")
    monkeypatch.setenv("TURBINE_COMPILE_CACHE", "0")
    (warning,), flags = _compile_dynamic_attention(caplog, tmp_path)
    assert "delinearize_index' op no basis element may be statically non-positive" in warning
    assert "speed-only defaults data tiling + ukernels (" in warning
    assert "--iree-llvmcpu-vector-pproc-strategy=peel" in flags and DATA_TILING not in flags
    assert cpu_matmul_kernel(flags) == cpu_matmul_kernel(default_compile_flags("llvm-cpu"))


@pytest.mark.skipif(not host_isa(), reason="turbine's kernels need AVX2 + FMA or AVX-512")
def test_dynamic_attention_on_the_dynamic_size_kernel_needs_no_retry(caplog, tmp_path):
    # With the products on turbine's dynamic-size kernel (the default for host builds with
    # the kernels) IREE does not data-tile them, so the defaults compile as they are.
    warnings, flags = _compile_dynamic_attention(caplog, tmp_path)
    assert not warnings
    assert DATA_TILING in flags
