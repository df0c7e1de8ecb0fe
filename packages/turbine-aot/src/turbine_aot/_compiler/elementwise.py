"""Element-wise functions of turbine's own in the compile copy: a torch op of one f32 tensor
(or of two of the same sizes) replaced by a call of a private function over builtin tensors
whose ``linalg.generic`` computes each element with scalar ``arith`` / ``math`` ops (IREE inlines
the call and vectorizes the body as it does torch-mlir's own element-wise code: one dispatch,
as before).

Used where IREE's expansion of a math function is slow or inaccurate for what torch computes:
:mod:`.gelu` (GELU's ``erf`` and ``tanh`` forms) and :mod:`.trig` (``sin``, ``cos``, ``tan``,
``atan``, ``atan2``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Any

from .torch_ir import Builder, TensorType, TopLevel, builtin_tensor, replace_each, walk

__all__ = [
    "Body",
    "elementwise_function",
    "f32_ops",
    "f32_same_shape",
    "rewrite_elementwise_ops",
]

#: Emits the scalar body for the element ``%v`` (f32; a second input's is ``%w``) through the
#: line emitter it is given and returns the name of the result (f32); the frame's own names
#: start with ``%frame_``.
Body = Callable[[Callable[[str], None]], str]


def f32_same_shape(op: Any) -> bool:
    """Whether ``op``'s first operand and first result are f32 tensors of the same sizes (the
    ops these functions replace)."""
    xt, rt = TensorType.of(op.operands[0]), TensorType.of(op.results[0])
    return (
        xt is not None and rt is not None and xt.dtype == rt.dtype == "f32" and rt.sizes == xt.sizes
    )


def f32_ops(module_op: Any, names: Collection[str], operands: int, tensors: int = 1) -> list[Any]:
    """The ops of ``module_op`` named one of ``names``, with ``operands`` operands, whose first
    operand and result are f32 tensors of the same sizes (:func:`f32_same_shape`), and the
    first ``tensors`` operands all of that type."""
    found = []
    for o in walk(getattr(module_op, "operation", module_op)):
        if o.name not in names or len(list(o.operands)) != operands or not f32_same_shape(o):
            continue
        first = TensorType.of(o.operands[0])
        others = [TensorType.of(o.operands[i]) for i in range(1, tensors)]
        if all(
            t is not None
            and first is not None
            and t.sizes == first.sizes
            and t.dtype == first.dtype
            for t in others
        ):
            found.append(o)
    return found


def elementwise_function(
    name: str, sizes: Sequence[int | None], body: Body, inputs: int = 1
) -> str:
    """The private function ``@name(x) -> f(x)`` (``@name(x, y) -> f(x, y)`` for two
    ``inputs``) over builtin f32 tensors of ``sizes`` (``None``: a dynamic size), ``f``
    computed element by element by ``body``."""
    t = builtin_tensor(sizes, "f32")
    rank = len(sizes)
    args = ["%frame_x", "%frame_x2"][:inputs]
    params = ", ".join(f"{a}: {t}" for a in args)
    lines = [f"func.func private @{name}({params}) -> {t} {{"]
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
    maps = ", ".join([ident] * (inputs + 1))
    ins = ", ".join(args)
    e(
        f"  %frame_y = linalg.generic {{indexing_maps = [{maps}], "
        f"iterator_types = [{iterators}]}} ins({ins} : {', '.join([t] * inputs)}) "
        f"outs(%frame_init : {t}) {{"
    )
    elements = ", ".join(f"{v}: f32" for v in ["%v", "%w"][:inputs])
    e(f"  ^bb0({elements}, %frame_out: f32):")
    result = body(lambda line: e(f"    {line}"))
    e(f"    linalg.yield {result} : f32")
    e(f"  }} -> {t}")
    e(f"  return %frame_y : {t}")
    e("}")
    return "\n".join(lines)


def rewrite_elementwise_ops(
    module_op: Any,
    ops: Sequence[Any],
    prefix: str,
    form: Callable[[Any], tuple[Hashable, str, Body]],
    inputs: int = 1,
) -> int:
    """Replaces, in place, each op of ``ops`` (of ``module_op``; ``inputs`` f32 operands of one
    type first, one result of that type) by a call of :func:`elementwise_function`.
    ``form(op)`` gives the op's key (ops of equal key and sizes share one function), a name
    part and the body; functions are named ``<prefix><name part>_<n>``.

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
            top.append(elementwise_function(name, sizes, body, inputs))
        operands = [(op.operands[i], t) for i in range(inputs)]
        return b.call_on_builtins(functions[key, sizes], operands, t, op.results[0].type)

    return replace_each(ops, call)
