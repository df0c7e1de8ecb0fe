"""Intrinsic values of a procedure: scalars and tensors, immediate or loaded from globals."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from turbine_ir.dialects import arith, tensor
from turbine_ir.ir import IndexType, IntegerAttr, RankedTensorType, ShapedType, Type, Value

from . import _scalars
from ._base import Intrinsic, current_ir_trace
from ._errors import ProcedureTraceError

if TYPE_CHECKING:
    from ._base import IrTrace

__all__ = [
    "IrImmediateScalar",
    "IrImmediateTensor",
    "IrScalar",
    "IrTensor",
    "MaterializedGlobal",
    "convert_py_value_to_ir",
]


class MaterializedGlobal:
    """Tags an Ir* that is duck-typed as a global.

    Attributes:
        symbol_name: The (uniqued) symbol of the ``util.global``.
        global_op: The ``util.global`` operation.
        global_type: The type of the global.
        ir_type: The type of values loaded from it (the same as ``global_type``).
    """

    __slots__ = ()
    symbol_name: str
    global_op: Any
    global_type: Type
    ir_type: Type


# --------------------------------------------------------------------------------------------
# Scalars
# --------------------------------------------------------------------------------------------


class IrScalar(Intrinsic):
    """An intrinsic that represents a scalar value.

    Subclasses are responsible for providing either value or load semantics. Arithmetic with
    other scalars or Python numbers (``+ - * // %``, ``/`` on floats) emits ``arith`` ops and
    yields an ``IrImmediateScalar``, so that sizes can be computed in a procedure
    (``n = IREE.tensor_dim(x, 0); IREE.tensor_slice(x, (1, n - 1))``).

    Args:
        ir_type: The MLIR type of the scalar.
    """

    __slots__ = ["ir_type"]

    def __init__(self, ir_type: Type):
        self.ir_type = ir_type

    def set(self, other: Any) -> None:
        """Assigns ``other`` (an IR scalar or a Python number) to this scalar (globals only)."""
        current_ir_trace().handle_assignment(None, self, other)

    def _binary(self, op: str, other: Any, *, reverse: bool = False) -> IrImmediateScalar:
        trace = current_ir_trace()
        with trace.loc, trace.ip:
            lhs = self.ir_value
            rhs = other.ir_value if isinstance(other, Intrinsic) else other
            if reverse:
                lhs, rhs = rhs, lhs
            try:
                return IrImmediateScalar(_scalars.binary_op(op, lhs, rhs))
            except ProcedureTraceError as e:
                raise ProcedureTraceError(f"procedure {trace.name!r}: {e}") from None

    def __add__(self, other: Any) -> IrImmediateScalar:
        return self._binary("add", other)

    def __radd__(self, other: Any) -> IrImmediateScalar:
        return self._binary("add", other, reverse=True)

    def __sub__(self, other: Any) -> IrImmediateScalar:
        return self._binary("sub", other)

    def __rsub__(self, other: Any) -> IrImmediateScalar:
        return self._binary("sub", other, reverse=True)

    def __mul__(self, other: Any) -> IrImmediateScalar:
        return self._binary("mul", other)

    def __rmul__(self, other: Any) -> IrImmediateScalar:
        return self._binary("mul", other, reverse=True)

    def __floordiv__(self, other: Any) -> IrImmediateScalar:
        return self._binary("floordiv", other)

    def __rfloordiv__(self, other: Any) -> IrImmediateScalar:
        return self._binary("floordiv", other, reverse=True)

    def __truediv__(self, other: Any) -> IrImmediateScalar:
        return self._binary("truediv", other)

    def __rtruediv__(self, other: Any) -> IrImmediateScalar:
        return self._binary("truediv", other, reverse=True)

    def __mod__(self, other: Any) -> IrImmediateScalar:
        return self._binary("mod", other)

    def __rmod__(self, other: Any) -> IrImmediateScalar:
        return self._binary("mod", other, reverse=True)

    def __bool__(self) -> bool:
        raise ProcedureTraceError(
            f"{self!r} has no Python truth value while tracing: its value is only known when "
            "the compiled program runs; Python control flow cannot depend on it"
        )


class IrImmediateScalar(IrScalar):
    """Represents an IR scalar value.

    Args:
        ir_value: The SSA value.
    """

    __slots__ = ["_ir_value"]

    def __init__(self, ir_value: Value):
        super().__init__(ir_value.type)
        self._ir_value = ir_value

    def resolve_ir_values(self, proc_trace: IrTrace) -> Sequence[Value]:
        return (self._ir_value,)

    @property
    def ir_values(self) -> Sequence[Value]:
        return (self._ir_value,)

    @property
    def ir_value(self) -> Value:
        return self._ir_value

    def __repr__(self) -> str:
        return f"IrImmediateScalar({self.ir_type})"


# --------------------------------------------------------------------------------------------
# Tensors
# --------------------------------------------------------------------------------------------


class IrTensor(Intrinsic):
    """An intrinsic that represents a tensor value.

    Carries additional metadata needed to resolve dimensions and original PyTorch attributes.
    Dynamic dimension sizes, once known (``set_dynamic_dim_values``, or computed by
    ``get_dim_value``), are remembered so that every later op reuses the same SSA values.

    Args:
        ir_type: A ranked tensor type.
        dtype: The torch dtype of the elements (``None`` for element types torch lacks).
    """

    __slots__ = ["_cached_dim_values", "_dynamic_dims", "_shape", "dtype", "ir_type"]
    _caches_dims = True

    def __init__(self, ir_type: Type, dtype: torch.dtype | None):
        if not _scalars.isa(RankedTensorType, ir_type):
            raise ProcedureTraceError(f"IrTensor needs a ranked tensor type, got {ir_type}")
        self.ir_type = RankedTensorType(ir_type)
        self.dtype = dtype
        self._shape: list[int | None] = [
            None if ShapedType.is_dynamic_size(d) else d for d in self.ir_type.shape
        ]
        self._dynamic_dims = [i for i, d in enumerate(self._shape) if d is None]
        self._cached_dim_values: dict[int, Value] = {}

    @property
    def rank(self) -> int:
        """The number of dimensions."""
        return len(self._shape)

    @property
    def shape(self) -> list[int | None]:
        """Static sizes, ``None`` for dynamic dimensions."""
        return list(self._shape)

    @property
    def element_type(self) -> Type:
        """The MLIR element type."""
        return self.ir_type.element_type

    @property
    def dynamic_dim_indices(self) -> list[int]:
        """Positions of the dynamic dimensions."""
        return list(self._dynamic_dims)

    def set_dynamic_dim_values(self, values: Sequence[Value]) -> None:
        """Sets all dynamic dim values (``index`` values, in dimension order)."""
        values = list(values)
        if len(values) != len(self._dynamic_dims):
            raise ProcedureTraceError(
                f"{self!r} has {len(self._dynamic_dims)} dynamic dimensions but "
                f"{len(values)} dimension values were given"
            )
        for index, value in zip(self._dynamic_dims, values):
            if not _scalars.isa(IndexType, value.type):
                raise ProcedureTraceError(
                    f"dynamic dimension {index} of {self!r} must be an index value, got {value.type}"
                )
            self._cached_dim_values[index] = value

    def get_dim_value(
        self,
        index: int,
        *,
        constant_cache: dict[int, Value] | None = None,
        resolved_ir_value: Value | None = None,
    ) -> Value:
        """Gets a dimension as an Index value: ``tensor.dim`` (static dimensions too, as the
        reference does), or the value set with :meth:`set_dynamic_dim_values`.

        Requires that an InsertionPoint and Location are on the context stack.

        This will cache the dim value, returning the cached value later if requested (not for
        globals, which are loaded anew at each use).

        Args:
            index: The dimension (negative counts from the end).
            constant_cache: Optional map of static size → ``index`` constant, to reuse constants.
            resolved_ir_value: The already materialized tensor value (avoids a second load for
                globals).
        """
        if index < 0:
            index += self.rank
        if not 0 <= index < self.rank:
            raise ProcedureTraceError(
                f"dimension {index} is out of range for rank-{self.rank} tensor {self.ir_type}"
            )
        cached = self._cached_dim_values.get(index)
        if cached is not None:
            return cached
        if resolved_ir_value is None:
            resolved_ir_value = self.ir_value
        dim = tensor.DimOp(resolved_ir_value, _index_constant(index, constant_cache)).result
        if self._caches_dims:
            self._cached_dim_values[index] = dim
        return dim

    def get_dynamic_dim_values(
        self,
        *,
        constant_cache: dict[int, Value] | None = None,
        resolved_ir_value: Value | None = None,
    ) -> list[Value]:
        """The ``index`` values of every dynamic dimension, in order (for ``{dims}`` operands)."""
        return [
            self.get_dim_value(
                i, constant_cache=constant_cache, resolved_ir_value=resolved_ir_value
            )
            for i in self._dynamic_dims
        ]

    def to_meta_tensor(self, dynamic_size: int = 2) -> torch.Tensor:
        """A ``meta`` tensor of this shape and dtype (dynamic dims get ``dynamic_size``).

        Useful for tracing torch code against this value (e.g. ``jittable``); pair it with
        ``dynamic_dim_indices`` to mark those dimensions dynamic for ``torch.export``.
        """
        if self.dtype is None:
            raise ProcedureTraceError(
                f"{self!r} has element type {self.element_type}, which has no torch dtype"
            )
        shape = [dynamic_size if d is None else d for d in self._shape]
        return torch.empty(shape, dtype=self.dtype, device="meta")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.ir_type}, dtype={self.dtype})"


class IrImmediateTensor(IrTensor):
    """Represents a Value in the IR under construction during procedural tracing.

    Args:
        ir_value: The SSA value (of ranked tensor type).
        dtype: The torch dtype of its elements (``None`` for element types torch lacks).
    """

    __slots__ = ["_ir_value"]

    def __init__(self, ir_value: Value, dtype: torch.dtype | None):
        super().__init__(ir_value.type, dtype)
        self._ir_value = ir_value

    def resolve_ir_values(self, proc_trace: IrTrace) -> Sequence[Value]:
        return (self._ir_value,)

    @property
    def ir_values(self) -> Sequence[Value]:
        return (self._ir_value,)

    @property
    def ir_value(self) -> Value:
        return self._ir_value


def _index_constant(value: int, cache: dict[int, Value] | None) -> Value:
    if cache is not None:
        hit = cache.get(value)
        if hit is not None:
            return hit
    index_type = IndexType.get()
    result = arith.ConstantOp(index_type, IntegerAttr.get(index_type, value)).result
    if cache is not None:
        cache[value] = result
    return result


# --------------------------------------------------------------------------------------------
# Conversion of Python values
# --------------------------------------------------------------------------------------------


def convert_py_value_to_ir(proc_trace: IrTrace, py_value: Any) -> Sequence[Value]:
    """Given procedurally traced python values, type check and convert to IR.

    Accepted: intrinsics (``IrTensor``, ``IrScalar``, globals), raw MLIR ``Value``s and Python
    scalars (bool → i1, int → i64, float → f64 constants).

    Raises:
        ProcedureTraceError: for any other value, naming the procedure.
    """
    if isinstance(py_value, Intrinsic):
        with proc_trace.loc, proc_trace.ip:
            return tuple(py_value.resolve_ir_values(proc_trace))
    if isinstance(py_value, Value):
        return (py_value,)
    if isinstance(py_value, (bool, int, float)):
        with proc_trace.loc, proc_trace.ip:
            return (_scalars.python_constant(py_value),)
    raise ProcedureTraceError(
        f"procedure {proc_trace.name!r}: cannot convert {_describe(py_value)} to IR; expected an "
        "IR tensor or scalar (an argument, an IREE.* result, a global), an MLIR Value or a "
        "Python bool/int/float"
    )


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    if isinstance(value, torch.Tensor):
        return (
            f"a torch.Tensor {tuple(value.shape)} {value.dtype} (eager tensors cannot be "
            "returned from a procedure; export it as a global with export_global)"
        )
    return f"a value of type {type(value).__name__} ({text})"
