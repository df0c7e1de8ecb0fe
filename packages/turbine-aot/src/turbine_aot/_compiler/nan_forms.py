"""NaN in, NaN out: the ops torch-mlir lowers without torch's NaN semantics, written in the
compile copy in forms that keep them (a correctness fix, every target; docs/performance.md,
section 27, "NaN").

torch propagates a NaN through ``maximum`` / ``minimum`` / ``clamp`` and counts it as the
largest and the smallest value in ``argmax`` / ``argmin`` and the indices of ``max.dim`` /
``min.dim``: ``torch.clamp(nan, -1, 1)`` is NaN, ``relu6(nan)`` is NaN, ``argmax([1, nan, 3])``
is 1. The linalg IREE 3.13's torch front end (torch-mlir) makes of them compares an ordered
``cmpf`` and selects, which drop it: ``clamp(nan, -1, 1)`` came out -1, ``relu6(nan)`` 6,
``maximum(nan, 0)`` 0 and ``argmax([1, nan, 3])`` 2, on every backend -- a model fed a NaN
answered with ordinary numbers. ``amax`` / ``max`` (values), ``relu``, the poolings and the
activations keep NaN already (checked by the tests).

:func:`rewrite_nan_forms` keeps each such op and puts the NaN back where torch has it:

- ``clamp`` (scalar or tensor bounds), ``clamp_min`` / ``clamp_max``, ``relu6``, ``hardtanh``,
  ``maximum`` / ``minimum``, ``max.other`` / ``min.other`` of float tensors: ``where(isnan(x),
  x, r)`` for each float tensor operand ``x`` (a NaN bound of a tensor ``clamp`` too), around the
  op's own result ``r``: one compare and one select an element, fused into the op's dispatch.
- ``argmax`` / ``argmin`` and ``max.dim`` / ``min.dim``'s indices of a float tensor:
  ``where(any(isnan(x)), argmax(isnan(x) as 0 / 1), r)``: the first NaN's index where the
  reduced row has one (``argmax`` takes the first of equal values), the op's own elsewhere; one
  more reduction over the row.

On vmvx a NaN is found by its bits (``|bits| > bits(inf)``, the float viewed as an integer):
IREE 3.13's vmvx compares NaN as if it were a number (``isnan(nan)`` and ``nan != nan`` are
false there), which is also why these ops drop it on vmvx.

It runs last in ``rewrites.module_for_compile``, after the kernels' rewrites have taken the ops
they match (a quantization's ``clamp``, a convolution's epilogue), so that they still find
them; turbine's own kernels keep NaN themselves (``arith.maximumf``). Still wrong on IREE 3.13
and left as they are (pinned by tests): ``sort`` and ``topk`` (torch orders NaN above
everything; IREE leaves it where it is), ``adaptive_max_pool1d`` (drops it).
"""

from __future__ import annotations

from typing import Any

from .torch_ir import Builder, TensorType, constant, producer, walk

__all__ = ["FLOAT_BITS", "float_bits", "nan_ops", "rewrite_nan_forms"]

#: Element-wise ops whose float tensor operands' NaN torch propagates.
_ELEMENTWISE = frozenset(
    {
        "torch.aten.clamp",
        "torch.aten.clamp.Tensor",
        "torch.aten.clamp_min",
        "torch.aten.clamp_max",
        "torch.aten.clamp_min.Tensor",
        "torch.aten.clamp_max.Tensor",
        "torch.aten.relu6",
        "torch.aten.hardtanh",
        "torch.aten.maximum",
        "torch.aten.minimum",
        "torch.aten.max.other",
        "torch.aten.min.other",
    }
)
#: Reductions to an index (one result) and to (values, indices) (the indices are result 1).
_ARG = frozenset({"torch.aten.argmax", "torch.aten.argmin"})
_VALUES_INDICES = frozenset({"torch.aten.max.dim", "torch.aten.min.dim"})
_FLOATS = frozenset({"f16", "bf16", "f32", "f64"})


def nan_ops(module_op: Any) -> list[Any]:
    """The ops of ``module_op`` :func:`rewrite_nan_forms` rewrites: those named in the module
    doc, on a float tensor (the first operand), with a float result (the element-wise ones)."""
    found = []
    for o in walk(getattr(module_op, "operation", module_op)):
        if o.name not in _ELEMENTWISE and o.name not in _ARG and o.name not in _VALUES_INDICES:
            continue
        operands = list(o.operands)
        x = TensorType.of(operands[0]) if operands else None
        if x is None or x.dtype not in _FLOATS:
            continue
        if o.name in _ELEMENTWISE:
            r = TensorType.of(o.results[0])
            if r is None or r.dtype not in _FLOATS:
                continue
        found.append(o)
    return found


