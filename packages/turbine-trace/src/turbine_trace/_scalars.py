"""Scalar IR helpers: constants, casts and arithmetic on index/integer/float values.

All functions require an ``InsertionPoint`` and a ``Location`` on the MLIR context stack (the
callers enter the current trace's ``ip``/``loc``).
"""

from __future__ import annotations

from typing import Any

from turbine_ir.dialects import arith
from turbine_ir.ir import (  # type: ignore[attr-defined]  # FloatType comes from the `*` import
    F32Type,
    F64Type,
    FloatAttr,
    FloatType,
    IndexType,
    IntegerAttr,
    IntegerType,
    Type,
    Value,
)

from ._errors import ProcedureTraceError

__all__ = [
    "binary_op",
    "cast_scalar",
    "constant",
    "is_float_type",
    "is_index_type",
    "is_integer_type",
    "isa",
    "python_constant",
]


def isa(cls: type, t: Type) -> bool:
    """Whether MLIR type ``t`` is an instance of the binding class ``cls`` (e.g. ``IndexType``)."""
    if isinstance(t, cls):
        return True
    try:
        cls(t)
    except (ValueError, TypeError):
        return False
    return True


def is_index_type(t: Type) -> bool:
    return isa(IndexType, t)


def is_integer_type(t: Type) -> bool:
    return isa(IntegerType, t)


def is_float_type(t: Type) -> bool:
    return isa(FloatType, t)


def _int_width(t: Type) -> int:
    return IntegerType(t).width


def constant(ir_type: Type, value: bool | int | float) -> Value:
    """An ``arith.constant`` of ``ir_type`` holding a Python number."""
    if is_index_type(ir_type) or is_integer_type(ir_type):
        if isinstance(value, float) and not value.is_integer():
            raise ProcedureTraceError(
                f"cannot make an integer constant of type {ir_type} from the float {value!r}"
            )
        ivalue = int(value)
        if is_integer_type(ir_type) and _int_width(ir_type) == 1:
            ivalue = 1 if ivalue else 0
        return arith.ConstantOp(ir_type, IntegerAttr.get(ir_type, ivalue)).result
    if is_float_type(ir_type):
        return arith.ConstantOp(ir_type, FloatAttr.get(ir_type, float(value))).result
    raise ProcedureTraceError(f"cannot make a constant of type {ir_type} from {value!r}")


def python_constant(value: bool | int | float) -> Value:
    """The IR constant for a Python scalar: bool → i1, int → i64, float → f64."""
    if isinstance(value, bool):
        return constant(IntegerType.get_signless(1), value)
    if isinstance(value, int):
        return constant(IntegerType.get_signless(64), value)
    if isinstance(value, float):
        return constant(F64Type.get(), value)
    raise ProcedureTraceError(f"{type(value).__name__} {value!r} is not a Python scalar")


def cast_scalar(value: Value, to_type: Type, *, what: str = "value") -> Value:
    """Converts a scalar value to ``to_type`` (index ↔ integer, integer widths, int ↔ float).

    Integers are treated as signed (MLIR integers are signless; torch integer dtypes except uint8
    are signed).
    """
    from_type = value.type
    if from_type == to_type:
        return value
    f_idx, t_idx = is_index_type(from_type), is_index_type(to_type)
    f_int, t_int = is_integer_type(from_type), is_integer_type(to_type)
    f_flt, t_flt = is_float_type(from_type), is_float_type(to_type)
    if (f_idx and t_int) or (f_int and t_idx):
        return arith.IndexCastOp(to_type, value).result
    if f_int and t_int:
        if _int_width(from_type) < _int_width(to_type):
            if _int_width(from_type) == 1:
                return arith.ExtUIOp(to_type, value).result
            return arith.ExtSIOp(to_type, value).result
        return arith.TruncIOp(to_type, value).result
    if f_flt and t_flt:
        from_w, to_w = FloatType(from_type).width, FloatType(to_type).width
        if from_w < to_w:
            return arith.ExtFOp(to_type, value).result
        return arith.TruncFOp(to_type, value).result
    if (f_int or f_idx) and t_flt:
        if f_idx:
            value = arith.IndexCastOp(IntegerType.get_signless(64), value).result
        return arith.SIToFPOp(to_type, value).result
    if f_flt and (t_int or t_idx):
        if t_idx:
            i64 = arith.FPToSIOp(IntegerType.get_signless(64), value).result
            return arith.IndexCastOp(to_type, i64).result
        return arith.FPToSIOp(to_type, value).result
    raise ProcedureTraceError(f"cannot convert {what} of type {from_type} to {to_type}")


