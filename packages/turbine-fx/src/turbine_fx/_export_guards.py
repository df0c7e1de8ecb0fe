"""Shape guards torch.export could not prove over the declared ranges: checked, then dropped.

``torch.export.export(strict=False)`` refuses a program ("Constraints violated") when it meets a
shape guard it cannot prove for every value of a named ``Dim``'s range, even when the guard
holds everywhere. A Llama decode step whose KV caches have ``Dim(max=MAX-1)`` on the sequence
dimension hits ``min(16 + 16*s, 32 + 32*s) == 16 + 16*s`` (a contiguity check of the grown,
transposed cache repeated for grouped-query attention; true for every ``s >= 0``); the
reference traces the same step through dynamo's export, which accepts it. Exported again with
``prefer_deferred_runtime_asserts_over_guards=True``, such guards become
``aten._assert_scalar`` nodes (which IREE's importer cannot take: they compute ``sym_min``).
:func:`unproven_guards` checks each one over the declared ranges (symbolically, else at every
point of a small finite range), and the jittable keeps the program only when all hold. A guard
that fails somewhere (a real violation: ``reshape(7, -1)`` of a size that is not a multiple of
7) or that cannot be checked (not provable symbolically, over an unbounded or too large range)
is reported, and the export stays refused. Import (``_program_prep``) removes the assertions
that hold over the program's ranges with :func:`drop_proven_guards`, after any re-trace
(``run_decompositions`` inserts them again).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

__all__ = [
    "UnprovenGuard",
    "drop_proven_guards",
    "has_guards",
    "is_constraint_violation",
    "unproven_guards",
]

#: The most points of a guard's range box evaluated (product of its symbols' range sizes).
MAX_POINTS = 1 << 16


@dataclass(frozen=True)
class UnprovenGuard:
    """A runtime assertion torch inserted that does not hold over the whole declared range."""

    expression: str
    #: Why: ``"false at s0=1"``, ``"not provably true for every s0 >= 0 (give its Dim a
    #: max)"``, ...
    reason: str

    def __str__(self) -> str:
        return f"{self.expression}: {self.reason}"


def is_constraint_violation(error: BaseException) -> bool:
    """Whether ``error`` is torch.export's "Constraints violated" refusal of a ``Dim`` range."""
    if isinstance(error, ConstraintViolationError):
        return True
    kind = getattr(error, "error_type", None)
    return getattr(kind, "name", None) == "CONSTRAINT_VIOLATION"


def has_guards(graph: Any) -> bool:
    """Whether ``graph`` holds a runtime assertion (``aten._assert_scalar``)."""
    return any(_is_assert(n) for n in graph.nodes)


def unproven_guards(graph: Any, ranges: dict[Any, Any]) -> list[UnprovenGuard]:
    """The runtime assertions of ``graph`` that do not hold over the whole of ``ranges``.

    Args:
        graph: An FX graph (an exported program's, traced with symbolic shapes).
        ranges: The program's ``range_constraints`` (symbol → value range).
    """
    return [u for _, u in _check(graph, ranges) if u is not None]


def drop_proven_guards(graph: Any, ranges: dict[Any, Any]) -> list[str]:
    """Removes the runtime assertions of ``graph`` that hold at every point of ``ranges``
    (and the symbolic arithmetic only they used), in place.

    Returns:
        The expressions of the assertions removed.
    """
    dropped = []
    for node, unproven in _check(graph, ranges):
        if unproven is None:
            dropped.append(str(_condition(node)))
            graph.erase_node(node)
    if dropped:
        _erase_dead_symbolic_nodes(graph)
    return dropped


def _is_assert(node: Any) -> bool:
    return node.op == "call_function" and node.target is torch.ops.aten._assert_scalar.default


def _condition(node: Any) -> Any:
    """The sympy expression an assertion node checks, or ``None``."""
    cond = node.args[0] if node.args else None
    value = cond.meta.get("val") if isinstance(cond, torch.fx.Node) else cond
    return getattr(getattr(value, "node", None), "expr", None)


def _check(graph: Any, ranges: dict[Any, Any]) -> list[tuple[Any, UnprovenGuard | None]]:
    out: list[tuple[Any, UnprovenGuard | None]] = []
    for node in list(graph.nodes):
        if not _is_assert(node):
            continue
        expr = _condition(node)
        if expr is None:
            out.append((node, UnprovenGuard(str(node.args[1:2]), "not a symbolic condition")))
            continue
        reason = _counterexample(expr, ranges)
        out.append((node, None if reason is None else UnprovenGuard(str(expr), reason)))
    return out


def _counterexample(expr: Any, ranges: dict[Any, Any]) -> str | None:
    """``None`` when ``expr`` holds for every value of its symbols' ranges, else why not.

    First symbolically: each symbol ``s`` in ``[lo, hi]`` is written ``lo + t`` with ``t`` a
    non-negative integer, and sympy must simplify the guard to true (that covers unbounded
    ranges too). Else, for a small finite box, at every point of it.
    """
    symbols = sorted(expr.free_symbols, key=str)
    lows: dict[Any, int] = {}
    highs: dict[Any, int | None] = {}
    for s in symbols:
        vr = ranges.get(s)
        if vr is None:
            return f"{s} has no declared range"
        low = _finite_int(vr.lower)
        if low is None:
            return f"{s} has the range {vr}, with no lower bound"
        lows[s], highs[s] = low, _finite_int(vr.upper)
    shifted = {s: lows[s] + sympy.Symbol(f"_t{i}", integer=True, nonnegative=True)
               for i, s in enumerate(symbols)}  # fmt: skip
    try:
        if sympy.simplify(expr.xreplace(shifted)) is sympy.true:
            return None
    except Exception:  # a function sympy cannot simplify symbolically: try the points
        pass
    bounds = []
    points = 1
    for s in symbols:
        hi = highs[s]
        if hi is None:
            return f"not provably true for every {s} >= {lows[s]} (give its Dim a max)"
        points *= max(hi - lows[s] + 1, 0)
        if points > MAX_POINTS:
            return f"not provably true, and its range box has more than {MAX_POINTS} points"
        bounds.append(range(lows[s], hi + 1))
    for values in itertools.product(*bounds):
        point = dict(zip(symbols, map(sympy.Integer, values), strict=True))
        try:
            result = expr.xreplace(point)
        except Exception:  # e.g. a division by zero at this point
            result = None
        if result is not sympy.true:
            where = ", ".join(f"{s}={v}" for s, v in zip(symbols, values, strict=True))
            return f"false at {where}" if result is sympy.false else f"undecided at {where}"
    return None


def _finite_int(bound: Any) -> int | None:
    """A range bound as an int, ``None`` for an infinite one (torch's ``int_oo``)."""
    try:
        return int(bound)
    except Exception:  # sympy raises AttributeError, OverflowError, TypeError for infinities
        return None


def _erase_dead_symbolic_nodes(graph: Any) -> None:
    """Erases nodes without users that compute Python/symbolic scalars (the asserts' inputs)."""
    scalar = (torch.SymInt, torch.SymBool, torch.SymFloat, int, float, bool)
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and not node.users:
            value = node.meta.get("val")
            if isinstance(value, scalar):
                graph.erase_node(node)
