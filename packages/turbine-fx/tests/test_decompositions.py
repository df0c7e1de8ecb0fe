"""Decomposition table scoping and the program preparation (local decomposition) path."""

from __future__ import annotations

import logging
import threading

import pytest
import torch
import torch.nn.functional as F

from turbine_fx import (
    DecompositionError,
    current_aot_decompositions,
    extend_aot_decompositions,
    jittable,
)
from turbine_fx._decompositions import resolve_decomposition_ops
from turbine_fx._program_prep import prepare_program

aten = torch.ops.aten


def test_default_table_holds_ops_iree_cannot_lower():
    table = current_aot_decompositions()
    assert aten._native_batch_norm_legit_no_training.default in table
    assert aten.logsumexp.default in table
    # Ops IREE lowers directly stay undecomposed: that keeps import fast.
    assert aten.gelu.default not in table
    assert aten.layer_norm.default not in table


def test_default_table_uses_turbine_forms_for_attention_and_linear():
    """linear is decomposed by default (turbine's 2-d form); SDPA stays attention unless asked
    for (turbine_aot rewrites it when compiling for a CPU), then in turbine's form."""
    from turbine_fx._turbine_decompositions import linear_as_2d, sdpa_as_matmul_softmax

    table = current_aot_decompositions()
    assert aten.scaled_dot_product_attention.default not in table
    assert table[aten.linear.default] is linear_as_2d
    with extend_aot_decompositions(add_ops=[aten.scaled_dot_product_attention]):
        added = current_aot_decompositions()
        assert added[aten.scaled_dot_product_attention.default] is sdpa_as_matmul_softmax
    with extend_aot_decompositions(remove_ops=[aten.linear]):
        assert aten.linear.default not in current_aot_decompositions()


def test_extend_nests_and_restores():
    base = current_aot_decompositions()
    with extend_aot_decompositions(add_ops=[aten.gelu]) as outer:
        assert aten.gelu.default in outer
        assert aten.gelu.default in current_aot_decompositions()
        with extend_aot_decompositions(remove_ops=[aten.gelu, aten.logsumexp]):
            inner = current_aot_decompositions()
            assert aten.gelu.default not in inner
            assert aten.logsumexp.default not in inner
        assert aten.gelu.default in current_aot_decompositions()
        with extend_aot_decompositions(from_current=False, add_ops=[aten.silu.default]) as fresh:
            assert set(fresh) == {aten.silu.default}
    assert current_aot_decompositions() == base


def test_scopes_are_per_thread():
    seen = {}

    def other():
        seen["other"] = aten.gelu.default in current_aot_decompositions()

    with extend_aot_decompositions(add_ops=[aten.gelu]):
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert aten.gelu.default in current_aot_decompositions()
    assert seen["other"] is False


def test_composite_implicit_op_can_be_added():
    with extend_aot_decompositions(from_current=False, add_ops=[aten.instance_norm]) as t:
        assert aten.instance_norm.default in t


def test_ops_without_decomposition_are_skipped_as_in_the_reference(caplog):
    # The add_ops list of a stateless-Llama export written for iree.turbine.aot: two of the four
    # have no torch decomposition. The reference skips those silently; so does turbine (a debug
    # line names them), and the table gets the two that have one.
    add_ops = [
        aten._scaled_dot_product_flash_attention_for_cpu,
        aten._scaled_dot_product_flash_attention.default,
        aten.masked_fill_.Scalar,
        aten.copy,
    ]
    caplog.set_level(logging.DEBUG, logger="turbine.fx")
    with extend_aot_decompositions(from_current=True, add_ops=add_ops) as table:
        assert aten._scaled_dot_product_flash_attention_for_cpu.default in table
        assert aten.masked_fill_.Scalar in table
        assert aten._scaled_dot_product_flash_attention.default not in table
        assert aten.copy.default not in table
        assert set(current_aot_decompositions()) == set(table)
    skipped = [r.getMessage() for r in caplog.records if "no decomposition registered" in r.msg]
    assert any("_scaled_dot_product_flash_attention.default" in m for m in skipped)
    assert any("aten.copy" in m for m in skipped)


def test_jittable_decompose_ops_skip_ops_without_decomposition():
    j = jittable(lambda x: x + 1, decompose_ops=[aten.mm.default, aten.gelu])
    table = j._table()
    assert aten.gelu.default in table and aten.mm.default not in table


