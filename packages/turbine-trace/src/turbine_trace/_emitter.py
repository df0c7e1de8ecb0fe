"""``IREEEmitter``: IREE tensor operations (``flow.tensor.*``) usable inside procedures.

Every operation supports dynamic dimensions: sizes, offsets and lengths may be Python ints or
IR scalars (``IrScalar`` from ``tensor_dim``/arithmetic/procedure arguments, or raw ``index`` /
integer ``Value``s); dynamic dimension sizes of operands are passed to the ``flow`` ops as their
``{dims}`` operands, and results remember theirs so later ops reuse the same values.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias, TypeGuard, TypeVar

import torch

from turbine_ir import element_type_to_torch_dtype
from turbine_ir.dialects import arith, flow, tensor, util
from turbine_ir.ir import IndexType, RankedTensorType, ShapedType, Type, Value

from . import _scalars
from ._base import Intrinsic, IrTrace, current_ir_trace
from ._errors import ProcedureTraceError
from ._primitives import IrImmediateScalar, IrImmediateTensor, IrScalar, IrTensor

__all__ = ["IREE", "IREEEmitter"]

_F = TypeVar("_F", bound=Callable[..., Any])

ElementType: TypeAlias = "torch.dtype | Type | str"
DimValue: TypeAlias = "int | IrScalar | Value"


class _OpError(ProcedureTraceError):
    pass


def _emitter(f: _F) -> _F:
    """Runs the op inside the current trace's location and insertion point."""

    @functools.wraps(f)
    def wrapper(self: IREEEmitter, *args: Any, **kwargs: Any) -> Any:
        trace = current_ir_trace()
        op_name = f"IREE.{f.__name__}"
        with trace.loc, trace.ip:
            try:
                return f(self, trace, *args, **kwargs)
            except _OpError as e:
                raise ProcedureTraceError(
                    f"{op_name} in procedure {trace.name!r}: {e.message}"
                ) from None

    return wrapper  # type: ignore[return-value]


