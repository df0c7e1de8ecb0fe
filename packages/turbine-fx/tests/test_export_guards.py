"""Shape guards torch.export could not prove over a Dim's range: checked, then kept or dropped."""

from __future__ import annotations

import sympy
import torch
from torch.utils._sympy.functions import Mod
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.value_ranges import ValueRanges

from turbine_fx._export_guards import (
    _counterexample,
    drop_proven_guards,
    has_guards,
    is_constraint_violation,
    unproven_guards,
)

S = sympy.Symbol("s0", integer=True, positive=True)
BOUNDED = {S: ValueRanges(0, 31)}
UNBOUNDED = {S: ValueRanges(0, int_oo)}


def test_a_guard_is_proven_symbolically_over_an_unbounded_range():
    # The decode-step guard of a Llama KV cache (see test_jittable): true for every s >= 0.
    guard = sympy.Eq(sympy.Min(16 * S + 16, 32 * S + 32), 16 * S + 16)
    assert _counterexample(guard, UNBOUNDED) is None
    assert _counterexample(guard, BOUNDED) is None


def test_a_guard_true_only_inside_the_range_is_checked_point_by_point():
    guard = sympy.Lt(S, 32)  # not true for every s, true for every s <= 31
    assert _counterexample(guard, BOUNDED) is None
    assert _counterexample(guard, UNBOUNDED) == (
        "not provably true for every s0 >= 0 (give its Dim a max)"
    )


def test_a_guard_false_somewhere_names_the_point():
    assert _counterexample(sympy.Eq(Mod(S, 7), 0), BOUNDED) == "false at s0=1"
    assert _counterexample(sympy.Eq(Mod(S, 7), 0), {}) == "s0 has no declared range"


def _program_with_a_guard(max_size: int):
    class Sevenths(torch.nn.Module):
        def forward(self, x):
            return x.reshape(7, -1)

    return torch.export.export(
        Sevenths(),
        (torch.randn(14),),
        dynamic_shapes=({0: torch.export.Dim("n", max=max_size)},),
        strict=False,
        prefer_deferred_runtime_asserts_over_guards=True,
    )


def test_guards_in_a_graph_are_found_kept_when_false_and_dropped_when_true():
    # reshape(7, -1) guards n % 7 == 0, and torch's size assumptions 7 * (n // 7) >= 2 and
    # n // 7 != 1.
    program = _program_with_a_guard(30)
    assert has_guards(program.graph)
    unproven = unproven_guards(program.graph, program.range_constraints)
    assert any("Mod(" in u.expression and u.reason.startswith("false at ") for u in unproven)
    kept = len(unproven)
    drop_proven_guards(program.graph, program.range_constraints)
    assert len(unproven_guards(program.graph, program.range_constraints)) == kept
    # Over a range holding only n = 14 every guard holds: all are removed, with the symbolic
    # arithmetic that only they used.
    program = _program_with_a_guard(30)
    (symbol,) = program.range_constraints
    ranges = {symbol: ValueRanges(14, 14)}
    assert unproven_guards(program.graph, ranges) == []
    assert len(drop_proven_guards(program.graph, ranges)) == 3
    assert not has_guards(program.graph)
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert targets == [torch.ops.aten.reshape.default]


def test_constraint_violations_are_recognized():
    class Sevenths(torch.nn.Module):
        def forward(self, x):
            return x.reshape(7, -1)

    try:
        torch.export.export(
            Sevenths(),
            (torch.randn(14),),
            dynamic_shapes=({0: torch.export.Dim("n", max=30)},),
            strict=False,
        )
    except Exception as e:
        assert is_constraint_violation(e)
    else:
        raise AssertionError("torch.export accepted a guard false at n=1")
    assert not is_constraint_violation(ValueError("Constraints violated"))