def test_resolving_an_op_without_decomposition_or_a_non_op_is_an_error():
    # resolve_decomposition_ops itself stays strict (the default table is built with it, so a
    # torch upgrade that drops one of its decompositions is noticed); a non-op is always an
    # error, in extend_aot_decompositions too.
    with pytest.raises(DecompositionError, match=r"no registered decomposition for aten\.mm"):
        resolve_decomposition_ops([aten.mm.default])
    assert resolve_decomposition_ops([aten.mm.default], skip_missing=True) == {}
    with pytest.raises(DecompositionError, match="is not a torch op"):
        extend_aot_decompositions(add_ops=["gelu"]).__enter__()


class _NeedsDecomp(torch.nn.Module):
    def forward(self, x, y):
        return torch.logsumexp(x, -1), F.instance_norm(y) + 1.0


def _args():
    return (torch.randn(3, 4), torch.randn(2, 3, 4, 4))


class _MatMul(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return torch.relu(x @ self.w)


def test_program_without_table_ops_is_not_retraced_or_copied():
    ep = torch.export.export(_MatMul(), (torch.randn(2, 4),))
    prepared = prepare_program(ep, current_aot_decompositions())
    assert prepared.strategy == "as-is"
    # Nothing to change and nothing the importer rewrites: the graph is read in place.
    assert prepared.graph is ep.graph


def test_graph_the_importer_rewrites_is_copied():
    class Lifted(torch.nn.Module):
        def forward(self, x):
            return x + torch.tensor([1.0, 2.0])  # lift_fresh_copy, canonicalized on import

    ep = torch.export.export(Lifted(), (torch.randn(2),))
    assert any(n.target == torch.ops.aten.lift_fresh_copy.default for n in ep.graph.nodes)
    prepared = prepare_program(ep, current_aot_decompositions())
    assert prepared.graph is not ep.graph


def test_only_needed_nodes_are_decomposed_locally():
    ep = torch.export.export(_NeedsDecomp(), _args())
    before = [n.format_node() for n in ep.graph.nodes]
    prepared = prepare_program(ep, current_aot_decompositions())
    assert prepared.strategy == "local"
    assert prepared.decomposed_nodes == 2
    targets = {n.target for n in prepared.graph.nodes if n.op == "call_function"}
    assert aten.logsumexp.default not in targets
    assert aten.instance_norm.default not in targets
    assert [n.format_node() for n in ep.graph.nodes] == before
    # Outputs still resolve through the (renamed) signature.
    names = {n.name for n in prepared.graph.nodes}
    assert all(s.arg.name in names for s in prepared.graph_signature.output_specs)
    # The rewritten graph computes the same thing.
    got = prepared.graph_module(*_args_with_seed())
    want = _NeedsDecomp()(*_args_with_seed())
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def _args_with_seed():
    torch.manual_seed(0)
    return _args()


def test_mutating_program_is_functionalized():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("state", torch.zeros(4))

        def forward(self, x):
            self.state.add_(x)
            return self.state * 2

    ep = torch.export.export(M(), (torch.randn(4),))
    prepared = prepare_program(ep, current_aot_decompositions())
    assert prepared.strategy == "retraced"
    assert not any(
        getattr(n.target, "_schema", None) is not None and n.target._schema.is_mutable
        for n in prepared.graph.nodes
        if n.op == "call_function"
    )


def test_node_names_that_shadow_builtins_are_kept():
    # nn.Sequential names its input "input"; FX renames such nodes when copying a graph.
    # (Linear is in the default table, so this graph is copied for its local decomposition.)
    ep = torch.export.export(torch.nn.Sequential(torch.nn.Linear(2, 2)), (torch.randn(1, 2),))
    prepared = prepare_program(ep, current_aot_decompositions())
    names = [n.name for n in prepared.graph.nodes]
    assert "input" in names
    assert [n.name for n in ep.graph.nodes if n.op == "placeholder"] == [
        n.name for n in prepared.graph.nodes if n.op == "placeholder"
    ]


def test_repeated_signatures_are_traced_once(monkeypatch):
    import torch.fx.experimental.proxy_tensor as proxy_tensor

    calls = []
    real_make_fx = proxy_tensor.make_fx

    def counting_make_fx(*args, **kwargs):
        calls.append(1)
        return real_make_fx(*args, **kwargs)

    class Layers(torch.nn.Module):
        def forward(self, x):
            for _ in range(4):
                x = x + torch.logsumexp(x, -1, keepdim=True)
            return x

    ep = torch.export.export(Layers(), (torch.randn(3, 4),))
    monkeypatch.setattr(proxy_tensor, "make_fx", counting_make_fx)
    prepared = prepare_program(ep, current_aot_decompositions())
    assert prepared.strategy == "local" and prepared.decomposed_nodes == 4
    assert len(calls) == 1
    x = torch.randn(3, 4)
    torch.testing.assert_close(prepared.graph_module(x)[0], Layers()(x))