class IREEEmitter:
    """IREE tensor operations for procedures (use the ``IREE`` instance).

    Example (inside a procedure)::

        n = IREE.tensor_dim(x, 0)                 # dynamic size as an index scalar
        head = IREE.tensor_slice(x, (0, n - 1), 0) # rows 0..n-2 of column 0
        out = IREE.tensor_update(x, head, 1, 0)    # write them back one row down
    """

    @_emitter
    def tensor_dim(
        self, trace: IrTrace, source: IrTensor, index: int, *, dtype: torch.dtype | None = None
    ) -> IrScalar:
        """Gets the dimension size of a tensor at a static position.

        Emits ``%c0 = arith.constant 0 : index`` and ``%dim = tensor.dim %t, %c0`` (static
        dimensions too, as the reference does), once per tensor and dimension.

        Args:
            source: The tensor.
            index: The dimension (negative counts from the end).
            dtype: An integer torch dtype to convert the ``index`` result to
                (``arith.index_castui``).
        """
        source = _tensor_arg(source, "source")
        if not isinstance(index, int) or not -source.rank <= index < source.rank:
            raise _OpError(
                f"dimension {index!r} is out of range for rank-{source.rank} tensor "
                f"{source.ir_type}"
            )
        value = source.get_dim_value(index)
        if dtype is not None:
            if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
                raise _OpError(f"dtype must be an integer torch dtype, got {dtype}")
            value = arith.IndexCastUIOp(
                trace.module_builder.torch_dtype_to_iree_type(dtype), value
            ).result
        return IrImmediateScalar(value)

    @_emitter
    def tensor_empty(
        self, trace: IrTrace, *dims: DimValue, dtype: ElementType = torch.float32
    ) -> IrTensor:
        """Constructs a tensor with uninitialized values.

        Args:
            *dims: Sizes: ints (static) or IR scalars (dynamic).
            dtype: A torch dtype, or a raw IREE element type (an MLIR ``Type`` or its text such as
                ``"i4"``).
        """
        element_type, torch_dtype = _element_type(trace, dtype)
        shape, dynamic = _dims(dims, "dims")
        result_type = RankedTensorType.get(shape, element_type)
        result = IrImmediateTensor(flow.TensorEmptyOp(result_type, dynamic).result, torch_dtype)
        result.set_dynamic_dim_values(dynamic)
        return result

    @_emitter
    def tensor_reshape(self, trace: IrTrace, source: IrTensor, *result_dims: DimValue) -> IrTensor:
        """Reshapes ``source`` (same elements, row-major) to ``result_dims``.

        Args:
            source: The tensor (static or dynamic shape).
            *result_dims: Sizes of the result: ints or IR scalars.
        """
        source = _tensor_arg(source, "source")
        source_value = source.ir_value
        source_dims = source.get_dynamic_dim_values(resolved_ir_value=source_value)
        shape, dynamic = _dims(result_dims, "result_dims")
        # An element-count mismatch is not refused here (the reference emits the op too): the
        # verifier of flow.tensor.reshape reports it (ExportOutput.verify() / compile).
        result_type = RankedTensorType.get(shape, source.element_type)
        value = flow.TensorReshapeOp(result_type, source_value, source_dims, dynamic).result
        result = IrImmediateTensor(value, source.dtype)
        result.set_dynamic_dim_values(dynamic)
        return result

    @_emitter
    def tensor_slice(
        self,
        trace: IrTrace,
        source: IrTensor,
        *indices: DimValue | tuple[DimValue, DimValue] | tuple[DimValue],
    ) -> IrTensor:
        """Extracts a slice of a tensor.

        The given indices must match the rank of the source and each index is interpreted as
        ``(start_index[, length])``, where the length is taken to be 1 if only a single value is
        given for an index. The result keeps the source's rank. Starts and lengths may be ints
        or IR scalars; an int length gives a static result dimension.
        """
        source = _tensor_arg(source, "source")
        if len(indices) != source.rank:
            raise _OpError(
                f"got {len(indices)} indices for a rank-{source.rank} source tensor "
                f"{source.ir_type}; give one index per dimension, each a start (int or IR "
                "scalar) or a (start, length) pair"
            )
        source_value = source.ir_value
        starts: list[Any] = []
        lengths: list[Any] = []
        for i, index in enumerate(indices):
            if isinstance(index, (tuple, list)):
                if len(index) not in (1, 2):
                    raise _OpError(f"index {i} is {index!r}; use start or (start, length)")
                start = index[0]
                length = index[1] if len(index) == 2 else 1
            else:
                start, length = index, 1
            for value, what in ((start, f"start of index {i}"), (length, f"length of index {i}")):
                if _is_int(value) and value < 0:
                    raise _OpError(f"{what} is {value}; sizes and offsets must be non-negative")
            static_dim = source.shape[i]
            if (
                _is_int(start)
                and _is_int(length)
                and static_dim is not None
                and start + length > static_dim
            ):
                raise _OpError(
                    f"index {i}: [{start}, {start + length}) is out of bounds for dimension "
                    f"{i} of size {static_dim}"
                )
            starts.append(start)
            lengths.append(length)
        if _is_contiguous(source.shape, [v if _is_int(v) else None for v in lengths]):
            # As the reference: flow.tensor.slice %src[starts for lengths], length constants
            # first (one per value), then one constant per start.
            source_dims = source.get_dynamic_dim_values(resolved_ir_value=source_value)
            length_cache: dict[int, Value] = {}
            length_values = [
                _index_value(v, f"length of index {i}", length_cache) for i, v in enumerate(lengths)
            ]
            start_values = [_index_value(v, f"start of index {i}") for i, v in enumerate(starts)]
            shape = [v if _is_int(v) else _DYNAMIC for v in lengths]
            result_dims = [lv for v, lv in zip(lengths, length_values) if not _is_int(v)]
            result_type = RankedTensorType.get(shape, source.element_type)
            value = flow.TensorSliceOp(
                result_type, source_value, source_dims, start_values, length_values, result_dims
            ).result
            result = IrImmediateTensor(value, source.dtype)
            result.set_dynamic_dim_values(result_dims)
            return result
        # Not a contiguous range of the source: IREE 3.13 performs flow.tensor.slice as ONE
        # contiguous copy (x[1:3, 2:5] of a 5x6 tensor returns 6 consecutive elements, static
        # or dynamic), so emit tensor.extract_slice, which IREE lowers correctly.
        cache: dict[int, Value] = {}
        offsets = _MixedIndices(cache)
        sizes = _MixedIndices(cache)
        for i, (start, length) in enumerate(zip(starts, lengths, strict=True)):
            offsets.add(start, f"start of index {i}")
            sizes.add(length, f"length of index {i}")
        result_type = RankedTensorType.get(sizes.static, source.element_type)
        value = tensor.ExtractSliceOp(
            result_type,
            source_value,
            offsets.values,
            sizes.values,
            [],
            offsets.static,
            sizes.static,
            [1] * source.rank,
        ).result
        result = IrImmediateTensor(value, source.dtype)
        result.set_dynamic_dim_values(sizes.values)
        return result

    @_emitter
    def tensor_splat(
        self,
        trace: IrTrace,
        *dims: DimValue,
        value: IrScalar | Value | int | float | bool,
        dtype: ElementType,
    ) -> IrTensor:
        """A tensor of shape ``dims`` with every element ``value``.

        Args:
            *dims: Sizes: ints or IR scalars.
            value: The fill value; converted to the element type (IR scalars are cast).
            dtype: A torch dtype or a raw IREE element type (MLIR ``Type`` or text).
        """
        element_type, torch_dtype = _element_type(trace, dtype)
        shape, dynamic = _dims(dims, "dims")
        if isinstance(value, (bool, int, float)):
            fill = _scalars.constant(element_type, value)
        else:
            fill = _scalar_value(value, "value")
            if _scalars.is_index_type(fill.type) and _scalars.is_integer_type(element_type):
                fill = arith.IndexCastUIOp(element_type, fill).result  # as the reference
            else:
                fill = _scalars.cast_scalar(fill, element_type, what="value")
        result_type = RankedTensorType.get(shape, element_type)
        result = IrImmediateTensor(
            flow.TensorSplatOp(result_type, fill, dynamic).result, torch_dtype
        )
        result.set_dynamic_dim_values(dynamic)
        return result

    @_emitter
    def tensor_trace(self, trace: IrTrace, key: str, *ts: IrTensor) -> None:
        """Emits ``flow.tensor.trace``: prints the tensors at run time under ``key``."""
        values: list[Value] = []
        dims: list[Value] = []
        for i, t in enumerate(ts):
            t = _tensor_arg(t, f"tensor {i}")
            v = t.ir_value
            values.append(v)
            dims.extend(t.get_dynamic_dim_values(resolved_ir_value=v))
        flow.TensorTraceOp(key, values, dims)

    @_emitter
    def tensor_update(
        self, trace: IrTrace, target: IrTensor, update: IrTensor, *start_indices: DimValue
    ) -> IrTensor:
        """Applies an update to a target at start_indices and returns the mutated target.

        Args:
            target: The tensor to update (static or dynamic shape).
            update: The values to write; same rank and element type as ``target``.
            *start_indices: One offset per dimension: ints or IR scalars.
        """
        target = _tensor_arg(target, "target")
        update = _tensor_arg(update, "update")
        if update.rank != target.rank:
            raise _OpError(
                f"update {update.ir_type} has rank {update.rank} but target {target.ir_type} has "
                f"rank {target.rank}"
            )
        if update.element_type != target.element_type:
            raise _OpError(
                f"update element type {update.element_type} differs from target element type "
                f"{target.element_type}"
            )
        if len(start_indices) != target.rank:
            raise _OpError(
                f"got {len(start_indices)} start indices for a rank-{target.rank} target "
                f"{target.ir_type}; give one per dimension"
            )
        for i, start in enumerate(start_indices):
            if _is_int(start) and start < 0:
                raise _OpError(f"start index {i} is {start}; offsets must be non-negative")
            static, size = target.shape[i], update.shape[i]
            if _is_int(start) and static is not None and size is not None and start + size > static:
                raise _OpError(
                    f"start index {i}: update of size {size} at offset {start} does not fit "
                    f"in dimension {i} of size {static}"
                )
        cache: dict[int, Value] = {}
        target_value = target.ir_value
        target_dims = target.get_dynamic_dim_values(
            constant_cache=cache, resolved_ir_value=target_value
        )
        update_value = update.ir_value
        update_dims = update.get_dynamic_dim_values(
            constant_cache=cache, resolved_ir_value=update_value
        )
        if _may_alias(update_value, target_value):
            # IREE 3.13 performs an update whose source is a view of the target's own buffer
            # (e.g. shifting rows of a cache: update = slice of target) as an in-place copy of
            # overlapping ranges, which the runtime rejects ("source and target ranges must not
            # overlap"). An optimization barrier makes IREE materialize the update first.
            update_value = util.OptimizationBarrierOp([update_value.type], [update_value]).results[
                0
            ]
        if _is_contiguous(target.shape, update.shape):
            # As the reference: flow.tensor.update %upd, %tgt[starts], one index constant per
            # value (shared with the dimension constants): [0, 0] is [%c0, %c0].
            start_values = [
                _index_value(v, f"start index {i}", cache) for i, v in enumerate(start_indices)
            ]
            value = flow.TensorUpdateOp(
                target_value, target_dims, start_values, update_value, update_dims
            ).result
        else:
            # Not a contiguous range of the target: IREE 3.13 performs flow.tensor.update as ONE
            # contiguous copy (a 2x2 update at [1, 1] of a 4x4 target writes 4 consecutive
            # elements), static or dynamic; IREE lowers tensor.insert_slice correctly.
            offsets = _MixedIndices(cache)
            for i, start in enumerate(start_indices):
                offsets.add(start, f"start index {i}")
            value = tensor.InsertSliceOp(
                update_value,
                target_value,
                offsets.values,
                update_dims,
                [],
                offsets.static,
                [_DYNAMIC if d is None else d for d in update.shape],
                [1] * target.rank,
            ).result
        result = IrImmediateTensor(value, target.dtype)
        result.set_dynamic_dim_values(target_dims)
        return result


