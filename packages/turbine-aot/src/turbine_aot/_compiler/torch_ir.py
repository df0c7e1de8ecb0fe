"""Helpers for reading and rewriting torch-dialect modules in place (shared by the compile-time
rewrites and the program traits): walking the operations, a module's top-level operations and
public functions, reading ``!torch.vtensor`` types and constant operands, creating ops before
an anchor op at its location, and adding parsed top-level operations (the kernels' executables,
private functions) under symbol names unique in the module."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "NOT_CONSTANT",
    "VIEW_OPS",
    "Builder",
    "TensorType",
    "TopLevel",
    "builtin_tensor",
    "constant",
    "constant_int_list",
    "erase_unused",
    "producer",
    "public_functions",
    "replace_each",
    "top_level_ops",
    "walk",
]


def walk(op: Any):
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                yield child.operation
                yield from walk(child.operation)


def top_level_ops(module: object) -> list:
    """The operations in a module's body (``ExportOutput``, ``ir.Module`` or its operation);
    empty when ``module`` is not a module."""
    op: Any = getattr(module, "mlir_module", module)
    op = getattr(op, "operation", op)
    try:
        return [getattr(o, "operation", o) for o in op.regions[0].blocks[0].operations]
    except Exception:
        return []


def public_functions(module: object, kinds: Sequence[str] = ("func.func", "util.func")) -> list:
    """The public function operations at the top level of an MLIR module.

    Args:
        module: an ``ir.Module``, its operation, or an object with ``mlir_module``
            (``ExportOutput``).
        kinds: operation names that count as functions.

    Returns:
        The operations (empty when ``module`` is not a module).
    """
    out = []
    for f in top_level_ops(module):
        if f.name not in kinds:
            continue
        attrs = f.attributes
        if "sym_visibility" in attrs and str(attrs["sym_visibility"]).strip('"') != "public":
            continue
        out.append(f)
    return out


class TopLevel:
    """The top level of a module being rewritten: its symbol names, and operations parsed from
    MLIR text appended to it (the kernel rewrites' executables and private functions)."""

    def __init__(self, module_op: Any) -> None:
        op = getattr(module_op, "operation", module_op)
        self._body = op.regions[0].blocks[0]
        self._context = op.context
        self._names = {_sym_name(o.operation) for o in self._body.operations} - {None}

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def unique(self, name: str) -> str:
        """``name``, or ``name`` followed by underscores where taken; reserved from now on."""
        while name in self._names:
            name += "_"
        self._names.add(name)
        return name

    def append(
        self, *texts: str, declarations: Sequence[str] = (), before_functions: bool = False
    ) -> None:
        """Parses ``texts`` as one module (so a call verifies beside its callee) and moves its
        operations to the end of this module's top level (``before_functions``: before its
        first function instead, after the globals the exporter declares; IREE 3.13 fails to
        convert a tensor global that an initializer stores when a function using it comes
        first: "failed to legalize unresolved target materialization"). ``declarations``: one
        top-level operation each (e.g. ``util.global private @w : tensor<4xf32>``), standing
        for symbols of this module the texts refer to; parsed before them, then dropped."""
        from turbine_ir.ir import InsertionPoint, Module

        with self._context:
            parsed = Module.parse("\n".join([*declarations, *texts]))
        anchor = None
        if before_functions:
            anchor = next(
                (
                    o.operation
                    for o in self._body.operations
                    if o.operation.name in ("func.func", "util.func")
                ),
                None,
            )
        for child in list(parsed.body.operations)[len(declarations) :]:
            op = child.operation
            op.detach_from_parent()
            if anchor is None:
                self._body.append(op)
            else:
                InsertionPoint(anchor).insert(op)
            name = _sym_name(op)
            if name is not None:
                self._names.add(name)


def _sym_name(op: Any) -> str | None:
    attrs = op.attributes
    return str(attrs["sym_name"]).strip('"') if "sym_name" in attrs else None


#: The ops that reshape a tensor without moving its elements.
VIEW_OPS = frozenset({"torch.aten.view", "torch.aten._unsafe_view", "torch.aten.reshape"})


def builtin_tensor(sizes: Sequence[int | None], dtype: str) -> str:
    """The builtin tensor type of ``sizes`` (``None``: dynamic) and the builtin element type
    ``dtype``, as the kernels' private functions declare their operands."""
    return "tensor<" + "".join(("?" if s is None else str(s)) + "x" for s in sizes) + dtype + ">"


class TensorType:
    """Sizes (``None`` = dynamic, a list the rewrites compare with lists) and element type of a
    ``!torch.vtensor``; read and printed by :class:`turbine_ir.VtensorType`, the one parser of
    the type string."""

    def __init__(self, sizes: list[int | None], dtype: str):
        self.sizes = sizes
        self.dtype = dtype

    @staticmethod
    def of(value: Any) -> TensorType | None:
        from turbine_ir import VtensorType

        t = VtensorType.parse(str(value.type))
        return None if t is None else TensorType(list(t.sizes), t.dtype)

    def with_sizes(self, sizes: list[int | None], dtype: str | None = None) -> TensorType:
        return TensorType(list(sizes), dtype or self.dtype)

    def asm(self) -> str:
        from turbine_ir import VtensorType

        return VtensorType(tuple(self.sizes), self.dtype).asm()


def constant(value: Any) -> Any:
    """The Python value of a ``torch.constant.*`` operand (``None`` for none), else a marker."""
    from turbine_ir.ir import (  # type: ignore[attr-defined]  # BoolAttr comes from the `*` import
        BoolAttr,
        FloatAttr,
        IntegerAttr,
    )

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


def constant_int_list(value: Any) -> list[int] | None:
    """The Python ints of a ``torch.prim.ListConstruct`` of integer constants (a convolution's
    stride, padding, ...), else ``None``."""
    owner = value.owner
    if getattr(owner, "name", None) != "torch.prim.ListConstruct":
        return None
    items = [constant(v) for v in owner.operands]
    if any(not isinstance(i, int) or isinstance(i, bool) for i in items):
        return None
    return items


NOT_CONSTANT = object()


def producer(value: Any) -> Any:
    """The operation defining ``value`` (``None`` for a block argument)."""
    owner = value.owner
    return getattr(owner, "operation", owner) if hasattr(owner, "name") else None


def erase_unused(value: Any, removable: frozenset[str]) -> None:
    """Erases the ops computing ``value`` that nothing uses any more, walking up through ops
    named in ``removable`` (ops without side effects): what a rewrite replaced (a quantized
    weight's dequantization, an integer matmul's operands). A use by
    ``torch.aten._assert_tensor_metadata`` (torch.export's checks of its own intermediate
    values) does not keep a value alive: the check is erased with it."""
    stack = [producer(value)]
    while stack:
        op = stack.pop()
        if op is None or op.name not in removable:
            continue
        users: list[Any] = []
        for r in op.results:
            for use in r.uses:
                user = getattr(use.owner, "operation", use.owner)
                if not any(user is u for u in users):
                    users.append(user)
        if any(u.name != "torch.aten._assert_tensor_metadata" for u in users):
            continue
        for u in users:
            u.erase()
        operands = list(op.operands)
        # An op reached twice (through two users, e.g. a reduction and its zeros_like) has other
        # handles on the stack, distinct Python objects: drop them while ``op`` still exists to
        # compare with (an erased op's handle must not be touched).
        stack = [x for x in stack if x is None or x != op]
        op.erase()
        stack.extend(producer(v) for v in operands)


def replace_each(ops: Sequence[Any], form: Callable[[Builder, Any], Any]) -> int:
    """Replaces each op of ``ops`` (one result) by the value ``form(Builder(op), op)`` builds
    before it, and erases the op; returns how many were replaced."""
    for op in ops:
        op.results[0].replace_all_uses_with(form(Builder(op), op))
        op.erase()
    return len(ops)


class Builder:
    """Creates torch-dialect ops before one op, at its location (or ``location``).

    The rewrites that replace an op by a call of a private function over builtin tensors (the
    CPU kernels' callers) build that call with :meth:`call_on_builtins`, or its three steps
    :meth:`to_builtin`, :meth:`call` and :meth:`from_builtin`.
    """

    def __init__(self, anchor: Any, location: Any = None):
        from turbine_ir.ir import InsertionPoint

        self.ip = InsertionPoint(anchor)
        self.loc = anchor.location if location is None else location
        self.context = anchor.context

    def to_builtin(self, value: Any, type_asm: str) -> Any:
        """``torch_c.to_builtin_tensor`` of the torch tensor ``value`` as ``type_asm``."""
        return self.op("torch_c.to_builtin_tensor", type_asm, [value])

    def from_builtin(self, value: Any, torch_type: Any) -> Any:
        """``torch_c.from_builtin_tensor`` of the builtin tensor ``value`` as ``torch_type``
        (a ``Type``)."""
        from turbine_ir.ir import Operation

        with self.loc, self.ip:
            return Operation.create(
                "torch_c.from_builtin_tensor", results=[torch_type], operands=[value]
            ).result

    def call(self, name: str, operands: Sequence[Any], result_types: Sequence[str]) -> Any:
        """``func.call @name(operands)`` with results of ``result_types``; returns the op."""
        from turbine_ir.ir import FlatSymbolRefAttr, Operation, Type

        with self.loc, self.ip:
            return Operation.create(
                "func.call",
                results=[Type.parse(t, self.context) for t in result_types],
                operands=list(operands),
                attributes={"callee": FlatSymbolRefAttr.get(name)},
            )

    def call_on_builtins(
        self,
        name: str,
        operands: Sequence[tuple[Any, str | None]],
        result_type: str,
        torch_type: Any,
    ) -> Any:
        """``func.call @name`` of ``operands``, each ``(value, builtin type)`` made a builtin
        tensor of that type (``None``: already one), and its one result back as a torch value
        of ``torch_type``."""
        builtin = [v if t is None else self.to_builtin(v, t) for v, t in operands]
        call = self.call(name, builtin, [result_type])
        return self.from_builtin(call.results[0], torch_type)

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
        from turbine_ir.ir import BoolAttr  # type: ignore[attr-defined]  # from the `*` import

        with self.loc:
            attr = BoolAttr.get(False)
        return self.op("torch.constant.bool", "!torch.bool", [], {"value": attr})

    def true(self) -> Any:
        from turbine_ir.ir import BoolAttr  # type: ignore[attr-defined]  # from the `*` import

        with self.loc:
            attr = BoolAttr.get(True)
        return self.op("torch.constant.bool", "!torch.bool", [], {"value": attr})

    def int_list(self, values: list[builtins.int]) -> Any:  # `int` is the method above
        return self.op(
            "torch.prim.ListConstruct", "!torch.list<int>", [self.int(v) for v in values]
        )