_INT_OPS = {
    "add": arith.AddIOp,
    "sub": arith.SubIOp,
    "mul": arith.MulIOp,
    "floordiv": arith.FloorDivSIOp,
    "mod": arith.RemSIOp,
    "min": arith.MinSIOp,
    "max": arith.MaxSIOp,
}
_FLOAT_OPS = {
    "add": arith.AddFOp,
    "sub": arith.SubFOp,
    "mul": arith.MulFOp,
    "truediv": arith.DivFOp,
    "mod": arith.RemFOp,
    "min": arith.MinimumFOp,
    "max": arith.MaximumFOp,
}


def _rank(t: Type) -> int:
    # Promotion order: i1 < other integers by width < index < floats by width.
    if is_integer_type(t):
        return _int_width(t)
    if is_index_type(t):
        return 1000
    if is_float_type(t):
        return 2000 + FloatType(t).width
    return -1


def binary_op(op: str, lhs: Value | Any, rhs: Value | Any) -> Value:
    """Applies ``op`` to two scalars, at least one of them an IR value.

    Python numbers take the type of the IR operand; a Python float with an integer/index
    operand makes the operation f32, as in the reference (``arith.sitofp`` of the operand to
    f32, an f32 constant, the f32 op). Two IR operands of different types are promoted to the
    wider kind (integer < index < float).
    """
    for py, ir_side in ((rhs, "lhs"), (lhs, "rhs")):
        other = lhs if ir_side == "lhs" else rhs
        if (
            isinstance(py, float)
            and isinstance(other, Value)
            and not is_float_type(other.type)
            and (is_integer_type(other.type) or is_index_type(other.type))
        ):
            promoted = cast_scalar(other, F32Type.get(), what="integer operand")
            if ir_side == "lhs":
                lhs = promoted
            else:
                rhs = promoted
    if not isinstance(lhs, Value):
        lhs = _py_operand(lhs, rhs.type)
    if not isinstance(rhs, Value):
        rhs = _py_operand(rhs, lhs.type)
    if lhs.type != rhs.type:
        target = lhs.type if _rank(lhs.type) >= _rank(rhs.type) else rhs.type
        lhs = cast_scalar(lhs, target, what="left operand")
        rhs = cast_scalar(rhs, target, what="right operand")
    t = lhs.type
    if is_float_type(t):
        table = _FLOAT_OPS
    elif is_integer_type(t) or is_index_type(t):
        table = _INT_OPS
    else:
        raise ProcedureTraceError(f"scalar arithmetic is not supported on values of type {t}")
    if op not in table:
        kind = "float" if table is _FLOAT_OPS else "integer/index"
        raise ProcedureTraceError(
            f"operator {op!r} is not supported on {kind} scalars of type {t}; "
            f"supported: {', '.join(sorted(table))}"
        )
    if table is _INT_OPS and op == "mod":
        # Python's floor modulo (sign of the divisor): ((a rem b) + b) rem b.
        rem = arith.RemSIOp(lhs, rhs).result
        return arith.RemSIOp(arith.AddIOp(rem, rhs).result, rhs).result
    return table[op](lhs, rhs).result


def _py_operand(value: Any, other_type: Type) -> Value:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProcedureTraceError(
            f"cannot combine {type(value).__name__} {value!r} with an IR scalar of type "
            f"{other_type}; use an int, a float or an IR scalar"
        )
    return constant(other_type, value)