IREE = IREEEmitter()


_DYNAMIC = ShapedType.get_dynamic_size()


def _is_contiguous(full: Sequence[int | None], part: Sequence[int | None]) -> bool:
    """Whether a box of sizes ``part`` (``None``: unknown) inside a row-major tensor of sizes
    ``full`` is one contiguous range of elements, whatever its offsets: every dimension after
    the first one of size other than 1 is taken whole."""
    k = 0
    while k < len(part) and part[k] == 1:
        k += 1
    return all(p is not None and p == f for p, f in zip(part[k + 1 :], full[k + 1 :], strict=True))


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


class _MixedIndices:
    """Offsets/sizes of a tensor slice op: static ints, or ``index`` values marked dynamic."""

    def __init__(self, cache: dict[int, Value]):
        self.static: list[int] = []
        self.values: list[Value] = []
        self._cache = cache

    def add(self, value: Any, what: str) -> None:
        if _is_int(value):
            if value < 0:
                raise _OpError(f"{what} is {value}; sizes and offsets must be non-negative")
            self.static.append(value)
        else:
            self.values.append(_index_value(value, what, self._cache))
            self.static.append(_DYNAMIC)


def _tensor_arg(value: Any, what: str) -> IrTensor:
    if isinstance(value, IrTensor):
        return value
    if isinstance(value, Value) and _scalars.isa(RankedTensorType, value.type):
        try:
            dtype = element_type_to_torch_dtype(RankedTensorType(value.type).element_type)
        except Exception:
            dtype = None
        return IrImmediateTensor(value, dtype)
    raise _OpError(
        f"{what} must be an IR tensor (a procedure argument, an IREE.* result or a global), "
        f"got {type(value).__name__} ({value!r:.60})"
    )


