"""Attention stays aten.scaled_dot_product_attention in the exported IR; compiling for a CPU
rewrites it (matmul + mask + softmax + matmul) in the module handed to IREE, and only then."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import turbine_aot as aot
from turbine_aot._compiler import invoke
from turbine_aot._compiler.attention import SDPA_OP, decompose_attention, targets_only_cpu
from turbine_aot.runtime import load_module

FAST = ["--iree-opt-data-tiling=false", "--iree-llvmcpu-enable-ukernels=none"]


class Variants(nn.Module):
    def forward(self, q, k, v, float_mask, bool_mask):
        return (
            F.scaled_dot_product_attention(q, k, v),
            F.scaled_dot_product_attention(q, k, v, is_causal=True),
            F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask, scale=0.3),
            F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask),
        )


class GroupedCausal(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _variant_inputs():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 2, 8, 16), torch.randn(2, 2, 10, 16), torch.randn(2, 2, 10, 16)
    bool_mask = torch.rand(2, 1, 8, 10) > 0.3
    bool_mask[..., 0] = True  # no fully masked row (eager gives NaN there)
    return q, k, v, torch.randn(8, 10), bool_mask


@pytest.fixture
def handed_to_iree(monkeypatch):
    """Records the IR text of every module ExportOutput.compile hands to IREE."""
    seen: list[str] = []
    in_process, tool = invoke.module_bytecode, invoke.compile_with_tool

    def spy_in_process(module_op):
        seen.append(str(module_op))
        return in_process(module_op)

    def spy_tool(module_op, *args):
        seen.append(str(module_op))
        return tool(module_op, *args)

    # Both ways ExportOutput.compile hands a module over (the tool for tool-only flags).
    monkeypatch.setattr(invoke, "module_bytecode", spy_in_process)
    monkeypatch.setattr(invoke, "compile_with_tool", spy_tool)
    return seen


def _softmaxes(ir: str) -> int:
    """The softmaxes in a compile copy: on llvm-cpu each is written as ``exp(x - max) * (1 /
    sum)`` (``_compiler.softmax``; one ``reciprocal`` each) or a call of the row kernel
    (``_compiler.row_softmax``), else it stays a softmax op."""
    return (
        ir.count("torch.aten.softmax.int")
        + ir.count("torch.aten.reciprocal")
        + ir.count("call @__turbine_softmax_")  # static, last dimension: the row kernel
    )


def test_exported_ir_keeps_attention():
    out = aot.export(Variants(), args=_variant_inputs())
    ir = str(out.mlir_module)
    assert ir.count(f"= {SDPA_OP} ") == 4
    assert "torch.aten.softmax" not in ir


def test_cpu_compile_rewrites_attention_and_matches_eager(handed_to_iree):
    args = _variant_inputs()
    out = aot.export(Variants(), args=args)
    vmfb = out.compile(None, extra_args=FAST)
    (ir,) = handed_to_iree
    assert SDPA_OP not in ir
    assert _softmaxes(ir) == 4
    assert "torch.aten.masked_fill.Scalar" in ir and "torch.aten.ge.Tensor" in ir  # masks
    assert str(out.mlir_module).count(f"= {SDPA_OP} ") == 4  # the export is left as it was
    got = load_module(vmfb).main(*args)
    for g, e in zip(got, Variants()(*args)):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_grouped_query_attention_and_dynamic_sequence_on_cpu(handed_to_iree):
    torch.manual_seed(0)
    seq = torch.export.Dim("seq", max=64)
    shapes = {"q": {2: seq}, "k": {2: seq}, "v": {2: seq}}
    q, k, v = torch.randn(1, 8, 6, 16), torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16)
    out = aot.export(GroupedCausal(), args=(q, k, v), dynamic_shapes=shapes)
    m = load_module(out.compile(None, extra_args=FAST))
    (ir,) = handed_to_iree
    assert SDPA_OP not in ir
    # grouped: the 8 query heads as 2 groups of 4 over the 2 key / value heads, which are
    # never repeated
    assert "torch.aten.expand" not in ir and "torch.aten.flatten.using_ints" not in ir
    assert "-> !torch.vtensor<[1,2,?,16],f32>" in ir  # q as [1, Hk, 4 * L, E]
    q, k, v = torch.randn(1, 8, 20, 16), torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16)
    torch.testing.assert_close(m.main(q, k, v), GroupedCausal()(q, k, v), rtol=1e-5, atol=1e-5)


def _repeat_kv(x: torch.Tensor, rep: int) -> torch.Tensor:
    """Hugging Face's ``repeat_kv``: the key / value heads repeated for their query groups."""
    b, h, s, e = x.shape
    return x[:, :, None, :, :].expand(b, h, rep, s, e).reshape(b, h * rep, s, e)


class RepeatedKV(nn.Module):
    """Attention as Hugging Face's Llama writes it: keys and values repeated per query group,
    then plain attention with a float mask ``[B, 1, L, S]`` and a bool one."""

    def forward(self, q, k, v, float_mask, bool_mask):
        k, v = _repeat_kv(k, 3), _repeat_kv(v, 3)
        return (
            F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask, scale=0.25),
            F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask),
            F.scaled_dot_product_attention(q, k, v, is_causal=True),
        )


