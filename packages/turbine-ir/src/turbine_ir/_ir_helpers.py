"""Small IR builders every export path shares: zero initial values, index constants, tensor dims.

Also the type and location queries the builders use (``as_ranked_tensor``, ``current_loc``).
"""

from __future__ import annotations

from iree.compiler import ir
from iree.compiler.dialects import arith, tensor

__all__ = [
    "as_ranked_tensor",
    "build_index_constant",
    "build_tensor_dim_value",
    "current_loc",
    "zero_initial_value",
]


def zero_initial_value(typ: ir.Type, *, what: str = "global") -> ir.Attribute:
    """The zero of ``typ`` as a global's initial value: ``0 : index``, ``0 : i32``,
    ``0.000000e+00 : f32``, ``false`` (i1), or a splat (``dense<0> : tensor<1xi32>``,
    ``dense<0.000000e+00> : tensor<2xf64>``) for a statically shaped tensor.

    Raises:
        ValueError: ``typ`` is a dynamically shaped tensor, or has no zero (e.g. not a number).
    """
    with typ.context, current_loc(typ.context):
        rtt = as_ranked_tensor(typ)
        if rtt is not None:
            if not rtt.has_static_shape:
                raise ValueError(
                    f"{what}: Cannot create initialization value for dynamic shaped tensor "
                    f"{typ}; declare the global with uninitialized=True (mutable=True, stored "
                    "before it is loaded) or external=True"
                )
            element = _scalar_zero(rtt.element_type, what)
            return ir.DenseElementsAttr.get_splat(rtt, element)
        return _scalar_zero(typ, what)


def _scalar_zero(typ: ir.Type, what: str) -> ir.Attribute:
    if _isa(ir.IndexType, typ) or _isa(ir.IntegerType, typ):
        return ir.IntegerAttr.get(typ, 0)
    if _isa(ir.FloatType, typ):
        return ir.FloatAttr.get(typ, 0.0)
    raise ValueError(f"{what}: no zero initial value for type {typ}")


def _isa(cls: type, t: ir.Type) -> bool:
    if isinstance(t, cls):
        return True
    try:
        cls(t)  # type: ignore[call-arg]
    except (ValueError, TypeError):
        return False
    return True


def as_ranked_tensor(t: ir.Type) -> ir.RankedTensorType | None:
    """``t`` as a ranked tensor type, or ``None`` when it is another type."""
    if isinstance(t, ir.RankedTensorType):
        return t
    try:
        return ir.RankedTensorType(t)
    except ValueError:
        return None


def current_loc(context: ir.Context) -> ir.Location:
    """The current location if it belongs to ``context``, else an unknown one in it."""
    try:
        loc = ir.Location.current
    except ValueError:
        loc = None
    if loc is None or loc.context != context:
        return ir.Location.unknown(context)
    return loc


def build_index_constant(value: int, constant_cache: dict[int, ir.Value] | None = None) -> ir.Value:
    """``arith.constant {value} : index`` at the current insertion point (cached if given)."""
    if constant_cache is not None and value in constant_cache:
        return constant_cache[value]
    result = arith.ConstantOp(ir.IndexType.get(), value).result
    if constant_cache is not None:
        constant_cache[value] = result
    return result


def build_tensor_dim_value(
    t: ir.Value, dim: int, constant_cache: dict[int, ir.Value] | None = None
) -> ir.Value:
    """An ``index`` value for dimension ``dim`` of tensor value ``t``.

    Static dimensions become (cached) ``arith.constant``; dynamic ones ``tensor.dim``. Needs a
    current insertion point and location.

    Raises:
        ValueError: ``t`` is not a ranked tensor or ``dim`` is out of range.
    """
    ttype = t.type
    rtt = as_ranked_tensor(ttype)
    if rtt is None:
        raise ValueError(f"build_tensor_dim_value: expected a ranked tensor value, got {ttype}")
    if not -rtt.rank <= dim < rtt.rank:
        raise ValueError(
            f"build_tensor_dim_value: dim {dim} is out of range for {ttype} (rank {rtt.rank})"
        )
    dim = dim % rtt.rank if rtt.rank else dim
    if not rtt.is_dynamic_dim(dim):
        return build_index_constant(rtt.shape[dim], constant_cache)
    index = build_index_constant(dim, constant_cache)
    return tensor.DimOp(t, index).result