def _scalar_value(value: Any, what: str) -> Value:
    if isinstance(value, IrScalar):
        return value.ir_value
    if isinstance(value, Intrinsic):
        raise _OpError(f"{what} must be a scalar, got {value!r}")
    if isinstance(value, Value):
        return value
    raise _OpError(
        f"{what} must be an int or an IR scalar, got {type(value).__name__} ({value!r:.60})"
    )


def _index_value(value: Any, what: str, cache: dict[int, Value] | None = None) -> Value:
    """An ``index`` value for an int, an IR scalar or an integer/index ``Value``."""
    if isinstance(value, bool):
        raise _OpError(f"{what} must be an int or an IR scalar, got bool")
    if isinstance(value, int):
        if value < 0:
            raise _OpError(f"{what} is {value}; sizes and offsets must be non-negative")
        if cache is not None and value in cache:
            return cache[value]
        v = _scalars.constant(IndexType.get(), value)
        if cache is not None:
            cache[value] = v
        return v
    v = _scalar_value(value, what)
    if _scalars.isa(IndexType, v.type):
        return v
    if _scalars.is_integer_type(v.type):
        return _scalars.cast_scalar(v, IndexType.get(), what=what)
    raise _OpError(f"{what} must be an integer or index scalar, got a value of type {v.type}")