def rewrite_nan_forms(module_op: Any, by_bits: bool = False) -> int:
    """Rewrites, in place, each of :func:`nan_ops` as the module doc says (``by_bits``: NaN
    found by the float's bits, for vmvx).

    Returns:
        How many ops were rewritten.
    """
    ops = nan_ops(module_op)
    for op in ops:
        if op.name in _ELEMENTWISE:
            _keep_nan(op, by_bits)
        elif op.name in _ARG:
            _first_nan_index(op, op.results[0], op.operands[1], op.operands[2], by_bits)
        else:
            _first_nan_index(op, op.results[1], op.operands[1], op.operands[2], by_bits)
    return len(ops)


def _after(op: Any) -> Builder:
    """A builder of ops right after ``op``."""
    from turbine_ir.ir import InsertionPoint

    b = Builder(op)
    b.ip = InsertionPoint.after(op)
    return b


#: float dtype -> (its bits' integer dtype, torch's ScalarType number of it, |bits| mask, the
#: bits of +inf): NaN is ``bits & mask > inf``
FLOAT_BITS = {
    "f16": ("si16", 2, 0x7FFF, 0x7C00),
    "bf16": ("si16", 2, 0x7FFF, 0x7F80),
    "f32": ("si32", 3, 0x7FFFFFFF, 0x7F800000),
    "f64": ("si64", 4, 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000),
}


def float_bits(b: Builder, x: Any, xt: TensorType) -> Any:
    """The float tensor ``x`` (of type ``xt``) viewed as signed integers of its width."""
    dtype, code, _, _ = FLOAT_BITS[xt.dtype]
    return b.op("torch.aten.view.dtype", TensorType(xt.sizes, dtype).asm(), [x, b.int(code)])


def _isnan(b: Builder, x: Any, xt: TensorType, by_bits: bool) -> Any:
    """``isnan(x)`` (``by_bits``: from the float's bits)."""
    flags = TensorType(xt.sizes, "i1").asm()
    if not by_bits:
        return b.op("torch.aten.isnan", flags, [x])
    bits = float_bits(b, x, xt)
    _, _, mask, inf = FLOAT_BITS[xt.dtype]
    magnitude = b.op("torch.aten.__and__.Scalar", str(bits.type), [bits, b.int(mask)])
    return b.op("torch.aten.gt.Scalar", flags, [magnitude, b.int(inf)])


def _keep_nan(op: Any, by_bits: bool) -> None:
    """``where(isnan(x), x, r)`` around ``op``'s result ``r``, for each float tensor operand."""
    r = op.results[0]
    b = _after(op)
    built: list[Any] = []
    value = r
    for x in list(op.operands):
        xt = TensorType.of(x)
        if xt is None or xt.dtype not in _FLOATS:
            continue  # a scalar bound (a !torch.float): torch keeps x's NaN, and so does this
        nan = _isnan(b, x, xt, by_bits)
        value = b.op("torch.aten.where.self", str(r.type), [nan, x, value])
        built.append(producer(value))
    r.replace_all_uses_except(value, built)  # the wheres built from r keep reading it


def _first_nan_index(op: Any, indices: Any, dim: Any, keepdim: Any, by_bits: bool) -> None:
    """``where(any(isnan(x), dim), argmax(isnan(x) as 0 / 1, dim), indices)`` for ``op``'s
    ``indices`` (``dim`` None: over all elements)."""
    x = op.operands[0]
    xt, it = TensorType.of(x), TensorType.of(indices)
    assert xt is not None and it is not None
    b = _after(op)
    nan = _isnan(b, x, xt, by_bits)
    ones = b.op(
        "torch.aten.where.Scalar",
        TensorType(xt.sizes, "f32").asm(),
        [nan, b.float(1.0), b.float(0.0)],
    )
    first = b.op("torch.aten.argmax", str(indices.type), [ones, dim, keepdim])
    if constant(dim) is None:  # one flag for the whole tensor (broadcast by the where)
        has = b.op("torch.aten.any", TensorType([], "i1").asm(), [nan])
    else:
        has = b.op("torch.aten.any.dim", TensorType(it.sizes, "i1").asm(), [nan, dim, keepdim])
    value = b.op("torch.aten.where.self", str(indices.type), [has, first, indices])
    indices.replace_all_uses_except(value, [producer(value)])
