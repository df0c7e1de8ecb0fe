"""Compile-time rewrite of mutable globals that IREE 3.13 would give one shared storage.

Two mutable tensor globals of the same type and the same initial value (``#util.uninitialized``
or the same ``dense<...>`` constant, e.g. the per-layer KV caches of
``export_global_tree(..., uninitialized=True, mutable=True)``) end up holding ONE buffer: after
``iree-util-combine-initializers`` has merged the globals' initializers into one, ``cse`` merges
their identical ``stream.tensor.empty`` (or ``stream.tensor.splat`` / constant) ops, both
globals are stored that one resource, later in-place updates (``flow.tensor.update`` stored
back, what a KV-cache write is) write it for both, and ``iree-util-fuse-globals`` finally fuses
the globals themselves. Reading either gives the last one written; no error anywhere. Globals
that differ in type or initial value, immutable ones, and scalars are not affected; IREE 3.13
has no flag that turns the merge off.

:func:`separate_shared_globals` gives each such global its own ``util.initializer`` whose fill
value goes through a ``util.optimization_barrier`` together with a per-global salt (an index
constant), so no two fills are the same operation and nothing can merge them (a float narrower
than 32 bits goes through as its bit pattern, ``arith.bitcast`` to and from ``iN``: the VM has
no f16 scalars)::

    util.global private mutable @cache.1 : tensor<1x32x2x16xf32>
    util.initializer {
      %zero = arith.constant 0.000000e+00 : f32
      %salt = arith.constant 1 : index
      %0:2 = util.optimization_barrier %salt, %zero : index, f32
      %1 = flow.tensor.splat %0#1 : tensor<1x32x2x16xf32>
      util.global.store %1, @cache.1 : tensor<1x32x2x16xf32>
      util.return
    }

A splat initial value is splatted that way; ``#util.uninitialized`` becomes zeros (any content is
a valid "uninitialized" one); another constant is written over such a salted fill with
``flow.tensor.update``. The compile path applies it to the copy handed to IREE
(``rewrites.module_for_compile``): the exported IR stays the reference's.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

__all__ = ["separate_shared_globals", "shared_mutable_globals"]

_UNINITIALIZED = "#util.uninitialized"


def shared_mutable_globals(module_op: Any) -> list[Any]:
    """The mutable tensor globals of ``module_op`` that share type and initial value with
    another one (those :func:`separate_shared_globals` rewrites), in module order."""
    op = getattr(module_op, "operation", module_op)
    groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for child in op.regions[0].blocks[0].operations:
        key = _storage_key(child.operation)
        if key is not None:
            groups[key].append(child.operation)
    return [g for group in groups.values() if len(group) > 1 for g in group]


def separate_shared_globals(module_op: Any) -> int:
    """Gives each global of :func:`shared_mutable_globals` its own storage, in place: its
    initial value moves into its own salted ``util.initializer`` (see the module doc).

    Returns:
        How many globals were rewritten.
    """
    from turbine_ir.dialects import arith, flow, util
    from turbine_ir.ir import (
        DenseElementsAttr,
        FunctionType,
        IndexType,
        InsertionPoint,
        IntegerAttr,
        RankedTensorType,
        StringAttr,
        TypeAttr,
    )

    shared = shared_mutable_globals(module_op)
    for salt, g in enumerate(shared):
        tensor_type = RankedTensorType(TypeAttr(g.attributes["type"]).value)
        initial = g.attributes["initial_value"]
        kind = _constant_kind(initial)
        symbol = StringAttr(g.attributes["sym_name"]).value
        with g.context, g.location:
            init = util.InitializerOp(
                TypeAttr.get(FunctionType.get([], [])),
                ip=InsertionPoint(g.parent.regions[0].blocks[0]),
            )
            init.operation.move_after(g)  # runs where the global's initial value ran
            with InsertionPoint(init.regions[0].blocks.append()):
                index = IndexType.get()
                element = tensor_type.element_type
                fill = (
                    DenseElementsAttr(initial).get_splat_value()
                    if kind == "splat"
                    else _zero(element)
                )
                fill_value = arith.ConstantOp(element, fill).result
                bits = _narrow_float_bits(element)
                if bits is not None:  # the VM has no such scalars: carry the bit pattern
                    fill_value = arith.BitcastOp(bits, fill_value).result
                barrier = util.OptimizationBarrierOp(
                    [index, fill_value.type],
                    [arith.ConstantOp(index, IntegerAttr.get(index, salt)).result, fill_value],
                )
                fill_value = barrier.results[1]
                if bits is not None:
                    fill_value = arith.BitcastOp(element, fill_value).result
                value = flow.TensorSplatOp(tensor_type, fill_value, []).result
                if kind == "dense":
                    zero = arith.ConstantOp(index, IntegerAttr.get(index, 0)).result
                    data = arith.ConstantOp(tensor_type, initial).result
                    value = flow.TensorUpdateOp(
                        value, [], [zero] * tensor_type.rank, data, []
                    ).result
                util.GlobalStoreOp(value, symbol)
                util.ReturnOp([])
            del g.attributes["initial_value"]
    return len(shared)


def _storage_key(op: Any) -> tuple[str, str] | None:
    """(type, initial value) of a mutable tensor global IREE 3.13 may merge, else ``None``."""
    from turbine_ir.ir import RankedTensorType, TypeAttr

    if op.name != "util.global" or "is_mutable" not in op.attributes:
        return None
    try:
        tensor_type = RankedTensorType(TypeAttr(op.attributes["type"]).value)
    except ValueError:
        return None  # scalars are values, not storage
    if not tensor_type.has_static_shape or not _fillable(tensor_type.element_type):
        return None  # nothing to fill (a dynamic one is stored whole before any use)
    if "initial_value" not in op.attributes:
        # No storage until a store gives it one (an update before that fails at run time), and
        # what this rewrite leaves: each is then stored by its own initializer.
        return None
    initial = op.attributes["initial_value"]
    kind = _constant_kind(initial)
    if kind is None:
        return None  # parameters (#flow.parameter.named) and the like have their own storage
    return (str(tensor_type), _UNINITIALIZED if kind == "uninitialized" else str(initial))


def _constant_kind(attr: Any) -> str | None:
    """``"uninitialized"``, ``"splat"``, ``"dense"`` (other constants) or ``None``."""
    from turbine_ir.ir import DenseElementsAttr, DenseResourceElementsAttr

    if str(attr).startswith(_UNINITIALIZED):
        return "uninitialized"
    try:
        return "splat" if DenseElementsAttr(attr).is_splat else "dense"
    except ValueError:
        pass
    try:
        DenseResourceElementsAttr(attr)
    except ValueError:
        return None
    return "dense"


def _fillable(element_type: Any) -> bool:
    """Whether ``arith.constant`` / ``flow.tensor.splat`` take this element type."""
    from turbine_ir.ir import (  # type: ignore[attr-defined]  # FloatType comes from the `*` import
        FloatType,
        IntegerType,
    )

    if isinstance(element_type, FloatType) or _isa(FloatType, element_type):
        return True
    return _isa(IntegerType, element_type) and IntegerType(element_type).is_signless


def _isa(cls: type, t: Any) -> bool:
    try:
        cls(t)
    except ValueError:
        return False
    return True


def _narrow_float_bits(element_type: Any) -> Any:
    """The signless integer type of a float type narrower than 32 bits (f16, bf16, f8), else
    ``None``: such scalars cannot live on the host (the VM has no f16: a barrier of one fails
    to legalize), so the salted fill carries its bit pattern and is bitcast back."""
    from turbine_ir.ir import (  # type: ignore[attr-defined]  # FloatType comes from the `*` import
        FloatType,
        IntegerType,
    )

    if not _isa(FloatType, element_type):
        return None
    width = FloatType(element_type).width
    return IntegerType.get_signless(width) if width < 32 else None


def _zero(element_type: Any) -> Any:
    from turbine_ir.ir import FloatAttr, IntegerAttr, IntegerType

    if _isa(IntegerType, element_type):
        return IntegerAttr.get(element_type, 0)
    return FloatAttr.get(element_type, 0.0)