def _dims(dims: Sequence[Any], what: str) -> tuple[list[int], list[Value]]:
    """Static shape (with the dynamic marker) and the dynamic size values of ``dims``."""
    shape: list[int] = []
    dynamic: list[Value] = []
    for i, d in enumerate(dims):
        if isinstance(d, int) and not isinstance(d, bool):
            if d < 0:
                raise _OpError(f"{what}[{i}] is {d}; sizes must be non-negative")
            shape.append(d)
        else:
            dynamic.append(_index_value(d, f"{what}[{i}]"))
            shape.append(ShapedType.get_dynamic_size())
    return shape, dynamic


def _element_type(trace: IrTrace, dtype: Any) -> tuple[Type, torch.dtype | None]:
    """(MLIR element type, torch dtype or None) for a torch dtype or a raw IREE element type."""
    if isinstance(dtype, torch.dtype):
        return trace.module_builder.torch_dtype_to_iree_type(dtype), dtype
    if isinstance(dtype, str):
        try:
            element_type = Type.parse(dtype)
        except Exception as e:
            raise _OpError(f"dtype {dtype!r} is not a valid MLIR element type: {e}") from None
    elif isinstance(dtype, Type):
        element_type = dtype
    else:
        raise _OpError(
            f"dtype must be a torch.dtype or an MLIR element type (Type or text such as 'i4'), "
            f"got {type(dtype).__name__} ({dtype!r:.60})"
        )
    try:
        torch_dtype = element_type_to_torch_dtype(element_type)
    except Exception:
        torch_dtype = None
    return element_type, torch_dtype


# Ops whose tensor result views (or is tied to) their first tensor operand's buffer.
_VIEW_OPS = frozenset(
    {
        "flow.tensor.slice",
        "flow.tensor.reshape",
        "flow.tensor.update",
        "flow.tensor.bitcast",
        "tensor.extract_slice",
        "tensor.insert_slice",
        "tensor.cast",
        "tensor.expand_shape",
        "tensor.collapse_shape",
        "tensor.reshape",
        "util.optimization_barrier",
    }
)


def _buffer_roots(value: Value, limit: int = 64) -> set[Any]:
    """Where a tensor value's storage may come from: block arguments and globals, through views."""
    roots: set[Any] = set()
    pending = [value]
    while pending and limit > 0:
        limit -= 1
        v = pending.pop()
        owner = v.owner
        if not hasattr(owner, "name"):  # a block argument
            roots.add(("arg", v.arg_number if hasattr(v, "arg_number") else str(v)))
            continue
        op = owner
        if op.name == "util.global.load":
            roots.add(("global", str(op.attributes["global"])))
        elif op.name in _VIEW_OPS:
            if op.name == "flow.tensor.update":
                pending.append(op.operands[0])  # the target
            elif op.name == "tensor.insert_slice":
                pending.append(op.operands[1])  # the dest
            else:
                pending.append(op.operands[0])
    return roots


def _may_alias(a: Value, b: Value) -> bool:
    if a == b:
        return True
    return bool(_buffer_roots(a) & _buffer_roots(b))
