"""Globals inside procedures: IrGlobalTensor / IrGlobalScalar load a global at each use, store on assignment.

A globals descriptor (:mod:`._globals`) creates these intrinsics, one per global, when a module
tracks it; a procedure reading one emits ``util.global.load``, and an assignment (through
``set()`` or a live collection) emits ``util.global.store`` after checking the value's type.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from turbine_ir import GlobalAttributes
from turbine_ir.dialects import tensor, util
from turbine_ir.ir import FlatSymbolRefAttr, RankedTensorType, Type, Value

from . import _scalars
from ._errors import ProcedureTraceError
from ._primitives import IrScalar, IrTensor, MaterializedGlobal

if TYPE_CHECKING:
    from ._base import IrTrace

__all__ = ["GlobalsInfo", "IrGlobalScalar", "IrGlobalTensor"]


class GlobalsInfo(Protocol):
    """What a global intrinsic knows of the descriptor that made it (a ``GlobalsDef``)."""

    @property
    def attrs(self) -> GlobalAttributes: ...


def _check_assignable(g: IrGlobalTensor | IrGlobalScalar, trace: IrTrace) -> None:
    if not g.info.attrs.mutable:
        raise ProcedureTraceError(
            f"procedure {trace.name!r}: cannot assign to global {g.export_name!r} "
            f"(@{g.symbol_name}): it is not mutable; export it with mutable=True "
            "(e.g. export_global(..., mutable=True))"
        )


def _single(g: Any, trace: IrTrace, ir_values: Sequence[Value]) -> Value:
    if len(ir_values) != 1:
        raise ProcedureTraceError(
            f"procedure {trace.name!r}: global {g.export_name!r} takes one value, got "
            f"{len(ir_values)}"
        )
    return ir_values[0]


class IrGlobalScalar(IrScalar, MaterializedGlobal):
    """An IrScalar that is loaded from a global and associated with its aggregate.

    Each use loads the global (``util.global.load``); ``set()`` or assignment through the owning
    module/collection stores it (``util.global.store``) and requires a mutable global.
    """

    __slots__ = ["export_name", "global_op", "global_type", "info", "symbol_name"]

    def __init__(
        self,
        export_name: str,
        info: GlobalsInfo,
        *,
        symbol_name: str,
        global_op: Any,
        global_type: Type,
    ):
        super().__init__(global_type)
        self.export_name = export_name
        self.info = info
        self.symbol_name = symbol_name
        self.global_op = global_op
        self.global_type = global_type

    def resolve_ir_values(self, trace: IrTrace) -> Sequence[Value]:
        return (util.GlobalLoadOp(self.global_type, self.symbol_name).result,)

    def resolve_assignment(self, proc_trace: IrTrace, ir_values: Sequence[Value]) -> None:
        _check_assignable(self, proc_trace)
        value = _single(self, proc_trace, ir_values)
        value = _scalars.cast_scalar(
            value, self.global_type, what=f"value for {self.export_name!r}"
        )
        util.GlobalStoreOp(value, self.symbol_name)

    def __repr__(self) -> str:
        return f"IrGlobalScalar(@{self.symbol_name} : {self.global_type})"


class IrGlobalTensor(IrTensor, MaterializedGlobal):
    """An IrTensor that is loaded from a global and associated with its aggregate.

    Each use loads the global; dynamic dimension sizes are not cached across uses (a mutable
    global may change shape). Assignment stores a tensor of a compatible type (a static shape
    is cast to the global's dynamic one).
    """

    __slots__ = ["export_name", "global_op", "global_type", "info", "symbol_name"]
    _caches_dims = False

    def __init__(
        self,
        export_name: str,
        info: GlobalsInfo,
        *,
        symbol_name: str,
        global_op: Any,
        global_type: Type,
        dtype: torch.dtype | None,
    ):
        super().__init__(global_type, dtype)
        self.export_name = export_name
        self.info = info
        self.symbol_name = symbol_name
        self.global_op = global_op
        self.global_type = global_type

    def resolve_ir_values(self, trace: IrTrace) -> Sequence[Value]:
        return (util.GlobalLoadOp(self.global_type, self.symbol_name).result,)

    def resolve_assignment(self, proc_trace: IrTrace, ir_values: Sequence[Value]) -> None:
        _check_assignable(self, proc_trace)
        value = _single(self, proc_trace, ir_values)
        if value.type != self.global_type:
            value = _cast_tensor_for_global(self, proc_trace, value)
        if _may_alias_other_global(value, self.symbol_name):
            # IREE 3.13 miscompiles storing another mutable global's loaded value (or a view
            # of it, or a call result that may be one): the two globals end up aliased, so a
            # later store to the source shows through. A barrier forces a real value.
            value = util.OptimizationBarrierOp([value.type], [value]).results[0]
        util.GlobalStoreOp(value, self.symbol_name)

    def __repr__(self) -> str:
        return f"IrGlobalTensor(@{self.symbol_name} : {self.global_type})"


# Ops whose tensor result is a view (or plain copy) of their first operand.
_VIEW_LIKE_OPS = frozenset(
    {
        "tensor.cast",
        "tensor.reshape",
        "tensor.expand_shape",
        "tensor.collapse_shape",
        "tensor.bitcast",
        "flow.tensor.reshape",
        "flow.tensor.bitcast",
        "torch_c.to_builtin_tensor",
        "torch_c.from_builtin_tensor",
    }
)


def _may_alias_other_global(value: Value, symbol_name: str) -> bool:
    """Whether ``value`` may be the contents of a global other than ``symbol_name``.

    Follows view-like ops back to a ``util.global.load`` of another global; a ``func.call``
    result is assumed to possibly be one (the callee may return a loaded global).
    """
    while True:
        owner = value.owner
        op = getattr(owner, "operation", None)
        if op is None:  # a block argument
            return False
        name = op.name
        if name == "util.global.load":
            return FlatSymbolRefAttr(op.attributes["global"]).value != symbol_name
        if name == "func.call":
            return True
        if name not in _VIEW_LIKE_OPS or not op.operands:
            return False
        value = op.operands[0]


def _cast_tensor_for_global(g: IrGlobalTensor, trace: IrTrace, value: Value) -> Value:
    """``tensor.cast`` between compatible shapes (same rank and element type, ``?`` vs static)."""
    problem = None
    if not _scalars.isa(RankedTensorType, value.type):
        problem = "it is not a ranked tensor"
    else:
        src = RankedTensorType(value.type)
        dst = RankedTensorType(g.global_type)
        if src.element_type != dst.element_type:
            problem = f"element type {src.element_type} differs from {dst.element_type}"
        elif src.rank != dst.rank:
            problem = f"rank {src.rank} differs from {dst.rank}"
        else:
            for i in range(src.rank):
                if dst.is_dynamic_dim(i) or src.is_dynamic_dim(i):
                    continue
                if src.get_dim_size(i) != dst.get_dim_size(i):
                    problem = f"dimension {i} is {src.get_dim_size(i)}, not {dst.get_dim_size(i)}"
                    break
    if problem:
        raise ProcedureTraceError(
            f"procedure {trace.name!r}: cannot assign a value of type {value.type} to global "
            f"{g.export_name!r} of type {g.global_type}: {problem}"
        )
    return tensor.CastOp(g.global_type, value).result
