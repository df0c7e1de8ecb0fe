"""Checking one call argument against the leaf it fills: a specialized constant's value, a
number, or a tensor's dtype, rank, static dimensions and dynamic dimensions (their ranges,
equal symbols, simple expressions)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .element_types import element_type_name
from .errors import value_error
from .leaf import Leaf

__all__ = ["check_tensor", "describe", "eval_expression", "same_constant"]


def check_tensor(
    where: str,
    leaf: Leaf,
    value: Any,
    dims: Mapping[str, tuple[int, int | None]],
    symbols: dict[str, tuple[int, str]],
) -> None:
    """dtype, rank, static dims, dynamic dims (range, equal symbols, simple expressions)."""
    want = element_type_name(leaf.dtype) if leaf.dtype else None
    shape = tuple(value.shape)

    def given() -> str:  # for the error messages only: formatted when one is raised
        return f"{str(value.dtype).removeprefix('torch.')} tensor of shape {list(shape)}"

    if want is not None and value.dtype != want:
        want_name = str(want).removeprefix("torch.")
        raise value_error(
            f"{where} expects dtype {want_name} ({leaf.type_text()}); got a {given()}. "
            f"Convert it with .to(torch.{want_name})"
        )
    if len(shape) != len(leaf.shape):
        raise value_error(
            f"{where} expects rank {len(leaf.shape)} ({leaf.type_text()}); got a {given()}"
        )
    for d, (want_d, got) in enumerate(zip(leaf.shape, shape)):
        if want_d is None:
            continue
        if isinstance(want_d, int):
            if got != want_d:
                raise value_error(
                    f"{where} expects dimension {d} to be {want_d} ({leaf.type_text()}); got a "
                    f"{given()}. The dimension is static: export it as dynamic (a torch.export.Dim, "
                    "or None in an AbstractTensor) to vary it"
                )
            continue
        sym = str(want_d)
        if sym in dims:
            lo, hi = dims[sym]
            if got < lo or (hi is not None and got > hi):
                rng = f"{lo}..{hi if hi is not None else 'inf'}"
                raise value_error(
                    f"{where} dimension {d} is {got}, outside the range {rng} of that dynamic "
                    f"dimension ({leaf.type_text()}); export with a torch.export.Dim(..., "
                    f"min=..., max=...) covering {got}"
                )
            if sym in symbols and symbols[sym][0] != got:
                first, first_where = symbols[sym]
                raise value_error(
                    f"{where} dimension {d} is {got} but {first_where} is {first}; they are "
                    f"the same dynamic dimension ({sym}) in the exported program and must be "
                    "equal"
                )
            symbols.setdefault(sym, (got, f"{leaf.path} dimension {d}"))
        else:
            expected = eval_expression(sym, {k: v[0] for k, v in symbols.items()})
            if expected is not None and expected != got:
                raise value_error(
                    f"{where} dimension {d} is {got}; it must be {sym} = {expected} "
                    f"({leaf.type_text()})"
                )


def eval_expression(expr: str, values: Mapping[str, int]) -> int | None:
    """Evaluates a shape expression such as ``2*s0 + 1`` once its symbols are known (integer
    ``+ - * // %`` only; anything else, or an unknown symbol, gives None: not checked)."""
    import ast
    import operator

    ops = {
        ast.Add: operator.add,
        ast.Sub: operator.sub,
        ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod,
    }

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return values[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(expr)

    try:
        return ev(ast.parse(expr, mode="eval").body)
    except (ValueError, KeyError, SyntaxError, ZeroDivisionError):
        return None


def same_constant(value: Any, recorded: Any) -> bool:
    try:
        return json.loads(json.dumps(value)) == recorded
    except (TypeError, ValueError):
        return False


def describe(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    if value is None or isinstance(value, (bool, int, float, str)):
        return f"{type(value).__name__} {value!r}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} with keys {', '.join(map(repr, value))}"
    return f"a {type(value).__module__}.{type(value).__qualname__}"