def _repeated_inputs(batch: int, lq: int, s: int):
    q = torch.randn(batch, 6, lq, 16)
    k, v = torch.randn(batch, 2, s, 16), torch.randn(batch, 2, s, 16)
    float_mask = torch.randn(batch, 1, lq, s)
    bool_mask = torch.rand(batch, 1, lq, s) > 0.3
    bool_mask[..., 0] = True  # no fully masked row (eager gives NaN there)
    return q, k, v, float_mask, bool_mask


def test_repeated_keys_and_values_run_grouped_on_cpu(handed_to_iree):
    """The repeat is recognized and dropped: the compiled attention reads each key / value head
    once per group of query heads, with eager's results, masks broadcast as before, for a
    dynamic number of queries."""
    torch.manual_seed(0)
    seq = torch.export.Dim("seq", max=32)
    shapes = ({2: seq}, None, None, {2: seq}, {2: seq})
    out = aot.export(RepeatedKV(), args=_repeated_inputs(2, 5, 12), dynamic_shapes=shapes)
    exported = str(out.mlir_module)
    assert exported.count("torch.aten.expand") == 2  # the export keeps the model's repeat
    m = load_module(out.compile(None, extra_args=FAST))
    (ir,) = handed_to_iree
    assert SDPA_OP not in ir and "torch.aten.expand" not in ir
    assert _softmaxes(ir) == 3
    for lq in (1, 7):  # a decode step's single query, and several
        args = _repeated_inputs(2, lq, 12)
        for g, e in zip(m.main(*args), RepeatedKV()(*args)):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


class PerHeadMask(nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, _repeat_kv(k, 2), _repeat_kv(v, 2), mask)


def test_a_mask_per_query_head_keeps_the_repeat(handed_to_iree):
    """A mask with one row per query head does not broadcast over a group: that attention is
    computed on the repeated keys and values, as before."""
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 5, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)
    mask = torch.randn(1, 4, 5, 9)
    out = aot.export(PerHeadMask(), args=(q, k, v, mask))
    m = load_module(out.compile(None, extra_args=FAST))
    (ir,) = handed_to_iree
    assert SDPA_OP not in ir and "torch.aten.expand" in ir
    torch.testing.assert_close(
        m.main(q, k, v, mask), PerHeadMask()(q, k, v, mask), rtol=1e-5, atol=1e-5
    )


def test_non_cpu_targets_get_the_attention_op(handed_to_iree):
    out = aot.export(
        GroupedCausal(), args=(torch.randn(1, 4, 8, 16),) + (torch.randn(1, 2, 8, 16),) * 2
    )
    # No GPU is needed to compile for CUDA; the IR handed over keeps the fused attention op.
    out.compile(None, target_device="cuda", extra_args=["--iree-cuda-target=sm_80"])
    assert f"= {SDPA_OP} " in handed_to_iree[-1]


def test_targets_only_cpu_reads_the_flags():
    assert targets_only_cpu(["--iree-hal-target-backends=llvm-cpu"])
    assert targets_only_cpu(
        ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu"]
    )
    assert targets_only_cpu(
        [
            "--iree-hal-target-device=local",
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu,vmvx",
        ]
    )
    assert not targets_only_cpu(["--iree-hal-target-device=cuda"])
    assert not targets_only_cpu(
        [
            "--iree-hal-target-device=local",
            "--iree-hal-target-device=hip",
            "--iree-hal-local-target-device-backends=llvm-cpu",
        ]
    )
    assert not targets_only_cpu(["--iree-hal-target-backends=llvm-cpu,vulkan-spirv"])
    assert not targets_only_cpu([])  # no target named: nothing to rewrite for


def test_dropout_or_dynamic_flags_are_left_alone():
    class Dropout(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)

    q = torch.randn(1, 1, 4, 8)
    out = aot.export(Dropout(), args=(q, q, q))
    assert decompose_attention(out.mlir_module.operation) == 0
    assert f"= {SDPA_OP} " in str(out.mlir_module)


def test_decomposing_at_export_is_still_the_users_choice():
    from turbine_aot.decompositions import extend_aot_decompositions

    with extend_aot_decompositions(add_ops=[torch.ops.aten.scaled_dot_product_attention]):
        out = aot.export(Variants(), args=_variant_inputs())
    ir = str(out.mlir_module)
    assert SDPA_OP not in ir
    assert "torch.aten._softmax" in ir or "torch.aten.softmax" in ir


@pytest.mark.parametrize("command", ["compile", "bundle"])
def test_cli_compile_of_an_mlir_file_rewrites_attention_for_cpu(tmp_path, monkeypatch, command):
    from turbine_aot._cli import commands
    from turbine_aot._cli.main import main
    from turbine_ir import ir

    args = _variant_inputs()
    src = tmp_path / "m.mlir"
    src.write_text(str(aot.export(Variants(), args=args).mlir_module))
    handed: list[str] = []
    compile_mlir = commands.compile_mlir  # what the compile and bundle commands call

    def spy(source, flags, **kw):
        handed.append(str(ir.Module.parse(source, context=ir.Context())))
        return compile_mlir(source, flags, **kw)

    monkeypatch.setattr(commands, "compile_mlir", spy)
    out = tmp_path / ("m.vmfb" if command == "compile" else "b")
    flags = [f"--flag={f}" for f in FAST]
    assert main([command, str(src), "-o", str(out), "-d", "local-task", *flags]) == 0
    (text,) = handed
    assert SDPA_OP not in text and _softmaxes(text) == 4
    assert f"= {SDPA_OP} " in src.read_text()  # the file itself is left as it was
    if command == "compile":
        got = load_module(str(out)).main(*args)
        for g, e in zip(got, Variants()(*args)):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
