"""Gathers by ``arange``\\ s over whole dimensions, over dynamic shapes, written as views in the
copy handed to IREE for CPUs (``_compiler.gathers``): Hugging Face's padding masks. What the
copy holds, that other gathers are left alone, and the values against eager, up to a
transformers BERT with a dynamic sequence."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import compile_copy_asm

from turbine_aot import export
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.gathers import arange_gathers, outer_gathers
from turbine_aot._compiler.isa import host_isa
from turbine_aot.runtime import load_module

INDEX = "torch.aten.index.Tensor"


def _flags() -> list[str]:
    return default_compile_flags("llvm-cpu", use_env=False)


class _PaddingMask(torch.nn.Module):
    """``attention_mask[b, kv]`` over ``arange``\\ s broadcast to ``[B, 1, 1, S]``, as
    transformers' ``padding_mask_function`` is evaluated, then used."""

    def forward(self, x, attention_mask):
        b, s = attention_mask.shape
        batch_idx = torch.arange(b)[:, None, None, None]
        kv_idx = (torch.arange(s) + 0)[None, None, None, :]
        keep = attention_mask.bool()[batch_idx, kv_idx]  # [B, 1, 1, S]
        return x.masked_fill(~keep, -1.0)


def _export(module, b=2, s=12):
    seq = torch.export.Dim("seq", min=2, max=256)
    x, mask = torch.randn(b, 3, s, s), torch.ones(b, s, dtype=torch.int64)
    return export(
        module, args=(x, mask), dynamic_shapes={"x": {2: seq, 3: seq}, "attention_mask": {1: seq}}
    )


def test_a_padding_mask_gather_becomes_a_view_and_is_right():
    eo = _export(_PaddingMask())
    assert len(arange_gathers(eo.mlir_module)) == 1
    asm = compile_copy_asm(eo, _flags())
    assert INDEX not in asm and "torch.aten.arange" not in asm  # the indices erased with it
    compiled = load_module(eo.compile(None))
    torch.manual_seed(0)
    for s, pad in ((2, 1), (19, 4), (70, 33)):
        x, mask = torch.randn(2, 3, s, s), torch.ones(2, s, dtype=torch.int64)
        mask[1, s - pad :] = 0
        torch.testing.assert_close(compiled.main(x, mask), _PaddingMask()(x, mask), rtol=0, atol=0)


class _OtherGathers(torch.nn.Module):
    """Gathers the rewrite leaves: indices that are not an ``arange`` (reversed), and
    ``arange``\\ s broadcast in the other order (a transpose, not a view)."""

    def forward(self, x, attention_mask):
        b, s = attention_mask.shape
        rev = attention_mask[torch.arange(b)[:, None], torch.flip(torch.arange(s), [0])[None, :]]
        swapped = attention_mask[torch.arange(b)[None, :], torch.arange(s)[:, None]]  # [S, B]
        return x + rev.sum() + swapped.sum()


def test_other_gathers_and_static_shapes_are_left_to_iree():
    eo = _export(_OtherGathers())
    assert str(eo.mlir_module).count(INDEX) == 2 and arange_gathers(eo.mlir_module) == []
    static = export(_PaddingMask(), args=(torch.randn(2, 3, 12, 12), torch.ones(2, 12).long()))
    assert (
        INDEX in str(static.mlir_module) and arange_gathers(static.mlir_module) == []
    )  # IREE's code is fine with static sizes


