"""Helpers for rewriting torch-dialect modules in place (shared by the compile-time rewrites):
walking the operations, reading ``!torch.vtensor`` types and constant operands, and creating
ops before an anchor op at its location."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["NOT_CONSTANT", "Builder", "TensorType", "constant", "walk"]

_VTENSOR = re.compile(r"^!torch\.vtensor<\[(.*)\],(.+)>$")


def walk(op: Any):
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                yield child.operation
                yield from walk(child.operation)


class TensorType:
    """Sizes (``None`` = dynamic) and element type of a ``!torch.vtensor``."""

    def __init__(self, sizes: list[int | None], dtype: str):
        self.sizes = sizes
        self.dtype = dtype

    @staticmethod
    def of(value: Any) -> TensorType | None:
        m = _VTENSOR.match(str(value.type))
        if m is None:
            return None
        dims = [d.strip() for d in m.group(1).split(",") if d.strip()]
        return TensorType([None if d == "?" else int(d) for d in dims], m.group(2))

    def with_sizes(self, sizes: list[int | None], dtype: str | None = None) -> TensorType:
        return TensorType(list(sizes), dtype or self.dtype)

    def asm(self) -> str:
        return f"!torch.vtensor<[{','.join('?' if s is None else str(s) for s in self.sizes)}],{self.dtype}>"


def constant(value: Any) -> Any:
    """The Python value of a ``torch.constant.*`` operand (``None`` for none), else a marker."""
    from turbine_ir.ir import BoolAttr, FloatAttr, IntegerAttr

    owner = value.owner
    name = getattr(owner, "name", None)
    if name == "torch.constant.none":
        return None
    if name == "torch.constant.float":
        return FloatAttr(owner.attributes["value"]).value
    if name == "torch.constant.bool":
        return BoolAttr(owner.attributes["value"]).value
    if name == "torch.constant.int":
        return IntegerAttr(owner.attributes["value"]).value
    return NOT_CONSTANT


NOT_CONSTANT = object()


class Builder:
    """Creates torch-dialect ops before one op, at its location."""

    def __init__(self, anchor: Any):
        from turbine_ir.ir import InsertionPoint

        self.ip = InsertionPoint(anchor)
        self.loc = anchor.location
        self.context = anchor.context

    def op(self, name: str, result: str, operands: list[Any], attrs: dict | None = None) -> Any:
        from turbine_ir.ir import Operation, Type

        with self.loc, self.ip:
            return Operation.create(
                name,
                results=[Type.parse(result, self.context)],
                operands=operands,
                attributes=attrs or {},
            ).result

    def int(self, v: int) -> Any:
        from turbine_ir.ir import IntegerAttr, IntegerType

        with self.loc:
            attr = IntegerAttr.get(IntegerType.get_signless(64), v)
        return self.op("torch.constant.int", "!torch.int", [], {"value": attr})

    def float(self, v: float) -> Any:
        from turbine_ir.ir import F64Type, FloatAttr

        with self.loc:
            attr = FloatAttr.get(F64Type.get(), v)
        return self.op("torch.constant.float", "!torch.float", [], {"value": attr})

    def none(self) -> Any:
        return self.op("torch.constant.none", "!torch.none", [])

    def false(self) -> Any:
        from turbine_ir.ir import BoolAttr

        with self.loc:
            attr = BoolAttr.get(False)
        return self.op("torch.constant.bool", "!torch.bool", [], {"value": attr})

    def int_list(self, values: list[int]) -> Any:
        return self.op(
            "torch.prim.ListConstruct", "!torch.list<int>", [self.int(v) for v in values]
        )
