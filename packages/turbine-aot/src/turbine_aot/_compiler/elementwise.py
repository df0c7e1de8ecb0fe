"""Element-wise functions of turbine's own in the compile copy: a torch op of one f32 tensor
replaced by a call of a private function over builtin tensors whose ``linalg.generic`` computes
each element with scalar ``arith`` / ``math`` ops (IREE inlines the call and vectorizes the body
as it does torch-mlir's own element-wise code: one dispatch, as before).

Used where IREE's expansion of a math function is slow or inaccurate for what torch computes:
:mod:`.gelu` (GELU's ``erf`` and ``tanh`` forms) and :mod:`.trig` (``sin`` and ``cos``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Any

from .torch_ir import Builder, TensorType, TopLevel, builtin_tensor, replace_each, walk

__all__ = ["Body", "f32_ops", "f32_same_shape", "rewrite_unary_ops", "unary_function"]

#: Emits the scalar body for the element ``%v`` (f32) through the line emitter it is given and
#: returns the name of the result (f32); the frame's own names start with ``%frame_``.
Body = Callable[[Callable[[str], None]], str]


def f32_same_shape(op: Any) -> bool:
    """Whether ``op``'s first operand and first result are f32 tensors of the same sizes (the
    ops these functions replace)."""
    xt, rt = TensorType.of(op.operands[0]), TensorType.of(op.results[0])
    return (
        xt is not None and rt is not None and xt.dtype == rt.dtype == "f32" and rt.sizes == xt.sizes
    )


def f32_ops(module_op: Any, names: Collection[str], operands: int) -> list[Any]:
    """The ops of ``module_op`` named one of ``names``, with ``operands`` operands, whose first
    operand and result are f32 tensors of the same sizes (:func:`f32_same_shape`)."""
    return [
        o
        for o in walk(getattr(module_op, "operation", module_op))
        if o.name in names and len(list(o.operands)) == operands and f32_same_shape(o)
    ]


def unary_function(name: str, sizes: Sequence[int | None], body: Body) -> str:
    """The private function ``@name(x) -> f(x)`` over the builtin f32 tensor of ``sizes``
    (``None``: a dynamic size), ``f`` computed element by element by ``body``."""
    t = builtin_tensor(sizes, "f32")
    rank = len(sizes)
    lines = [f"func.func private @{name}(%frame_x: {t}) -> {t} {{"]
    e = lines.append
    dims = []
    for i, s in enumerate(sizes):
        if s is None:
            e(f"  %frame_c{i} = arith.constant {i} : index")
            e(f"  %frame_d{i} = tensor.dim %frame_x, %frame_c{i} : {t}")
            dims.append(f"%frame_d{i}")
    e(f"  %frame_init = tensor.empty({', '.join(dims)}) : {t}")
    loops = ", ".join(f"d{i}" for i in range(rank))
    ident = f"affine_map<({loops}) -> ({loops})>"
    iterators = ", ".join(['"parallel"'] * rank)
    e(
        f"  %frame_y = linalg.generic {{indexing_maps = [{ident}, {ident}], "
        f"iterator_types = [{iterators}]}} ins(%frame_x : {t}) outs(%frame_init : {t}) {{"
    )
    e("  ^bb0(%v: f32, %frame_out: f32):")
    result = body(lambda line: e(f"    {line}"))
    e(f"    linalg.yield {result} : f32")
    e(f"  }} -> {t}")
    e(f"  return %frame_y : {t}")
    e("}")
    return "\n".join(lines)


def rewrite_unary_ops(
    module_op: Any,
    ops: Sequence[Any],
    prefix: str,
    form: Callable[[Any], tuple[Hashable, str, Body]],
) -> int:
    """Replaces, in place, each op of ``ops`` (of ``module_op``; one f32 operand first, one
    result of its type) by a call of :func:`unary_function`. ``form(op)`` gives the op's key
    (ops of equal key and sizes share one function), a name part and the body; functions are
    named ``<prefix><name part>_<n>``.

    Returns:
        How many ops were replaced.
    """
    top = TopLevel(getattr(module_op, "operation", module_op))
    functions: dict[tuple[Hashable, tuple[int | None, ...]], str] = {}

    def call(b: Builder, op: Any) -> Any:
        xt = TensorType.of(op.operands[0])
        assert xt is not None
        key, part, body = form(op)
        sizes = tuple(xt.sizes)
        t = builtin_tensor(sizes, "f32")
        if (key, sizes) not in functions:
            name = top.unique(f"{prefix}{part}_{len(functions)}")
            functions[key, sizes] = name
            top.append(unary_function(name, sizes, body))
        return b.call_on_builtins(
            functions[key, sizes], [(op.operands[0], t)], t, op.results[0].type
        )

    return replace_each(ops, call)