def test_a_transformers_bert_with_a_dynamic_sequence_matches_eager():
    """End to end, Hugging Face's own mask: its gather as a view, the mask computed once for
    both layers, the attention's products on the dynamic-size kernel (where the kernels are
    built: a host with AVX2 or AVX-512)."""
    transformers = pytest.importorskip(
        "transformers", reason="transformers is a dev requirement (tools/requirements-dev.txt)"
    )
    cfg = transformers.BertConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        vocab_size=256,
    )
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    seq = torch.export.Dim("seq", min=2, max=128)
    ids, mask = torch.randint(0, 256, (2, 16)), torch.ones(2, 16, dtype=torch.int64)
    eo = export(
        model,
        kwargs={"input_ids": ids, "attention_mask": mask},
        dynamic_shapes={"input_ids": {1: seq}, "attention_mask": {1: seq}},
    )
    asm = compile_copy_asm(eo, _flags())
    assert INDEX not in asm
    assert asm.count("call @__turbine_materialized_mask") == 1
    if host_isa():
        assert asm.count("call @__turbine_dynamic_matmul_") == 4  # two products a layer
    compiled = load_module(eo.compile(None))
    for s, pad in ((5, 2), (19, 4), (77, 30)):
        ids, mask = torch.randint(0, 256, (2, s)), torch.ones(2, s, dtype=torch.int64)
        mask[1, s - pad :] = 0
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask).last_hidden_state
        got = compiled.main(input_ids=ids, attention_mask=mask)
        got = getattr(got, "last_hidden_state", got[0] if isinstance(got, (tuple, list)) else got)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ outer-product gathers
class _Upsample(torch.nn.Module):
    """LR-ASPP's head: a bilinear (or nearest) upsampling to a given size, and a gather by an
    outer product of indices written as the user would."""

    def __init__(self, size, mode="bilinear"):
        super().__init__()
        self.size, self.mode = size, mode

    def forward(self, x):
        kw = {"align_corners": False} if self.mode == "bilinear" else {}
        up = torch.nn.functional.interpolate(x, size=self.size, mode=self.mode, **kw)
        rows = torch.tensor([[2], [0], [-1]])  # negative: from the end, as torch counts
        return up, x[:, :, rows, torch.tensor([1, -2, 0, 3])]


def test_outer_product_gathers_become_two_index_selects(monkeypatch):
    """``F.interpolate`` reaches the copy as ``x[:, :, h[:, None], w]`` gathers (four for a
    bilinear one); each is written as a gather along the last dimension then one of whole rows
    (docs/performance.md, section 24)."""
    eo = export(_Upsample((16, 12)).eval(), args=(torch.randn(1, 5, 4, 6),))
    exported = str(eo.mlir_module)
    assert exported.count(INDEX) == 5 and len(outer_gathers(eo.mlir_module)) == 5
    asm = compile_copy_asm(eo, _flags())
    assert INDEX not in asm
    # the gathers along the last dimension: two of the bilinear one's four are the same (CSE
    # may merge them later), plus the user's; then the rows
    assert asm.count("torch.aten.index_select") == 10
    assert str(eo.mlir_module) == exported  # the exported module is the reference's
    assert INDEX in compile_copy_asm(eo, ["--iree-hal-target-device=vmvx"])  # llvm-cpu only
    monkeypatch.setenv("TURBINE_CPU_OUTER_GATHERS", "keep")
    assert INDEX in compile_copy_asm(eo, _flags())


@pytest.mark.parametrize(
    ("size", "mode", "shape"),
    [
        ((128, 128), "bilinear", (1, 5, 16, 16)),  # LR-ASPP's classifier output
        ((16, 16), "bilinear", (1, 128, 8, 8)),  # and its head
        ((13, 7), "bilinear", (2, 3, 5, 9)),  # shrinking one side
        ((12, 20), "nearest", (1, 4, 6, 5)),
    ],
    ids=["lraspp-out", "lraspp-head", "odd", "nearest"],
)
def test_outer_product_gathers_match_eager(size, mode, shape, monkeypatch):
    torch.manual_seed(0)
    m = _Upsample(size, mode).eval()
    x = torch.randn(*shape)
    eo = export(m, args=(x,))
    got = load_module(eo.compile(save_to=None)).main(x)
    want = m(x)
    # eager interpolates in its own kernel: its roundings, not the decomposition's
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1], want[1])  # a gather: the same elements
    monkeypatch.setenv("TURBINE_CPU_OUTER_GATHERS", "keep")
    kept = load_module(eo.compile(save_to=None)).main(x)
    assert torch.equal(got[0], kept[0])  # the same elements into the same arithmetic
